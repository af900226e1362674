"""pyproject.toml promises Python 3.10: nothing in fleet/ or fleet_jobs/ may need 3.11 to start.

Caught before: fleet/gce/config.py imported tomllib (3.11+), so no command of the CLI started on 3.10.
The interpreter under test is newer, so this reads the sources instead of running them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fleet.gce.config import tomllib

ROOT = Path(__file__).resolve().parent.parent
# Standard-library modules and names that first appeared in Python 3.11.
NEW_MODULES = {"tomllib", "wsgiref.types"}
NEW_NAMES = {
    ("datetime", "UTC"),
    ("enum", "StrEnum"),
    ("typing", "Self"),
    ("typing", "LiteralString"),
    ("typing", "Never"),
    ("typing", "assert_never"),
    ("typing", "reveal_type"),
    ("hashlib", "file_digest"),
    ("contextlib", "chdir"),
    ("asyncio", "TaskGroup"),
    ("asyncio", "timeout"),
    ("builtins", "ExceptionGroup"),
    ("builtins", "BaseExceptionGroup"),
}


def guarded(node: ast.AST, parents: dict) -> bool:
    """Inside `try: ... except (ModuleNotFoundError|ImportError)` - a fallback exists."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ModuleNotFoundError", "ImportError") for h in node.handlers
        ):
            return True
    return False


def problems(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    try:
        tree = ast.parse(source, str(path), feature_version=(3, 10))
    except SyntaxError as e:
        return [f"{path}:{e.lineno}: syntax newer than 3.10 ({e.msg})"]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            new = [a.name for a in node.names if a.name in NEW_MODULES]
        elif isinstance(node, ast.ImportFrom):
            new = (
                [node.module]
                if node.module in NEW_MODULES
                else [f"{node.module}.{a.name}" for a in node.names if (node.module, a.name) in NEW_NAMES]
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            new = [f"{node.value.id}.{node.attr}"] if (node.value.id, node.attr) in NEW_NAMES else []
        elif isinstance(node, ast.Name):
            new = [node.id] if ("builtins", node.id) in NEW_NAMES else []
        else:
            continue
        if new and not guarded(node, parents):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {', '.join(new)} needs Python 3.11")
    return out


def test_the_promise_is_python_3_10():
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.10"


def test_nothing_the_product_runs_needs_python_3_11():
    files = sorted([*ROOT.glob("fleet/**/*.py"), *ROOT.glob("fleet_jobs/**/*.py")])
    assert len(files) > 20
    assert [p for f in files for p in problems(f)] == []


def test_the_check_catches_an_unguarded_3_11_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import tomllib\nfrom datetime import UTC\nx = datetime.UTC\n"
        "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n"
    )
    assert problems(probe, tmp_path) == [
        f"probe.py:{n}: {what} needs Python 3.11"
        for n, what in ((1, "tomllib"), (2, "datetime.UTC"), (3, "datetime.UTC"))
    ]
    probe.write_text("try:\n    pass\nexcept* ValueError:\n    pass\n")
    assert "syntax newer than 3.10" in problems(probe, tmp_path)[0]

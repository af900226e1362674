"""The wings of fleet/ stay apart: the core imports neither the GCE wing nor the CLI, the GCE wing
does not import the CLI, and nothing in fleet/ imports a job (jobs are found by discovery only).

Checked on the source (every import statement, inside functions too), so a lazy import inside
a function cannot cross a wing unseen."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parent.parent / "fleet"

# What each part of fleet/ may not import. fleet.job (the job API) and fleet/__init__ belong with the core.
FORBIDDEN = {
    "core": ("fleet.gce", "fleet.cli", "fleet_jobs"),
    "gce": ("fleet.cli", "fleet_jobs"),
    "cli": ("fleet_jobs",),
}


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module == "fleet":  # from fleet import gce
                out += [(node.lineno, f"fleet.{alias.name}") for alias in node.names]
    return out


def wing_of(path: Path) -> str:
    rel = path.relative_to(FLEET)
    return rel.parts[0] if len(rel.parts) > 1 else "core"


def crossings(path: Path) -> list[str]:
    bad = []
    for line, name in imports(path):
        if path.name == "job.py" and path.parent == FLEET and name == "fleet_jobs":
            continue  # discovery: the jobs package is found, never named a job
        for forbidden in FORBIDDEN[wing_of(path)]:
            if name == forbidden or name.startswith(forbidden + "."):
                bad.append(f"{path.relative_to(FLEET.parent)}:{line} imports {name}")
    return bad


def test_the_three_wings_exist():
    assert {p.name for p in FLEET.iterdir() if (p / "__init__.py").is_file()} >= {"core", "gce", "cli"}


@pytest.mark.parametrize("path", sorted(FLEET.rglob("*.py")), ids=lambda p: str(p.relative_to(FLEET)))
def test_no_module_crosses_a_wing(path):
    assert crossings(path) == []


def test_the_rule_catches_a_crossing(tmp_path, monkeypatch):
    """The check itself: a core module with a lazy import of the GCE wing is caught."""
    fake = tmp_path / "fleet"
    (fake / "core").mkdir(parents=True)
    module = fake / "core" / "x.py"
    module.write_text("def f():\n    from fleet.gce import compute\n    import fleet.cli.render\n")
    monkeypatch.setattr(sys.modules[__name__], "FLEET", fake)
    assert crossings(module) == ["fleet/core/x.py:2 imports fleet.gce", "fleet/core/x.py:3 imports fleet.cli.render"]

"""The wings of fleet/ stay apart, and no import goes round in a circle.

The record formats (``fleet.formats``: each format's writer and reader) are the layer below
everything: they import nothing of the fleet and no job, and the core, the job API and the
jobs import them. The core imports neither the GCE wing nor the CLI nor the job API (``fleet.job``: the facade a
job imports, above the core, re-exporting what the core defines), the GCE wing does not import
the CLI, nothing in fleet/ imports ``fleet.job``, and nothing in fleet/ imports a job (jobs are
found by discovery only: ``fleet.core.discovery`` lists the jobs package, never names a job in it).
And among the modules of fleet/ and fleet_jobs/ there is no import cycle: each module's imports
lead only down, so a module can be read, tested and moved with what it imports alone.

Checked on the source (every import statement, inside functions too), so a lazy import inside
a function cannot cross a wing, or close a circle, unseen."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parent.parent / "fleet"
ROOT = FLEET.parent
PACKAGES = ("fleet", "fleet_jobs")  # the modules whose imports must not go round in a circle

# What each part of fleet/ may not import. fleet/job.py is the facade a job imports; fleet/__init__ is the
# library's front door: ``fleet.local`` and its errors come from fleet.cli.api, imported on first use.
FORBIDDEN = {
    "front": ("fleet.job", "fleet.gce", "fleet_jobs"),
    "formats": ("fleet.core", "fleet.job", "fleet.gce", "fleet.cli", "fleet_jobs"),
    "core": ("fleet.job", "fleet.gce", "fleet.cli", "fleet_jobs"),
    "gce": ("fleet.job", "fleet.cli", "fleet_jobs"),
    "cli": ("fleet.job", "fleet_jobs"),
    "facade": ("fleet.gce", "fleet.cli", "fleet_jobs"),
}
DISCOVERY = Path("core") / "discovery.py"  # may import the package fleet_jobs itself, to list its folders


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
    if rel == Path("job.py"):
        return "facade"
    if rel == Path("__init__.py"):
        return "front"
    return rel.parts[0] if len(rel.parts) > 1 else "core"


def crossings(path: Path) -> list[str]:
    bad = []
    for line, name in imports(path):
        if path.relative_to(FLEET) == DISCOVERY and name == "fleet_jobs":
            continue  # discovery: the jobs package is found, never named a job
        for forbidden in FORBIDDEN[wing_of(path)]:
            if name == forbidden or name.startswith(forbidden + "."):
                bad.append(f"{path.relative_to(FLEET.parent)}:{line} imports {name}")
    return bad


def test_the_three_wings_exist():
    assert {p.name for p in FLEET.iterdir() if (p / "__init__.py").is_file()} >= {"formats", "core", "gce", "cli"}


@pytest.mark.parametrize("path", sorted(FLEET.rglob("*.py")), ids=lambda p: str(p.relative_to(FLEET)))
def test_no_module_crosses_a_wing(path):
    assert crossings(path) == []


def test_the_rule_catches_a_crossing(tmp_path, monkeypatch):
    """The check itself: a core module with a lazy import of the GCE wing, or of the job API, is caught;
    so is a format that imports the core or a job."""
    fake = tmp_path / "fleet"
    (fake / "core").mkdir(parents=True)
    module = fake / "core" / "x.py"
    module.write_text(
        "def f():\n    from fleet.gce import compute\n    import fleet.cli.render\n"
        "from fleet.job import Job\nfrom fleet import job\nimport fleet_jobs\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "FLEET", fake)
    assert sorted(crossings(module)) == [
        "fleet/core/x.py:2 imports fleet.gce",
        "fleet/core/x.py:3 imports fleet.cli.render",
        "fleet/core/x.py:4 imports fleet.job",
        "fleet/core/x.py:5 imports fleet.job",
        "fleet/core/x.py:6 imports fleet_jobs",
    ]
    formats = fake / "formats" / "x.py"
    formats.parent.mkdir()
    formats.write_text(
        "from fleet.core.store import Store\nimport fleet.formats.tfrecord\nfrom fleet_jobs.text.tokenizers import native\n"
    )
    assert crossings(formats) == [
        "fleet/formats/x.py:1 imports fleet.core.store",
        "fleet/formats/x.py:3 imports fleet_jobs.text.tokenizers",
    ]
    discovery = fake / "core" / "discovery.py"
    discovery.write_text("import fleet_jobs\nimport fleet_jobs.bert\n")
    assert crossings(discovery) == ["fleet/core/discovery.py:2 imports fleet_jobs.bert"]


# -- no import circles ---------------------------------------------------------------------------


def module_files(root: Path) -> dict[str, Path]:
    """Every module of PACKAGES under ``root``, by dotted name (a package by its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which of the modules each module imports, at top level or inside a function (relative
    imports resolved); ``from package import name`` counts the module ``package.name`` if there
    is one, else the package. What lies outside PACKAGES is left out."""
    modules = module_files(root)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # fleet.core.store.Store -> fleet.core.store
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], circle: list[str]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(circle)))}" for m in circle)


def test_no_import_goes_round_in_a_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and "fleet.core.run" in graph and "fleet_jobs.text.job" in graph
    found = circles(graph)
    assert not found, f"{len(found)} import circle(s): " + " | ".join(describe(graph, c) for c in found)


def test_the_circle_check_sees_lazy_relative_and_long_circles(tmp_path):
    """The check itself: a circle closed by an import inside a function, one of relative imports,
    one through three modules, and a package and its own module; a line of imports is none."""
    files = {
        "fleet/__init__.py": "",
        "fleet/a.py": "from fleet import b\n",
        "fleet/b.py": "def f():\n    from fleet.a import x\n",
        "fleet/p/__init__.py": "from .q import y\n",
        "fleet/p/q.py": "from . import r\n",
        "fleet/p/r.py": "from fleet.p import s\n",
        "fleet/p/s.py": "import fleet.p.q\n",
        "fleet/store/__init__.py": "from fleet.store.local import L\n",
        "fleet/store/local.py": "from fleet.store import Store\n",
        "fleet_jobs/__init__.py": "",
        "fleet_jobs/j.py": "from fleet.a import x\nimport fleet_jobs.k\n",
        "fleet_jobs/k.py": "import numpy\nfrom fleet.store import local\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["fleet_jobs.k"] == {"fleet.store.local"}
    assert sorted(circles(graph)) == [
        ["fleet.a", "fleet.b"],
        ["fleet.p.q", "fleet.p.r", "fleet.p.s"],
        ["fleet.store", "fleet.store.local"],
    ]

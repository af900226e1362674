"""The wings of fleet/ stay apart.

The core imports neither the GCE wing nor the CLI nor the job API (``fleet.job``: the facade a
job imports, above the core, re-exporting what the core defines), the GCE wing does not import
the CLI, nothing in fleet/ imports ``fleet.job``, and nothing in fleet/ imports a job (jobs are
found by discovery only: ``fleet.core.discovery`` lists the jobs package, never names a job in it).

Checked on the source (every import statement, inside functions too), so a lazy import inside
a function cannot cross a wing unseen."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parent.parent / "fleet"

# What each part of fleet/ may not import. fleet/__init__ belongs with the core; fleet/job.py is the facade.
FORBIDDEN = {
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
    assert {p.name for p in FLEET.iterdir() if (p / "__init__.py").is_file()} >= {"core", "gce", "cli"}


@pytest.mark.parametrize("path", sorted(FLEET.rglob("*.py")), ids=lambda p: str(p.relative_to(FLEET)))
def test_no_module_crosses_a_wing(path):
    assert crossings(path) == []


def test_the_rule_catches_a_crossing(tmp_path, monkeypatch):
    """The check itself: a core module with a lazy import of the GCE wing, or of the job API, is caught."""
    fake = tmp_path / "fleet"
    (fake / "core").mkdir(parents=True)
    module = fake / "core" / "x.py"
    module.write_text("def f():\n    from fleet.gce import compute\n    import fleet.cli.render\n"
                      "from fleet.job import Job\nfrom fleet import job\nimport fleet_jobs\n")
    monkeypatch.setattr(sys.modules[__name__], "FLEET", fake)
    assert sorted(crossings(module)) == ["fleet/core/x.py:2 imports fleet.gce", "fleet/core/x.py:3 imports fleet.cli.render",
                                 "fleet/core/x.py:4 imports fleet.job", "fleet/core/x.py:5 imports fleet.job",
                                 "fleet/core/x.py:6 imports fleet_jobs"]
    discovery = fake / "core" / "discovery.py"
    discovery.write_text("import fleet_jobs\nimport fleet_jobs.bert\n")
    assert crossings(discovery) == ["fleet/core/discovery.py:2 imports fleet_jobs.bert"]


"""Jobs import nothing of the fleet but its job API and the record formats (docs/layout.md; issue 22).

A job is written against ``fleet.job`` alone (and the shared text layer ``fleet_jobs/text``, and
``fleet.formats``: the bytes of each record format, which import nothing of the fleet),
so the fleet's internals can change without breaking a job, and a job's reader needs no
fleet internals: ``fleet.core.follow`` reads any job's examples from ``Job.features``.
Every import in every module under fleet_jobs/ is checked, top level or inside a function.
"""

from __future__ import annotations

import ast
import os

from tests.helpers.procs import ROOT

ALLOWED = {"fleet.job", "fleet.formats"}  # each with what is under it


def allowed(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in ALLOWED)


def fleet_imports(path: str) -> list[str]:
    """``line: module`` of each import of a fleet module other than the job API."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from fleet import store` imports fleet.store: name each imported module
            modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "fleet" else [node.module]
        else:
            continue
        for module in modules:
            if (module == "fleet" or module.startswith("fleet.")) and not allowed(module):
                found.append(f"{node.lineno}: {module}")
    return found


def job_modules() -> list[str]:
    root = os.path.join(ROOT, "fleet_jobs")
    return sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names if name.endswith(".py")
    )


def test_job_modules_import_only_the_job_api_of_the_fleet():
    modules = job_modules()
    assert len(modules) > 20 and any(m.endswith(os.path.join("causal_lm", "job.py")) for m in modules)
    breaking = {os.path.relpath(m, ROOT): found for m in modules if (found := fleet_imports(m))}
    listed = "; ".join(f"{module} ({', '.join(found)})" for module, found in sorted(breaking.items()))
    assert not breaking, (
        f"{len(breaking)} module(s) under fleet_jobs/ import fleet internals; a job may import only "
        f"{', '.join(sorted(ALLOWED))} from the fleet: {listed}"
    )


def test_the_check_sees_every_form_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import fleet.core.store\nfrom fleet import job, run\nfrom fleet.job import Job\n"
        "def f():\n    from fleet.inputs.parquet import StoreFile\n    import fleet\n"
        "from . import fleet\nfrom fleet_jobs.text import output\nfrom fleet.formats import tfrecord\n"
        "import fleet.formats.tfrecord.wire\nfrom fleet import formats\nimport fleet.formatsx\n"
    )
    assert fleet_imports(str(source)) == [
        "1: fleet.core.store",
        "2: fleet.run",
        "12: fleet.formatsx",  # (top level first)
        "5: fleet.inputs.parquet",
        "6: fleet",
    ]

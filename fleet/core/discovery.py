"""Finding jobs: ``load_job(name)`` from a ``fleet.jobs`` entry point, an out-of-tree
``package.module:ATTR``, or a package ``fleet_jobs.<name>`` that defines ``JOB``; and
``available_jobs()``, what ``fleet jobs`` lists.

The fleet never names a job: it scans the jobs package and imports what it finds. This is the
one module of fleet/ that imports the package ``fleet_jobs`` (to list its folders, never a job
in it); the planner, the worker and the readers load a run's job through it.
"""

from __future__ import annotations

import importlib
import os
import sys

from fleet.core.errors import JobNotFound
from fleet.core.job import Job


def available_jobs() -> list[str]:
    """Jobs by discovery: the packages under fleet_jobs/ that define JOB (a shared library there,
    which defines none, is not a job), and ``fleet.jobs`` entry points."""
    import fleet_jobs as _jobs_pkg  # the jobs package is found by discovery, not by name

    names = []
    for path in _jobs_pkg.__path__:
        for entry in sorted(os.listdir(path)):
            init = os.path.join(path, entry, "__init__.py")
            if os.path.isfile(init) and not entry.startswith(("_", ".")) and _defines_job(init):
                names.append(entry)
    try:
        from importlib.metadata import entry_points

        names += [ep.name for ep in entry_points(group="fleet.jobs")]
    except Exception:
        pass
    return sorted(set(names))


def _defines_job(init: str) -> bool:
    """Whether a package's ``__init__.py`` binds the name ``JOB`` at top level (an assignment or
    an import), read without importing it: a word in a docstring or comment does not count."""
    import ast

    try:
        with open(init, encoding="utf-8") as f:
            tree = ast.parse(f.read(), init)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "JOB" for t in targets):
                return True
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "JOB" for a in node.names):
            return True
    return False


def _may_declare_entry_points(group: str) -> bool:
    """Whether an installed distribution may declare entry points in ``group``: a look for the
    group's name in each ``entry_points.txt`` on sys.path (1 ms), where importlib.metadata costs
    0.04 s of CPU in every process that loads a job (its import, then every distribution's
    metadata read and parsed). Where it cannot tell (a zip or an egg file on sys.path, a finder
    of distributions other than the path's), it says yes and importlib.metadata decides."""
    from importlib.machinery import PathFinder

    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return True
    needle = group.encode()
    for entry in sys.path:
        root = entry or "."
        try:
            names = os.listdir(root)
        except NotADirectoryError:
            return True
        except OSError:  # gone, or not a folder that can be listed: importlib.metadata finds nothing there
            continue
        egg = root.lower().endswith(".egg")
        for child in names:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")) or (egg and low == "egg-info"):
                try:
                    with open(os.path.join(root, child, "entry_points.txt"), "rb") as f:
                        if needle in f.read():
                            return True
                except OSError:  # none (or a PKG-INFO file): no entry points
                    continue
    return False


def load_job(name: str) -> Job:
    """Discovery: a ``fleet.jobs`` entry point, else the module ``fleet_jobs.<name>``."""
    if _may_declare_entry_points("fleet.jobs"):
        from importlib.metadata import entry_points

        for ep in entry_points(group="fleet.jobs"):
            if ep.name == name:
                return ep.load()
    if ":" in name:  # an out-of-tree job: "package.module:ATTR"
        module_name, _, attr = name.partition(":")
        if not (all(part.isidentifier() for part in module_name.split(".")) and attr.isidentifier()):
            raise JobNotFound(f"job {name!r}: expected package.module:NAME (an out-of-tree job) or the name of "
                              "a job under fleet_jobs/ (`fleet jobs` lists them)")
        try:
            job = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise JobNotFound(f"job {name!r}: {e}") from None
        if not isinstance(job, Job):
            raise JobNotFound(f"job {name!r} is not a fleet.job.Job")
        return job
    if not name.isidentifier():
        raise JobNotFound(f"unknown job {name!r} (available: {', '.join(available_jobs()) or 'none'})")
    try:
        module = importlib.import_module(f"fleet_jobs.{name}")
    except ModuleNotFoundError as e:
        if e.name in (f"fleet_jobs.{name}", "fleet_jobs"):
            known = ", ".join(available_jobs()) or "none"
            raise JobNotFound(f"unknown job {name!r} (available: {known})") from None
        raise
    job = getattr(module, "JOB", None)
    if not isinstance(job, Job):
        raise JobNotFound(f"fleet_jobs.{name} does not define JOB, a fleet.job.Job")
    return job

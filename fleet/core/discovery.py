"""Finding jobs: ``load_job(name)`` from a ``fleet.jobs`` entry point, an out-of-tree
``package.module:ATTR``, or a package ``fleet_jobs.<name>`` that defines ``JOB``; and
``available_jobs()``, what ``fleet jobs`` lists.

The fleet never names a job: it scans the jobs package and imports what it finds. This is the
one module of fleet/ that imports the package ``fleet_jobs`` (to list its folders, never a job
in it); the planner, the worker and the readers load a run's job through it.

A job's name and options as a run or a command gives them pass ``resolve_job`` first: a former
name (``FORMER_NAMES``, data, the one place a job is named here) is read as what it became, so a
run planned under it (its run.json) resumes and reads, and a command that gives it still plans.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from fleet.core.errors import ConfigError, JobNotFound
from fleet.core.job import Job


@dataclass(frozen=True)
class FormerName:
    """A job name with one setting, as runs were planned before that setting's value became a job
    of its own (or became the only one the job has): read as ``becomes`` with the setting dropped.
    ``retired``: options the job wrote into every run's run.json then (each at the value it held
    there), which ``becomes`` no longer has; dropped at that value, refused at any other."""

    job: str
    setting: str
    value: str
    becomes: str
    retired: Mapping[str, Any] = field(default_factory=dict)


# Issue 31: electra_zh_en held the bert job as format=bert until the bert job got its own name, and
# wrote format and the bert job's options into every run.json (format=electra runs too, at their
# defaults). Runs planned so, and commands written so, keep working; electra_zh_en holds ELECTRA
# alone. (A value of the setting not listed is refused, naming the ones that are.)
FORMER_NAMES = (
    FormerName(
        "electra_zh_en",
        "format",
        "electra",
        becomes="electra_zh_en",
        retired={
            "masked_lm_prob": 0.15,
            "max_predictions_per_seq": 20,
            "short_seq_prob": 0.1,
            "dupe_factor": 1,
            "whole_word_masking": True,
            "v2_feature_names": False,
        },
    ),
    FormerName("electra_zh_en", "format", "bert", becomes="bert", retired={"provenance": False}),
)


@dataclass(frozen=True)
class JobChoice:
    """The job to load and the settings (``--set`` strings or a run.json's config) to parse."""

    job: str
    settings: dict[str, Any]


def resolve_job(name: str, settings: Mapping[str, Any]) -> JobChoice:
    """What a run or a command that names job ``name`` with ``settings`` means now (FORMER_NAMES):
    every path that loads a job for a run (plan, the workers, status, the readers) goes through
    here, the run's spec read by ``fleet.core.run`` and a plan's ``--job``/``--set``."""
    rows = [row for row in FORMER_NAMES if row.job == name and row.setting in settings]
    if not rows:
        return JobChoice(name, dict(settings))
    setting, value = rows[0].setting, settings[rows[0].setting]
    row = next((r for r in rows if r.value == value), None)
    if row is None:
        moved = "".join(
            f"; {setting}={r.value} is the job {r.becomes}: --job {r.becomes}" for r in rows if r.becomes != name
        )
        raise ConfigError(
            f"option {setting}: {value!r} is not supported (known: {', '.join(r.value for r in rows)}{moved})"
        )
    kept = {}
    for key, given in settings.items():
        if key == setting:
            continue
        if key in row.retired:
            if _same_value(given, row.retired[key]):
                continue
            raise ConfigError(f"option {key}: not with {setting}={value} (job {row.becomes} has no option {key})")
        kept[key] = given
    return JobChoice(row.becomes, kept)


def _same_value(given: Any, retired: Any) -> bool:
    """A retired option's value as a run.json holds it (typed) or as ``--set`` gives it (a string)."""
    if isinstance(given, str) and not isinstance(retired, str):
        text = given.strip().lower()
        if isinstance(retired, bool):
            return text in (("1", "true", "yes", "on") if retired else ("0", "false", "no", "off"))
        try:
            return float(text) == retired
        except ValueError:
            return False
    return given == retired and type(given) is type(retired)


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
            raise JobNotFound(
                f"job {name!r}: expected package.module:NAME (an out-of-tree job) or the name of "
                "a job under fleet_jobs/ (`fleet jobs` lists them)"
            )
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


def load_configured(name: str, settings: Mapping[str, Any]) -> tuple[Job, Any]:
    """(the job, its config) for a job name and settings as a run or a command gives them
    (``resolve_job``: a former name as the job it became)."""
    chosen = resolve_job(name, settings)
    job = load_job(chosen.job)
    return job, job.parse_config(chosen.settings)

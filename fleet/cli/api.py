"""fleet as a library (``fleet.local``, ``fleet.PlanError``...): :func:`local` runs a job on this machine as `fleet local` does and returns
what it did, and the command is a thin layer over it (its arguments, checked here, then a console).

    import fleet

    run = fleet.local("corpus/", "out/", options={"vocab_file": "vocab.txt"}, workers=2)
    run.ok, run.summary["examples"], run.outputs[:2]

It prints nothing unless asked (``progress=True``: the bar on a terminal or a line every 30 s, the
summary table and the report, on stderr, as the command prints them), and raises instead of
exiting, with the command's one-line messages (they name an argument as the command line spells
it: ``--item-mb 0: give 0.001 to 1e+06 MB``):

- ``PlanError``: an argument out of range, inputs that are not there, a run that cannot be
  resumed in ``output``;
- ``ConfigError`` (a job option), ``JobNotFound``, ``InputError``, ``StoreError``;
- ``Interrupted``: Ctrl-C or SIGTERM; the workers gave their items back, and the same call resumes.

A run that ends with failed items is no exception: its failures are the data's (``run.ok`` is
False, ``run.status.failures`` says which and why), as the command's exit code 1 says.

Why not ``plan``/``launch``/``status`` here too: a fleet on Compute Engine is driven from a
terminal or a script around the command (it runs for hours, and each step is one command a person
reads); ``fleet.core.status.StatusReader`` and ``fleet.core.follow.follow_examples`` are the
library's readers of a run, wherever it runs.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from fleet.cli.local import Interrupted
from fleet.core.run import PlanError
from fleet.gce.config import PROCS_PER_CORE

__all__ = ["local", "LocalRun", "Interrupted", "PlanError"]

if TYPE_CHECKING:
    from fleet.core.stage import StageOptions
    from fleet.core.status import RunStatus

ITEM_MB = (0.001, 1e6)  # 1 kB to 1 TB of input per item
LEASE_TTL = (1.0, 86400.0)  # seconds: a lease is renewed every TTL/3, so a day is already generous
MAX_ATTEMPTS = (1, 100)
SHARDS = (1, 100_000)
SHUFFLE_MB = (1.0, 1e5)


@dataclass(frozen=True)
class LocalRun:
    """What :func:`local` did: the run's counts (``status``), the summary it wrote
    (``OUT/summary.json``), and the command's exit code (0: every item done, 1: some failed
    or did not run)."""

    output: str
    status: RunStatus
    summary: dict
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def outputs(self) -> list[str]:
        """The run's output files (``part-*``), in order."""
        return sorted(glob.glob(os.path.join(self.output, "part-*")))


def local(
    inputs: str | Sequence[str],
    output: str,
    *,
    job: str = "electra_zh_en",
    options: Mapping[str, Any] | None = None,
    workers: int = 0,
    item_mb: float | None = None,
    lease_ttl: float = 60.0,
    max_attempts: int = 3,
    retry_failed: bool = False,
    shards: int | None = None,
    dedup: str | None = None,
    shuffle_mb: float = 256.0,
    text_column: str = "text",
    keep_titles: bool = False,
    max_bad_share: float = 0.5,
    progress: bool | Any = False,
) -> LocalRun:
    """Run ``job`` over ``inputs`` (files or folders) into the folder ``output``, on ``workers``
    processes here (0: one per core), as `fleet local INPUT... OUTPUT` with the same options
    does; a second call on the same ``output`` resumes. ``options``: the job's (``--set``;
    values are given as the command line would, ``str(value)``). ``progress``: True prints
    what the command prints to stderr; a ``rich.console.Console`` prints it there."""
    from rich.console import Console

    from fleet.cli.local import run_local

    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not paths:
        raise PlanError("give at least one input file or folder")
    processes("--workers", workers)
    plan_numbers(item_mb, lease_ttl, max_attempts)
    check_inputs([os.fspath(p) for p in paths])
    stages = stage_options(shards, dedup, shuffle_mb)
    if isinstance(progress, Console):
        console = progress
    else:
        console = Console(stderr=True, markup=False, quiet=not progress)
    result = run_local(
        [os.fspath(p) for p in paths],
        os.fspath(output),
        job,
        workers or os.cpu_count() or 1,
        {str(k): _setting(v) for k, v in (options or {}).items()},
        lease_ttl=lease_ttl,
        max_attempts=max_attempts,
        item_bytes=int(item_mb * 1e6) if item_mb else None,
        console=console,
        retry_failed=retry_failed,
        read={"text_column": text_column, "keep_titles": keep_titles, "max_bad_share": max_bad_share},
        stage_options=stages,
        shuffle_budget=int(shuffle_mb * 1e6),
    )
    return LocalRun(os.path.abspath(os.fspath(output)), result.status, result.summary, result.exit_code)


def _setting(value: Any) -> str:
    """An option's value as ``--set`` spells it: a bool as true/false, the rest as str()."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# -- the arguments' checks, shared with the command line (fleet.cli.commands) ----------------


def shown(value: float) -> str:
    """A number as given, short: an int of 400 digits does not even convert to a float."""
    text = str(value) if isinstance(value, int) else f"{value:g}"
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def within(option: str, value: float, bounds: tuple[float, float], note: str = "") -> None:
    """Anything outside (inf, NaN, a typo's extra zeros) is refused up front in one line naming
    the range, before it can overflow a conversion or a timer."""
    low, high = bounds
    if not low <= value <= high:  # NaN and inf too
        raise PlanError(f"{option} {shown(value)}: give {low:g} to {high:g}{note}")


def at_least(option: str, value: float, low: float) -> None:
    if not value >= low:  # NaN too
        raise PlanError(f"{option} {shown(value)}: give {low:g} or more")


def max_procs() -> int:
    return PROCS_PER_CORE * (os.cpu_count() or 1)


def processes(option: str, value: int) -> None:
    """A worker process count: 0 (one per core) up to PROCS_PER_CORE per core."""
    within(
        option,
        value,
        (0, max_procs()),
        f" (0 = one per core; at most {PROCS_PER_CORE} per core, {os.cpu_count() or 1} cores here)",
    )


def check_inputs(inputs: list[str], option: str = "INPUT") -> None:
    """An empty input (or file:// with no path) would name the current folder and read all of it."""
    for inp in inputs:
        if not inp.strip() or inp.strip().lower() in ("file:", "file://", "file:///"):
            raise PlanError(f"{option} {inp!r}: empty; give an input file or folder")


def plan_numbers(item_mb: float | None, lease_ttl: float, max_attempts: int) -> None:
    if item_mb is not None:
        within("--item-mb", item_mb, ITEM_MB, " MB")
    within("--lease-ttl", lease_ttl, LEASE_TTL, " seconds")
    within("--max-attempts", max_attempts, MAX_ATTEMPTS)


def stage_options(shards: int | None, dedup: str | None, shuffle_mb: float) -> StageOptions:
    """--shards and --dedup as given: a number of files >= 1, a mode named (the job checks which)."""
    from fleet.core.stage import StageOptions

    if shards is not None:
        within("--shards", shards, SHARDS, " output files")
    if dedup is not None and not dedup.strip():
        raise PlanError("--dedup '': give a mode (exact, near or exact,near)")
    within("--shuffle-mb", shuffle_mb, SHUFFLE_MB, " MB")
    return StageOptions(shards or 0, (dedup or "").strip())

"""`fleet local`: plan and work on this machine, through a local-folder bucket.

It is the same plan, lease protocol and worker code a VM runs; only the
bucket is a folder (OUT_DIR/.fleet) and the workers are local processes.
Running it again on the same OUT_DIR resumes: done items stay done.

What only some runs need is imported where they need it, not with the module: the live bar
(``rich.progress``, on a terminal only) and the repair of a resumed run (``fleet.core.repair``
and ``fleet.core.verify``). A first run into a file or a pipe does not load them, and every
`fleet` command, which imports this module, starts without them (tests/test_start_cost.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from urllib.parse import unquote, urlsplit
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet.core.progress import ProgressLines, every_from_env
from fleet.core.codesync import code_version
from fleet.gce.config import DEFAULT_CODE_PATHS
from fleet.core.discovery import load_configured
from fleet.core.job import Job
from fleet.core.stage import StageOptions
from fleet.cli.render import (
    print_counts,
    print_detail,
    print_failed_files,
    print_input_files,
    printable,
    print_skipped,
    say,
    stage_counts,
)
from fleet.core.run import PlanError, PlanRequest, load_spec, plan
from fleet.core.layout import LOCAL_RUN, STATE_DIR, SUMMARY, spec_name
from fleet.core.processes import start_workers, stop_workers, wait_for_exit
from fleet.core.status import RunStatus, StatusReader
from fleet.core.manifest import finish_run, finishing_name
from fleet.core.window_counts import run_counts
from fleet.core.store import StoreError, open_store

RUN = LOCAL_RUN


def auto_item_bytes(total: int) -> int:
    """Items of 1/16 of the corpus, from 256 KiB to 64 MiB: enough items for a few workers to
    share, few enough to keep retries cheap. The size depends on the corpus only, never on the
    number of workers, since items are what the records are seeded by: a rerun with other
    --workers writes the same records."""
    return int(min(64 << 20, max(256 << 10, total // 16)))


@dataclass
class LocalResult:
    status: RunStatus
    summary: dict
    exit_code: int


class Interrupted(Exception):
    """Ctrl-C: the workers gave their items back; the message says how to resume."""


def summarize(st: RunStatus, job: Job, wall: float, workers: int, bytes_before: int = 0) -> dict:
    """The run's figures (docs/outputs.md, "Every figure of the summary"). ``bytes_before``: the
    input bytes already done when this call started its workers (a resumed run), which its
    ``wall`` did not convert: ``mb_per_s`` is over what this call converted."""
    totals = st.totals
    busy = totals.get("seconds", 0.0)
    mb = st.bytes_done / 1e6
    converted = max(0, st.bytes_done - bytes_before) / 1e6
    summary = {
        "run": st.run,
        "job": st.job,
        "items": st.items,
        "done": st.done,
        "failed": st.failed,
        **({"stages": stage_counts(st), "blocked": st.blocked} if st.stages else {}),
        "input_mb": round(mb, 3),
        "wall_seconds": round(wall, 2),
        "workers": workers,
        "mb_per_s": round(converted / wall, 3) if wall > 0 else 0.0,
        "mb_per_s_per_worker": round(mb / busy, 3) if busy > 0 else 0.0,
        **{k: v for k, v in sorted(totals.items()) if k not in ("seconds", "input_bytes")},
        **job.summarize(totals),
        "outputs": sorted(st.outputs),
        "sources": st.sources,  # exact counts per input file (fleet.core.manifest)
        "output_counts": st.output_counts,  # exact counts per output, by name
        "failures": st.failures,
        "failed_files": st.failed_files,  # files a grouped item could not read; the rest of its files are converted
        "skipped": st.bad_records,
        # Every file found under the inputs: read, or skipped by reason (fleet.core.accounting).
        "input_files": st.input_files,
    }
    if st.failed:
        summary["hint"] = "failed items stay failed when the run resumes; run again with --retry-failed to retry them"
    elif st.failed_files:
        summary["hint"] = (
            "an input file that failed is left out of a finished run: fix or remove it and plan a new "
            "run (another OUT_DIR) to convert it"
        )
    return summary


def print_summary(console: Console, summary: dict, out_dir: str) -> None:
    table = Table(title=f"fleet local: {summary['done']}/{summary['items']} items done", show_header=False)
    for key, value in summary.items():
        if key in (
            "outputs",
            "failures",
            "failed_files",
            "run",
            "hint",
            "skipped",
            "sources",
            "output_counts",
            "input_files",
        ):
            continue
        table.add_row(
            key,
            Text(
                f"{value:,.3f}"
                if isinstance(value, float)
                else f"{value:,}"
                if isinstance(value, int)
                else printable(str(value))
            ),
        )  # a job name or a path, as it is
    table.add_row("outputs", Text(printable(f"{len(summary['outputs'])} files in {out_dir}")))
    console.print(table)
    print_input_files(console, summary.get("input_files") or {})
    print_counts(console, summary.get("sources") or {}, summary.get("output_counts") or {})
    for f in summary["failures"]:
        say(console, f"item {f['item']} ({f['source']}): {f['error']}", "failed", "red")
        print_detail(console, f.get("detail") or {})
    print_failed_files(console, summary.get("failed_files") or [], int(summary.get("files_failed", 0)))
    print_skipped(console, summary["skipped"], int(summary.get("bad_records", 0)))
    if "dedup_documents_kept" in summary:
        dropped, kept = int(summary.get("dedup_documents_dropped", 0)), int(summary["dedup_documents_kept"])
        say(
            console,
            f"dedup: {dropped:,} of {dropped + kept:,} documents dropped as exact copies of earlier ones "
            f"({summary.get('dedup_bytes_dropped', 0) / 1e6:,.2f} MB of text)",
        )
    if "near_documents_kept" in summary:
        say(console, near_line(summary))
    if summary.get("hint"):
        say(console, summary["hint"])


def near_line(summary: dict) -> str:
    """The summary's line for ``--dedup near``: what was dropped, and the clusters."""
    near, exact = int(summary.get("near_documents_dropped", 0)), int(summary.get("dedup_documents_dropped", 0))
    total = near + exact + int(summary["near_documents_kept"])
    mb = (summary.get("near_bytes_dropped", 0) + summary.get("dedup_bytes_dropped", 0)) / 1e6
    exact_part = f" ({exact:,} exact copies)" if exact else ""
    return (
        f"dedup near: {near + exact:,} of {total:,} documents dropped as near copies of earlier ones{exact_part}, "
        f"{mb:,.2f} MB of text; {int(summary.get('near_clusters', 0)):,} clusters, the largest of "
        f"{int(summary.get('near_cluster_size_max', 0)):,} documents"
    )


def write_run_files(console: Console, job, spec, reader: StatusReader, out_dir: str) -> None:
    """A finished run's manifest.json and the job's run files (fleet.core.manifest), if its
    workers have not written them already; a file there with other bytes is named, not replaced."""
    try:
        _, differ = finish_run(open_store(out_dir), job, job.parse_config(spec.config), spec, run_counts(reader))
    except (OSError, StoreError, ValueError, TypeError) as e:  # the outputs are all there; say what is missing
        say(console, f"{out_dir}: the run's files (manifest.json) not written: {e}", style="yellow")
        return
    for name in differ:
        say(
            console,
            f"{os.path.join(out_dir, name)} holds other bytes than this run's counts give; left as it is "
            "(remove it and run again to rewrite it)",
            style="yellow",
        )


def print_report(console: Console, job: Job, config: dict, out_dir: str) -> None:
    """The job's own look at its outputs, if it has one; a failing report never fails the run."""
    try:
        text = job.report(out_dir, job.parse_config(config))
    except Exception as e:  # the run is done; a report is advice
        text = f"report: {type(e).__name__}: {e}"
    if text:
        say(console, text)


def local_folder(out_dir: str) -> str:
    """OUT_DIR as the local folder it names: a path or a file:// URL. `fleet local` writes its
    state, outputs and summary with plain file calls, so any other URL (gs://, s3://) would
    become a folder named after it in the current one: refused, as is an empty OUT_DIR, which
    would write into the current folder."""
    if not out_dir.strip():
        raise PlanError("OUT_DIR is empty: give the output folder (fleet local INPUT... OUT_DIR)")
    if "://" not in out_dir:
        return out_dir
    url = urlsplit(out_dir)
    path = unquote(url.path, errors="surrogateescape")
    if url.scheme.lower() == "file" and url.netloc in ("", "localhost") and path.strip("/"):
        return path
    if url.scheme.lower() == "gs":
        hint = "; to write to a bucket, `fleet plan --output gs://...` and then `fleet work` or `fleet launch`"
    else:
        hint = ""
    raise PlanError(f"OUT_DIR {out_dir}: `fleet local` writes to a local folder (a path or file:///PATH) only{hint}")


_SIGNALLED: list[int] = []  # the signals that interrupted this run (see _interrupt)


def _interrupt(signum, frame):
    """Ctrl-C or SIGTERM: recorded, then raised as KeyboardInterrupt. The record outlives the
    exception, which Python swallows when it lands inside a finalizer or a __del__ that the
    collector runs ("Exception ignored in ..."): the run then still ends as interrupted (exit 130)
    once its workers, which got the same Ctrl-C, are gone, not as a run whose workers stopped."""
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt


def _existing_spec(bucket: str):
    """The spec of the run planned in this folder before, if any: a resumed run keeps its items
    (their size) and is resumed wherever its folder is now."""
    store = open_store(bucket)
    if store.stat(spec_name(RUN)) is None:
        return None
    return load_spec(store, RUN)


def run_local(
    inputs: list[str],
    out_dir: str,
    job: str,
    workers: int,
    settings: dict[str, str],
    lease_ttl: float = 60.0,
    max_attempts: int = 3,
    item_bytes: int | None = None,
    console: Console | None = None,
    retry_failed: bool = False,
    read: Mapping[str, Any] | None = None,
    stage_options: StageOptions = StageOptions(),
    shuffle_budget: int = 256 << 20,
) -> LocalResult:
    console = console or Console(stderr=True, markup=False)
    if workers < 1:
        raise PlanError(f"--workers {workers}: give 1 or more (0 means one per core)")
    out_dir = os.path.abspath(local_folder(out_dir))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PlanError(f"{out_dir}: the output folder is an existing file; give a folder")
    bucket = os.path.join(out_dir, STATE_DIR)
    existing = _existing_spec(bucket)
    if item_bytes is None and existing is not None:
        item_bytes = existing.item_bytes or None
    planned_output = out_dir
    if existing is not None and existing.output != out_dir:
        # OUT_DIR was copied or moved since the run was planned: the run's outputs are in the folder
        # that holds its state (output_place), so it resumes here, and writes nothing where it came from.
        say(
            console,
            f"the run in {out_dir} was planned in {existing.output}: the folder was copied or moved "
            "since; resuming it here",
        )
        planned_output = existing.output
    request = PlanRequest(
        run=RUN,
        job=job,
        inputs=inputs,
        output=planned_output,
        code_version=code_version(paths=DEFAULT_CODE_PATHS),
        settings=settings,
        lease_ttl=lease_ttl,
        max_attempts=max_attempts,
        item_bytes=item_bytes if item_bytes is not None else auto_item_bytes,
        exclude=[out_dir],  # OUT_DIR may be inside an input folder: its outputs are not inputs
        again="write to another OUT_DIR, or restore what changed to resume this one",
        read=read or {},
        stage_options=stage_options,
        shuffle_budget=shuffle_budget,
    )
    chosen, config = load_configured(job, settings)  # a former name (format=bert): the job it became, as plan has it
    chosen.check_here(config)  # the workers run here: what they need must be here
    spec, items, created = plan(bucket, request)
    store = open_store(bucket)
    reader = StatusReader(store, RUN)
    st = reader.collect()
    if not created:
        from fleet.core.repair import repair_run
        from fleet.core.verify import describe_stale

        fix = repair_run(store, reader, release=True, retry_failed=retry_failed)
        if fix.damaged:
            say(
                console,
                f"{len(fix.damaged)} damaged lease object(s) ({', '.join(list(fix.damaged)[:5])}): converting those "
                "items again",
            )
        if fix.stale:  # the lease is the truth; a lone marker lies
            say(console, describe_stale(fix.stale))
        if fix.freed:
            say(console, f"{fix.freed} item(s) held by workers of an earlier run that died are given back")
        if fix.lost:
            for d in fix.lost[:10]:
                say(console, str(d), "output lost:", "yellow")
            say(
                console,
                f"{len({d.item for d in fix.lost})} done item(s) whose outputs are gone or changed are converted again",
            )
        if fix.retried:
            say(console, f"retrying {len(fix.retried)} failed item(s) (--retry-failed)")
        st = reader.collect()
        say(
            console,
            f"resuming the run in {out_dir}: {st.done} of {st.items} items already done"
            + (f", {st.failed} failed (--retry-failed retries them)" if st.failed else ""),
        )
    left = st.items - st.done - st.failed
    if 0 < left < workers:  # the others would only start, find nothing to claim and leave
        say(
            console,
            f"{left} item{'s' if left != 1 else ''} to convert: {left} worker{'s' if left != 1 else ''} "
            f"instead of {workers}",
        )
        workers = left
    t0, bytes_before = time.time(), st.bytes_done
    children = []
    interrupted = False
    _SIGNALLED.clear()
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, _interrupt)  # SIGTERM: as Ctrl-C
    try:
        if not st.finished:
            # Forked where this process may: its bucket is a folder, no client state to share.
            logs = os.path.join(bucket, "logs")
            children = start_workers(bucket, RUN, workers, log_dir=logs, prefix="local", fork=True)
        with _progress(console, spec.input_bytes, st.bytes_done) as show:
            while True:
                st = reader.collect()
                show(st, any(c.is_alive() for c in children))
                if st.finished or not any(c.is_alive() for c in children):
                    break
                # A worker that ends (the last one out: the run is drained) wakes this at once.
                wait_for_exit(children, timeout=0.3)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        try:
            stop_workers(children)  # SIGTERM: each gives its item back
        except KeyboardInterrupt:  # a second Ctrl-C: stop at once
            stop_workers(children, timeout=0)
            interrupted = True
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    if interrupted or _SIGNALLED:
        st = reader.collect()
        raise Interrupted(
            f"interrupted: {st.done} of {st.items} items done, the others given back; "
            "run the same command again to resume"
        )
    st = reader.collect()
    refused = [f["error"] for f in st.failures if (f.get("detail") or {}).get("option")]
    if refused:  # an option the data cannot satisfy (--shards above the examples): a user error, nothing kept
        if created:
            shutil.rmtree(bucket, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)  # only if this left it empty
        raise PlanError(refused[0])
    wall = time.time() - t0
    summary = summarize(st, chosen, wall, workers, bytes_before)
    path = os.path.join(out_dir, SUMMARY)
    try:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    except OSError as e:  # the table below still says it all
        say(console, f"{path}: not written ({e.strerror})", style="yellow")
    if st.done == st.items:
        write_run_files(console, chosen, spec, reader, out_dir)
    else:  # a worker stopped while claiming the run's files leaves no claim to wait out after a retry
        store.delete(finishing_name(RUN))
    print_summary(console, summary, out_dir)
    print_report(console, chosen, spec.config, out_dir)
    if st.blocked:
        say(console, f"{st.blocked} item(s) of later stages did not run: a stage before them failed", style="red")
    if not st.finished:
        reasons = stopped_reasons(os.path.join(bucket, "logs"))
        say(
            console,
            f"workers stopped with {st.items - st.done - st.failed} items unfinished"
            + (f": {reasons[0]}" if reasons else "")
            + f"; see their logs in {os.path.join(bucket, 'logs')}",
            style="red",
        )
        return LocalResult(st, summary, 1)
    return LocalResult(st, summary, 1 if st.failed or st.failed_files else 0)


@contextlib.contextmanager
def _progress(console: Console, total: int, done: int) -> Iterator[Callable[[RunStatus, bool], None]]:
    """``show(status, live)`` for the run's loop: on a terminal the live bar, which goes when the run
    ends (the summary table says where it ended, and a refusal stays one line); to a file, a
    plain line at a steady interval (fleet.cli.progress)."""
    if not console.is_terminal:
        lines = ProgressLines(total, time.monotonic(), done, every_from_env())

        def log(st: RunStatus, live: bool) -> None:
            text = lines.line(_progress_line(st), st.bytes_done, time.monotonic(), live)
            if text:
                say(console, text)

        yield log
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=total, completed=done)
        yield lambda st, live: bar.update(task, completed=st.bytes_done, description=_progress_line(st))


def _progress_line(st: RunStatus) -> str:
    """Items done, by stage in a run with stages: the bar's bytes count only the map's input."""
    failed = f" ({st.failed} failed)" if st.failed else ""
    if not st.stages:
        return f"items {st.done}/{st.items}{failed}"
    return stage_counts(st) + failed


def stopped_reasons(log_dir: str) -> list[str]:
    """The one-line reasons workers gave for stopping early (a full disk, a changed vocab)."""
    reasons: list[str] = []
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return reasons
    for name in names:
        try:
            with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    for marker in (" ERROR cannot start: ", " ERROR stopped: "):
                        if marker in line:
                            reason = line.split(marker, 1)[1].strip()
                            if reason not in reasons:
                                reasons.append(reason)
        except OSError:
            continue
    return reasons

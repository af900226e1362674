"""`fleet local`: plan and work on this machine, through a local-folder bucket.

It is the same plan, lease protocol and worker code a VM runs; only the
bucket is a folder (OUT_DIR/.fleet) and the workers are local processes.
Running it again on the same OUT_DIR resumes: done items stay done.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from fleet.codesync import code_version
from fleet.inputs import find_inputs
from fleet.job import load_job
from fleet.run import plan
from fleet.spawner import start_workers, stop_workers
from fleet.status import RunStatus, StatusReader
from fleet.store import open_store

STATE_DIR = ".fleet"
RUN = "local"


def auto_item_bytes(total: int, workers: int) -> int:
    """Several items per worker for balance; at most 64 MiB so a retry costs little."""
    return int(min(64 << 20, max(256 << 10, total // max(1, workers * 4))))


@dataclass
class LocalResult:
    status: RunStatus
    summary: dict
    exit_code: int


def summarize(st: RunStatus, job_name: str, wall: float, workers: int) -> dict:
    job = load_job(job_name)
    totals = st.totals
    busy = totals.get("seconds", 0.0)
    mb = st.bytes_done / 1e6
    summary = {
        "run": st.run,
        "job": st.job,
        "items": st.items,
        "done": st.done,
        "failed": st.failed,
        "input_mb": round(mb, 3),
        "wall_seconds": round(wall, 2),
        "workers": workers,
        "mb_per_s": round(mb / wall, 3) if wall > 0 else 0.0,
        "mb_per_s_per_worker": round(mb / busy, 3) if busy > 0 else 0.0,
        **{k: v for k, v in sorted(totals.items()) if k not in ("seconds", "input_bytes")},
        **job.summarize(totals),
        "outputs": sorted(st.outputs),
        "failures": st.failures,
    }
    return summary


def print_summary(console: Console, summary: dict, out_dir: str) -> None:
    table = Table(title=f"fleet local: {summary['done']}/{summary['items']} items done", show_header=False)
    for key, value in summary.items():
        if key in ("outputs", "failures", "run"):
            continue
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value))
    table.add_row("outputs", f"{len(summary['outputs'])} files in {out_dir}")
    console.print(table)
    for f in summary["failures"]:
        console.print(f"[red]failed[/red] item {f['item']} ({f['source']}): {f['error']}", highlight=False, soft_wrap=True)


def print_report(console: Console, job_name: str, config: dict, out_dir: str) -> None:
    """The job's own look at its outputs, if it has one; a failing report never fails the run."""
    job = load_job(job_name)
    try:
        text = job.report(out_dir, job.parse_config(config))
    except Exception as e:  # the run is done; a report is advice
        text = f"report: {type(e).__name__}: {e}"
    if text:
        console.print(text, markup=False, highlight=False, soft_wrap=True)


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
) -> LocalResult:
    console = console or Console(stderr=True)
    out_dir = os.path.abspath(out_dir)
    bucket = os.path.join(out_dir, STATE_DIR)
    if item_bytes is None:
        item_bytes = auto_item_bytes(sum(f.size for f in find_inputs(inputs)), workers)
    spec, items, created = plan(bucket, RUN, job, inputs, out_dir, settings, code_version(),
                                lease_ttl=lease_ttl, max_attempts=max_attempts, item_bytes=item_bytes)
    reader = StatusReader(open_store(bucket), RUN)
    st = reader.collect()
    if not created:
        console.print(f"resuming the run in {out_dir}: {st.done} of {st.items} items already done")
    t0 = time.time()
    children = []
    if not st.finished:
        children = start_workers(bucket, RUN, workers, log_dir=os.path.join(bucket, "logs"), prefix="local")
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("", total=spec.input_bytes, completed=st.bytes_done)
            while True:
                st = reader.collect()
                progress.update(task, completed=st.bytes_done,
                                description=f"items {st.done}/{st.items}" + (f" ({st.failed} failed)" if st.failed else ""))
                if st.finished or not any(c.is_alive() for c in children):
                    break
                time.sleep(0.3)
    finally:
        stop_workers(children)
    st = reader.collect()
    wall = time.time() - t0
    summary = summarize(st, job, wall, workers)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print_summary(console, summary, out_dir)
    print_report(console, job, spec.config, out_dir)
    if not st.finished:
        console.print(f"[red]workers stopped with {st.items - st.done - st.failed} items unfinished; "
                      f"see their logs in {os.path.join(bucket, 'logs')}[/red]")
        return LocalResult(st, summary, 1)
    return LocalResult(st, summary, 1 if st.failed else 0)

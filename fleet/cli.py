"""The `fleet` command line."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from fleet.job import ConfigError, InputError, JobNotFound
from fleet.run import PlanError, list_runs
from fleet.store import StoreError, open_store

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Corpus to BERT/ELECTRA pre-training TFRecords on a fleet of short-lived VMs.")
console = Console(stderr=True)
USER_ERRORS = (PlanError, ConfigError, InputError, JobNotFound, StoreError)


def fail(message: str, code: int = 2) -> None:
    console.print(f"[red]fleet: error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def parse_settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            fail(f"--set {pair!r}: expected key=value")
        out[key.strip()] = value
    return out


@app.command("plan")
def plan_cmd(
    bucket: str = typer.Option(..., help="gs://BUCKET or a local folder that holds the run's state"),
    run: str = typer.Option(..., help="Run name"),
    job: str = typer.Option(..., help="Job name (a folder under jobs/)"),
    input: List[str] = typer.Option(..., "--input", help="Input file or folder (repeatable)"),
    output: str = typer.Option(..., help="Where outputs go: gs://BUCKET/prefix or a local folder"),
    set_: List[str] = typer.Option([], "--set", help="Job option key=value (repeatable)"),
    lease_ttl: float = typer.Option(300.0, help="Seconds a lease lives without renewal"),
    max_attempts: int = typer.Option(3, help="Attempts per item before it is marked failed"),
    item_mb: float = typer.Option(64.0, help="Target size of a work item (MB of input)"),
) -> None:
    """Write a run's spec and work items to the bucket."""
    from fleet.codesync import code_version
    from fleet.run import plan

    try:
        spec, items, created = plan(bucket, run, job, input, output, parse_settings(set_), code_version(),
                                    lease_ttl=lease_ttl, max_attempts=max_attempts, item_bytes=int(item_mb * 1e6))
    except USER_ERRORS as e:
        fail(str(e))
    verb = "planned" if created else "already planned (unchanged)"
    console.print(f"run {run} {verb}: {len(items)} items, {spec.input_bytes / 1e6:,.1f} MB, "
                  f"job {job}, code {spec.code_version}")


@app.command("work")
def work_cmd(
    bucket: str = typer.Option(..., help="gs://BUCKET or local folder holding the run"),
    run: str = typer.Option(..., help="Run name"),
    procs: int = typer.Option(0, help="Worker processes (0 = one per core)"),
    log_dir: Optional[str] = typer.Option(None, help="Write each process's log here instead of stderr"),
) -> None:
    """Claim, convert and commit items until the run is drained (what each VM runs)."""
    from fleet.spawner import work

    try:
        code = work(bucket, run, procs or os.cpu_count() or 1, log_dir)
    except USER_ERRORS as e:
        fail(str(e))
    raise typer.Exit(code)


@app.command("local", context_settings={"allow_interspersed_args": True})
def local_cmd(
    paths: List[str] = typer.Argument(..., help="INPUT... OUT_DIR: input files or folders, then the output folder"),
    job: str = typer.Option("electra_zh_en", help="Job name"),
    workers: int = typer.Option(0, help="Worker processes (0 = one per core)"),
    set_: List[str] = typer.Option([], "--set", help="Job option key=value (repeatable)"),
    lease_ttl: float = typer.Option(60.0, help="Seconds a lease lives without renewal"),
    max_attempts: int = typer.Option(3, help="Attempts per item"),
    item_mb: Optional[float] = typer.Option(None, help="Target item size in MB (default: a few items per worker)"),
) -> None:
    """Run the whole job on this machine: plan, N workers, progress, summary."""
    from fleet.local import run_local

    if len(paths) < 2:
        fail("give at least one input and an output folder: fleet local INPUT... OUT_DIR")
    *inputs, out_dir = paths
    try:
        result = run_local(inputs, out_dir, job, workers or os.cpu_count() or 1, parse_settings(set_),
                           lease_ttl=lease_ttl, max_attempts=max_attempts,
                           item_bytes=int(item_mb * 1e6) if item_mb else None, console=console)
    except USER_ERRORS as e:
        fail(str(e))
    raise typer.Exit(result.exit_code)


def _resolve(target: Optional[str], bucket: Optional[str], run: Optional[str]) -> tuple[str, str]:
    from fleet.local import RUN, STATE_DIR

    if target and not bucket:
        local_state = os.path.join(target, STATE_DIR)
        bucket = local_state if os.path.isdir(local_state) else target
    if not bucket:
        fail("give an output folder of `fleet local`, or --bucket URL --run NAME")
    store = open_store(bucket)
    if not run:
        runs = list_runs(store)
        if len(runs) == 1:
            run = runs[0]
        elif not runs:
            fail(f"no runs in {bucket}")
        else:
            fail(f"several runs in {bucket}: {', '.join(runs)}; pick one with --run")
    return bucket, run


@app.command("status")
def status_cmd(
    target: Optional[str] = typer.Argument(None, help="An output folder of `fleet local`, or a bucket URL"),
    bucket: Optional[str] = typer.Option(None, help="gs://BUCKET or local folder"),
    run: Optional[str] = typer.Option(None, help="Run name"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON"),
    watch: bool = typer.Option(False, help="Refresh every few seconds until the run finishes"),
) -> None:
    """Counts of items pending/leased/done/failed, throughput, failures, workers."""
    from fleet.status import StatusReader

    try:
        bucket, run = _resolve(target, bucket, run)
        reader = StatusReader(open_store(bucket), run)
        while True:
            st = reader.collect(with_workers=True)
            if as_json:
                print(json.dumps(st.to_dict(), indent=1, sort_keys=True))
            else:
                render_status(st)
            if not watch or st.finished:
                break
            time.sleep(5)
    except USER_ERRORS as e:
        fail(str(e))


def render_status(st) -> None:
    out = Console()
    table = Table(title=f"run {st.run} ({st.job})", show_header=False)
    table.add_row("items", f"{st.items:,}")
    table.add_row("pending", f"{st.pending:,}")
    table.add_row("leased", f"{st.leased:,}")
    table.add_row("done", f"{st.done:,}")
    table.add_row("failed", f"{st.failed:,}")
    table.add_row("MB done", f"{st.bytes_done / 1e6:,.1f} of {st.input_bytes / 1e6:,.1f}")
    for key in ("examples", "tokens"):
        if key in st.totals:
            table.add_row(key, f"{int(st.totals[key]):,}")
    if st.first_start and st.bytes_done:
        span = (st.last_finish if st.finished else time.time()) - st.first_start
        if span > 0:
            rate = st.bytes_done / span
            table.add_row("MB/s", f"{rate / 1e6:,.2f}")
            if not st.finished and rate > 0:
                table.add_row("ETA", f"{(st.input_bytes - st.bytes_done) / rate:,.0f} s")
    live = [w for w in st.workers if w.get("state") not in ("exited", "stopped") and time.time() - w.get("updated", 0) < 120]
    table.add_row("live workers", str(len(live)))
    out.print(table)
    for f in st.failures:
        out.print(f"[red]failed[/red] item {f['item']} ({f['source']}): {f['error']}", highlight=False)
    for r in st.retrying:
        out.print(f"[yellow]retrying[/yellow] item {r['item']} after attempt {r['attempt']}: {r['error']}", highlight=False)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()

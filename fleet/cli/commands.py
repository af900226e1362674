"""The `fleet` command line."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List, NoReturn, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from fleet.cli.api import at_least, check_inputs, plan_numbers, processes, stage_options, within
from fleet.gce.config import PROCS_PER_CORE, ConfigError as FleetConfigError
from fleet.cli.render import (
    logs_text,
    plan_line,
    print_fleet,
    print_options,
    print_status,
    roles_text,
    say,
    stdout,
    sync_line,
)
from fleet.core.errors import ConfigError, InputError, JobNotFound
from fleet.core.layout import LOG_SUFFIX, launch_name, log_prefix
from fleet.core.run import PlanError, check_run_name, list_runs
from fleet.core.store import StoreError, open_store

try:  # typer 0.2x carries its own copy of click
    from typer._click import exceptions as _click_errors
except ImportError:  # older typer: click itself
    from click import exceptions as _click_errors  # type: ignore[no-redef]

UsageError = _click_errors.UsageError
NoArgsIsHelpError = getattr(_click_errors, "NoArgsIsHelpError", ())  # click 8.2+: `fleet` alone


class _Commands(TyperGroup):
    """Every command's user errors end here, said once and the same way: one line, exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as e:  # `fleet --bad-option`
            _usage(e)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as e:  # a missing option, a number that is not one, an unknown command
            _usage(e)
        except Exception as e:
            if not user_error(e):
                raise
            fail(explain(e))


def _usage(e: UsageError) -> None:
    """click's usage error, in the one line every user error gets (not its boxed help panel)."""
    if isinstance(e, NoArgsIsHelpError):  # `fleet` alone: the help, as asked
        raise e
    command = e.ctx.command.name if e.ctx is not None and e.ctx.parent is not None else ""
    where = f"fleet {command}" if command else "fleet"
    fail(f"{where}: {e.format_message()} (see `{where} --help`)")


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="A text corpus to pre-training data (BERT/ELECTRA/GPT-style records: TFRecord, Parquet, MDS, Megatron, "
    "tokens), on one machine (fleet local) or a self-deleting fleet of Spot VMs.",
)
console = Console(stderr=True, soft_wrap=True, markup=False)  # one line however long; text as it is (`[/` too)
USER_ERRORS = (PlanError, ConfigError, InputError, JobNotFound, StoreError, FleetConfigError)


def fail(message: str, code: int = 2) -> NoReturn:
    """The one line of a user error: only the prefix is styled; the message is printed as it is."""
    say(console, " ".join(str(message).splitlines()), "fleet: error:", "red")
    raise typer.Exit(code)


def explain(e: Exception) -> str:
    """One line for a user error; an OSError (a full disk, a file where a folder should be)
    names its file, as the store's own errors do."""
    if isinstance(e, OSError) and not isinstance(e, StoreError):
        where = e.filename if e.filename is not None else ""
        return f"{where}: {e.strerror or e}" if where else str(e.strerror or e)
    return str(e)


def user_error(e: BaseException) -> bool:
    """A problem the user can fix (bad input, a setting, the bucket, the disk): one line, no traceback."""
    compute = sys.modules.get("fleet.gce.compute_requests")  # imported only by the commands that talk to Compute Engine
    return isinstance(e, (*USER_ERRORS, OSError)) or (compute is not None and isinstance(e, compute.ComputeError))


# What the number options accept: anything outside (inf, NaN, a typo's extra zeros) is refused
# up front in one line naming the range, before it can overflow a conversion or a timer.
POLL = (0.05, 3600.0)  # seconds
DEAD_AFTER = (0.0, 7 * 86400.0)  # seconds `fleet follow` waits for a sign of life; 0: forever
SHARDS_HELP = (
    "Write exactly N output files of examples globally shuffled by the run's seed, their counts "
    "differing by at most one (a second stage on the same workers)"
)
DEDUP_HELP = (
    "exact: drop documents whose normalized text equals an earlier one's; near: also those "
    "MinHash LSH finds near an earlier one (options near_*); exact,near: both (stages before converting)"
)
SHUFFLE_MB_HELP = "Memory (MB) a worker's sort between stages holds before it spills to local disk"
# The options `fleet plan` and `fleet local` share, declared once.
TEXT_COLUMN = typer.Option("text", help="The text field of JSON records / column of Parquet files; several: title,text")
KEEP_TITLES = typer.Option(False, "--keep-titles", help="WikiExtractor: keep each document's title line")
MAX_BAD_SHARE = typer.Option(
    0.5, help="An item fails when more of its records than this share are bad (fewer are skipped and counted)"
)
SHARDS = typer.Option(None, help=SHARDS_HELP)
DEDUP = typer.Option(None, help=DEDUP_HELP)
SHUFFLE_MB_OPTION = typer.Option(256.0, help=SHUFFLE_MB_HELP)


def _run_name(run: Optional[str]) -> Optional[str]:
    """Every command's --run, checked as `fleet plan` does: it becomes part of object names."""
    if run is not None:
        check_run_name(run)
    return run


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
    bucket: Optional[str] = typer.Option(
        None, help="gs://BUCKET or a local folder that holds the run's state (default: fleet.toml's bucket)"
    ),
    run: str = typer.Option(..., callback=_run_name, help="Run name"),
    job: str = typer.Option(..., help="Job name (a folder under fleet_jobs/)"),
    input: List[str] = typer.Option(..., "--input", help="Input file or folder (repeatable)"),
    output: str = typer.Option(..., help="Where outputs go: gs://BUCKET/prefix or a local folder"),
    set_: List[str] = typer.Option([], "--set", help="Job option key=value (repeatable)"),
    lease_ttl: float = typer.Option(300.0, help="Seconds a lease lives without renewal (1 to 86400)"),
    max_attempts: int = typer.Option(3, help="Attempts per item before it is marked failed"),
    item_mb: float = typer.Option(64.0, help="Target size of a work item (MB of input)"),
    text_column: str = TEXT_COLUMN,
    keep_titles: bool = KEEP_TITLES,
    max_bad_share: float = MAX_BAD_SHARE,
    shards: Optional[int] = SHARDS,
    dedup: Optional[str] = DEDUP,
    shuffle_mb: float = SHUFFLE_MB_OPTION,
) -> None:
    """Write a run's spec and work items to the bucket."""
    from fleet.core.codesync import code_version
    from fleet.core.run import PlanRequest, plan

    plan_numbers(item_mb, lease_ttl, max_attempts)
    check_inputs(input, "--input")
    cfg = _config()
    bucket = _bucket(bucket, cfg)
    version = code_version(paths=code_paths(cfg))
    stages = stage_options(shards, dedup, shuffle_mb)
    request = PlanRequest(
        run=run,
        job=job,
        inputs=input,
        output=output,
        code_version=version,
        settings=parse_settings(set_),
        lease_ttl=lease_ttl,
        max_attempts=max_attempts,
        item_bytes=int(item_mb * 1e6),
        read=_read(text_column, keep_titles, max_bad_share),
        stage_options=stages,
        shuffle_budget=int(shuffle_mb * 1e6),
    )
    spec, items, created = plan(bucket, request)
    console.print(plan_line(spec, len(items), created, [len(i.parts) for i in items if i.parts]))


def _read(text_column: str, keep_titles: bool, max_bad_share: float) -> dict:
    """The read flags, passed on to the job unread: it checks them at plan time (Job.check_read)."""
    return {"text_column": text_column, "keep_titles": keep_titles, "max_bad_share": max_bad_share}


@app.command("work")
def work_cmd(
    bucket: Optional[str] = typer.Option(
        None, help="gs://BUCKET or local folder holding the run (default: fleet.toml's bucket)"
    ),
    run: str = typer.Option(..., callback=_run_name, help="Run name"),
    procs: int = typer.Option(0, help=f"Worker processes (0 = one per core; at most {PROCS_PER_CORE} per core)"),
    log_dir: Optional[str] = typer.Option(None, help="Write each process's log here instead of stderr"),
    name_prefix: Optional[str] = typer.Option(None, help="Workers are named PREFIX-w0, -w1...: a VM passes its name"),
    standby: Optional[int] = typer.Option(
        None,
        help="Leave once nothing is left to claim and this many "
        "idle workers stay on standby (default: stay until the run is drained)",
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Give failed items new attempts first (run it from one place only)"
    ),
    drained_file: Optional[str] = typer.Option(
        None,
        help="Create this file when a worker process finds the run "
        "drained, by a listing of every lease and marker (a VM's startup "
        "script then deletes the fleet without listing the run again)",
    ),
) -> None:
    """Claim, convert and commit items until the run is drained (what each VM runs)."""
    from fleet.core.processes import work

    processes("--procs", procs)
    if standby is not None:
        at_least("--standby", standby, 0)
    bucket = _bucket(bucket, _config())
    if retry_failed:
        _retry_failed(bucket, run)
    code = work(bucket, run, procs or os.cpu_count() or 1, log_dir, name_prefix, standby, drained_file)
    raise typer.Exit(code)


def _retry_failed(bucket: str, run: str) -> None:
    from fleet.core.status import StatusReader
    from fleet.core.verify import reopen

    store = open_store(bucket)
    failed = [f["item"] for f in StatusReader(store, run).collect().failures]
    reopen(store, run, failed)
    console.print(f"retrying {len(failed)} failed item(s)", highlight=False)


@app.command("local", context_settings={"allow_interspersed_args": True})
def local_cmd(
    paths: List[str] = typer.Argument(..., help="INPUT... OUT_DIR: input files or folders, then the output folder"),
    job: str = typer.Option("electra_zh_en", help="Job name"),
    workers: int = typer.Option(
        0,
        help=f"Worker processes (0 = one per core; at most {PROCS_PER_CORE} per core, and no more than the items left)",
    ),
    set_: List[str] = typer.Option([], "--set", help="Job option key=value (repeatable)"),
    lease_ttl: float = typer.Option(60.0, help="Seconds a lease lives without renewal (1 to 86400)"),
    max_attempts: int = typer.Option(3, help="Attempts per item"),
    item_mb: Optional[float] = typer.Option(
        None, help="Target item size in MB (default: a few items per worker; a resumed run keeps its own)"
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Give the failed items of a resumed run new attempts"
    ),
    text_column: str = TEXT_COLUMN,
    keep_titles: bool = KEEP_TITLES,
    max_bad_share: float = MAX_BAD_SHARE,
    shards: Optional[int] = SHARDS,
    dedup: Optional[str] = DEDUP,
    shuffle_mb: float = SHUFFLE_MB_OPTION,
) -> None:
    """Run the whole job on this machine: plan, N workers, progress, summary."""
    from fleet.cli.api import Interrupted, local

    if len(paths) < 2:
        fail("give at least one input and an output folder: fleet local INPUT... OUT_DIR")
    *inputs, out_dir = paths
    try:
        result = local(
            inputs,
            out_dir,
            job=job,
            options=parse_settings(set_),
            workers=workers,
            item_mb=item_mb,
            lease_ttl=lease_ttl,
            max_attempts=max_attempts,
            retry_failed=retry_failed,
            shards=shards,
            dedup=dedup,
            shuffle_mb=shuffle_mb,
            text_column=text_column,
            keep_titles=keep_titles,
            max_bad_share=max_bad_share,
            progress=console,
        )
    except Interrupted as e:
        say(console, str(e))
        raise typer.Exit(130) from None
    raise typer.Exit(result.exit_code)


def _resolve(target: Optional[str], bucket: Optional[str], run: Optional[str]) -> tuple[str, str]:
    from fleet.core.layout import STATE_DIR

    if target and not bucket:
        local_state = os.path.join(target, STATE_DIR)
        bucket = local_state if os.path.isdir(local_state) else target
    if not bucket:
        cfg = _config()
        bucket = cfg.bucket if cfg else None
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


@app.command("jobs")
def jobs_cmd(
    name: Optional[str] = typer.Argument(None, help="A job: show only its options"),
) -> None:
    """The jobs this fleet knows, each with its options (--set key=value): type, default, help."""
    from fleet.core.discovery import available_jobs, load_job
    from fleet.core.options import describe_options

    names = [name] if name else available_jobs()
    for job_name in names:
        job = load_job(job_name)
        doc = (type(job).__doc__ or (job.__doc__ or "")).strip().splitlines()
        print_options(stdout(), job_name + (f": {doc[0]}" if doc else ""), describe_options(job.config_type))


@app.command("follow")
def follow_cmd(
    bucket: Optional[str] = typer.Option(
        None, help="gs://BUCKET or local folder holding the run (or an output folder of `fleet local`)"
    ),
    run: Optional[str] = typer.Option(None, callback=_run_name, help="Run name (needed when the bucket holds several)"),
    from_start: bool = typer.Option(False, "--from-start", help="Also the outputs committed before now"),
    poll: float = typer.Option(2.0, help="Seconds between looks at the bucket"),
    dead_after: Optional[float] = typer.Option(
        None,
        help="Seconds without a live worker or a finished item after which the run counts as stopped "
        "(default: 60 for a `fleet local` run, 900 for a bucket run, whose VMs take minutes to boot; 0: wait forever)",
    ),
) -> None:
    """Print each committed output's URL once, in commit order, as items finish; exit when the run drains.

    Exits 0 when every item is done, 1 (listing them) when some failed, 3 when no worker has
    been alive for --dead-after seconds with items unfinished (the run is stopped)."""
    from fleet.core.follow import RunStopped, default_dead_after, follow

    within("--poll", poll, POLL, " seconds")
    if dead_after is not None:
        within("--dead-after", dead_after, DEAD_AFTER, " seconds")
    bucket, run = _resolve(bucket, None, run)
    wait = default_dead_after(run) if dead_after is None else dead_after
    follower = follow(bucket, run, from_start=from_start, poll=poll, dead_after=wait or None)
    try:
        for out in follower:
            print(out.url, flush=True)
    except RunStopped as e:
        fail(str(e), 3)
    for item, error in follower.failed:
        say(console, f"item {item}: {error}", "failed", "red")
    raise typer.Exit(1 if follower.failed else 0)


@app.command("status")
def status_cmd(
    target: Optional[str] = typer.Argument(None, help="An output folder of `fleet local`, or a bucket URL"),
    bucket: Optional[str] = typer.Option(None, help="gs://BUCKET or local folder"),
    run: Optional[str] = typer.Option(None, callback=_run_name, help="Run name"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON"),
    watch: bool = typer.Option(False, help="Refresh every few seconds until the run finishes"),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Read every done item's outputs (in the folder named, for "
        "an OUT_DIR of `fleet local`, even copied or moved) and check them against the "
        "digests their leases recorded; send items whose outputs are gone or changed "
        "back to pending, and exit 1",
    ),
) -> None:
    """Counts of items pending/leased/done/failed, throughput, failures, workers, and the store requests the
    workers made, with what they cost at Cloud Storage's list price."""
    from fleet.core.status import StatusReader

    bucket, run = _resolve(target, bucket, run)
    try:
        reader = StatusReader(open_store(bucket), run)
    except PlanError:  # a damaged run spec: say so, after why the run stopped itself if it did
        _print_stop(open_store(bucket), run)
        raise
    damaged = _verify(open_store(bucket), reader, run) if verify else False
    while True:
        st = reader.collect(with_workers=True)
        fleet_view = _fleet_view(open_store(bucket), run, st.workers)
        if as_json:
            print(
                json.dumps({**st.to_dict(), **({"fleet": fleet_view} if fleet_view else {})}, indent=1, sort_keys=True)
            )
        else:
            print_status(stdout(), st)
            if fleet_view:
                print_fleet(stdout(), fleet_view)
        if not watch or (st.finished and not (fleet_view or {}).get("mig")):
            break
        time.sleep(5)
    if damaged:  # what was found is said above; exit 1, as a run with failed items does
        raise typer.Exit(1)


def _verify(store, reader, run: str) -> bool:
    """Check the done items' outputs where the run's state puts them (fleet.core.run.output_place)
    and send the damaged back to pending; True when there were any."""
    from fleet.core.repair import repair_run
    from fleet.core.verify import describe_stale

    fix = repair_run(store, reader, deep=True)
    if fix.stale:
        say(console, f"verify: {describe_stale(fix.stale)}")
    for d in fix.lost:
        say(console, str(d), "output lost:", "yellow")
    for item, error in fix.damaged.items():
        say(console, f"item {item}: {error}", "damaged lease:", "yellow")
    items, done = fix.hit, fix.done
    if items:
        if fix.later:
            say(console, f"verify: {len(fix.later)} item(s) of later stages read those and are redone with them")
        console.print(
            f"verify: {len(items)} of {done} done items sent back to pending (outputs gone or changed); "
            "resume the run to convert them again (`fleet local` with the same arguments, "
            "`fleet work`, or `fleet launch`)",
            highlight=False,
            soft_wrap=True,
        )
        return True
    console.print(f"verify: the outputs of all {done} done items match their digests", highlight=False)
    return False


# -- the fleet on Google Cloud ---------------------------------------------------------------------
def _config():
    """fleet.toml if there is one: it only supplies defaults here."""
    from fleet.gce.config import load_optional

    return load_optional()


def _bucket(bucket: Optional[str], cfg) -> str:
    if bucket:
        return bucket
    if cfg is None:
        fail("give --bucket, or write fleet.toml with `fleet init`")
    return cfg.bucket


def code_paths(cfg) -> list[str]:
    """What a code version is made of: fleet.toml's code_paths, else the default (fleet.core.codesync takes
    them from here, so that the worker side never reads the configuration)."""
    from fleet.gce.config import DEFAULT_CODE_PATHS

    return list(cfg.code_paths) if cfg else list(DEFAULT_CODE_PATHS)


def _required_config():
    from fleet.gce.config import load

    return load()


@app.command("init")
def init_cmd(
    project: str = typer.Option(..., help="Google Cloud project id"),
    bucket: str = typer.Option(..., help="gs://BUCKET for code, run state, logs"),
    zone: Optional[str] = typer.Option(None, help="Zone of a zonal MIG, e.g. us-central1-a"),
    region: Optional[str] = typer.Option(None, help="Region of a regional MIG (VMs in any of its zones)"),
    service_account: str = typer.Option("", help="Email of the workers' service account"),
    machine_type: str = typer.Option("e2-standard-4", help="VM machine type"),
    image: str = typer.Option(
        "projects/debian-cloud/global/images/family/debian-12",
        help="Boot image or family (the Packer image family skips installs at boot)",
    ),
    spot: bool = typer.Option(True, help="Spot VMs (preemptible, much cheaper)"),
    disk_gb: int = typer.Option(20, help="Boot disk size"),
    disk_type: str = typer.Option("", help="Boot disk type, e.g. pd-balanced (default: the machine series' own)"),
    workers_per_vm: int = typer.Option(0, help="Worker processes per VM (0 = one per core)"),
    standby: int = typer.Option(2, help="Idle workers kept in the tail to take over expired leases"),
    max_run_hours: Optional[float] = typer.Option(
        None,
        help="A run's time limit from its launch: every VM is deleted by then (default: 3 x the run's expected time)",
    ),
    force: bool = typer.Option(False, help="Overwrite an existing fleet.toml"),
) -> None:
    """Write fleet.toml: where the fleet runs and what its VMs look like."""
    from fleet.gce.config import FleetConfig, write

    cfg = FleetConfig(
        project=project,
        bucket=bucket,
        zone=zone or "",
        region=region or "",
        service_account=service_account,
        machine_type=machine_type,
        image=image,
        spot=spot,
        disk_gb=disk_gb,
        disk_type=disk_type,
        workers_per_vm=workers_per_vm,
        standby=standby,
        max_run_hours=max_run_hours,
    )
    path = write(cfg, force=force)
    console.print(
        f"wrote {path}: project {cfg.project}, {cfg.location}, {cfg.bucket}, {cfg.machine_type}"
        f"{' (Spot)' if cfg.spot else ''}. Next: fleet sync",
        highlight=False,
    )


@app.command("sync")
def sync_cmd(
    bucket: Optional[str] = typer.Option(None, help="gs://BUCKET (default: fleet.toml's)"),
    root: Optional[str] = typer.Option(None, help="Project root (default: the one this fleet runs from)"),
) -> None:
    """Upload the code to gs://BUCKET/code/<version>/: only files whose content is new."""
    from fleet.core.codesync import sync

    cfg = _config()
    result = sync(_bucket(bucket, cfg), root, paths=code_paths(cfg))
    console.print(sync_line(result), highlight=False)
    print(result.version)


@app.command("launch")
def launch_cmd(
    run: str = typer.Option(..., callback=_run_name, help="Run name (planned with `fleet plan`)"),
    workers: int = typer.Option(..., help="Number of VMs"),
    template: Optional[str] = typer.Option(None, help="Instance template name (default: the MIG's name)"),
    spot: Optional[bool] = typer.Option(None, "--spot/--no-spot", help="Spot VMs (default: fleet.toml's)"),
    max_run_hours: Optional[float] = typer.Option(
        None,
        help="The run may last this long from now: every VM, recreated ones included, is deleted by then "
        "(default: fleet.toml's, else 3 x the expected time)",
    ),
    deadline: Optional[str] = typer.Option(
        None, help="The run's end instead, as a time: 2025-06-01T18:00:00Z (RFC 3339, with its zone)"
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the requests and the cost estimate (machines and bucket operations); create nothing",
    ),
    force: bool = typer.Option(False, "--force", help="Launch even if the quota or service-account check fails"),
) -> None:
    """Create (or reuse) the instance template and the MIG of VMs that work on the run.

    First, read-only: the region's quotas, the machine type and the service account; a
    shortfall stops the launch with the fix (--force goes on)."""
    from fleet.gce import gcp

    cfg = _required_config()
    plan, checks = gcp.prepare(cfg, run, workers, template, spot, max_run_hours, deadline)
    problems = checks.problems
    if checks.skipped and not dry_run:
        fail(f"{checks.skipped}; nothing was created")
    if dry_run:
        for request in plan.requests:
            print(request.render())
        for line in plan.estimate.lines():
            print(line)
        print(
            "checks: "
            + (
                f"quota and service-account checks skipped: {checks.skipped}"
                if checks.skipped
                else "; ".join(problems) or "quota and service account ok"
            )
        )
        console.print(
            f"dry run: nothing created; `fleet launch` would also write {cfg.bucket}/{launch_name(run)}",
            highlight=False,
        )
        if problems and not force:
            raise typer.Exit(1)
        return
    for line in plan.estimate.lines():
        console.print(line, highlight=False, soft_wrap=True)
    if problems and not force:
        fail("; ".join(problems) + "; or --force to launch anyway")
    for line in problems:
        say(console, line, "--force:", "yellow")
    gcp.launch(cfg, plan, echo=lambda m: say(console, m))
    console.print(f"watch it with: fleet status --run {run} --watch", highlight=False)


def _fleet_view(store, run: str, workers: list) -> dict | None:
    """The MIG side of a launched run, for `fleet status`; None for a run never launched."""
    if not store.url.startswith("gs://") or store.stat(launch_name(run)) is None:
        return None  # (one stat, not the Compute client's import: 4 s of CPU for a run never launched)
    from fleet.gce import gcp  # imports the Compute client: only for runs that were launched

    from fleet.gce import boots

    record, state, problem = gcp.fleet_state(store, run)
    if record is None:
        return None
    vms, hours = gcp.vm_usage(workers)
    stop = boots.load_stop(store, run)
    return {
        "mig": state.__dict__ if state else None,
        "launch": record.__dict__,
        "problem": problem,
        "vms_seen": vms,
        "vm_hours": round(hours, 3),
        "stopped": stop.line() if stop else None,
        "boots": boots.summary(boots.boot_records(store, run)),
    }


def _print_stop(store, run: str) -> None:
    from fleet.gce.boots import load_stop

    stop = load_stop(store, run) if store.url.startswith("gs://") else None
    if stop is not None:
        say(console, stop.line(), style="red")


@app.command("iam")
def iam_cmd(
    role: Optional[str] = typer.Option(None, help="Print only this role's definition (YAML for gcloud --file)"),
) -> None:
    """The workers' least-privilege roles, and the gcloud commands that create and bind them."""
    from fleet.gce import iam

    if role is not None:
        found = next((r for r in iam.ROLES if r.id == role), None)
        if found is None:
            fail(f"--role {role}: no such role; known: {', '.join(r.id for r in iam.ROLES)}")
        sys.stdout.write(iam.role_yaml(found))
        return
    cfg = _config()
    project = cfg.project if cfg else "PROJECT"
    bucket = cfg.bucket if cfg else "gs://BUCKET"
    sys.stdout.write(roles_text(iam.ROLES, iam.CONDITION_TITLE, iam.NAME_PREFIX))
    sys.stdout.write(iam.setup_commands(project, bucket, cfg.service_account if cfg else ""))


@app.command("logs")
def logs_cmd(
    worker: Optional[str] = typer.Argument(None, help="A VM (or worker) name; without it, list the logs"),
    run: str = typer.Option(..., callback=_run_name, help="Run name"),
    bucket: Optional[str] = typer.Option(None, help="gs://BUCKET (default: fleet.toml's)"),
) -> None:
    """The logs the VMs stream to the bucket: list them, or print one VM's."""
    from fleet.gce import gcp

    store = open_store(_bucket(bucket, _config()))
    prefix = log_prefix(run)
    logs = {b.name[len(prefix) :].removesuffix(LOG_SUFFIX): b for b in store.list(prefix)}
    if worker is None:
        if not logs:
            fail(f"no logs for run {run!r} in {store.url} yet")
        sys.stdout.write(logs_text(logs))
        return
    vm = worker if worker in logs else gcp.vm_of(worker)
    if vm not in logs:
        fail(f"no log of {worker!r} for run {run!r} (known: {', '.join(sorted(logs)) or 'none'})")
    sys.stdout.write(store.read(logs[vm].name).decode(errors="replace"))


@app.command("down")
def down_cmd(
    run: str = typer.Option(..., callback=_run_name, help="Run name"),
    bucket: Optional[str] = typer.Option(None, help="gs://BUCKET (default: fleet.toml's)"),
) -> None:
    """Delete the run's MIG (its VMs give their items back) and its instance template."""
    from fleet.gce import gcp

    cfg = _config()
    gcp.down(open_store(_bucket(bucket, cfg)), run, cfg, echo=lambda m: say(console, m))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()

"""A run's fleet on Google Cloud: launch it, look at it, tear it down.

The bucket is the only shared state: `fleet launch` writes ``runs/<run>/launch.json``
(where the MIG and template are), so `status`, `logs` and `down` need only the
bucket and the run name. Compute requests are built by fleet.gce.compute_requests and sent by
fleet.gce.compute; a VM leaves its MIG from startup/startup.sh (curl and the metadata server's
token: it must work when Python or the code is what failed).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Callable

from fleet.gce import boots, compute, compute_requests, estimate, iam, prelaunch
from fleet.core.codesync import has_version, locate
from fleet.gce.config import PROCS_PER_CORE, FleetConfig
from fleet.core.records import JsonRecord
from fleet.core.liveness import beat_time
from fleet.core.status import EarlierLives, covered_seconds
from fleet.core.layout import launch_name
from fleet.core.run import PlanError, StepPlan, load_items, load_spec
from fleet.core.store import NotFound, Store, open_store

if TYPE_CHECKING:  # (imported where it is used: the Compute library loads slowly)
    from google.cloud import compute_v1

STARTUP_SCRIPT = os.path.join("startup", "startup.sh")
SHUTDOWN_SCRIPT = os.path.join("startup", "shutdown.sh")


@dataclass
class LaunchRecord(JsonRecord):
    run: str
    project: str
    zone: str
    region: str
    mig: str
    template: str
    workers: int
    spot: bool
    machine_type: str
    max_run_hours: float  # from the launch to the deadline
    code_version: str
    launched: float = field(default_factory=time.time)
    deadline: float = 0.0  # every VM's terminationTime, seconds since the epoch (0: launched before deadlines)

    @property
    def place(self) -> compute_requests.Place:
        return compute_requests.Place(self.project, self.zone, self.region)


def load_record(store: Store, run: str) -> LaunchRecord | None:
    try:
        return LaunchRecord.from_json(store.read(launch_name(run)))
    except NotFound:
        return None


def read_startup_script(root: str | None = None, script: str = STARTUP_SCRIPT) -> str:
    path = locate(script, root)  # (a checkout's, or an installed fleet's copy in fleet/_data)
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise PlanError(f"{path}: missing; the VMs need it as their {os.path.basename(script)[:-3]} script") from None


@dataclass
class LaunchPlan:
    record: LaunchRecord
    spec: compute_requests.FleetSpec
    template: compute_v1.InstanceTemplate
    mig: compute_v1.InstanceGroupManager
    requests: list[compute_requests.Request]
    estimate: estimate.Estimate


def rates(cfg: FleetConfig) -> estimate.Rates:
    return estimate.Rates(cfg.mb_per_vcpu_s, cfg.boot_minutes, cfg.vcpu_hour_usd, cfg.spot_vcpu_hour_usd)


def check_template(template: str | None) -> None:
    if template is not None and not template.startswith(iam.NAME_PREFIX):
        raise PlanError(
            f"--template {template}: must start with {iam.NAME_PREFIX!r}: the workers' IAM condition "
            f"lets them delete only templates named so (`fleet iam`)"
        )


def parse_deadline(text: str) -> float:
    """``--deadline``: an RFC 3339 time with its zone (2025-06-01T18:00:00Z, or +02:00), as seconds."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise PlanError(f"--deadline {text}: not a time; give one like 2025-06-01T18:00:00Z (RFC 3339)") from None
    if when.tzinfo is None:
        raise PlanError(f"--deadline {text}: give its time zone, e.g. {text}Z for UTC")
    return when.timestamp()


@dataclass(frozen=True)
class Deadline:
    """When every VM of the run is gone (scheduling.terminationTime), and who said so."""

    at: float  # seconds since the epoch
    hours: float | None  # for the estimate: None = derive it from the plan; else launch to deadline
    how: str  # "" when derived


def run_deadline(cfg: FleetConfig, max_run_hours: float | None, deadline: str | None, now: float) -> Deadline:
    """The run's deadline from --deadline, --max-run-hours or fleet.toml's max_run_hours (all
    checked here, each refusal one line naming the option), else None hours: derived from the plan.
    A run without one is refused: a hung worker would bill until `fleet down`."""
    boot = cfg.boot_minutes * 60
    hours: float | None
    if deadline is not None and max_run_hours is not None:
        raise PlanError(f"--deadline {deadline} and --max-run-hours {max_run_hours:g}: give one of the two")
    if deadline is not None:
        # In whole seconds, as terminationTime takes it (compute_requests.rfc3339), before it is checked.
        at, name = float(int(parse_deadline(deadline))), f"--deadline {deadline}"
        if at <= now:
            raise PlanError(
                f"{name}: that time has passed (it is {compute_requests.rfc3339(now)} now); give a later one"
            )
        hours, how = (at - now) / 3600, "--deadline"
    else:
        hours, name = (
            (max_run_hours, f"--max-run-hours {max_run_hours:g}")
            if max_run_hours is not None
            else (
                cfg.max_run_hours,
                f"fleet.toml: max_run_hours = {cfg.max_run_hours:g}" if cfg.max_run_hours is not None else "",
            )
        )
        if hours is None:
            return Deadline(0.0, None, "")
        if hours == 0:
            raise PlanError(
                f"{name}: a run without a time limit is refused (a hung worker would bill until "
                "`fleet down`); give the hours the run may last with --max-run-hours, a time with "
                "--deadline, or neither to derive one from the plan"
            )
        if not 1 / 120 <= hours <= 24 * 120:
            raise PlanError(f"{name}: give 0.0083 (30 s) to 2880 (120 days), GCE's range for a time limit")
        at, how = now + hours * 3600, "--max-run-hours" if max_run_hours is not None else "max_run_hours in fleet.toml"
    if at - now < boot:
        raise PlanError(
            f"{name}: {at - now:.0f} s from now is shorter than one VM boot ({cfg.boot_minutes:g} min, "
            "boot_minutes in fleet.toml); give a later deadline"
        )
    if at - now > estimate.MAX_BOUND_S:
        raise PlanError(f"{name}: more than 120 days from now, GCE's longest time limit")
    # Whole minutes from hours (a dry run and its launch a few seconds apart agree); a time given stays as given.
    return Deadline(at if deadline is not None else float(math.ceil(at / 60) * 60), hours, how)


def plan_launch(
    cfg: FleetConfig,
    run: str,
    workers: int,
    template: str | None = None,
    spot: bool | None = None,
    max_run_hours: float | None = None,
    vcpus: int | None = None,
    deadline: str | None = None,
    now: float | None = None,
) -> LaunchPlan:
    """Check the run can go to VMs and build the exact requests; sends nothing to Compute.

    ``vcpus`` per VM (machineTypes.get, see fleet.gce.prelaunch) sizes the estimate and the derived
    deadline; without it the machine type's name says. ``now``: the launch's time (the deadline is
    fixed from it)."""
    now = time.time() if now is None else now
    kind = "zonal" if cfg.zone else "regional"
    limit = compute_requests.MIG_LIMIT[kind]
    if workers > limit and cfg.zone:
        raise PlanError(
            f"--workers {workers}: a zonal managed instance group holds at most {limit} VMs; "
            f'set region = "{cfg.zone.rpartition("-")[0]}" in fleet.toml instead of zone '
            f"(a regional one holds {compute_requests.MIG_LIMIT['regional']})"
        )
    if not 1 <= workers <= limit:
        raise PlanError(
            f"--workers {workers}: give 1 to {limit} (the limit of a {kind} managed instance group; "
            "more needs several runs)"
        )
    if not cfg.service_account:
        raise PlanError(
            "fleet.toml: service_account is empty; the VMs need one to reach the bucket (docs/gcp.md, step 2)"
        )
    limit_at = run_deadline(cfg, max_run_hours, deadline, now)
    check_template(template)
    store = open_store(cfg.bucket)
    spec = load_spec(store, run)
    items = load_items(store, run)
    for what, url in (("output", spec.output), ("input", items[0].url)):
        if not url.startswith("gs://"):
            raise PlanError(f"run {run!r}: its {what} {url} is a local path; VMs can read and write only gs:// URLs")
    if not has_version(cfg.bucket, spec.code_version):
        raise PlanError(
            f"code version {spec.code_version} (pinned by run {run!r}) is not in {cfg.bucket}: "
            "run `fleet sync` with the code the run was planned with"
        )
    known = vcpus or prelaunch.vcpus_from_name(cfg.machine_type)
    if known and cfg.workers_per_vm > PROCS_PER_CORE * known:  # each VM's `fleet work --procs` would refuse it
        raise PlanError(
            f"fleet.toml: workers_per_vm = {cfg.workers_per_vm}: a {cfg.machine_type} VM has {known} "
            f"vCPUs; give 0 (one per vCPU) to {PROCS_PER_CORE * known}"
        )
    cores = known or 1
    use_spot = cfg.spot if spot is None else spot
    est = estimate.estimate(
        [item.size for item in items],
        workers,
        cores,
        cfg.workers_per_vm,
        use_spot,
        rates(cfg),
        limit_at.hours,
        item_steps=[item.step for item in items],
        stages=estimate.boundaries(StepPlan(spec), [item.step for item in items]),
    )
    at = limit_at.at or float(math.ceil((now + est.bound_hours * 3600) / 60) * 60)
    est = dataclasses.replace(est, deadline=compute_requests.rfc3339(at), bound_how=limit_at.how)
    mig = compute_requests.mig_name(run)
    fspec = compute_requests.FleetSpec(
        run=run,
        bucket=cfg.bucket,
        code_version=spec.code_version,
        template=template or mig,
        machine_type=cfg.machine_type,
        image=cfg.image,
        service_account=cfg.service_account,
        startup_script=read_startup_script(),
        shutdown_script=read_startup_script(script=SHUTDOWN_SCRIPT),
        spot=use_spot,
        max_run_hours=0,
        deadline=at,
        disk_gb=cfg.disk_gb,
        disk_type=cfg.disk_type,
        workers_per_vm=cfg.workers_per_vm,
        standby=cfg.standby,
        network=cfg.network,
        subnetwork=cfg.subnetwork,
        external_ip=cfg.external_ip,
    )
    place = compute_requests.Place(cfg.project, cfg.zone, cfg.region)
    tpl = compute_requests.template_resource(fspec)
    mig_res = compute_requests.mig_resource(fspec, place, mig, workers)
    record = LaunchRecord(
        run,
        cfg.project,
        cfg.zone,
        cfg.region,
        mig,
        fspec.template,
        workers,
        fspec.spot,
        cfg.machine_type,
        est.bound_hours,
        spec.code_version,
        launched=now,
        deadline=at,
    )
    return LaunchPlan(record, fspec, tpl, mig_res, compute_requests.launch_requests(tpl, mig_res, place), est)


@dataclass(frozen=True)
class Checks:
    """What stands in a launch's way (one line each, with the fix), or why nothing was checked."""

    problems: list[str]
    skipped: str = ""  # why the quota and service-account checks could not run (no credentials)


def prepare(
    cfg: FleetConfig,
    run: str,
    workers: int,
    template: str | None = None,
    spot: bool | None = None,
    max_run_hours: float | None = None,
    deadline: str | None = None,
) -> tuple[LaunchPlan, Checks]:
    """The plan, sized with the machine type's real vCPUs, and what stands in its way (quota, the
    service account): read-only calls only, so a dry run makes them too. Without Google
    credentials the plan is sized from the machine type's name and the checks are skipped:
    a dry run still shows the requests and the cost, a launch refuses (fleet.cli.commands)."""
    now = time.time()  # the deadline is fixed once, from here
    plan = plan_launch(
        cfg, run, workers, template, spot, max_run_hours, deadline=deadline, now=now
    )  # the bucket's refusals first
    comp = compute.Compute(compute_requests.Place(cfg.project, cfg.zone, cfg.region))
    try:
        facts = prelaunch.gather(cfg, comp)
    except compute.NoCredentials as e:
        return plan, Checks([], str(e))
    if facts.vcpus != plan.estimate.vcpus:
        plan = plan_launch(
            cfg, run, workers, template, spot, max_run_hours, vcpus=facts.vcpus, deadline=deadline, now=now
        )
    disk = plan.template.properties.disks[0].initialize_params
    account = iam.check_service_account(cfg.service_account)
    return plan, Checks(
        prelaunch.shortfalls(cfg, workers, plan.spec.spot, disk.disk_type, disk.disk_size_gb, facts, account)
    )


def launch(cfg: FleetConfig, plan: LaunchPlan, echo: Callable[[str], None] = print) -> LaunchRecord:
    comp = compute.Compute(plan.record.place)
    boots.clear_stop(open_store(cfg.bucket), plan.record.run)  # a run that stopped itself counts failures afresh
    how = comp.ensure_template(plan.template)
    echo(f"instance template {plan.record.template}: {how}")
    how = comp.create_mig(plan.mig)
    echo(
        f"managed instance group {plan.record.mig} in {plan.record.place.scope}: {how} "
        f"({plan.record.workers} VMs{', Spot' if plan.record.spot else ''})"
    )
    # Unconditional, so the client would not retry it on its own; a replay writes the same record.
    open_store(cfg.bucket).write(launch_name(plan.record.run), plan.record.to_json(), idempotent=True)
    return plan.record


def fleet_state(store: Store, run: str) -> tuple[LaunchRecord | None, compute_requests.MigState | None, str]:
    """The launch record, the MIG's live state (None once deleted) and a problem reaching it, if any."""
    record = load_record(store, run)
    if record is None:
        return None, None, ""
    try:
        return record, compute.Compute(record.place).state(record.mig), ""
    except Exception as e:  # no credentials, no network, an API error: status still shows the run
        return record, None, str(e).splitlines()[0] if str(e) else type(e).__name__


def down(store: Store, run: str, cfg: FleetConfig | None, echo: Callable[[str], None] = print) -> None:
    """Delete the run's MIG (its VMs get SIGTERM and give their items back) and then its template."""
    record = load_record(store, run)
    if record is None:
        if cfg is None:
            raise PlanError(f"run {run!r} was never launched from this bucket and there is no fleet.toml to say where")
        record = LaunchRecord(
            run,
            cfg.project,
            cfg.zone,
            cfg.region,
            compute_requests.mig_name(run),
            compute_requests.mig_name(run),
            0,
            cfg.spot,
            cfg.machine_type,
            cfg.max_run_hours or 0.0,
            "",
        )
    comp = compute.Compute(record.place)
    gone = comp.delete_mig(record.mig)
    echo(f"managed instance group {record.mig}: {'deleted' if gone else 'not there (already deleted)'}")
    gone = comp.delete_template(record.template, in_use_timeout=120)
    echo(f"instance template {record.template}: {'deleted' if gone else 'not there (already deleted)'}")


_WORKER_SUFFIX = re.compile(r"-w\d+$")


def vm_of(worker: str) -> str:
    """Worker processes are named <vm>-w<i> (fleet.core.processes)."""
    return _WORKER_SUFFIX.sub("", worker)


def vm_usage(workers: list[dict]) -> tuple[int, float]:
    """(VMs seen, VM-hours) from heartbeats: per VM name, the time its worker processes ran, from
    start to last beat, over every life of the name (a VM the MIG recreated under it: the lives a
    heartbeat carries, fleet.core.status.earlier_lives), the gaps between lives left out. Boot time
    is not counted."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for w in workers:
        lives = EarlierLives.of(w).spans
        start, end = beat_time(w, "started"), beat_time(w, "updated")
        if start and end:
            lives.append((start, end))
        if lives:
            spans.setdefault(vm_of(str(w.get("worker", ""))), []).extend(lives)
    return len(spans), sum(map(covered_seconds, spans.values())) / 3600

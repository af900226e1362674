"""What `fleet launch` checks before it creates anything: quota and the workers' account.

A MIG that cannot get its VMs retries forever and bills nothing, but the run
then "hangs on quota", the complaint users of batch tools name first. So the
launch reads the region's quotas (``regions.get``) and the machine type's vCPUs
(``machineTypes.get``) and refuses, in one line naming the shortfall and the fix,
when the fleet cannot fit; likewise when the service account does not exist.
``--force`` goes on regardless. Quota rules (Compute Engine's quota docs):

- vCPUs: E2 and N1 count against ``CPUS``; other series against ``<SERIES>_CPUS``
  when the region has that metric. Spot (and preemptible) VMs count against
  ``PREEMPTIBLE_CPUS`` when the project has been granted some (limit > 0),
  otherwise against the same quota as standard VMs.
- ``IN_USE_ADDRESSES``: one per VM with an external IP (ephemeral ones too).
- boot disks: ``pd-standard`` against ``DISKS_TOTAL_GB``; ``pd-balanced`` and
  ``pd-ssd`` against ``SSD_TOTAL_GB``; other disk types are not checked here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from fleet.gce import compute, compute_requests, iam
from fleet.gce.config import FleetConfig

_PREDEFINED = re.compile(r"^[a-z][a-z0-9]*-(?:standard|highmem|highcpu|highgpu|megamem|ultramem|custom)-(\d+)")
_SHARED = {"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}


@dataclass(frozen=True)
class Facts:
    """What the API says about where the fleet would run."""

    zones: list[str]
    quotas: dict[str, tuple[float, float]]  # metric -> (limit, usage)
    vcpus: int
    problems: list[str] = field(default_factory=list)  # what could not be read


def vcpus_from_name(machine_type: str) -> int | None:
    """A predefined type's name ends with its vCPUs (e2-standard-4); shared-core ones are listed."""
    if machine_type in _SHARED:
        return _SHARED[machine_type]
    m = _PREDEFINED.match(machine_type)
    return int(m.group(1)) if m else None


def gather(cfg: FleetConfig, comp: compute.Compute) -> Facts:
    """Read-only calls: regions.get, then machineTypes.get in a zone of the fleet."""
    problems: list[str] = []
    try:
        zones, quotas = comp.region_info()
    except compute.NoCredentials:
        raise  # not a permission to grant: the caller says how to log in
    except compute_requests.ComputeError as e:
        zones, quotas = [], {}
        problems.append(f"cannot read the quotas of region {comp.region} ({e}); grant compute.regions.get")
    zone = cfg.zone or (zones[0] if zones else "")
    vcpus = None
    if zone:
        try:
            vcpus = comp.machine_vcpus(zone, cfg.machine_type)
        except compute.NoCredentials:
            raise
        except compute_requests.ComputeError as e:
            if " 404 " in f" {e} ":
                problems.append(
                    f"machine type {cfg.machine_type} does not exist in {zone}: fix machine_type in "
                    "fleet.toml (gcloud compute machine-types list --zones " + zone + ")"
                )
            else:
                problems.append(f"cannot read machine type {cfg.machine_type} ({e})")
    if vcpus is None:
        vcpus = vcpus_from_name(cfg.machine_type) or 1
    return Facts(zones, quotas, vcpus, problems)


def cpu_metric(machine_type: str, spot: bool, quotas: dict[str, tuple[float, float]]) -> str:
    series = machine_type.split("-", 1)[0].upper()
    standard = f"{series}_CPUS" if series not in ("E2", "N1") and f"{series}_CPUS" in quotas else "CPUS"
    if spot and quotas.get("PREEMPTIBLE_CPUS", (0.0, 0.0))[0] > 0:
        return "PREEMPTIBLE_CPUS"
    return standard


def disk_metric(disk_type: str) -> str | None:
    kind = disk_type.rsplit("/", 1)[-1]
    return {"pd-standard": "DISKS_TOTAL_GB", "pd-balanced": "SSD_TOTAL_GB", "pd-ssd": "SSD_TOTAL_GB"}.get(kind)


@dataclass(frozen=True)
class Need:
    metric: str
    per_vm: float
    unit: str


def needs(
    cfg: FleetConfig, spot: bool, disk_type: str, disk_gb: int, vcpus: int, quotas: dict[str, tuple[float, float]]
) -> list[Need]:
    out = [Need(cpu_metric(cfg.machine_type, spot, quotas), vcpus, f"vCPUs ({cfg.machine_type})")]
    if cfg.external_ip:
        out.append(Need("IN_USE_ADDRESSES", 1, "external IP"))
    metric = disk_metric(disk_type)
    if metric:
        out.append(Need(metric, disk_gb, f"GB of {disk_type.rsplit('/', 1)[-1]} boot disk"))
    return out


def shortfalls(
    cfg: FleetConfig,
    workers: int,
    spot: bool,
    disk_type: str,
    disk_gb: int,
    facts: Facts,
    account: iam.AccountCheck | None,
) -> list[str]:
    """One line per problem, each naming the fix; empty when the launch can go ahead."""
    out = list(facts.problems)
    region = cfg.region or cfg.zone.rsplit("-", 1)[0]
    for need in needs(cfg, spot, disk_type, disk_gb, facts.vcpus, facts.quotas):
        if need.metric not in facts.quotas:
            continue  # not a quota of this region (or not readable): nothing to compare
        limit, usage = facts.quotas[need.metric]
        free = max(0.0, limit - usage)
        want = workers * need.per_vm
        if want > free:
            fits = math.floor(free / need.per_vm) if need.per_vm else 0
            out.append(
                f"quota {need.metric} in {region}: {workers} VMs need {want:g} ({need.per_vm:g} {need.unit} "
                f"each) but {free:g} of {limit:g} are free; request more (console: IAM & Admin > Quotas, "
                f"metric {need.metric}) or launch --workers {fits}"
                if fits
                else f"quota {need.metric} in {region}: {workers} VMs need {want:g} ({need.per_vm:g} {need.unit} "
                f"each) but {free:g} of {limit:g} are free; request more (console: IAM & Admin > Quotas, "
                f"metric {need.metric})"
            )
    if account is not None and account.exists is False:
        out.append(
            f"service account {cfg.service_account} does not exist: create it (`fleet iam` prints the "
            "commands) or fix service_account in fleet.toml"
        )
    elif account is not None and account.exists is None:
        out.append(
            f"cannot check that service account {cfg.service_account} exists ({account.detail}); "
            "you need iam.serviceAccounts.get on it (roles/iam.serviceAccountUser, which launching VMs "
            "as it needs anyway)"
        )
    return out

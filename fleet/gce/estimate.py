"""What a run should cost, and how long a VM may live: from the plan's size, before anything starts.

    work time  = input MB / (MB/s per vCPU × busy worker processes × efficiency)
                 (never less than the largest item at one process's rate)
    wall time  = boot + work time
    VM-hours   = VMs × wall time;  vCPU-hours = VM-hours × vCPUs per VM
    cost       = vCPU-hours × price per vCPU-hour (Spot or on-demand)

The bound every VM gets as ``maxRunDuration`` is 3 × the expected wall time in whole hours, at
least an hour (a slow boot or a slow mirror must not kill a healthy VM) and
within GCE's 30 s to 120 days. The upper end of the price range is that bound
for every VM once: what the run costs if no VM ever leaves on its own.
Rates and prices come from fleet.toml (docs/costs.md), so they can be
replaced by what `fleet status` measures on a slice of the corpus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EFFICIENCY = 0.8  # boot, the last items' tail, lease and upload I/O (docs/costs.md)
MARGIN = 3.0
MIN_BOUND_S = 3600.0
MAX_BOUND_S = 120 * 86400.0  # GCE's maxRunDuration range: 30 s .. 120 days


@dataclass(frozen=True)
class Rates:
    mb_per_vcpu_s: float  # text converted per second by one worker process on one vCPU
    boot_minutes: float  # from VM creation to the first item claimed
    vcpu_hour_usd: float  # on-demand price per vCPU-hour of the machine type
    spot_vcpu_hour_usd: float


@dataclass(frozen=True)
class Estimate:
    input_bytes: int
    items: int
    workers: int  # VMs
    vcpus: int  # per VM
    procs: int  # worker processes per VM
    spot: bool
    work_s: float
    wall_s: float
    vm_hours: float
    vcpu_hours: float
    vcpu_hour_usd: float
    bound_hours: float  # maxRunDuration of every VM (0 = none)
    bound_derived: bool
    rates: Rates

    @property
    def expected_usd(self) -> float:
        return self.vcpu_hours * self.vcpu_hour_usd

    @property
    def bound_vm_hours(self) -> float:
        return self.workers * self.bound_hours

    @property
    def bound_usd(self) -> float:
        return self.bound_vm_hours * self.vcpus * self.vcpu_hour_usd

    def lines(self) -> list[str]:
        kind = "Spot" if self.spot else "on-demand"
        r = self.rates
        out = [
            f"plan: {self.input_bytes / 1e6:,.1f} MB of input in {self.items:,} items; {self.workers} VMs × "
            f"{self.procs} worker process(es) at {r.mb_per_vcpu_s:g} MB/s per vCPU, {r.boot_minutes:g} min boot",
            f"expected: about {_duration(self.wall_s)} wall time, {self.vm_hours:,.2f} VM-hours "
            f"({self.vcpu_hours:,.2f} vCPU-hours), ≈ ${self.expected_usd:,.2f} at ${self.vcpu_hour_usd:g} "
            f"per {kind} vCPU-hour (machine only)",
        ]
        if self.bound_hours:
            how = (f"derived: {MARGIN:g} × the expected time, at least {MIN_BOUND_S / 3600:g} h; --max-run-hours "
                   "overrides" if self.bound_derived else "set by max_run_hours")
            out.append(f"maxRunDuration: {_duration(self.bound_hours * 3600)} per VM ({how}); at most "
                       f"{self.bound_vm_hours:,.2f} VM-hours, ≈ ${self.bound_usd:,.2f}, if every VM ran that long once")
            out.append(f"price range: ≈ ${self.expected_usd:,.2f} to ${self.bound_usd:,.2f}")
        else:
            out.append("maxRunDuration: none (max_run_hours = 0): a VM that never leaves bills until `fleet down`")
        return out


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def derived_bound_hours(wall_s: float) -> float:
    """Whole hours, so that a relaunch with a few more VMs usually derives the same template."""
    return min(math.ceil(max(MARGIN * wall_s, MIN_BOUND_S) / 3600), MAX_BOUND_S / 3600)


def estimate(item_sizes: list[int], workers: int, vcpus: int, workers_per_vm: int, spot: bool, rates: Rates,
             max_run_hours: float | None) -> Estimate:
    """``max_run_hours`` None derives the bound; 0 means none; otherwise it is the bound."""
    procs = workers_per_vm or vcpus
    total_mb = sum(item_sizes) / 1e6
    busy = max(1, min(workers * procs, len(item_sizes)))
    rate = rates.mb_per_vcpu_s
    work_s = max(total_mb / (rate * busy * EFFICIENCY), max(item_sizes, default=0) / 1e6 / rate)
    wall_s = rates.boot_minutes * 60 + work_s
    vm_hours = workers * wall_s / 3600
    price = rates.spot_vcpu_hour_usd if spot else rates.vcpu_hour_usd
    bound = derived_bound_hours(wall_s) if max_run_hours is None else max_run_hours
    return Estimate(sum(item_sizes), len(item_sizes), workers, vcpus, procs, spot, work_s, wall_s, vm_hours,
                    vm_hours * vcpus, price, round(bound, 4), max_run_hours is None, rates)

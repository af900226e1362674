"""Following a run from the trainer: its outputs, records or examples, in commit order, as items finish.

Every finished item is an immutable, committed output (its lease says done and names
its files), so training can start before the data is done: a follower polls the
``final/`` markers (one listing), reads the leases of the items newly finished, and
hands on their outputs sorted by commit time. It ends when every item is finished;
the failed ones are then in ``failed``.

On top of it, the run's examples for any job that declares its features
(``Job.features``): ``follow_examples`` (a plain-Python iterator of ``{feature: numpy
array}``: no TensorFlow, no torch) and ``follow_dataset`` (a ``tf.data.Dataset`` of
parsed examples). The layout comes from the run's job and config in ``run.json``;
each output is read and checked by ``fleet.core.outputs`` (TFRecord, GZIP or Parquet).
Items that failed are what ``fleet follow`` reports: once everything else is read,
the reading raises ``FollowError`` naming them (and the dataset fails with it).

A run nobody works on any more (its workers killed, its VMs deleted) would be waited on
forever. With ``dead_after`` a follower says so instead: ``RunStopped`` once, for that many
seconds of its own clock, no item finished and no worker showed life (``Liveness``).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import numpy as np

from fleet.core.discovery import load_job
from fleet.core.errors import ConfigError, JobNotFound
from fleet.core.sink import Feature
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.liveness import worker_alive
from fleet.core.outputs import (
    Output,
    OutputError,
    is_parquet,
    is_rows,
    row_examples,
    read_records,
    record_examples,
    row_columns,
)
from fleet.core.run import PlanError, list_runs, load_items, load_spec, output_place
from fleet.core.layout import LOCAL_RUN, boots_prefix, final_prefix, lease_prefix, log_prefix, worker_prefix
from fleet.core.store import NotFound, Store, StoreError, open_store

if TYPE_CHECKING:
    import tensorflow as tf

EXAMPLE_FILES = (
    ".tfrecord",
    ".tfrecord.gz",
    ".parquet",
    ".mds",
    ".mds.zstd",
)  # what the examples readers read of an item's outputs
_CHUNK = 256  # records per element handed from Python to tf.data (then unbatched)


class FollowError(Exception):
    """Items of the run failed, or an output cannot be read as the run's examples; the
    message names them."""


class RunStopped(FollowError):
    """No worker of the run has been alive for ``dead_after`` seconds and items are unfinished:
    nothing will finish them until workers start again. The message says how to."""


@dataclass
class Liveness:
    """Does anyone still work on the run? Asked by a follower that has seen no item finish.

    A look lists the run's heartbeats (``workers/``), VM boot records (``boots/``) and VM logs
    (``logs/``). The run shows life when that listing changed since the last look (a worker
    beat, one started, a VM booted or logged: a change the follower sees on its own clock, so
    no clock skew between machines matters), or when a heartbeat is alive by
    ``liveness.worker_alive`` (fresh, and on this machine its process running: a `fleet local`
    killed with SIGKILL is seen dead at once). A worker beats at every lease renewal (TTL/3)
    and every idle poll, so between items and on a long item alike it shows life well within a
    TTL; a run still starting has ``dead_after`` from the follower's start before any sign is
    due. Only the heartbeats whose listing changed are read: a look costs three listings.
    """

    store: Store
    run: str
    lease_ttl: float
    clock: Callable[[], float] = time.time
    _listed: frozenset[tuple[str, int]] | None = None
    _beats: dict[tuple[str, int], dict] = field(default_factory=dict)

    def alive(self) -> bool:
        listed = frozenset(
            (b.name, b.generation)
            for prefix in (worker_prefix(self.run), boots_prefix(self.run), log_prefix(self.run))
            for b in self.store.list(prefix)
        )
        changed = self._listed is not None and listed != self._listed
        self._listed = listed
        beats: dict[tuple[str, int], dict] = {}
        for key in listed:
            if not key[0].startswith(worker_prefix(self.run)):
                continue
            beat = self._beats.get(key)
            if beat is None:
                try:
                    beat = json.loads(self.store.read(key[0]))
                except (NotFound, StoreError, ValueError):
                    continue  # removed since the listing, or not read this time: the next look reads it
            if isinstance(beat, dict):
                beats[key] = beat
        self._beats = beats
        now = self.clock()
        return changed or any(worker_alive(beat, self.lease_ttl, now) for beat in beats.values())


def default_dead_after(run: str) -> float:
    """How long `fleet follow` waits for a sign of life: a `fleet local` run's workers start
    seconds after its plan and are seen dead at once by their pid, a bucket run's VMs take
    minutes to boot (or to be recreated after a preemption)."""
    return 60.0 if run == LOCAL_RUN else 900.0


@dataclass
class Follower:
    """Iterate over a run's outputs as they are committed.

    ``from_start``: also the outputs committed before the follower started (a trainer
    that starts mid-run catches up); otherwise only those committed after.
    ``dead_after``: raise RunStopped when no item finished and no worker was alive
    (``Liveness``) for that many seconds while items are unfinished; None waits forever.
    ``clock`` and ``sleep`` are the follower's time (tests give their own).
    """

    bucket: str
    run: str
    from_start: bool = True
    poll: float = 2.0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (item, error), known once drained
    dead_after: float | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    _seen: set[str] = field(default_factory=set)

    def __iter__(self) -> Iterator[Output]:
        store = open_store(self.bucket)
        spec = load_spec(store, self.run)
        output_root = output_place(spec, store).rstrip("/")  # a moved OUT_DIR's own files
        skip_before = 0.0 if self.from_start else time.time()
        prefix = final_prefix(self.run)
        # A run with stages: a failed barrier means the stages after it never run (StepPlan).
        barriers = {i.id for i in load_items(store, self.run) if i.meta.get("barrier")} if spec.stages else set()
        idle = 0
        watch = Liveness(store, self.run, spec.lease_ttl, self.clock) if self.dead_after else None
        last_life = looked = self.clock()
        while True:
            finished = [b.name[len(prefix) :] for b in store.list(prefix)]
            if idle >= 5:  # no marker for a while: a committer may have died before writing one
                finished += [b.name[len(lease_prefix(self.run)) :] for b in store.list(lease_prefix(self.run))]
                idle = 0
            fresh = [item for item in dict.fromkeys(finished) if item not in self._seen]
            found: list[tuple[float, str, Lease]] = []
            for item in fresh:
                lease = _lease(store, self.run, item)
                if lease is None:
                    continue  # reopened since (fleet status --verify): it will finish again
                self._seen.add(item)
                if lease.state == FAILED:
                    self.failed.append((item, lease.error or ""))
                elif lease.state == DONE:
                    found.append((lease.finished, item, lease))
            for committed, item, lease in sorted(found):
                if committed < skip_before:
                    continue
                for out in lease.outputs:
                    if out.get("place") == "state":
                        continue  # records between stages, not outputs
                    yield Output(
                        f"{output_root}/{out['name']}",
                        item,
                        committed,
                        int(out.get("size", 0)),
                        str(out.get("sha256", "")),
                    )
            if len(self._seen) >= spec.items or any(item in barriers for item, _ in self.failed):
                return
            progressed = bool(found) or any(item in self._seen for item in fresh)
            idle = 0 if progressed else idle + 1
            now = self.clock()
            if watch is not None and self.dead_after is not None:
                if progressed:
                    last_life = now
                elif now - looked >= min(max(self.poll, 5.0), self.dead_after / 4):
                    looked = now
                    if watch.alive():
                        last_life = now
                    elif now - last_life >= self.dead_after:
                        raise RunStopped(self._stopped(spec.items - len(self._seen), now - last_life))
            self.sleep(self.poll)

    def _stopped(self, unfinished: int, dead_for: float) -> str:
        again = (
            "resume it with `fleet local` on the same inputs and OUT_DIR"
            if self.run == LOCAL_RUN
            else f"start its workers again (`fleet work --bucket {self.bucket} --run {self.run}`, or relaunch its VMs)"
        )
        return (
            f"run {self.run}: no worker has been alive for {dead_for:.0f} s and {unfinished} item(s) are "
            f"unfinished: the run is stopped; {again}"
        )


def _lease(store: Store, run: str, item: str) -> Lease | None:
    name = lease_prefix(run) + item
    try:
        lease = Lease.parse(store.read(name), f"{store.url}/{name}")
    except NotFound:
        return None
    return lease if lease.state in (DONE, FAILED) else None


def follow(
    bucket: str, run: str, from_start: bool = True, poll: float = 2.0, dead_after: float | None = None
) -> Follower:
    """``for out in follow("gs://b", "wiki"): train_on(out.url)``; see Follower."""
    return Follower(bucket, run, from_start, poll, dead_after=dead_after)


# -- a run's examples, for any job that declares its features ---------------------------


def resolve_run(source: str, run: str | None = None) -> tuple[str, str]:
    """(bucket, run) from a bucket URL, a local bucket folder or an output folder of
    ``fleet local``; the run may be left out when the bucket holds only one."""
    from fleet.core.layout import STATE_DIR

    bucket = source
    state = os.path.join(source, STATE_DIR)
    if "://" not in source and os.path.isdir(state):
        bucket = state
    if run:
        return bucket, run
    try:
        runs = list_runs(open_store(bucket))
    except (StoreError, OSError) as e:
        raise FollowError(f"{source}: cannot list its runs ({e})") from None
    if len(runs) != 1:
        raise FollowError(
            f"{source}: {'no runs' if not runs else 'several runs: ' + ', '.join(runs)}; name one with run="
        )
    return bucket, runs[0]


def feature_spec(layout: Mapping[str, Feature]) -> dict:
    """``{name: tf.io.FixedLenFeature}`` for ``tf.io.parse_example`` (imports TensorFlow)."""
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([f.length], tf.as_dtype(f.dtype)) for name, f in layout.items()}


@dataclass
class RunReader:
    """A run's examples, as its items are committed. Each iteration follows the run anew
    (from the start, or from the time it begins when ``from_start`` is false)."""

    source: str  # gs://BUCKET, a local bucket folder, or an output folder of fleet local
    run: str | None = None
    from_start: bool = True
    poll: float = 2.0
    # (index, count): read only the items of this share, e.g. one per DataLoader worker or
    # per host; the shares of 0..count-1 are disjoint and together the whole run.
    shard: tuple[int, int] = (0, 1)
    bucket: str = field(init=False)
    config: Any = field(init=False)  # the run's job config, as the job parses its run.json
    layout: dict[str, Feature] = field(init=False)  # the job's features for that config

    def __post_init__(self) -> None:
        index, count = self.shard
        if not 0 <= index < count:
            raise FollowError(f"shard {index} of {count}: the index must be in 0..{count - 1}")
        self.bucket, self.run = resolve_run(self.source, self.run)
        try:
            spec = load_spec(open_store(self.bucket), self.run)
            job = load_job(spec.job)
            self.config = job.parse_config(spec.config)
        except (PlanError, StoreError, JobNotFound, ConfigError) as e:
            raise FollowError(f"run {self.run} in {self.bucket}: {e}") from None
        self.layout = dict(job.features(self.config))
        if not self.layout:
            raise FollowError(
                f"run {self.run} in {self.bucket}: its job {spec.job} declares no features "
                "(Job.features); read its outputs with fleet.core.follow.follow"
            )

    # -- the outputs, then their records or examples --------------------------------------
    def outputs(self) -> Iterator[Output]:
        """Each committed output once, in commit order; FollowError at the end if items failed."""
        assert self.run is not None  # (resolved in __post_init__)
        follower = Follower(self.bucket, self.run, self.from_start, self.poll)
        index, count = self.shard
        for out in follower:
            if not out.url.endswith(EXAMPLE_FILES):
                continue  # beside the examples: a provenance sidecar, a log
            if count == 1 or _share(out.item, count) == index:
                yield out
        if follower.failed:
            listed = "; ".join(f"{item}: {error}" for item, error in follower.failed)
            raise FollowError(f"run {self.run}: {len(follower.failed)} item(s) failed: {listed}")

    def record_chunks(self, size: int = _CHUNK) -> Iterator[list[bytes]]:
        """Serialized ``tf.train.Example``s in lists of at most ``size``, never across outputs."""
        for out in self.outputs():
            if is_rows(out):
                raise FollowError(
                    f"{out.url}: {'Parquet' if is_parquet(out) else 'MDS'}: its examples are rows, not records; "
                    "read them with examples() or dataset()"
                )
            chunk: list[bytes] = []
            for record in _checked(read_records(out)):
                chunk.append(record)
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk

    def records(self) -> Iterator[bytes]:
        for chunk in self.record_chunks():
            yield from chunk

    def examples(self) -> Iterator[dict[str, np.ndarray]]:
        """``{name: array}`` per example, of the layout's lengths and dtypes, as
        ``tf.io.parse_single_example`` with ``feature_spec(layout)`` gives them."""
        for out in self.outputs():
            read = row_examples if is_rows(out) else record_examples
            yield from _checked(read(out, self.layout))

    def dataset(self) -> "tf.data.Dataset":
        """A ``tf.data.Dataset`` of parsed examples that ends when the run drains; it fails
        with the FollowError's message when items failed. TFRecords are parsed by
        TensorFlow, a chunk at a time; Parquet rows come in a row group at a time."""
        import tensorflow as tf

        layout = self.layout
        spec = feature_spec(layout)
        signature = (
            tf.TensorSpec([None], tf.string),
            {name: tf.TensorSpec([None, f.length], tf.as_dtype(f.dtype)) for name, f in layout.items()},
        )
        chunks = tf.data.Dataset.from_generator(self._mixed_chunks, output_signature=signature)

        def merge(records, columns):
            parsed = tf.io.parse_example(records, spec)
            return {name: tf.concat([parsed[name], columns[name]], 0) for name in layout}

        return chunks.map(merge).unbatch()

    def _mixed_chunks(self) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """(serialized records, {name: rows}) per chunk, one of the two empty: each output
        in its own format, so a run's TFRecords and Parquet files go through one dataset."""
        no_rows = {name: np.zeros((0, f.length), f.dtype) for name, f in self.layout.items()}
        no_records = np.zeros(0, object)
        for out in self.outputs():
            if is_rows(out):
                for columns in _checked(row_columns(out, self.layout)):
                    yield no_records, columns
                continue
            chunk: list[bytes] = []
            for record in _checked(read_records(out)):
                chunk.append(record)
                if len(chunk) >= _CHUNK:
                    yield np.array(chunk, object), no_rows
                    chunk = []
            if chunk:
                yield np.array(chunk, object), no_rows


def _checked(items: Iterator) -> Iterator:
    """The output's items, its OutputError raised as the FollowError a trainer catches."""
    try:
        yield from items
    except OutputError as e:
        raise FollowError(str(e)) from None


def _share(item: str, count: int) -> int:
    """Items are numbered: consecutive ones go to different shares (else a stable hash). The
    files of ``--shards N`` are numbered too (``00003-of-00016``): with ``count`` = N, share i
    is file i, so every host of a pod reads one balanced shard."""
    number = item.split("-of-", 1)[0]
    return int(number) % count if number.isdigit() else zlib.crc32(item.encode()) % count


def follow_examples(
    source: str, run: str | None = None, from_start: bool = True, poll: float = 2.0, shard: tuple[int, int] = (0, 1)
) -> Iterator[dict[str, np.ndarray]]:
    """``for ex in follow_examples("gs://b", "wiki"): ...``: the run's examples as dicts of
    numpy arrays, as items finish; ends when the run drains (FollowError if items failed)."""
    return RunReader(source, run, from_start, poll, shard).examples()


def follow_dataset(
    source: str, run: str | None = None, from_start: bool = True, poll: float = 2.0, shard: tuple[int, int] = (0, 1)
) -> "tf.data.Dataset":
    """The same as a ``tf.data.Dataset`` of parsed examples (see ``RunReader.dataset``)."""
    return RunReader(source, run, from_start, poll, shard).dataset()

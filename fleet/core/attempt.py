"""One attempt at one item, as the lease protocol wants it: renew the lease while the job
converts, upload the outputs, then commit, fail (an attempt spent) or give the item back.

A thread renews the lease; if renewal finds it taken over, the converter is stopped at its
next ``ctx.checkpoint()`` (Cancelled) and the work discarded, so a stale worker never commits.
Which item to try, and when, is the claim loop's (fleet.core.spawner); this is what happens to
an item once it is held.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Sequence

from fleet.core.codesync import sha256_file
from fleet.core.errors import InputError, ItemFailed
from fleet.core.item import ItemContext, ItemInput, item_seed
from fleet.core.job import Converter
from fleet.core.sink import Sink
from fleet.core.stage import Reducer
from fleet.core.lease import DONE, FAILED, Held, Leases, Lost
from fleet.core.run import Item, RunSpec, StepPlan, output_place
from fleet.core.layout import counts_name, index_name, output_name, released_prefix, shuffle_name
from fleet.core.shuffle import (
    PartitionWriter,
    ShufflePiece,
    build_index,
    combine,
    index_totals,
    load_index,
    partitions_for,
    reduce_records,
)
from fleet.core.store import Store, StoreError, Unavailable, open_store

log = logging.getLogger("fleet.worker")


def _test_pause(point: str, item: str) -> None:
    """Test-only hook, off unless FLEET_TEST_PAUSE is set (e.g. "claimed=0.5,uploaded=0.5"):
    log that this worker reached a named point, then sleep there, so a test can SIGKILL
    or SIGSTOP it at that moment. Points: leased (the claim's write returned, the worker not yet
    holding the item), claimed (lease written, no work yet),
    converting (first document read), uploaded (outputs written, renewal stopped, lease not
    yet done)."""
    for part in os.environ.get("FLEET_TEST_PAUSE", "").split(","):
        name, _, seconds = part.partition("=")
        if name == point:
            log.info("test pause at %s, item %s", point, item)
            time.sleep(float(seconds or 0))


class Shutdown(BaseException):
    """SIGTERM (preemption, `fleet down`) or Ctrl-C: give the item back and leave."""


class ShutdownShield:
    """Where a Shutdown must wait: a claim in flight. The store may write the lease while its
    reply is on the way; raised there, the worker would not know it holds the item, and the
    lease would stand until its TTL (an item `fleet down` leaves for minutes). The signal
    handler (fleet.core.processes) sees ``depth`` and only notes the signal; leaving the last
    shield raises it."""

    def __init__(self):
        self.depth = 0
        self.pending = False

    def __enter__(self) -> "ShutdownShield":
        self.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        self.check()

    def check(self) -> None:
        """Outside every shield, raise the Shutdown noted meanwhile: one a claim held back, or one
        Python dropped because it was raised inside a finalizer (fleet.core.processes)."""
        if self.depth == 0 and self.pending:
            self.pending = False
            raise Shutdown()


SHIELD = ShutdownShield()


class Environment(Exception):
    """This worker's surroundings fail, not the item: a full disk, a read-only or forbidden
    output place. Every item would fail alike, so the item is given back (no attempt
    spent) and the worker stops with this one-line reason; a rerun after the fix finishes."""


# Errors of the machine, not of the data: retrying the item elsewhere (or later) is the cure.
ENVIRONMENT_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOMEM,
    errno.EIO,
}


def environmental(e: BaseException) -> str | None:
    """The one-line reason if ``e`` is the machine's fault, else None."""
    if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or os.strerror(e.errno)}"
    return None


class DirSink(Sink):
    def __init__(self, folder: str):
        self.folder = folder
        self.files: list[tuple[str, str]] = []  # (suffix, local path)

    def open(self, suffix: str) -> BinaryIO:
        if any(s == suffix for s, _ in self.files) or "/" in suffix:
            raise ValueError(f"output suffix {suffix!r} used twice or contains '/'")
        path = os.path.join(self.folder, f"out-{len(self.files)}")
        self.files.append((suffix, path))
        return open(path, "wb")

    def add(self, suffix: str, path: str) -> None:
        """Take over a finished file of the item's scratch folder as it is: no copy. A suffix may
        name a subfolder, never climb out of the output place."""
        parts = suffix.split("/")
        if (
            any(s == suffix for s, _ in self.files)
            or any(p in ("", ".", "..") for p in parts[1:])
            or "\\" in suffix
            or "\x00" in suffix
        ):
            raise ValueError(f"output suffix {suffix!r} used twice or not a plain relative path")
        self.files.append((suffix, path))

    def describe(self, outputs: list[dict]) -> None:
        """Put what the converter counted of each output (``Sink.count``) into its entry of the
        lease (``"counts"``), in the order the files were opened; counts of an output it never
        wrote are a bug of the job's, which fails the item rather than vanish."""
        counted = dict(getattr(self, "output_counts", {}))
        for (suffix, _), out in zip(self.files, outputs):
            counts = counted.pop(suffix, None)
            if counts is not None:
                out["counts"] = dict(sorted(counts.items()))
        if counted:
            raise ValueError(
                f"counts given for output(s) {', '.join(sorted(map(repr, counted)))} that the item did not write"
            )


def part_counts(item: Item, given: ItemInput, workdir: str) -> str:
    """A grouped item's exact counts per input file, as a local file to upload: a JSON list in the
    order of its parts, each part's bytes and what the job counted of it (ItemInput.count). Kept
    beside the lease, not in it: at thousands of files an item, they would make every reader of
    the lease (status, the barrier of a stage, the claim loop) read them too."""
    rows = [{"input_bytes": piece.size, **read.counts} for piece, read in zip(item.parts, given.parts)]
    fd, path = tempfile.mkstemp(prefix="part-counts-", suffix=".json", dir=workdir)  # the converter's folder too
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(rows, f, separators=(",", ":"), sort_keys=True)
    return path


class _Renewer(threading.Thread):
    """Renews a held lease every ttl/3 until stopped, beating the worker's heartbeat with it
    (so a busy worker looks alive as long as it holds a live lease); flags loss of the lease."""

    def __init__(self, leases: Leases, held: Held, beat=None):
        super().__init__(daemon=True)
        self.leases, self.held, self.beat = leases, held, beat
        self.stop = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        interval = max(0.05, self.leases.ttl / 3)
        while not self.stop.wait(interval):
            try:
                self.leases.renew(self.held)
                if self.beat is not None:
                    self.beat("working")
            except Lost:
                self.lost.set()
                return
            except Exception as e:  # a store hiccup: keep trying until the lease would expire
                log.warning("renewing %s failed: %s", self.held.item, e)
                if time.time() > self.held.lease.expires:
                    self.lost.set()
                    return

    def finish(self) -> None:
        self.stop.set()
        self.join()


@dataclass
class Counters:
    items_done: int = 0
    items_failed: int = 0
    items_lost: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.time)


class StageError(InputError):
    """A stage cannot run on what the stages before it made (an item failed; fewer records
    than shards): retrying will not help. ``detail`` says which option, for the exit code."""

    def __init__(self, message: str, detail: dict | None = None):
        super().__init__(message)
        self.detail = dict(detail or {})


class ItemRunner:
    """The items of one worker process, one at a time: ``process`` is one attempt's whole
    protocol; ``release`` gives an item back without spending an attempt.

    In a run with stages (fleet.core.run.StepPlan) an item is one of four kinds: a map item
    (the job's converter over its input), a combine item (merges a fixed group of the step
    before's record files into one: fleet.core.shuffle.combine), a barrier (checks the step
    before is all done and indexes its records) or a stage's item (the job's reducer over its
    records). An item whose step feeds a stage writes keyed records (a PartitionWriter) into
    the run's state instead of outputs."""

    def __init__(
        self,
        store: Store,
        spec: RunSpec,
        leases: Leases,
        converter: Converter,
        seed: int,
        scratch: str,
        counters: Counters,
        beat: Callable[[str], None],
        reducer: Callable[[str], Reducer] | None = None,
        steps: StepPlan | None = None,
        items: Sequence[Item] = (),
    ):
        self.store, self.run, self.spec = store, spec.run, spec
        self.leases = leases
        self.output = open_store(output_place(spec, store))  # a moved OUT_DIR: its own folder
        self.converter = converter
        self.make_reducer = reducer
        self.reducers: dict[str, Reducer] = {}
        self.steps = steps or StepPlan(spec)
        self.items = list(items)
        self._map_items: list[Item] | None = None
        self._index: tuple[str, str, Any] | None = None  # (name, version, Index): one load per worker and stage
        self.seed = seed  # the run's seed (Job.seed); each item's comes from it and the item id
        self.scratch = scratch  # each attempt works in a fresh folder under it
        self.counters = counters
        self.beat = beat  # the worker's heartbeat, beaten while the lease is renewed
        self.current: str | None = None  # the item in hand, for the heartbeat

    def _checkpoint(self, item: Item, renewer: _Renewer):
        """What a converter calls as it goes: the first call is the "converting" test pause,
        and each raises Lost (discard the work) once the lease is taken over."""
        first = [True]

        def checkpoint() -> None:
            if first[0]:
                first[0] = False
                _test_pause("converting", item.id)
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")

        return checkpoint

    def process(self, item: Item, held: Held) -> None:
        _test_pause("claimed", item.id)
        self.current = item.id
        self.beat("working")
        t0 = time.time()
        # A log read live (a VM's serial console, `tail -f`) says what each worker is doing.
        log.info(
            "item %s started (attempt %d, %s): %s",
            item.id,
            held.lease.attempt,
            self.steps.name(item.step),
            item.display,
        )
        renewer = _Renewer(self.leases, held, self.beat)
        renewer.start()
        try:
            with tempfile.TemporaryDirectory(prefix=f"item-{item.id}-", dir=self.scratch) as workdir:
                checkpoint = self._checkpoint(item, renewer)
                feeds = self.steps.feeds(item.step)
                ctx = ItemContext(
                    item.id,
                    item_seed(self.seed, item.id),
                    item.display,
                    workdir,
                    self.spec.read,
                    checkpoint,
                    self.steps.name(item.step),
                    feeds,
                    self.seed,
                )
                sink: DirSink | PartitionWriter = (
                    PartitionWriter(workdir, self.steps.partitions(item.step), self.spec.shuffle_budget)
                    if feeds
                    else DirSink(workdir)
                )
                counted = None
                if item.meta.get("barrier"):
                    stats, files = self._barrier(item, workdir)
                elif item.meta.get("combine"):
                    stats, files = self._combine(item, workdir, checkpoint)
                else:
                    if item.step:
                        stage = self.steps.stage_of(item.step)
                        if stage.rereads:
                            ctx = dataclasses.replace(ctx, input=self._map_item(item.meta["part"]).input())
                        stats = dict(self._reducer(item).reduce(self._records(item, workdir, checkpoint), ctx, sink))
                    else:
                        given = item.input()
                        stats = dict(self.converter.convert(given, ctx, sink))
                        if item.parts:
                            counted = part_counts(item, given, workdir)
                    if isinstance(sink, PartitionWriter):
                        files = [(self.store, shuffle_name(self.run, item.id), sink.finish())]
                        stats["shuffle_records"] = sink.records
                    else:
                        files = [(self.output, output_name(item.id, suffix), path) for suffix, path in sink.files]
                if counted is not None:  # in the run's state, beside the lease: it may be big
                    files.append((self.store, counts_name(self.run, item.id), counted))
                outputs = [self._upload(item, store, name, path, renewer) for store, name, path in files]
                if isinstance(sink, DirSink):
                    sink.describe(outputs)
            renewer.finish()
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")
            _test_pause("uploaded", item.id)  # no renewal from here to the commit: the risky gap
            stats.update(input_bytes=item.size, seconds=round(time.time() - t0, 3))
            self.leases.commit(held, outputs, stats)
            self.counters.items_done += 1
            self.counters.bytes_done += item.size
            took = time.time() - t0
            log.info(
                "item %s done in %.1fs, %.1f MB at %.2f MB/s (%s)",
                item.id,
                took,
                item.size / 1e6,
                item.size / 1e6 / max(took, 1e-3),
                item.display,
            )
        except Lost as e:
            renewer.finish()
            self.counters.items_lost += 1
            log.warning("%s; discarding its work", e)
        except ItemFailed as e:  # the job said why (a program's exit code and stderr): no traceback
            renewer.finish()
            # (A grouped item's failure is one of its files', which the job names: the group is its source.)
            message = (str(e) if item.parts else f"{item.display}: {e}").splitlines()[0]
            final = self.leases.fail(held, message, retry=True, detail=e.detail)
            if final:
                self.counters.items_failed += 1
            elif held.lease.expires == 0.0:
                self.announce_release(item.id)
            tail = "".join(f"\n    {line}" for line in e.detail.get("stderr_tail") or ())
            log.error(
                "item %s attempt %d failed%s: %s%s",
                item.id,
                held.lease.attempt,
                " for good" if final else "",
                message,
                tail,
            )
        except InputError as e:
            renewer.finish()
            self.leases.fail(held, str(e), retry=False, detail=getattr(e, "detail", None))
            self.counters.items_failed += 1
            log.error("item %s failed: %s", item.id, e)
        except Shutdown:
            renewer.finish()
            self.release(held)
            raise
        except Unavailable:  # the store is out, not the item: no attempt spent; the worker rides it out
            renewer.finish()  # (fleet.core.processes), then gives the item back (Worker.holding)
            raise
        except Exception as e:
            renewer.finish()
            reason = str(e) if isinstance(e, Environment) else environmental(e)
            if reason is not None:
                self._give_back(held)
                raise Environment(reason) from None
            message = f"{item.display}: {type(e).__name__}: {e}".splitlines()[0]
            final = self.leases.fail(held, message, retry=True)
            if final:
                self.counters.items_failed += 1
            elif held.lease.expires == 0.0:
                self.announce_release(item.id)
            # A store error (403, bucket gone) is explained by its one line; anything else is a bug: keep the trace.
            trace = "" if isinstance(e, StoreError) else "\n" + traceback.format_exc()
            log.error(
                "item %s attempt %d failed%s: %s%s",
                item.id,
                held.lease.attempt,
                " for good" if final else "",
                message,
                trace,
            )
        finally:
            self.current = None

    def _upload(self, item: Item, store: Store, name: str, path: str, renewer: "_Renewer") -> dict:
        """One output (or, in the run's state, records for the next stage) uploaded and described
        as the lease records it: size, sha256, and the generation and version written."""
        if renewer.lost.is_set():
            raise Lost(f"item {item.id}: lease taken over")
        try:
            generation = store.upload_file(name, path)
        except Unavailable:
            raise
        except StoreError as e:  # the output place refuses every item alike
            raise Environment(f"writing outputs: {e}") from None
        out = {
            "name": name,
            "size": os.path.getsize(path),
            "sha256": sha256_file(path),
            "generation": generation,
            "version": self._version_of(name, generation, store),
        }
        if store is not self.output:
            out["place"] = "state"  # in the bucket with the run's state, not among the outputs
        return out

    def _reducer(self, item: Item) -> Reducer:
        stage = item.meta["stage"]
        if stage not in self.reducers:
            if self.make_reducer is None:
                raise StageError(f"{item.display}: this worker runs no stages")
            self.reducers[stage] = self.make_reducer(stage)
        return self.reducers[stage]

    def _map_item(self, k: int) -> Item:
        """Map item ``k`` (in plan order): what item k of a stage that rereads the inputs reads."""
        if self._map_items is None:
            self._map_items = [i for i in self.items if i.step == 0]
        if not 0 <= k < len(self._map_items):
            raise StageError(f"no map item {k} to reread (the run has {len(self._map_items)}): its plan is damaged")
        return self._map_items[k]

    def _barrier_of(self, step: int) -> Item:
        return next(i for i in self.items if i.step == step - 1 and i.meta.get("barrier"))

    def _records(self, item: Item, workdir: str, checkpoint: Callable[[], None]):
        """A stage item's records, sorted by (key, value), from the index its barrier wrote."""
        assert self.steps is not None  # (a stage's item: the run has stages)
        stage = self.steps.stage_of(item.step)
        name = index_name(self.run, self._barrier_of(item.step).id)
        blob = self.store.stat(name)
        if blob is None:
            raise StageError(f"{item.display}: its index {name} is gone; reopen the stage's barrier")
        if self._index is None or self._index[:2] != (name, blob.version):
            self._index = (name, blob.version, load_index(self.store, name, blob.version or None))
        return reduce_records(
            self.store, self._index[2], item.meta["part"], stage.items, stage.balanced, workdir, checkpoint
        )

    def _pieces(self, item: Item, before: list[Item]) -> list[ShufflePiece]:
        """The record files of ``before`` (items of the step before), each pinned to the version its
        lease committed: one lease read each. Fails for good, naming what failed, if one of them
        did, so a stage never runs on less; waits (a retry) while one is not done."""
        with ThreadPoolExecutor(16) as pool:
            leases = list(pool.map(lambda i: self.leases.read(i.id), before))
        failed = [(i, got[0]) for i, got in zip(before, leases) if got is not None and got[0].state == FAILED]
        if failed:
            first, lease = failed[0]
            cannot = f"stage {item.meta['stage']} cannot run: "
            message = f"{cannot}{len(failed)} item(s) before it failed (item {first.id}: {lease.error})"
            if lease.error and lease.error.startswith(cannot):  # a combine item that failed for what failed before it
                message = lease.error
            raise StageError(message, {"failed_items": [i.id for i, _ in failed]})
        unfinished = [i.id for i, got in zip(before, leases) if got is None or got[0].state != DONE]
        if unfinished:  # reopened since the gate opened (fleet status --verify): wait for them
            raise ItemFailed(f"item(s) {', '.join(unfinished[:5])} of the step before are not done yet")
        pieces = []
        for i, got in zip(before, leases):
            assert got is not None  # every one is done (unfinished above)
            lease = got[0]
            out = next((o for o in lease.outputs if o.get("name") == shuffle_name(self.run, i.id)), None)
            if out is None:
                raise StageError(
                    f"stage {item.meta['stage']} cannot run: item {i.id} left no records for it "
                    "(planned by another version?)"
                )
            pieces.append(ShufflePiece(i.id, out["name"], out.get("version", "")))
        return pieces

    def _combine(self, item: Item, workdir: str, checkpoint: Callable[[], None]) -> tuple[dict, list]:
        """Merge the record files of the group of the step before that the plan gave this item (its
        meta ``items``: positions among that step's items), in its key block (``partitions``),
        into one file of the same format for the barrier to index."""
        lo, hi = item.meta["items"]
        p1, p2 = item.meta["partitions"]
        before = [i for i in self.items if i.step == item.step - 1][lo:hi]
        pieces = self._pieces(item, before)
        made = combine(self.store, pieces, self.steps.partitions(item.step), (p1, p2), workdir, checkpoint)
        return {"combined_records": made.records}, [(self.store, shuffle_name(self.run, item.id), made.path)]

    def _barrier(self, item: Item, workdir: str) -> tuple[dict, list]:
        """Every item of the step before is done: index their records for this stage's items (one
        read of each), or fail for good naming what failed, so the stage never runs on less."""
        pieces = self._pieces(item, [i for i in self.items if i.step == item.step - 1])
        assert self.steps is not None  # (a barrier: the run has stages)
        stage = self.steps.stage_of(item.step + 1)
        data = build_index(self.store, pieces, partitions_for(stage.items, stage.balanced))
        path = os.path.join(workdir, "index")
        with open(path, "wb") as f:
            f.write(data)
        total = sum(index_totals(data))
        if stage.balanced and total < stage.items:
            raise StageError(
                f"--shards {stage.items}: the run holds only {total:,} record(s); give at most {total:,}",
                {"option": "--shards"},
            )
        return {"stage_records": total}, [(self.store, index_name(self.run, item.id), path)]

    def _version_of(self, name: str, generation: int, store: Store | None = None) -> str:
        """The uploaded object's version, which a cheap check of the outputs compares (see
        fleet.core.verify): "" if it is already another generation (then the generation is compared)."""
        blob = (store or self.output).stat(name)
        return blob.version if blob is not None and blob.generation == generation else ""

    def _give_back(self, held: Held) -> None:
        """Release an item without spending an attempt; if even that cannot be written (the
        full disk holds the bucket too), its lease simply expires."""
        try:
            self.release(held)
        except Exception as e:
            log.warning(
                "could not give item %s back (%s); its lease expires in %.0f s",
                held.item,
                environmental(e) or e,
                max(0.0, held.lease.expires - time.time()),
            )

    def release(self, held: Held) -> None:
        """Give an item back without spending an attempt, and say so in released/."""
        self.leases.release(held)
        if held.lease.expires == 0.0:
            self.announce_release(held.item)

    def announce_release(self, item: str) -> None:
        try:  # advisory: without it the item is still taken, once its lease stands still
            self.store.write(released_prefix(self.run) + item, b"", idempotent=True)
        except Exception as e:
            log.warning("released marker for %s not written: %s", item, e)

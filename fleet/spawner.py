"""The worker loop a VM (or `fleet local`) runs: claim, convert, commit, leave.

Each worker process visits the items in its own shuffled order, so many
workers do not all contend for the same lease object, and stops when every
item is done or failed. While it converts an item a thread renews the lease;
if renewal finds the lease taken over, the conversion is stopped at the next
document and its work discarded, so a stale worker never commits.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
import weakref
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from fleet.claims import ClaimPolicy
from fleet.codesync import check_pinned, sha256_file
from fleet.inputs import Tally, read_slice
from fleet.job import ConfigError, InputError, ItemContext, JobNotFound, Sink, item_seed, load_job
from fleet.layout import final_prefix, idle_prefix, lease_prefix, released_prefix, worker_prefix
from fleet.lease import Held, Lease, Leases, Lost
from fleet.liveness import pid_alive
from fleet.run import Item, PlanError, RunSpec, load_items, load_spec, pinned_opener, read_options
from fleet.store import PreconditionFailed, Store, StoreError, open_store

log = logging.getLogger("fleet.worker")


def _test_pause(point: str, item: str) -> None:
    """Test-only hook, off unless FLEET_TEST_PAUSE is set (e.g. "claimed=0.5,uploaded=0.5"):
    log that this worker reached a named point, then sleep there, so a test can SIGKILL
    or SIGSTOP it at that moment. Points: claimed (lease written, no work yet),
    converting (first document read), uploaded (outputs written, renewal stopped, lease not
    yet done)."""
    for part in os.environ.get("FLEET_TEST_PAUSE", "").split(","):
        name, _, seconds = part.partition("=")
        if name == point:
            log.info("test pause at %s, item %s", point, item)
            time.sleep(float(seconds or 0))


class Shutdown(BaseException):
    """SIGTERM (preemption, `fleet down`) or Ctrl-C: give the item back and leave."""


class Environment(Exception):
    """This worker's surroundings fail, not the item: a full disk, a read-only or forbidden
    output place. Every item would fail alike, so the item is given back (no attempt
    spent) and the worker stops with this one-line reason; a rerun after the fix finishes."""


# Errors of the machine, not of the data: retrying the item elsewhere (or later) is the cure.
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE,
                      errno.ENFILE, errno.ENOMEM, errno.EIO}


def environmental(e: BaseException) -> str | None:
    """The one-line reason if ``e`` is the machine's fault, else None."""
    if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or os.strerror(e.errno)}"
    return None


SCRATCH_PREFIX = "fleet-scratch-"


def make_scratch() -> str:
    """This process's scratch folder; first, sweep those of workers that died without cleaning up
    (SIGKILL, OOM), recognised by a pid in the name that no longer runs."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.listdir(root):
            if not entry.startswith(SCRATCH_PREFIX):
                continue
            pid = entry[len(SCRATCH_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


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


def output_name(item: str, suffix: str) -> str:
    return f"part-{item}{suffix}"


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


def standby_rank(name: str) -> str:
    """Workers agree on who stays on standby by this order: a hash, so standbys spread over VMs."""
    return hashlib.sha256(name.encode()).hexdigest()


class Worker:
    def __init__(self, bucket: str, run: str, name: str | None = None, poll: float | None = None,
                 standby: int | None = None):
        self.store: Store = open_store(bucket)
        self.run = run
        self.spec: RunSpec = load_spec(self.store, run)
        check_pinned(self.spec.code_version)  # a snapshot of other code must not touch this run
        # None: stay until every item is done or failed. A number: leave once nothing is claimable
        # and that many idle workers ranked before this one stay to take over expiring leases.
        self.standby = standby
        self.items: list[Item] = load_items(self.store, run)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.leases = Leases(self.store, lease_prefix(run), self.name, self.spec.lease_ttl, self.spec.max_attempts)
        self.poll = poll if poll is not None else min(10.0, max(0.2, self.spec.lease_ttl / 6))
        self.output = open_store(self.spec.output)
        self.counters = Counters()
        self.job = load_job(self.spec.job)
        self.config = self.job.parse_config(self.spec.config)
        # The files the run pinned (a vocab) must still be what was planned, or records would mix.
        self.converter = self.job.converter(self.config, pinned_opener(self.spec, self.job, self.config))
        self.read_options = read_options(self.spec)
        self.scratch = make_scratch()
        # Removed with the worker, however it ends short of a kill (a worker made in-process by a test too).
        self._sweep = weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self.current: str | None = None
        self.holding: Held | None = None  # from claim to the end of process(), for a SIGTERM in between
        self.live_window = max(4 * self.poll + 1.0, 3.0)  # an idle worker beats every poll
        self.idle_marked = False

    # -- heartbeat -------------------------------------------------------------
    def beat(self, state: str) -> None:
        body = {"worker": self.name, "host": socket.gethostname(), "pid": os.getpid(), "state": state,
                "item": self.current, "updated": time.time(), **self.counters.__dict__}
        try:
            self.store.write(worker_prefix(self.run) + self.name, json.dumps(body, sort_keys=True).encode(),
                             idempotent=True)  # only this worker writes it: a replay is harmless
        except Exception as e:  # a heartbeat is advisory; never let it stop the work
            log.warning("heartbeat failed: %s", e)

    # -- one item ----------------------------------------------------------------
    def _documents(self, item: Item, workdir: str, renewer: _Renewer, tally: Tally) -> Iterator[list[str]]:
        for n, doc in enumerate(read_slice(item.slice, workdir, tally, self.read_options)):
            if n == 0:
                _test_pause("converting", item.id)
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")
            yield doc

    def process(self, item: Item, held: Held) -> None:
        _test_pause("claimed", item.id)
        self.current = item.id
        self.beat("working")
        t0 = time.time()
        renewer = _Renewer(self.leases, held, self.beat)
        renewer.start()
        try:
            with tempfile.TemporaryDirectory(prefix=f"item-{item.id}-", dir=self.scratch) as workdir:
                sink = DirSink(workdir)
                ctx = ItemContext(item.id, item_seed(self.job.seed(self.config), item.id), item.slice.display)
                tally = Tally()
                stats = dict(self.converter.convert(self._documents(item, workdir, renewer, tally), ctx, sink))
                tally.documents_cut += int(item.cuts_document)
                stats.update(tally.stats())
                outputs = []
                for suffix, path in sink.files:
                    if renewer.lost.is_set():
                        raise Lost(f"item {item.id}: lease taken over")
                    name = output_name(item.id, suffix)
                    try:
                        generation = self.output.upload_file(name, path)
                    except StoreError as e:  # the output place refuses every item alike
                        raise Environment(f"writing outputs: {e}") from None
                    outputs.append({"name": name, "size": os.path.getsize(path), "sha256": sha256_file(path),
                                    "generation": generation, "version": self._version_of(name, generation)})
            renewer.finish()
            if renewer.lost.is_set():
                raise Lost(f"item {item.id}: lease taken over")
            _test_pause("uploaded", item.id)  # no renewal from here to the commit: the risky gap
            stats.update(input_bytes=item.size, seconds=round(time.time() - t0, 3))
            self.leases.commit(held, outputs, stats)
            self.counters.items_done += 1
            self.counters.bytes_done += item.size
            log.info("item %s done in %.1fs (%s)", item.id, time.time() - t0, item.slice.display)
        except Lost as e:
            renewer.finish()
            self.counters.items_lost += 1
            log.warning("%s; discarding its work", e)
        except InputError as e:
            renewer.finish()
            self.leases.fail(held, str(e), retry=False)
            self.counters.items_failed += 1
            log.error("item %s failed: %s", item.id, e)
        except Shutdown:
            renewer.finish()
            self.release(held)
            raise
        except Exception as e:
            renewer.finish()
            reason = str(e) if isinstance(e, Environment) else environmental(e)
            if reason is not None:
                self._give_back(held)
                raise Environment(reason) from None
            message = f"{item.slice.display}: {type(e).__name__}: {e}".splitlines()[0]
            final = self.leases.fail(held, message, retry=True)
            if final:
                self.counters.items_failed += 1
            elif held.lease.expires == 0.0:
                self.announce_release(item.id)
            # A store error (403, bucket gone) is explained by its one line; anything else is a bug: keep the trace.
            trace = "" if isinstance(e, StoreError) else "\n" + traceback.format_exc()
            log.error("item %s attempt %d failed%s: %s%s", item.id, held.lease.attempt,
                      " for good" if final else "", message, trace)
        finally:
            self.current = None

    def _version_of(self, name: str, generation: int) -> str:
        """The uploaded object's version, which a cheap check of the outputs compares (see
        fleet.verify): "" if it is already another generation (then the generation is compared)."""
        blob = self.output.stat(name)
        return blob.version if blob is not None and blob.generation == generation else ""

    def _give_back(self, held: Held) -> None:
        """Release an item without spending an attempt; if even that cannot be written (the
        full disk holds the bucket too), its lease simply expires."""
        try:
            self.release(held)
        except Exception as e:
            log.warning("could not give item %s back (%s); its lease expires in %.0f s", held.item,
                        environmental(e) or e, max(0.0, held.lease.expires - time.time()))

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

    def _unannounce(self, item: str) -> None:
        try:
            self.store.delete(released_prefix(self.run) + item)
        except Exception as e:
            log.warning("released marker for %s not removed: %s", item, e)

    # -- the loop ------------------------------------------------------------------
    def run_until_drained(self) -> Counters:
        """Visit items until all are done or failed (or this worker may leave).

        Coordination costs a few requests per item, whatever the fleet size: each pass
        takes two listings, and fleet.claims decides from them which items to try and
        which leases are worth reading. After an item a worker goes on to the next item
        that had no lease in its listing, and lists again as soon as one turns out taken:
        listings are taken about as often as they go stale.
        """
        policy = ClaimPolicy([item.id for item in self.items], self.name, self.spec.lease_ttl,
                             standby=self.standby is not None)
        by_id = {item.id: item for item in self.items}
        prefix, final, back = lease_prefix(self.run), final_prefix(self.run), released_prefix(self.run)
        self.beat("starting")
        while True:
            # Leases before markers (see ClaimPolicy.observe): a marker counts only with its lease.
            listing = {b.name[len(prefix):]: b.generation for b in self.store.list(prefix)}
            finals = [b.name[len(final):] for b in self.store.list(final)]
            policy.observe(finals, listing, time.monotonic(), [b.name[len(back):] for b in self.store.list(back)])
            worked = False
            for item_id, fresh in policy.candidates(time.monotonic(), time.time()):
                if worked and not fresh:
                    break  # stalled leases are judged from fresh listings only
                item = by_id[item_id]
                current = None
                if not fresh:
                    current = policy.current(item_id)
                    if current is None:
                        current = self.leases.read(item_id)
                        if current is not None:
                            policy.remember(item_id, *current)
                    if current is not None:
                        if current[0].terminal:  # its committer died before writing the marker
                            self._finish(policy, item_id, current[0])
                            continue
                        if current[0].live(time.time()):
                            if item_id in policy.released and current[0].worker != self.name:
                                self._unannounce(item_id)  # taken again already: the marker is stale
                            continue  # a slow renewal, not a dead holder: wait for its expiry
                stale = fresh and item_id in policy.stale
                if stale and not self.drop_stale_marker(item_id):
                    continue  # a new lease beside the old marker would read as finished
                got = self.leases.claim(item_id, current)
                if isinstance(got, Held):
                    if stale:  # the lease was really gone (else the claim finds it, and the marker is rewritten)
                        log.warning("item %s: a final/ marker without its lease (stale: the lease was deleted); "
                                    "marker removed, the item is converted again", item_id)
                    if item_id in policy.released:
                        self._unannounce(item_id)
                    self.mark_idle(False)
                    self.holding = got
                    self.process(item, got)
                    self.holding = None
                    worked = True
                    policy.remember(item_id, got.lease, got.generation)
                    if got.lease.terminal:
                        self._finish(policy, item_id, got.lease)
                    continue  # the next unleased item of this listing, until one turns out taken
                if isinstance(got, Lease):
                    if got.terminal:
                        self._finish(policy, item_id, got)
                    else:
                        policy.forget(item_id)
                if fresh and worked:
                    break  # this listing has gone stale while we worked: take fresh ones
            if policy.drained():
                return self.leave()
            policy.end_pass(worked)
            if not worked:
                if self.standby is not None and self.standbys_ahead() >= self.standby:
                    log.info("leaving: nothing to claim, and %d standby worker(s) stay", self.standby)
                    return self.leave()
                self.mark_idle(True)
                self.beat("idle")
                time.sleep(self.poll * random.uniform(0.8, 1.2))

    def _finish(self, policy: ClaimPolicy, item: str, lease: Lease) -> None:
        self.mark_final(item, lease)
        policy.finished(item)
        if item in policy.released:
            self._unannounce(item)

    def leave(self) -> Counters:
        self.mark_idle(False)
        self.beat("exited")
        return self.counters

    def close(self) -> None:
        self._sweep()

    def mark_idle(self, idle: bool) -> None:
        """Keep this worker's idle/ marker in step with its state (advisory: the heartbeat
        says whether it is alive, so a marker left by a dead worker misleads no one)."""
        if idle == self.idle_marked:
            return
        name = idle_prefix(self.run) + self.name
        try:
            if idle:
                self.store.write(name, b"", idempotent=True)
            else:
                self.store.delete(name)
            self.idle_marked = idle
        except Exception as e:
            log.warning("idle marker not %s: %s", "written" if idle else "removed", e)

    def mark_final(self, item: str, lease: Lease) -> None:
        """A marker that lets every worker (and status) see the item is finished from a listing."""
        try:  # create-only: a finished item never changes, so the marker is never rewritten
            self.store.write(final_prefix(self.run) + item, lease.state.encode(), if_generation_match=0)
        except PreconditionFailed:
            pass  # already there (or our own write, replayed after a lost response)
        except Exception as e:  # advisory: the lease stays the truth, and readers fall back to it
            log.warning("final marker for %s not written: %s", item, e)

    def drop_stale_marker(self, item: str) -> bool:
        """A final/ marker whose lease is gone (deleted by hand, or a reopen cut short) says
        nothing: the lease is the truth. Remove it before claiming the item as new, so that
        no one takes the new lease for a finished one."""
        try:
            self.store.delete(final_prefix(self.run) + item)
            return True
        except Exception as e:  # tried again next pass
            log.warning("stale final marker for %s not removed: %s", item, e)
            return False

    def standbys_ahead(self) -> int:
        """Live idle workers ranked before this one, counted up to `standby`.

        Every worker ranks all by the same hash, so when many go idle at once the
        first `standby` of them stay and the rest leave: a bounded tail that is
        never empty while an item is unfinished (a standby that dies stops
        beating, and the next in rank stops leaving). One listing of idle/
        markers, then heartbeat reads that stop at `standby` live ones.
        """
        prefix = idle_prefix(self.run)
        mine = standby_rank(self.name)
        idle = (b.name[len(prefix):] for b in self.store.list(prefix))
        ahead = sorted((name for name in idle if standby_rank(name) < mine), key=standby_rank)
        found, now = 0, time.time()
        for name in ahead:
            if found >= (self.standby or 0):
                break
            try:
                beat = json.loads(self.store.read(worker_prefix(self.run) + name))
            except Exception:  # gone or half-written: not a standby
                continue
            if beat.get("state") == "idle" and now - float(beat.get("updated", 0)) < self.live_window:
                found += 1
        return found


def _setup_logging(name: str, log_file: str | None) -> None:
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _on_sigterm(signum, frame):
    # Once only: a second SIGTERM (a VM's shutdown signals every process, and startup.sh forwards
    # its own), or SIGTERM after Ctrl-C (fleet local stops its workers), must not interrupt the
    # release of the item being given back. A handler that does nothing, not SIG_IGN: a signal
    # already pending when the handler changes would otherwise raise "ignored due to race condition".
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    raise Shutdown()


def _ignore(signum, frame):
    pass


def work_one(bucket: str, run: str, name: str | None = None, log_file: str | None = None,
             standby: int | None = None) -> int:
    """One worker process until the run is drained; exit code 0 unless it crashed.

    A problem that is the user's, the store's or the machine's (no such run or bucket, 403,
    a bad or changed vocab, an unknown job, a full disk) is one log line and exit code 2,
    never a traceback; an item in hand is given back first."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _on_sigterm)  # Ctrl-C reaches every process of the group: same as SIGTERM
    try:
        worker = Worker(bucket, run, name, standby=standby)
    except Shutdown:
        return 0
    except (PlanError, ConfigError, JobNotFound, StoreError) as e:
        _setup_logging(name or "worker", log_file)
        log.error("cannot start: %s", e)
        return 2
    except OSError as e:
        _setup_logging(name or "worker", log_file)
        log.error("cannot start: %s", environmental(e) or e)
        return 2
    _setup_logging(worker.name, log_file)
    # What the worker loaded lives as long as it does (modules, the job's vocab and tokenizer): kept
    # out of the collector's reach, so its full collections no longer walk them while items convert.
    gc.freeze()
    try:
        try:
            counters = worker.run_until_drained()
        except Shutdown:
            held = worker.holding
            if held is not None and held.lease.live(time.time()):
                worker.release(held)  # the signal came after the claim, before process() could give it back
            worker.mark_idle(False)
            worker.beat("stopped")
            log.info("stopped by a signal; items given back")
            return 0
        except Environment as e:
            log.error("stopped: %s", e)
            worker.mark_idle(False)
            worker.beat("stopped")
            return 2
        except StoreError as e:  # retries (fleet.store.gcs) are spent: the store is gone or refuses us
            log.error("stopped: %s", e)
            worker.beat("stopped")
            return 2
        except OSError as e:
            reason = environmental(e)
            if reason is None:
                raise
            log.error("stopped: %s", reason)
            return 2
    finally:
        # Leaving: nothing is held any more, so a SIGTERM now (`fleet local` stops its workers once the
        # run is finished) must not interrupt the scratch sweep with a Shutdown and a traceback.
        signal.signal(signal.SIGTERM, _ignore)
        signal.signal(signal.SIGINT, _ignore)
        worker.close()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    log.info("drained: %d done, %d failed here", counters.items_done, counters.items_failed)
    return 0


def _child(bucket: str, run: str, name: str, log_file: str | None, standby: int | None = None) -> None:
    raise SystemExit(work_one(bucket, run, name, log_file, standby))


@contextlib.contextmanager
def _without_cli_main():
    """Spawn runs the parent's main script again in each child before its target (as
    ``__mp_main__``). A worker needs nothing of it (its target is ``_child``, here), and when the
    parent is the ``fleet`` command that script imports the whole CLI (typer, rich, pydantic):
    about 0.1 s of every worker's start. So, for fleet's own CLI only, the main module looks
    like no script while the children start (another main script may define what its jobs need)."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    entry = getattr(main, "main", None)
    if main is None or not (spec_name == "fleet.cli" or getattr(entry, "__module__", None) == "fleet.cli"):
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


def start_workers(bucket: str, run: str, procs: int, log_dir: str | None = None,
                  prefix: str | None = None, standby: int | None = None) -> list[multiprocessing.process.BaseProcess]:
    """Start worker processes (spawned, so no client state is shared across a fork)."""
    base = prefix or f"{socket.gethostname()}-{uuid.uuid4().hex[:4]}"
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    children = []
    for i in range(procs):
        name = f"{base}-w{i}"
        log_file = os.path.join(log_dir, f"{name}.log") if log_dir else None
        child = ctx.Process(target=_child, args=(bucket, run, name, log_file, standby), name=name)
        with _without_cli_main():
            child.start()
        children.append(child)
    return children


def stop_workers(children: list, timeout: float = 10.0) -> None:
    """SIGTERM (each gives its item back), then SIGKILL whatever is left."""
    for c in children:
        if c.is_alive():
            with contextlib.suppress(Exception):
                os.kill(c.pid, signal.SIGTERM)
    deadline = time.time() + timeout
    for c in children:
        c.join(max(0.0, deadline - time.time()))
        if c.is_alive():
            c.kill()
            c.join()


def work(bucket: str, run: str, procs: int = 1, log_dir: str | None = None, prefix: str | None = None,
         standby: int | None = None) -> int:
    """Run `procs` worker processes (one per core is right: conversion is CPU-bound)."""
    if procs == 1:
        name = f"{prefix or socket.gethostname() + '-' + uuid.uuid4().hex[:4]}-w0"
        return work_one(bucket, run, name, os.path.join(log_dir, f"{name}.log") if log_dir else None, standby)
    children = start_workers(bucket, run, procs, log_dir, prefix, standby)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop_workers(children))
    try:
        pending = list(children)
        while pending:
            for c in list(pending):
                c.join(0.2)
                if c.is_alive():
                    continue
                pending.remove(c)
                if c.exitcode == 0 and pending and drained(bucket, run):
                    # The others can only be idle now, waiting out a poll: let them go at once.
                    stop_workers(pending)
                    pending = []
                    break
    except KeyboardInterrupt:  # Ctrl-C reached the children too: they give their items back
        stop_workers(children)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [c.exitcode for c in children if c.exitcode and c.exitcode != -signal.SIGTERM]
    if not failed:
        return 0
    return 2 if all(code == 2 for code in failed) else 1  # 2: each said why in one line (work_one)


def drained(bucket: str, run: str) -> bool:
    """Every item finished: one listing of the leases, then one of the final/ markers; a
    marker counts only while its lease is there (a stale one must not stop the workers)."""
    try:
        store = open_store(bucket)
        prefix, final = lease_prefix(run), final_prefix(run)
        leased = {b.name[len(prefix):] for b in store.list(prefix)}
        finals = {b.name[len(final):] for b in store.list(final)}
        return len(finals & leased) >= load_spec(store, run).items
    except Exception:  # then the workers find out themselves
        return False

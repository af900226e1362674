"""The worker loop a VM (or `fleet local`) runs: claim, convert, commit, leave.

Each worker process visits the items in its own shuffled order, so many
workers do not all contend for the same lease object, and stops when every
item is done or failed. What happens to an item once claimed (renewal, the
converter, upload, commit or failure) is fleet.core.attempt's; starting and stopping
worker processes is fleet.core.processes'.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
import uuid
import weakref
from typing import Sequence

from fleet.core.attempt import SHIELD, Counters, ItemRunner, _test_pause
from fleet.core.claims import STEAL, SWEEP, VISIT, ClaimPolicy
from fleet.core.codesync import check_pinned
from fleet.core.discovery import load_job
from fleet.core.lease import Held, Lease, Leases
from fleet.core.liveness import pid_alive
from fleet.core.run import Item, RunSpec, StepPlan, load_items, load_spec, pinned_opener
from fleet.core.layout import (
    done_prefix,
    final_prefix,
    finishing_name,
    idle_prefix,
    lease_prefix,
    released_prefix,
    worker_prefix,
)
from fleet.core.manifest import Renewal, run_ended
from fleet.core.status import EarlierLives, StatusReader, earlier_lives
from fleet.core.store import NotFound, PreconditionFailed, open_store
from fleet.core.store.metered import MeteredStore

log = logging.getLogger("fleet.worker")


SCRATCH_PREFIX = "fleet-scratch-"


def make_scratch() -> str:
    """This process's scratch folder; first, sweep those of workers that died without cleaning up
    (SIGKILL, OOM), recognised by a pid in the name that no longer runs."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.listdir(root):
            if not entry.startswith(SCRATCH_PREFIX):
                continue
            pid = entry[len(SCRATCH_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def standby_rank(name: str) -> str:
    """Workers agree on who stays on standby by this order: a hash, so standbys spread over VMs."""
    return hashlib.sha256(name.encode()).hexdigest()


class Worker:
    """One worker process's claim loop: which item to try next, from listings of the leases and
    markers (fleet.core.claims decides), its heartbeat, idle and final markers, and when to leave;
    an item claimed is handed to the ItemRunner (fleet.core.attempt)."""

    def __init__(
        self, bucket: str, run: str, name: str | None = None, poll: float | None = None, standby: int | None = None
    ):
        self.store = MeteredStore(open_store(bucket))  # its requests counted, for the heartbeat
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
        self.counters = Counters()
        earlier = earlier_lives(self._last_beat()) if name else EarlierLives()
        self._earlier = {"earlier": earlier.to_dict()} if earlier.lives else {}  # the same in every beat
        self.job = load_job(self.spec.job)
        self.config = self.job.parse_config(self.spec.config)
        # The files the run pinned (a vocab) must still be what was planned, or records would mix.
        opener = pinned_opener(self.spec, self.job, self.config)
        steps = StepPlan(self.spec)
        converter = self.job.converter(self.config, opener)
        self.scratch = make_scratch()
        # Removed with the worker, however it ends short of a kill (a worker made in-process by a test too).
        self._sweep = weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self.runner = ItemRunner(
            self.store,
            self.spec,
            self.leases,
            converter,
            self.job.seed(self.config),
            self.scratch,
            self.counters,
            self.beat,
            reducer=lambda stage: self.job.reducer(self.config, opener, stage),
            steps=steps,
            items=self.items,
        )
        self.runner.output = MeteredStore(self.runner.output, self.store.meter)  # the outputs' uploads too
        self.holding: Held | None = None  # from claim to the end of process(), for a SIGTERM in between
        self.live_window = max(4 * self.poll + 1.0, 3.0)  # an idle worker beats every poll
        self.idle_marked = False
        self.sleeping = False  # between idle sweeps, holding nothing
        self.found_drained = False  # it left because the run's drain was confirmed and ended (end_run)
        self.started = time.time()  # a drain ended before this is an earlier one's (run_ended)
        self.finishing: tuple[contextlib.ExitStack, Renewal] | None = None  # while it holds the claim to end the run
        self.awaiting_end = False  # the run found drained, another worker confirming it and writing its files

    # -- heartbeat -------------------------------------------------------------
    def _last_beat(self) -> dict | None:
        """The heartbeat an earlier life of this name left (or None): this one's overwrites it.
        Asked by a stat first: a read of a missing object makes the GCS store look the bucket up
        (storage.buckets.get), which the workers' role does not hold."""
        name = worker_prefix(self.run) + self.name
        try:
            if self.store.stat(name) is None:
                return None
            beat = json.loads(self.store.read(name))
            return beat if isinstance(beat, dict) else None
        except NotFound:
            return None
        except Exception as e:  # advisory, as a heartbeat is: its figures are then short of that life's
            log.warning("the heartbeat of an earlier %s not read: %s", self.name, e)
            return None

    def beat(self, state: str) -> None:
        body = {
            "worker": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": state,
            "item": self.runner.current,
            "started": self.started,
            "updated": time.time(),
            **self.counters.__dict__,
            "requests": self.store.meter.for_beat(),
            **self._earlier,
        }
        try:
            self.store.write(
                worker_prefix(self.run) + self.name, json.dumps(body, sort_keys=True).encode(), idempotent=True
            )  # only this worker writes it: a replay is harmless
        except Exception as e:  # a heartbeat is advisory; never let it stop the work
            log.warning("heartbeat failed: %s", e)

    def _unannounce(self, item: str) -> None:
        try:
            self.store.delete(released_prefix(self.run) + item)
        except Exception as e:
            log.warning("released marker for %s not removed: %s", item, e)

    # -- the loop ------------------------------------------------------------------
    def run_until_drained(self) -> Counters:
        """Visit items until all are done or failed (or this worker may leave).

        Coordination costs a few requests per item, whatever the fleet's size and the run's: a
        pass lists one window of the leases and markers (fleet.core.claims says which, and when a
        worker steals or sweeps instead), and fleet.core.claims decides from the listings which
        items to try and which leases are worth reading. After an item a worker goes on to the
        next item that had no lease in its listing, and lists again as soon as one turns out
        taken: listings are taken about as often as they go stale.
        """
        try:
            return self._claim_loop()
        finally:
            self.release_finish()  # (a signal or an error while confirming the drain: the next to drain does)

    def _claim_loop(self) -> Counters:
        policy = ClaimPolicy(
            [item.id for item in self.items],
            self.name,
            self.spec.lease_ttl,
            steps={i.id: i.step for i in self.items if i.step},
            barriers=[i.id for i in self.items if i.meta.get("barrier")],
        )
        prefix, final, back = lease_prefix(self.run), final_prefix(self.run), released_prefix(self.run)
        done = done_prefix(self.run)
        self.beat("starting")
        kind, window, confirm = STEAL, None, False
        while True:
            SHIELD.check()  # (a stop whose Shutdown a finalizer swallowed: now, not at the next claim)
            targets: list[int] | None = None
            if kind in (STEAL, SWEEP) and not confirm:  # where is work left? the done/ markers first
                policy.observe_marks(b.name[len(done) :] for b in self.store.list(done))
            if kind == STEAL:  # then a window picked at random
                window = policy.steal()
                kind = VISIT if window is not None else SWEEP
            if kind == SWEEP:
                window = None
                targets = policy.sweep_targets(full=confirm)
            # Leases before markers (see ClaimPolicy.observe): a marker counts only with its lease.
            released = None
            for scope in [window] if kind == VISIT else targets if targets is not None else [None]:
                bounds = () if scope is None else policy.windows[scope].bounds("")
                listing = {
                    b.name[len(prefix) :]: b.generation for b in self.store.list(prefix, *(prefix + x for x in bounds))
                }
                finals = [b.name[len(final) :] for b in self.store.list(final, *(final + x for x in bounds))]
                if released is None:
                    released = [b.name[len(back) :] for b in self.store.list(back)]
                policy.observe(finals, listing, time.monotonic(), released, window=scope, sweep=kind == SWEEP)
            for barrier in policy.unknown_barriers():  # a stage opens (or is blocked) by its barrier's state
                current = self.leases.read(barrier)
                if current is not None:
                    policy.remember(barrier, *current)
            worked = self._try_candidates(policy, self.by_id, window)
            self.mark_windows(policy)
            if kind == SWEEP:
                if confirm:
                    self.unmark_windows(policy)
                if policy.drained():
                    # One worker confirms the drain and ends the run (fleet.core.manifest.claim_finish):
                    # the others wait for its word, idle, rather than each listing every lease and marker.
                    if self.finishing is None:
                        self.claim_finish()  # (first: a read of a claim not there would ask for the bucket)
                        if self.finishing is None and run_ended(self.store, self.run, self.started):
                            return self.leave(drained=True)
                    if self.finishing is not None:
                        self.awaiting_end = False
                        if confirm or targets is None:  # a listing of every lease and marker says so too
                            return self.end_run()
                        confirm = True  # markers say so: a sweep of every lease and marker must too
                        continue
                    self.awaiting_end = True
                else:
                    self.awaiting_end = False
                    if self.finishing is not None:  # the confirming sweep found an item unfinished
                        self.release_finish()
                confirm = False
            next_pass = policy.end_pass(kind, worked, window)
            if kind == SWEEP and not worked:
                if self.standby is not None and not policy.waiting() and self.standbys_ahead() >= self.standby:
                    log.info("leaving: nothing to claim, and %d standby worker(s) stay", self.standby)
                    return self.leave()
                self.mark_idle(True)
                self.beat("idle")
                self.sleeping = True  # (fleet.core.processes may end this sleep: a sibling found the run drained)
                try:
                    time.sleep(self.poll * random.uniform(0.8, 1.2))
                finally:
                    self.sleeping = False
            kind, window = next_pass

    def _try_candidates(self, policy: ClaimPolicy, by_id: dict[str, Item], window: int | None) -> bool:
        """Try this pass's candidates in order; True if an item was worked on."""
        worked = False
        for item_id, fresh in policy.candidates(time.monotonic(), time.time(), window):
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
            with SHIELD:  # a signal now waits until the worker knows whether it holds the item
                got = self.leases.claim(item_id, current)
                _test_pause("leased", item_id)
                if isinstance(got, Held):
                    self.holding = got
            if isinstance(got, Held):
                if stale:  # the lease was really gone (else the claim finds it, and the marker is rewritten)
                    log.warning(
                        "item %s: a final/ marker without its lease (stale: the lease was deleted); "
                        "marker removed, the item is converted again",
                        item_id,
                    )
                if item_id in policy.released:
                    self._unannounce(item_id)
                self.mark_idle(False)
                self.holding = got
                policy.worked_in(item_id)
                self.runner.process(item, got)
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
        return worked

    def mark_windows(self, policy: ClaimPolicy) -> None:
        """A done/ marker for each window a listing showed finished: create-only (a finished window
        stays finished until a reopen removes its marker first) and advisory (sweeps trust none).
        It holds the window's counts (fleet.core.window_counts), so the run's end reads a marker
        per window rather than a lease per item; a marker there already is not made again."""
        for w in policy.to_mark():
            name = done_prefix(self.run) + w.key
            try:
                generation = self.store.write(name, b"", if_generation_match=0)
            except PreconditionFailed:
                policy.marked_now(w)  # another worker's (its counts are its to write), or our own replayed
                continue
            except Exception as e:
                log.warning("done marker of window %s not written: %s", w.key, e)
                continue
            policy.marked_now(w)
            # The marker's creator alone reads the window's leases for its counts: the others lost
            # the create above before reading anything. Empty until then, it holds no counts.
            try:
                self.store.write(name, self._window_body(policy, w.items), if_generation_match=generation)
            except Exception as e:  # (PreconditionFailed: unmarked since) the run's end reads the leases
                log.warning("counts of window %s not kept in its done marker: %s", w.key, e)

    def _window_body(self, policy: ClaimPolicy, items: Sequence[str]) -> bytes:
        from fleet.core.window_counts import window_body

        generations = {i: policy.listing.get(i, -1) for i in items}  # (-1: not listed, read it)
        for i in items:
            known = policy.known.get(i)
            if known is not None and known[1] == generations[i]:
                self.counts_reader.remember(i, *known)  # read or committed by this worker: not read again
        try:
            return window_body((self.by_id[i] for i in items), self.counts_reader.read_leases(generations))
        finally:
            self.counts_reader.forget(items)  # (a worker's memory does not grow with the windows it marks)

    @functools.cached_property
    def counts_reader(self) -> StatusReader:
        """Reads leases for the windows' counts and the run's end, caching them by generation."""
        return StatusReader(self.store, self.run, spec=self.spec, items=self.items)

    @functools.cached_property
    def by_id(self) -> dict[str, Item]:
        return {item.id: item for item in self.items}

    def unmark_windows(self, policy: ClaimPolicy) -> None:
        """Remove the done/ markers of windows a sweep found unfinished (a lease deleted by hand)."""
        for w in policy.stale_marks():
            log.warning("window %s: a done/ marker, but an item in it is not finished; marker removed", w.key)
            try:
                self.store.delete(done_prefix(self.run) + w.key)
                policy.unmarked(w)
            except Exception as e:
                log.warning("stale done marker of window %s not removed: %s", w.key, e)

    def _finish(self, policy: ClaimPolicy, item: str, lease: Lease) -> None:
        self.mark_final(item, lease)
        policy.finished(item)
        if item in policy.released:
            self._unannounce(item)

    def leave(self, drained: bool = False) -> Counters:
        """Stop. ``drained``: the run's drain is confirmed and ended (end_run): the VM may take the
        fleet with it (fleet work --drained-file), since the run's files are written by then."""
        self.release_finish()
        self.mark_idle(False)
        self.found_drained = drained
        self.beat("exited")
        return self.counters

    # -- ending the run: one worker confirms the drain and writes the run's files --------------------
    def claim_finish(self) -> None:
        """Take the claim to end the run if no other live worker holds it (fleet.core.manifest),
        renewed from here until end_run or release_finish."""
        from fleet.core.manifest import claim_finish, holding_finish

        try:
            generation = claim_finish(self.store, self.run, self.name, self.spec.lease_ttl, started=self.started)
        except Exception as e:  # advisory: tried again at the next sweep
            log.warning("the claim to end the run was not taken: %s", e)
            return
        if generation is not None:
            stack = contextlib.ExitStack()
            renewal = stack.enter_context(
                holding_finish(self.store, self.run, self.name, generation, self.spec.lease_ttl / 3)
            )
            self.finishing = (stack, renewal)

    def release_finish(self) -> None:
        """Give the claim up (the drain was not confirmed, or the worker leaves), for the next to drain."""
        if self.finishing is None:
            return
        stack, _ = self.finishing
        self.finishing = None
        stack.close()
        try:
            self.store.delete(finishing_name(self.run))
        except Exception as e:  # it ages: another worker takes it over after a TTL
            log.warning("the claim to end the run was not given up: %s", e)

    def stopped_after_the_end(self) -> bool:
        """A worker stopped (SIGTERM) while it waited for the run's end: whether the end came first.
        The VM that ends the run deletes the fleet, and so stops the VMs still waiting for its word:
        those left a drained run (their boots are done), not an unfinished one. One read."""
        if not self.awaiting_end or self.holding is not None:
            return False
        try:
            ended = run_ended(self.store, self.run, self.started)
        except Exception:  # (the store down: the boot counts as stopped, which is safe)
            return False
        if ended:
            self.found_drained = True
            log.info("stopped after the run ended: it left drained")
        return ended

    def end_run(self) -> Counters:
        """The drain confirmed by this worker's listing of every lease and marker: write the run's
        files, then say on the claim that the run ended, so that the workers waiting for it leave,
        after the files (a VM that leaves drained deletes the fleet: it must not cut the files short)."""
        from fleet.core.manifest import end_claim

        files = self.write_run_files()
        assert self.finishing is not None  # (run_until_drained ends the run only while it holds the claim)
        stack, renewal = self.finishing
        self.finishing = None
        stack.close()  # (renewals stop: the generation to match is the last one)
        try:
            end_claim(self.store, self.run, self.name, renewal.generation, files)
        except Exception as e:  # its claim ages, and the next worker to drain ends the run
            log.warning("the run's end not recorded: %s", e)
        return self.leave(drained=True)

    def write_run_files(self) -> str:
        """The run's manifest and the job's run files (fleet.core.manifest), if every item is done:
        the writes are create-only and the bytes a pure function of the leases, so any other
        writer (a claim taken over, `fleet local`) finds them equal. Returns what became of them,
        for the claim's last word; a failure is logged, never stops the worker (`fleet local`
        writes them too)."""
        from fleet.core.manifest import MANIFEST, finish_run
        from fleet.core.window_counts import run_counts

        try:
            output = self.runner.output
            if output.stat(MANIFEST) is not None:
                return "written"  # by an earlier drain (the same bytes: a pure function of the leases)
            _test_pause("finishing", "")
            manifest, _ = finish_run(output, self.job, self.config, self.spec, run_counts(self.counts_reader))
        except Exception as e:
            log.warning("run files not written: %s", e)
            return f"not written: {e}"
        if manifest is None:
            return "not due: an item failed or is blocked"
        log.info("run finished: %s written with %d output(s) counted", MANIFEST, len(manifest.outputs))
        return "written"

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
        idle = (b.name[len(prefix) :] for b in self.store.list(prefix))
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

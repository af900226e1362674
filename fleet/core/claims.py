"""Which item a worker tries next, and what it lists to find out: the claim policy, apart from the
I/O that feeds it.

A worker decides from listings and reads almost nothing: finished items are the ``final/``
markers of listed leases (the lease is the truth: a marker whose lease is gone is stale, and its
item is claimed as new); an item with no lease is tried first (claimed by a create-only write); a
lease is read only when its generation has stood still, by this worker's own clock, for half a
TTL, while holders rewrite theirs every third of one. So only dead, released or failed-for-retry
leases are ever read, and a lease whose holder keeps renewing is never taken, whatever the skew
between clocks. Idle workers keep the same rule: before, a standby also read every lease in
flight that it had not seen at its current generation, which in the tail of a run is each renewal
of each item still converting, by each idle worker (lease reads rose from 1.3 to 5.2 an item
between 20,000 and 100,000 items in bench/scale_sim.py), to save at most half a TTL on a lease
that was dead before it looked. An item given back (preemption, shutdown, a failure to retry) is
announced by a marker in ``released/`` that every worker lists, so a busy fleet takes it at once.

What is listed, so that coordination costs the same per item at a thousand items or a million
(fleet.core.windows says why windows). A pass is one of:

- ``VISIT``: one window's leases and markers (two ranged listings, one call each). A worker
  stays in its window while it finds work there, each worker in its own order of the window's
  items, and lists it again after each item (the listing went stale while it worked).
- ``STEAL``: when its window has nothing left to claim, a worker first walks on to the next
  window (most often still untouched), then lists the ``done/`` markers of finished windows
  (``windows / 1,000`` calls: 64,000 items a call) and visits a window picked at random among the
  unfinished ones, its own random pick, so that workers spread over what is left.
- ``SWEEP``: after a few fruitless visits, every window that is not finished: the ``done/``
  markers, then a visit of each unfinished window of the open steps, or, when that would cost as
  much, every lease and every marker (``items / 1,000`` calls). Only a sweep sees all that is
  left, so only after one may a worker leave as a spare standby. One worker confirms a drain: the
  one that takes the claim to end the run (fleet.core.manifest.claim_finish) sweeps every lease and
  marker, trusting no ``done/`` marker (a window whose items it finds unfinished is unfinished, and
  its marker is removed), and writes the run's files; the others wait for its word, or leave as
  spares. Idle workers sweep once a poll; busy ones sweep only when windows keep turning up nothing. In the tail the unfinished windows are the few that hold
  live leases, so an idle worker's sweep costs a few calls, not the run's size.

Per item a busy worker therefore lists its window about once (3 calls with ``released/``), and
the listings that do grow with the run (steals, sweeps) happen a bounded number of times per
worker, not per item, and the drain's confirmation once a run. A SIGKILLed worker's lease is found by whoever lists its window twice half a
TTL apart, and at the latest by the sweeps of the tail.

Pure: the worker loop (fleet.core.spawner) lists, reads and writes; this decides.
"""

from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.windows import Window, cut_windows

VISIT, STEAL, SWEEP = "visit", "steal", "sweep"
WALK = 1  # fruitless visits after which a worker stops walking to the next window and steals
STEALS = 2  # fruitless steals after which it sweeps


class ClaimPolicy:
    def __init__(
        self,
        items: Sequence[str],
        worker: str,
        lease_ttl: float,
        steps: Mapping[str, int] | None = None,
        barriers: Iterable[str] = (),
        window: int | None = None,
    ):
        self.worker = worker
        self.rng = random.Random(worker)  # each worker its own picks: 200 do not queue on one window
        # A run with stages (fleet.core.run.StepPlan): an item of a step is tried only once every item
        # of the steps before is finished, and every barrier before is done (a failed one blocks the rest).
        self.steps = dict(steps or {})
        self.windows: list[Window] = cut_windows(((i, self.steps.get(i, 0)) for i in items), window)
        self.window_of = {item: w.index for w in self.windows for item in w.items}
        self.by_key = {w.key: w.index for w in self.windows}
        self.sweep_order = [w.index for w in self.windows]
        self.rng.shuffle(self.sweep_order)  # a sweep's claims, too, start where others' do not
        self.step_list = sorted({w.step for w in self.windows} | {0})
        self.barrier_of = {self.steps.get(b, 0): b for b in barriers}
        # What this worker knows, each window's part replaced whenever the window is listed.
        self.terminal: set[str] = set()  # finished as of the last listing of its window
        self.stale: set[str] = set()  # final/ markers whose lease was not listed: not finished
        self.known: dict[str, tuple[Lease, int]] = {}  # leases read: (lease, its generation)
        self.since: dict[str, tuple[int, float]] = {}  # item -> (generation listed, monotonic time first listed)
        self.listing: dict[str, int] = {}
        self.released: set[str] = set()  # items announced as given back: read at once
        # Windows whose items are all finished: from listings, or from done/ markers (trusted until a sweep).
        self.done: set[int] = set()
        self.unfinished = {step: {w.index for w in self.windows if w.step == step} for step in self.step_list}
        self.marked: set[int] = set()  # windows whose done/ marker is known to exist
        self.seen_done: set[int] = set()  # windows seen finished by a listing, and not yet marked
        self.worked_here: set[int] = set()  # windows this worker claimed in, until it marks them
        self.still = lease_ttl / 2
        self.current_window: int | None = None
        self.fruitless = 0  # passes in a row with nothing claimed, since the last claim or sweep

    # -- what a pass saw -------------------------------------------------------------------------
    def observe(
        self,
        finals: Iterable[str],
        listing: dict[str, int],
        now: float,
        released: Iterable[str] = (),
        window: int | None = None,
        sweep: bool = False,
    ) -> None:
        """A pass's listings: finished items, the leases' generations (``now``: monotonic) and the
        items announced as given back, of one window, or (``window`` None) of the whole run. List
        the leases before the markers: a marker is written after its lease is done and removed
        before its lease is, so a marker seen after its lease was listed belongs to that lease.

        Finished is recomputed from these listings for every item they cover, never kept from an
        earlier one: a lease deleted since (``fleet status --verify`` reopening it, or a hand)
        makes its item unfinished again, whatever marker is left. Names the listings hand back
        that are not this window's items (a stage id in a map window's range) are ignored.
        ``sweep``: a window visited by a sweep, which marks it done/ if it finds it finished (else
        only the worker that worked in a window does: its last committer)."""
        scope = self.windows if window is None else [self.windows[window]]
        # (The whole run's items are window_of's keys: a sweep of a million items builds no set of them.)
        covered = self.window_of if window is None else set(self.windows[window].items)
        finals = {f for f in finals if f in covered}
        listing = {k: v for k, v in listing.items() if k in covered}
        if window is None:
            self.listing, self.terminal, self.stale = {}, set(), set()
        else:
            for item in covered:
                self.listing.pop(item, None)
                self.terminal.discard(item)
                self.stale.discard(item)
        self.listing.update(listing)
        self.stale |= finals - listing.keys()
        self.terminal |= finals & listing.keys()
        self.terminal |= {
            item
            for item, (lease, gen) in self.known.items()  # (read: this worker's own, mostly)
            if lease.terminal and item in covered and listing.get(item) == gen
        }
        self.released = set(released)
        elsewhere = {item for item in self.released if item not in covered and item in self.window_of}
        for item in elsewhere:  # rewritten (or reopened) since this worker listed it: read it afresh
            self.listing.pop(item, None)
            self.terminal.discard(item)
        since = self.since
        for name, gen in listing.items():
            seen = since.get(name)
            if seen is None or seen[0] != gen:
                since[name] = (gen, now)
        for w in scope:  # a window's last committer marks it: one marker write a window, not one a visitor
            self._recount(
                w,
                marked=(sweep and window is not None or w.index in self.worked_here)
                and all(item in finals and item in listing for item in w.items),
            )
        for index in {self.window_of[item] for item in elsewhere}:
            self._recount(self.windows[index])

    def observe_marks(self, keys: Iterable[str]) -> None:
        """The names under ``done/``: windows another worker (or this one) found finished."""
        for key in keys:
            index = self.by_key.get(key)
            if index is not None:  # a marker of another window size: ignored
                self.marked.add(index)
                self.seen_done.discard(index)
                self.worked_here.discard(index)
                if index not in self.done:
                    self.done.add(index)
                    self.unfinished[self.windows[index].step].discard(index)

    def _recount(self, w: Window, marked: bool = False) -> None:
        """Whether ``w`` is finished, from what is known of its items; ``marked``: a listing just
        showed every item's final/ marker with its lease, what a done/ marker says."""
        if all(item in self.terminal for item in w.items):
            self.done.add(w.index)
            self.unfinished[w.step].discard(w.index)
            if marked and w.index not in self.marked:
                self.seen_done.add(w.index)
        else:
            self.done.discard(w.index)
            self.unfinished[w.step].add(w.index)
            self.seen_done.discard(w.index)

    def to_mark(self) -> list[Window]:
        """Windows a listing showed finished and whose ``done/`` marker is not known to exist:
        the worker writes them (create-only), then calls :meth:`marked_now`."""
        return [self.windows[i] for i in sorted(self.seen_done)]

    def marked_now(self, w: Window) -> None:
        self.marked.add(w.index)
        self.seen_done.discard(w.index)
        self.worked_here.discard(w.index)

    def stale_marks(self) -> list[Window]:
        """Windows marked done that a sweep found unfinished (a lease deleted by hand): their
        markers say nothing, and the worker removes them."""
        return [self.windows[i] for i in sorted(self.marked - self.done)]

    def unmarked(self, w: Window) -> None:
        self.marked.discard(w.index)

    # -- the gate of steps ---------------------------------------------------------------------------
    def barrier_state(self, item: str) -> str | None:
        """A finished barrier's state (done or failed) as known at its listed generation, or, when
        its window is known finished from a done/ marker without a listing, as last read (a
        finished lease changes only by a reopen, which removes the marker first); else None."""
        known = self.known.get(item)
        if known is None or (self.window_of.get(item) not in self.done and self.listing.get(item) != known[1]):
            return None  # (a done window is not listed again: the generation it was last listed at is old)
        return known[0].state if known[0].terminal else None

    def unknown_barriers(self) -> list[str]:
        """Finished barriers whose state this worker must read before the steps after them open."""
        return [
            b
            for b in self.barrier_of.values()
            if (b in self.terminal or self.window_of.get(b) in self.done) and self.barrier_state(b) is None
        ]

    def _gate(self) -> tuple[int, bool]:
        """(the last step open for claims, whether the steps after it are blocked for good)."""
        for step in self.step_list:
            if self.unfinished.get(step):
                return step, False
            barrier = self.barrier_of.get(step)
            if barrier is not None:
                state = self.barrier_state(barrier)
                if state != DONE:
                    return step, state == FAILED
        return self.step_list[-1], False

    def waiting(self) -> bool:
        """Items of later steps will open once the open ones finish: not a time to leave."""
        step, blocked = self._gate()
        return not blocked and step < self.step_list[-1]

    def drained(self) -> bool:
        """Every item finished, or every item that can still run: a failed barrier blocks the rest.
        Ask it after a sweep: between sweeps, what a worker knows of other windows may be old;
        and before leaving, confirm it by a sweep that lists everything (``sweep_targets(full=True)``)."""
        step, blocked = self._gate()
        return all(not self.unfinished.get(s) for s in self.step_list if not blocked or s <= step)

    # -- what to try ---------------------------------------------------------------------------------
    def candidates(self, now: float, wall: float, window: int | None = None) -> list[tuple[str, bool]]:
        """Items to try this pass, in order, each with True when it had no lease when listed:
        unleased ones first, then leases that stood still long enough to be read, and items
        announced as given back anywhere. ``window``: the window just listed (None: a sweep)."""
        open_step = self._gate()[0]
        if window is None:
            scope = [
                item
                for i in self.sweep_order
                if self.windows[i].step <= open_step and i not in self.done
                for item in self._order(self.windows[i])
            ]
        else:
            w = self.windows[window]
            scope = self._order(w) if w.step <= open_step else []
        todo = [item for item in scope if item not in self.terminal]
        unleased = [(item, True) for item in todo if item not in self.listing]
        stalled = [
            (item, False)
            for item in todo
            if item in self.listing
            and (now - self.since[item][1] >= self.still or item in self.released or self._free(item, wall))
        ]
        inside = set(scope)
        given_back = [
            (item, False)
            for item in sorted(self.released)
            if item not in inside
            and item not in self.terminal
            and self.steps.get(item, 0) <= open_step
            and item in self.window_of
        ]
        return unleased + stalled + given_back

    def _order(self, w: Window) -> list[str]:
        """This worker's own order of a window's items: workers sharing a window rarely race."""
        items = list(w.items)
        random.Random(f"{self.worker}/{w.index}").shuffle(items)
        return items

    def _free(self, item: str, wall: float) -> bool:
        """Known claimable at the listed generation, e.g. an item this worker failed for a retry."""
        known = self.known.get(item)
        return known is not None and known[1] == self.listing.get(item) and not known[0].live(wall)

    def current(self, item: str) -> tuple[Lease, int] | None:
        """The lease as known at the generation listed, or None: read it (or, unlisted, claim it)."""
        known = self.known.get(item)
        return known if known is not None and known[1] == self.listing.get(item) else None

    def remember(self, item: str, lease: Lease, generation: int) -> None:
        self.known[item] = (lease, generation)

    def forget(self, item: str) -> None:
        """Someone else's now: read it afresh if it stalls."""
        self.known.pop(item, None)

    def finished(self, item: str) -> None:
        self.terminal.add(item)
        index = self.window_of.get(item)
        if index is not None:
            self._recount(self.windows[index])

    # -- what to list next -------------------------------------------------------------------------
    def end_pass(self, kind: str, worked: bool, window: int | None = None) -> tuple[str, int | None]:
        """The next pass, after one of ``kind`` (on ``window``) that claimed something or not:
        (VISIT, window), (STEAL, None) or (SWEEP, None)."""
        if worked:
            self.fruitless = 0
            if window is None and self.current_window is None:
                return SWEEP, None
            return VISIT, window if window is not None else self.current_window
        if kind == SWEEP:
            self.fruitless = 0
            return SWEEP, None  # (after the worker's poll): idle workers sweep until work or the drain
        self.fruitless += 1
        if self.fruitless <= WALK and window is not None:
            nxt = self._walk(window)
            if nxt is not None:
                return VISIT, nxt
        if self.fruitless <= WALK + STEALS:
            return STEAL, None
        self.fruitless = 0
        return SWEEP, None

    def worked_in(self, item: str) -> None:
        """The window of an item just claimed becomes this worker's window."""
        self.current_window = self.window_of.get(item, self.current_window)
        if self.current_window is not None:
            self.worked_here.add(self.current_window)

    def _open(self) -> list[int]:
        open_step = self._gate()[0]
        return [i for s in self.step_list if s <= open_step for i in sorted(self.unfinished.get(s, ()))]

    def _walk(self, window: int) -> int | None:
        """The next unfinished window of an open step after ``window``, in id order."""
        candidates = self._open()
        if not candidates:
            return None
        later = [i for i in candidates if i > window]
        return (later or candidates)[0]

    def sweep_targets(self, full: bool = False) -> list[int] | None:
        """What a sweep lists, after a listing of the ``done/`` markers: the unfinished windows of
        the open steps, one visit each, or None (list every lease and marker) when that is as
        cheap (at most ``2 x windows`` calls against ``2 x items / 1,000``), or when ``full``: the
        sweep that confirms a drain, which trusts no marker."""
        if full:
            return None
        targets = self._open()
        pages = -(-len(self.window_of) // 1000)
        return targets if len(targets) < pages else None

    def steal(self) -> int | None:
        """A window to visit after a listing of the ``done/`` markers: one of the unfinished windows
        of the open steps, at random (so a long untouched stretch is the likeliest pick), or None
        when there is none (then sweep)."""
        candidates = self._open()
        if not candidates:
            return None
        pick = self.rng.choice(candidates)
        self.current_window = pick
        return pick

"""Which item a worker tries next: the claim policy, apart from the I/O that feeds it.

A worker decides from two listings and reads almost nothing: finished items are the
``final/`` markers of listed leases (the lease is the truth: a marker whose lease is gone
is stale, and its item is claimed as new); an item with no lease is tried first (claimed by a create-only
write); a lease is read only when its generation has stood still, by this worker's own
clock, for half a TTL, while holders rewrite theirs every third of one. So only dead,
released or failed-for-retry leases are ever read, and a lease whose holder keeps
renewing is never taken, whatever the skew between clocks. A worker idle for a pass or
two (a standby) also reads leases it has not seen at their current generation; and an
item given back (preemption, shutdown, a failure to retry) is announced by a marker in
``released/`` that every worker lists, so a busy fleet takes it at once too.

Pure: the worker loop (fleet.core.spawner) lists, reads and writes; this decides.
"""

from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

from fleet.core.lease import DONE, FAILED, Lease


class ClaimPolicy:
    def __init__(self, items: Sequence[str], worker: str, lease_ttl: float, standby: bool,
                 steps: Mapping[str, int] | None = None, barriers: Iterable[str] = ()):
        self.order = list(items)
        random.Random(worker).shuffle(self.order)  # each worker its own order: 200 do not queue on one lease
        # A run with stages (fleet.core.run.StepPlan): an item of a step is tried only once every item
        # of the steps before is finished, and every barrier before is done (a failed one blocks the rest).
        self.steps = dict(steps or {})
        self.step_list = sorted(set(self.steps.values()) | {0})
        self.barrier_of = {self.steps.get(b, 0): b for b in barriers}
        self.by_step: dict[int, list[str]] = {}
        for item in self.order:
            self.by_step.setdefault(self.steps.get(item, 0), []).append(item)
        self.terminal: set[str] = set()  # finished as of the last listings (recomputed every pass)
        self.stale: set[str] = set()  # final/ markers whose lease was not listed: not finished
        self.known: dict[str, tuple[Lease, int]] = {}  # leases read: (lease, its generation)
        self.since: dict[str, tuple[int, float]] = {}  # item -> (generation listed, monotonic time first listed)
        self.listing: dict[str, int] = {}
        self.released: set[str] = set()  # items announced as given back: read at once
        self.still = lease_ttl / 2
        # Idle for this many passes, a worker reads unseen leases at once: with standbys, two,
        # so that the other idle workers have had a pass to see its beat and leave.
        self.watch_after = 2 if standby else 1
        self.idle = 0  # passes in a row with nothing claimed

    def observe(self, finals: Iterable[str], listing: dict[str, int], now: float,
                released: Iterable[str] = ()) -> None:
        """A pass's listings: finished items, every lease's generation (``now``: monotonic), and
        the items announced as given back. List the leases before the markers: a marker is
        written after its lease is done and removed before its lease is, so a marker seen
        after its lease was listed belongs to that lease.

        Finished is recomputed from these listings every pass, never kept from an earlier one:
        a lease deleted since (``fleet status --verify`` reopening it, or a hand) makes its item
        unfinished again, whatever marker is left."""
        finals = set(finals)
        self.listing = listing
        self.stale = finals - listing.keys()
        self.terminal = {item for item in finals if item in listing} | {
            item for item, (lease, gen) in self.known.items() if lease.terminal and listing.get(item) == gen}
        self.released = set(released)
        for name, gen in listing.items():
            if self.since.get(name, (None, 0.0))[0] != gen:
                self.since[name] = (gen, now)

    def barrier_state(self, item: str) -> str | None:
        """A finished barrier's state (done or failed) as known at its listed generation, else None."""
        known = self.current(item)
        return known[0].state if known is not None and known[0].terminal else None

    def unknown_barriers(self) -> list[str]:
        """Finished barriers whose state this worker must read before the steps after them open."""
        return [b for b in self.barrier_of.values() if b in self.terminal and self.barrier_state(b) is None]

    def _gate(self) -> tuple[int, bool]:
        """(the last step open for claims, whether the steps after it are blocked for good)."""
        for step in self.step_list:
            if any(item not in self.terminal for item in self.by_step.get(step, ())):
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

    def candidates(self, now: float, wall: float) -> list[tuple[str, bool]]:
        """Items to try this pass, in order, each with True when it had no lease when listed.
        Unleased ones first; then leases that stood still long enough to be read."""
        open_step = self._gate()[0]
        todo = [item for item in self.order if item not in self.terminal and self.steps.get(item, 0) <= open_step]
        unleased = [(item, True) for item in todo if item not in self.listing]
        watch = 0.0 if self.idle >= self.watch_after else self.still
        stalled = [(item, False) for item in todo if item in self.listing
                   and (now - self.since[item][1] >= watch or item in self.released or self._free(item, wall))]
        return unleased + stalled

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

    def end_pass(self, worked: bool) -> None:
        self.idle = 0 if worked else self.idle + 1

    def drained(self) -> bool:
        """Every item finished, or every item that can still run: a failed barrier blocks the rest."""
        step, blocked = self._gate()
        return all(item in self.terminal for item in self.order if not blocked or self.steps.get(item, 0) <= step)

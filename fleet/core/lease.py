"""Leases: one small object per item, rewritten only under generation match.

The lease object is the single source of truth for an item's state, as a
Terraform GCS state lock is for a state file: whoever wrote the generation
you read holds it. Every lease carries a fresh claim token, so a write whose
response was lost (the library retries it and sees 412) is recognised as
our own on the read that follows.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from fleet.core.errors import Cancelled
from fleet.core.records import JsonRecord
from fleet.core.store import NotFound, PreconditionFailed, Store

LEASED, DONE, FAILED = "leased", "done", "failed"
DAMAGED = "damaged"  # the token of a lease read from an object that was not a lease


@dataclass
class Lease(JsonRecord):
    state: str
    worker: str
    attempt: int
    expires: float
    token: str = ""
    error: str | None = None
    # What the last failed attempt left beside its one-line error (fleet.job.ItemFailed.detail:
    # a program's exit code and the last lines of its stderr), for `fleet status` to show.
    detail: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # counters (numbers), and lists a job reports
    started: float = 0.0
    finished: float = 0.0
    # A done grouped item's counts per input file (fleet.core.attempt.part_counts), loaded by the
    # status reader from the object its outputs name: never written into the lease, which stays small.
    part_counts: list[dict[str, int]] | None = field(
        default=None, compare=False, repr=False, metadata={"transient": True}
    )

    json_indent = None  # rewritten at every renewal: compact

    @classmethod
    def parse(cls, data: bytes, where: str) -> "Lease":
        """A lease from its object; a damaged one (not JSON, not a lease) reads as released,
        with the damage as its error, so the item is converted again instead of crashing
        every reader. Outputs are deterministic, so converting again is always safe."""
        try:
            lease = cls.from_json(data)
            if (
                lease.state not in (LEASED, DONE, FAILED)
                or not isinstance(lease.attempt, int)
                or not isinstance(lease.expires, (int, float))
                or not isinstance(lease.outputs, list)
                or not isinstance(lease.detail, dict)
            ):
                raise ValueError("unexpected field values")
            return lease
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            return cls(
                LEASED,
                "",
                0,
                0.0,
                token=DAMAGED,
                error=f"{where}: damaged lease object ({type(e).__name__}); the item is converted again",
            )

    @property
    def damaged(self) -> bool:
        return self.token == DAMAGED

    @property
    def terminal(self) -> bool:
        return self.state in (DONE, FAILED)

    def live(self, now: float) -> bool:
        return self.state == LEASED and self.expires > now


@dataclass
class Held:
    """A lease this worker holds: the generation it last wrote."""

    item: str
    generation: int
    lease: Lease


class Lost(Cancelled):
    """The lease was taken over: stop the item and discard its work."""


class Leases:
    def __init__(
        self,
        store: Store,
        prefix: str,
        worker: str,
        ttl: float,
        max_attempts: int,
        clock: Callable[[], float] = time.time,
    ):
        self.store, self.prefix, self.worker = store, prefix, worker
        self.ttl, self.max_attempts, self.clock = ttl, max_attempts, clock

    def name(self, item: str) -> str:
        return self.prefix + item

    def read(self, item: str) -> tuple[Lease, int] | None:
        try:
            data, gen = self.store.read_generation(self.name(item))
        except NotFound:
            return None
        return Lease.parse(data, f"{self.store.url}/{self.name(item)}"), gen

    def _write(self, item: str, lease: Lease, generation: int) -> int | None:
        """Conditional write; None if someone else's write got there first."""
        return self._write_or_see(item, lease, generation)[0]

    def _write_or_see(self, item: str, lease: Lease, generation: int) -> tuple[int | None, tuple[Lease, int] | None]:
        """(our generation, None), or (None, the lease that won) when the write lost."""
        try:
            return self.store.write(self.name(item), lease.to_json(), if_generation_match=generation), None
        except PreconditionFailed:
            seen = self.read(item)
            if seen and seen[0].token == lease.token and seen[0].to_json() == lease.to_json():
                return seen[1], None  # our own write, whose response was lost and retried
            return None, seen

    def _fresh(self, attempt: int, error: str | None = None, detail: dict[str, Any] | None = None) -> Lease:
        now = self.clock()
        return Lease(
            LEASED, self.worker, attempt, now + self.ttl, uuid.uuid4().hex, error, dict(detail or {}), started=now
        )

    def claim(self, item: str, current: tuple[Lease, int] | None = None) -> Held | Lease | None:
        """Take the item if it is free or its lease expired.

        Returns the Held lease, or the Lease that stands in the way (done,
        failed or live), or None when another worker won a race just now.
        """
        if current is None:
            lease = self._fresh(1)
            gen, current = self._write_or_see(item, lease, 0)
            if gen is not None:
                return Held(item, gen, lease)
            if current is None:
                return None
        old, old_gen = current
        if old.terminal or old.live(self.clock()):
            return old
        if old.attempt >= self.max_attempts:
            why = old.error or f"lease of {old.worker} expired (worker died or hung)"
            failed = dataclasses.replace(
                old,
                state=FAILED,
                error=f"gave up after {old.attempt} attempts: {why}",
                token=uuid.uuid4().hex,
                finished=self.clock(),
            )
            return failed if self._write(item, failed, old_gen) is not None else None
        lease = self._fresh(old.attempt + 1, old.error, old.detail)
        gen = self._write(item, lease, old_gen)
        return Held(item, gen, lease) if gen is not None else None

    def renew(self, held: Held) -> None:
        """Push expiry out; raises Lost if another worker took the item."""
        lease = dataclasses.replace(held.lease, expires=self.clock() + self.ttl)
        gen = self._write(held.item, lease, held.generation)
        if gen is None:
            raise Lost(f"item {held.item}: lease taken over")
        held.generation, held.lease = gen, lease

    def commit(self, held: Held, outputs: list[dict[str, Any]], stats: dict[str, float]) -> None:
        lease = dataclasses.replace(
            held.lease, state=DONE, outputs=outputs, stats=stats, error=None, detail={}, finished=self.clock()
        )
        gen = self._write(held.item, lease, held.generation)
        if gen is None:
            raise Lost(f"item {held.item}: lease taken over before commit")
        held.generation, held.lease = gen, lease

    def fail(self, held: Held, error: str, retry: bool = True, detail: dict[str, Any] | None = None) -> bool:
        """Record an error (and its detail); release for another attempt, or mark failed. True if final."""
        final = not retry or held.lease.attempt >= self.max_attempts
        detail = dict(detail or {})
        if final:
            lease = dataclasses.replace(held.lease, state=FAILED, error=error, detail=detail, finished=self.clock())
        else:
            lease = dataclasses.replace(held.lease, expires=0.0, error=error, detail=detail)
        gen = self._write(held.item, lease, held.generation)
        if gen is not None:
            held.generation, held.lease = gen, lease
        return final

    def release(self, held: Held) -> None:
        """Give the item back at once (shutdown, preemption) without spending an attempt."""
        lease = dataclasses.replace(held.lease, expires=0.0, attempt=held.lease.attempt - 1)
        gen = self._write(held.item, lease, held.generation)
        if gen is not None:
            held.generation, held.lease = gen, lease

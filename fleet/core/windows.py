"""Windows: a run's items cut into runs of consecutive ids of one step, so that a worker lists
one window of the leases and ``final/`` markers (a ranged listing) instead of all of them.

Why windows. A listing hands back at most 1,000 objects a call (one Class A operation on Cloud
Storage), so a worker that lists every lease to choose its next item pays ``items / 1,000`` calls
a pass, and a run takes about as many passes as it has items: the bill and the time grow with the
square of the run. A window's listing costs one call whatever the run's size, and hands back at
most ``2 x WINDOW`` objects (its leases and its markers). The claim policy (fleet.core.claims)
keeps a worker in one window while it has work, and moves it on cheaply.

Why these windows. Item ids are fixed-width and sorted the way the store sorts names, so the
items of a window are a contiguous range of lease names: ``[first, last + "!")`` (``!`` sorts
before every character an id holds: digits, letters, ``-`` and ``.``). Stage ids
(``00003-of-00016``) sort among map ids: a map window's range also holds a few of them, which the
listing hands back and the policy ignores (at most one per map id, so a window's listing stays
under ``4 x WINDOW`` objects). A window holds items of one step only, so a finished step is a set
of finished windows, whatever the steps after it.

A finished window (every item's ``final/`` marker listed with its lease) may be marked by a
create-only ``done/<key>`` object: one listing of those (``windows / 1,000`` calls) tells a worker
where the work is left. The key carries the window size, so markers of another size are ignored.
The marker's body keeps the window's counts, for the run's end (fleet.core.window_counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

WINDOW = 64  # items a window at most: a listing is one call and hands back a few hundred objects at most
MIN_WINDOW = 8
SPREAD = 64  # windows a run has at least, where it has the items: a crowd of workers spreads over them
RANGE_END = "!"  # sorts before every character of an item id


@dataclass(frozen=True)
class Window:
    index: int  # its place in the run's windows: steps in order, ids in order
    step: int
    items: tuple[str, ...]  # sorted
    size: int  # the run's window size (the last window of a step may hold fewer)

    @property
    def key(self) -> str:
        """Its ``done/`` marker's name: the size, the step and the first id name one window."""
        return f"{self.size}-{self.step}-{self.items[0]}"

    def bounds(self, prefix: str) -> tuple[str, str]:
        """(start, end) of the ranged listing of this window's objects under ``prefix``."""
        return prefix + self.items[0], prefix + self.items[-1] + RANGE_END


def window_size(items: int) -> int:
    """The window size of a run of ``items``: WINDOW, or less in a small run, so that it still has
    SPREAD windows and a crowd of workers does not queue in a few (a race for an item costs a
    failed create and a read). Every worker computes it from the same item list."""
    return max(MIN_WINDOW, min(WINDOW, items // SPREAD))


def cut_windows(items: Iterable[tuple[str, int]], size: int | None = None) -> list[Window]:
    """(item id, step) pairs in any order -> the run's windows: per step, its ids sorted and cut
    into runs of ``size`` (by default :func:`window_size` of the run)."""
    items = list(items)
    size = size or window_size(len(items))
    by_step: dict[int, list[str]] = {}
    for item, step in items:
        if not item or min(item) <= RANGE_END:
            raise ValueError(f"item id {item!r}: ids hold no spaces, control characters or '!'")
        by_step.setdefault(step, []).append(item)
    out: list[Window] = []
    for step in sorted(by_step):
        ids = sorted(by_step[step])
        for start in range(0, len(ids), size):
            out.append(Window(len(out), step, tuple(ids[start : start + size]), size))
    return out

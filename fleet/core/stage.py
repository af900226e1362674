"""The stages a job may ask for after its map (MapReduce through the bucket): a Stage (name,
items, balanced), the run's stage options (``--shards``, ``--dedup``: StageOptions), and the
Reducer that does one stage item's work.

The planner lays the stages' items out, the claim policy opens them in order, the worker runs
their reducers: core, so these types live here; a job gets them from ``fleet.job``.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Iterator

from fleet.core.item import ItemContext
from fleet.core.sink import KeyedSink, Sink


@dataclass(frozen=True)
class Stage:
    """A stage a job asks for after its map over the inputs (``Job.stages``): MapReduce through
    the bucket. Each stage's items read the records the stage before emitted (KeyedSink), once
    every item of that stage is done; the same leases, retries and workers run them.

    ``items`` reduce items each get one key range (a partition) of the records, sorted by
    (key, value); ``balanced``: instead, the records in (key, value) order are cut into
    ``items`` runs of equal counts (differing by at most one), e.g. shards of a global shuffle.
    The last stage writes the run's outputs: item i of n names them ``part-<i>-of-<n>...``.

    ``rereads``: item i also reads map item i's input again (``ItemContext.input``), so a stage
    can decide about each document from small records (``item_key`` sends a record to item i)
    without the documents travelling through every stage before it; it has one item per map
    item."""

    name: str
    items: int
    balanced: bool = False
    rereads: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name == "map":
            raise ValueError(f"stage name {self.name!r}: an identifier other than 'map'")
        if self.items < 1:
            raise ValueError(f"stage {self.name}: {self.items} items; give 1 or more")
        if self.rereads and self.balanced:
            raise ValueError(f"stage {self.name}: a stage that rereads the map's inputs is cut by key, not balanced")

    def as_dict(self) -> dict:
        """The stage as a run's spec keeps it: ``rereads`` only when set, so the spec of a run
        planned before it existed is the spec planned today (a resumed run keeps its own steps)."""
        out = dataclasses.asdict(self)
        if not self.rereads:
            del out["rereads"]
        return out


def item_key(item: int, items: int, offset: int) -> int:
    """A key that an unbalanced stage of ``items`` items hands to item ``item``, ``offset`` (from 0,
    below ``item_span(items)``) into its range: records keyed so reach item i sorted by offset.
    Item i's partition holds the keys k with ``k * items >> 64 == i`` (fleet.core.shuffle)."""
    if not 0 <= offset < item_span(items):
        raise ValueError(f"offset {offset} is outside an item's {item_span(items):,} keys")
    return -(-(item << 64) // items) + offset


def item_span(items: int) -> int:
    """How many keys each item of an unbalanced stage of ``items`` items has at least."""
    return (1 << 64) // items - 1


@dataclass(frozen=True)
class StageOptions:
    """The run's stage options as ``fleet plan`` / ``fleet local`` take them (``--shards``,
    ``--dedup``), checked by the fleet for form only; a job says what they mean (Job.stages)."""

    shards: int = 0  # 0: no sharding, the map's items write the outputs
    dedup: str = ""  # "": none; a mode the job knows ("exact")

    def __bool__(self) -> bool:
        return bool(self.shards or self.dedup)


class Reducer(abc.ABC):
    """One stage's work on one item after the map: records in, outputs (or records for the
    next stage) out."""

    @abc.abstractmethod
    def reduce(
        self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
    ) -> dict[str, float]:
        """The item's records, sorted by (key, value), to outputs; return counters. ``sink`` is
        a KeyedSink when ``ctx.feeds`` names a next stage."""

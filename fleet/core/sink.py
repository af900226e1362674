"""Where an item's work goes: a Sink for the run's outputs (and their exact counts), a KeyedSink
for records that feed a later stage (keyed by ``shuffle_key``), the Features a job's examples
hold (what the run's readers check them against), and the RunManifest of a finished run's
counts.

The worker fills the sinks and commits what they hold, the shuffle sorts the keyed records,
the readers and the run's end read the features and the counts: all core, so the types live
here, and a job gets them from ``fleet.job``.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field
from typing import BinaryIO, Mapping


class Sink(abc.ABC):
    """Where a converter writes an item's outputs; the fleet commits them."""

    @abc.abstractmethod
    def open(self, suffix: str) -> BinaryIO:
        """A new binary file that becomes the output ``<item_id><suffix>``."""

    def add(self, suffix: str, path: str) -> None:
        """A finished local file (a program wrote it) becomes the output ``<item_id><suffix>``;
        ``suffix`` may name a subfolder (``-logs/a.txt``). The sink may take the file over
        instead of copying it (the fleet's does): leave it alone afterwards."""
        import shutil

        with open(path, "rb") as src, self.open(suffix) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    def count(self, suffix: str, counts: Mapping[str, int]) -> None:
        """Exact counts of what the output ``<item_id><suffix>`` holds (tokens, documents,
        examples...): the fleet keeps them with the output in its lease, and the run's manifest
        (RunManifest) sums them, so a trainer's token budget comes from what was written."""
        totals = self.__dict__.setdefault("output_counts", {}).setdefault(suffix, {})
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + int(value)


@dataclass(frozen=True)
class RunManifest:
    """A finished run's exact counts: per input file (summed over its items' counters; a file of a
    grouped item: what ``ItemInput.count`` gave it, and its bytes) and per output (what
    ``Sink.count`` recorded), by counter name; ``outputs`` maps output names (relative to the
    output place) to their counts, in output-name order; ``stages`` maps each stage after the
    map, in run order, to its items' counters combined (``fleet.core.manifest.add_counts``)."""

    sources: dict[str, dict[str, int]]
    outputs: dict[str, dict[str, int]]
    stages: dict[str, dict[str, int]] = field(default_factory=dict)


class KeyedSink(abc.ABC):
    """The sink of an item whose outputs feed a later stage (``ctx.feeds``): records keyed for
    the shuffle between stages. The fleet cuts the key space [0, 2**64) into equal ranges,
    one per partition, so the reduce items get every record of their range, from every item
    of this stage, sorted by (key, value): a global order that does not depend on how the
    work was cut into items or which worker did it."""

    partitions: int

    @abc.abstractmethod
    def emit(self, key: int, value: bytes) -> None:
        """One record: ``key`` an unsigned 64-bit integer (see :func:`shuffle_key`)."""


def shuffle_key(seed: int, value: bytes | memoryview) -> int:
    """A key that puts records in a pseudo-random order seeded by ``seed`` (the run's seed): a
    keyed 64-bit BLAKE2b of the record. Equal records get equal keys, so the order depends on
    nothing but the records and the seed."""
    return int.from_bytes(hashlib.blake2b(value, digest_size=8, key=_seed_bytes(seed)).digest(), "big")


def _seed_bytes(seed: int) -> bytes:
    return (seed % (1 << 128)).to_bytes(16, "big")


@dataclass(frozen=True)
class Feature:
    """One feature of every example a job writes: ``length`` values of ``dtype``, in its
    TFRecords (an int64 or float list) and in its Parquet rows (a list column) alike."""

    length: int
    dtype: str = "int64"  # int64 | float32

    def __post_init__(self) -> None:
        if self.dtype not in ("int64", "float32") or self.length < 0:
            raise ValueError(f"Feature({self.length}, {self.dtype!r}): a length >= 0 of int64 or float32")

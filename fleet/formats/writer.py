"""The writer interface the example formats share: a job's features (``Column``) and what a
writer of its examples does (``ExampleWriter``: framed records or rows of values in, one file
out, with its counts).

Below the writers of each format (``tfrecord.writer.TFRecordWriter``, ``parquet``) and
``fleet_jobs.text.output.open_writer`` that picks one for a job, so a format's module imports
the interface, not the module that picks it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence

import numpy as np


class Readable(Protocol):
    """Bytes read in turn: a file, a gzip stream, an object's buffered reader (not only BinaryIO)."""

    def read(self, size: int = ..., /) -> bytes: ...


class Writable(Protocol):
    """Bytes written in turn: a file, a gzip stream, a sink's output."""

    def write(self, data: bytes, /) -> int: ...


@dataclass(frozen=True)
class Column:
    """One feature of a job's examples: a list of ints (token ids, masks) or of floats, of
    ``length`` values each (None: not said; a format of fixed-size columns, MDS, needs it); or,
    kind "text", a list of strings (or None) of any length: input fields carried along (Parquet
    and MDS only; its values are Python lists, not arrays)."""

    name: str
    kind: str = "int"  # int | float | text
    length: Optional[int] = None


class ExampleWriter(abc.ABC):
    """An item's examples, in the run's output format."""

    def __init__(self, columns: Sequence[Column]):
        self.columns = list(columns)
        self.examples = 0  # written so far: open_writer records it as the file's count (Sink.count)
        self.counts: dict[str, int] = {}  # what the job adds of the file (``note``): tokens, documents

    def note(self, **counts: int) -> None:
        """Exact counts of what this file holds besides its examples (tokens, documents), kept with
        the output (``Sink.count``) when open_writer closes it; nothing when examples feed a stage."""
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(value)

    @abc.abstractmethod
    def write(self, records: bytes, count: Optional[int] = None) -> None:
        """Framed TFRecords of ``tf.train.Example``s holding exactly the columns' features;
        ``count``, how many, where the caller knows (else the frames are counted)."""

    @abc.abstractmethod
    def write_columns(self, values: Mapping[str, np.ndarray]) -> None:
        """Examples as one 2-D array per column: row i of every array is example i."""

    def write_examples(self, values: Mapping[str, np.ndarray]) -> None:
        """``write_columns``, giving the file ``write`` would give for the same examples encoded
        as records (Parquet: the same row groups), for a job that can write either way."""
        self.write_columns(values)

    def close(self) -> None:
        """Finish the file (Parquet writes its footer here)."""


def row_count(columns: Sequence[Column], values: Mapping[str, np.ndarray]) -> int:
    """How many examples ``values`` holds (one 2-D array per column), checked against the columns."""
    names = {c.name for c in columns}
    if set(values) != names:
        raise ValueError(f"columns {sorted(values)} given, the writer has {sorted(names)}")
    counts = {len(values[name]) for name in names}
    if len(counts) != 1:
        raise ValueError(f"columns of different lengths: {sorted(counts)}")
    return counts.pop()

"""An item as a job sees it: the input object the plan pinned (Source), the piece of it an item
is (Piece), the converter's reads of it (ItemInput), and what else the attempt knows
(ItemContext: its seed, scratch folder, stage, checkpoint).

The planner, the worker and the job all build or read these, so they live in the core, under
the job API that re-exports them (``fleet.job``); with them the few pure functions every side
must compute alike: an item's seed from the run's (``item_seed``), the cut of an object at
newlines (``cut_at_newlines``), a file name fit to print (``printable``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from dataclasses import field
from typing import Any, Callable, Mapping

from fleet.core.errors import InputError
from fleet.core.store import Changed, NotFound, open_store


@dataclass(frozen=True)
class Source:
    """An input object as the planner found it, pinned to that version."""

    url: str  # store URL (a local folder or gs://bucket[/prefix])
    name: str  # object name inside that store
    size: int
    version: str = ""  # Blob.version when found: what a worker checks before reading

    @property
    def display(self) -> str:
        return printable(f"{self.url.rstrip('/')}/{self.name}")


@dataclass(frozen=True)
class Piece:
    """One item as a job's planner cuts it from a source: ``start``-``end`` in bytes, or in a
    unit the job names in ``meta["unit"]`` (Parquet row groups); ``size`` is the bytes of work
    it holds (by default end - start), ``meta`` what the job's converter needs to know of it."""

    start: int
    end: int
    size: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class ItemInput:
    """An item's input, as a converter reads it: ranged reads of the object version the plan
    pinned. A file rewritten, truncated or removed since fails the item (InputError)
    instead of feeding it other bytes.

    An item of a job that takes grouping (``Job.group_small_files``) may hold several whole
    small files: then ``parts`` are their inputs, in the order the planner found them, each
    an ItemInput of its own (url, name, range, meta, display naming that file), and the item
    itself reads nothing (``read``/``fetch`` refuse: read the parts). Any item's ``parts`` is
    the list to read, so a job that takes grouping reads every item the same way."""

    def __init__(
        self,
        url: str,
        name: str,
        start: int,
        end: int,
        version: str = "",
        meta: Mapping[str, Any] | None = None,
        display: str = "",
        parts: list["ItemInput"] | None = None,
    ):
        self.url, self.name, self.start, self.end, self.version = url, name, start, end, version
        self.meta = dict(meta or {})
        self.display = display or printable(f"{url.rstrip('/')}/{name}")
        self._store = None
        self._parts = list(parts or ())
        # Exact counts of what this part gave (``count``): the manifest's row of its file.
        self.counts: dict[str, int] = {}

    @property
    def grouped(self) -> bool:
        """Whether this item holds several files (read its ``parts``)."""
        return bool(self._parts)

    @property
    def parts(self) -> list["ItemInput"]:
        """What to read, in order: the files of a grouped item, else the item itself."""
        return self._parts or [self]

    def count(self, counts: Mapping[str, int]) -> None:
        """Exact counts of what this part of a grouped item gave (documents read, bad records...):
        the fleet keeps them as its file's row of the run's manifest (RunManifest.sources), where
        an item of one file has its stats. Counts of what the item made of several files together
        (examples that span them) belong to no file: they stay in the item's stats only."""
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(value)

    @property
    def file(self) -> str:
        return printable(f"{self.url.rstrip('/')}/{self.name}")

    @property
    def store(self):
        """The store holding the input (fleet.core.store.Store): ``read(name, start, end, version)``."""
        self._one_file()
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def _one_file(self) -> None:
        if self._parts:
            raise TypeError(f"{self.display}: a grouped item reads nothing itself; read its parts (ItemInput.parts)")

    def stat_size(self) -> int:
        """The object's size now (it must still be there)."""
        blob = self.store.stat(self.name)
        if blob is None:
            raise InputError(f"{self.display}: input file is gone")
        return blob.size

    @contextlib.contextmanager
    def _pinned(self):
        """A read of the pinned version: the object gone or rewritten since the plan is bad input."""
        try:
            yield
        except NotFound:
            raise InputError(f"{self.display}: input file is gone") from None
        except Changed as e:
            raise InputError(f"{printable(str(e))}; plan a new run for the new contents") from None

    def read(self, start: int, end: int) -> bytes:
        """Bytes start-end of the pinned version of the object."""
        with self._pinned():
            return self.store.read(self.name, start, end, version=self.version or None)

    def read_all(self) -> bytes:
        """The item's byte range (start-end) in memory, checked to be all of it: for a small part."""
        data = self.read(self.start, self.end)
        if len(data) != self.end - self.start:
            raise InputError(
                f"{self.file}: changed since it was planned (bytes {self.start}-{self.end} planned, "
                f"{len(data)} there now); plan a new run for the new contents"
            )
        return data

    def fetch(self, path: str) -> str:
        """Download the item's byte range (start-end) to a local file, checked to be all of it."""
        with self._pinned():
            self.store.download_file(self.name, path, self.start, self.end, version=self.version or None)
        got = os.path.getsize(path)
        if got != self.end - self.start:
            raise InputError(
                f"{self.file}: changed since it was planned (bytes {self.start}-{self.end} planned, "
                f"{got} there now); plan a new run for the new contents"
            )
        return path


@dataclass(frozen=True)
class ItemContext:
    item_id: str
    seed: int  # derived from the run's seed and the item id, never from time or worker
    source: str  # human-readable origin of the item, for error messages
    workdir: str = ""  # an empty scratch folder of this attempt, removed after it
    read: Mapping[str, Any] = field(default_factory=dict)  # the run's input options (``fleet plan --text-column``...)
    checkpoint: Callable[[], None] = lambda: None  # call often: raises Cancelled once the lease is lost
    stage: str = "map"  # the stage this item belongs to: "map" (the inputs), or a Stage.name the job asked for
    # The stage this item's outputs feed, or "" when they are the run's outputs. When set, the sink
    # is a KeyedSink: the item emits (key, value) records, and that stage's items get them by key.
    feeds: str = ""
    run_seed: int = 0  # the run's seed (Job.seed): what a key that must not depend on the item is seeded by
    # A stage that rereads the map's inputs (Stage.rereads): item i's is map item i's input; else None.
    input: ItemInput | None = None


Opener = Callable[[str], bytes]  # reads a small object by URL or local path


def printable(text: str) -> str:
    """A file name fit for a log line or a terminal: bytes that are not UTF-8 (kept by
    the OS as surrogate escapes) shown as \\xNN instead of crashing the writer."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def cut_at_newlines(source: Source, item_bytes: int, scan: int = 1 << 20) -> list[Piece]:
    """Byte ranges of about ``item_bytes`` that each end just after a newline (or at the end of
    the object), so no line is split; a line longer than an item makes its item longer."""

    store = open_store(source.url)
    pieces, start = [], 0
    while start < source.size:
        cut = start + item_bytes
        if cut >= source.size:
            pieces.append(Piece(start, source.size))
            break
        at = cut - 1  # the range ends after the first newline at or past byte cut - 1
        while True:
            chunk = store.read(source.name, at, min(source.size, at + scan), version=source.version or None)
            nl = chunk.find(b"\n")
            if nl >= 0:
                end = at + nl + 1
                break
            at += len(chunk)
            if at >= source.size or not chunk:
                end = source.size
                break
        pieces.append(Piece(start, end))
        start = end
    return pieces


def item_seed(run_seed: int, item_id: str) -> int:
    digest = hashlib.sha256(f"{run_seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")

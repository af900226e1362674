"""A work item's slice of an input file: how the text layer cuts a file into items (at
document boundaries, whole compressed files, ranges of Parquet row groups), and reads one as
exactly the bytes that were planned."""

from __future__ import annotations

import io
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Iterator

from fleet.job import ItemInput, Source, Store, find_sources, open_store, printable

from fleet_jobs.text.inputs.compression import head_of
from fleet_jobs.text.inputs.encoding import wide
from fleet_jobs.text.inputs.formats import ReadOptions, Tally, check_text_field, decide, iter_documents
from fleet_jobs.text.inputs.names import describe, skip_reason
from fleet_jobs.text.inputs.parquet import _open as parquet_file
from fleet_jobs.text.inputs.parquet import parquet_documents, plan_row_groups, row_groups
from fleet_jobs.text.inputs.places import Place, line_records, parquet_records, placed
from fleet_jobs.text.inputs.ranges import plan_ranges

log = logging.getLogger("fleet.plan")


@dataclass(frozen=True)
class Slice:
    """The part of an input file one work item covers."""

    url: str
    name: str
    start: int
    end: int
    format: str
    compression: str
    version: str = ""  # the file's Blob.version when planned ("" in runs planned before versions)
    cuts_document: bool = False  # ends inside a document longer than an item
    # Parquet: start and end count row groups, and this is the text they hold (bytes of the
    # text column); otherwise 0 and the slice's size is end - start.
    text_bytes: int = 0

    @property
    def size(self) -> int:
        return self.text_bytes or self.end - self.start

    @property
    def display(self) -> str:
        where = f"{self.url.rstrip('/')}/{self.name}"
        if self.format == "parquet":
            where += f" (row groups {self.start}-{self.end - 1})"
        elif self.compression == "none" and self.start:
            where += f" (from byte {self.start})"
        return printable(where)


def cut_source(source: Source, item_bytes: int, options: ReadOptions = ReadOptions()) -> list[Slice]:
    """A file's slices of about ``item_bytes``: byte ranges of a plain file cut at document
    boundaries, the whole of a compressed one or of one in UTF-16 or UTF-32 (its boundaries are
    not where UTF-8 has them: encoding.py), ranges of row groups of a Parquet file. The text
    field or column is checked here, at plan time: in the first records of a JSON file's head
    (formats.check_text_field), in a Parquet file's schema (parquet.row_groups)."""
    store = open_store(source.url)
    _, compression = describe(source.name)
    fmt, head = _format_and_head(store, source.name, source.size)
    if fmt == "parquet":
        groups = row_groups(
            store, source.name, source.size, source.version or None, options.text_column, source.display
        )
        return [
            Slice(source.url, source.name, first, end, fmt, "none", source.version, False, max(1, size))
            for first, end, size in plan_row_groups(groups, item_bytes)
        ]
    if not wide(head):  # UTF-16 or UTF-32 lines are not split at b"\n": read as they come
        check_text_field(head, fmt, options.text_column, source.display)
    if compression != "none" or wide(head):
        return [Slice(source.url, source.name, 0, source.size, fmt, compression, source.version)]
    ranges = plan_ranges(store, source.name, source.size, fmt, item_bytes)
    cuts = sum(cut for _, _, cut in ranges)
    if cuts:
        log.warning(
            "warning: %s: %d document(s) longer than an item (%s bytes) cut between items at a line boundary",
            source.display,
            cuts,
            f"{item_bytes:,}",
        )
    return [
        Slice(source.url, source.name, start, end, fmt, compression, source.version, cut) for start, end, cut in ranges
    ]


def find_corpus(paths: list[str]) -> list[Source]:
    """The corpus files under some files or folders (a file named is always taken)."""
    return find_sources(paths, skip=skip_reason)


def plan_slices(paths: list[str], item_bytes: int, options: ReadOptions = ReadOptions()) -> list[Slice]:
    """Every corpus file under some files or folders cut into slices (what a text job's items
    are; for tests and tools: a run plans them through fleet.core.run)."""
    return [piece for source in find_corpus(paths) if source.size for piece in cut_source(source, item_bytes, options)]


def read_slice(
    piece: Slice,
    workdir: str,
    tally: Tally | None = None,
    options: ReadOptions = ReadOptions(),
    places: list[Place] | None = None,
    first: int = 0,
    data: bytes | None = None,
) -> Iterator[list[str]]:
    """Download a slice to a local file, then stream its documents; with a ``places`` list,
    each document's Place is appended to it before the document is handed on (places.py; a
    ``Places`` list names the input fields each Place carries),
    ``first`` the ordinal of its first document in the item. ``data``: the slice's bytes,
    already read (ItemInput.read_all: a small file of a grouped item), instead of a download.

    The bytes read must be the bytes planned: a file that was rewritten, truncated or
    replaced since (another version, or fewer bytes than the slice) fails the item
    with an InputError rather than feed it other data or nothing."""
    file = f"{piece.url.rstrip('/')}/{piece.name}"
    source = printable(file)
    item = ItemInput(piece.url, piece.name, piece.start, piece.end, piece.version, display=piece.display)
    if piece.format == "parquet":  # ranged reads of its row groups, no download
        size = item.stat_size()
        docs = parquet_documents(
            item.store,
            piece.name,
            size,
            piece.version or None,
            piece.start,
            piece.end,
            source,
            tally if tally is not None else Tally(),
            options,
        )
        if places is not None:
            pf = parquet_file(item.store, piece.name, size, piece.version or None, source)
            docs = placed(
                docs,
                parquet_records(pf, piece.start, piece.end, options.text_column, getattr(places, "fields", ())),
                file,
                True,
                places,
                first,
            )
        yield from docs
        return
    base = piece.start if piece.compression == "none" else 0
    if data is not None:
        docs = iter_documents(io.BytesIO(data), piece.format, piece.compression, source, base, tally, options)
        if places is None:
            yield from docs
        else:
            yield from placed(
                docs,
                line_records(
                    io.BytesIO(data), piece.format, piece.compression, base, options, getattr(places, "fields", ())
                ),
                file,
                False,
                places,
                first,
            )
        return
    fd, tmp = tempfile.mkstemp(prefix="input-", dir=workdir)
    os.close(fd)
    try:
        # The fleet's checked download of exactly the planned bytes (a compressed file is one
        # slice, 0 to its size, read whole).
        item.fetch(tmp)
        with open(tmp, "rb") as f:
            docs = iter_documents(f, piece.format, piece.compression, source, base, tally, options)
            if places is None:
                yield from docs
                return
            with open(tmp, "rb") as again:  # read a second time, for the places
                yield from placed(
                    docs,
                    line_records(again, piece.format, piece.compression, base, options, getattr(places, "fields", ())),
                    file,
                    False,
                    places,
                    first,
                )
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:  # a failed download removes its own file
            pass


def file_format(store: Store, name: str, size: int) -> str:
    """A file's format: what its name says, or its first bytes show (formats.decide)."""
    return _format_and_head(store, name, size)[0]


def _format_and_head(store: Store, name: str, size: int) -> tuple[str, bytes]:
    """(format, the first bytes of its stream, decompressed: b"" for Parquet)."""
    by_name, compression = describe(name)
    if by_name == "parquet":
        return by_name, b""
    prefix = store.read(name, 0, min(size, (1 << 20) if compression != "none" else (64 << 10)))
    head = head_of(prefix, compression)
    return decide(by_name, name, head), head


def iter_path_documents(paths: list[str], options: ReadOptions = ReadOptions()) -> Iterator[list[str]]:
    """Every document under some files or folders (for vocab training and tools)."""
    for inp in find_corpus(paths):
        store = open_store(inp.url)
        fmt, (_, compression) = file_format(store, inp.name, inp.size), describe(inp.name)
        if fmt == "parquet":
            groups = row_groups(store, inp.name, inp.size, inp.version or None, options.text_column, inp.display)
            yield from parquet_documents(
                store, inp.name, inp.size, inp.version or None, 0, len(groups), inp.display, Tally(), options
            )
            continue
        if not inp.url.startswith("gs://"):
            with open(os.path.join(inp.url, inp.name), "rb") as f:
                yield from iter_documents(f, fmt, compression, inp.display, options=options)
            continue
        with tempfile.TemporaryDirectory() as d:
            yield from read_slice(Slice(inp.url, inp.name, 0, inp.size, fmt, compression), d, options=options)

"""Parquet inputs (hub datasets such as wikimedia/wikipedia or FineWeb): a document per row.

A file's items are ranges of its row groups, so a 500 MB shard spreads over several
workers; each reads only its row groups' text column, by ranged reads pinned to the
version planned, a row group at a time and a batch of rows of about ``_BATCH_BYTES``
at a time (bounded memory). A row's text splits into lines at newlines; a row whose
text is null or not valid UTF-8, or holds a line over MAX_LINE_BYTES, is a bad record
(named by its row), and costs that row only.

A row longer than MAX_DOCUMENT_CHARS is never made one Python string: its lines are
decoded from the Arrow buffer a window at a time, and ``formats._assemble`` hands them on
in parts of at most MAX_DOCUMENT_CHARS characters, as it does a text file's. pyarrow
still decodes a value whole, a page at a time: while it does, it holds the page
(compressed and not; with a dictionary, the dictionary page and its decoded copy) and the
value, two to four times the row's size (measured: 100 MB, plain and zstd: 250 MB;
pyarrow's defaults, dictionary and snappy: 365 MB). A big batch that ends its row group
lets the reader and those pages go before its rows are handed on. So the floor for a huge
row is its size times that factor; nothing of ours grows with it.

Several text columns (``--text-column title,text``): each must be a string column of the file
(checked at plan time, as one is); a row's document is their lines in the order named (their
texts joined by a blank line), a null column giving none; a row null in all of them, or bad
(invalid UTF-8, an over-long line) in any, is a bad record. Each column is read as one is,
a long value streamed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Iterator, cast

from fleet.job import InputError
from fleet.job import Changed, NotFound, Store, StoreFile

from fleet_jobs.text.inputs.formats import (
    _END,
    MAX_DOCUMENT_CHARS,
    MAX_LINE_BYTES,
    Bad,
    ReadOptions,
    Tally,
    _assemble,
    text_fields,
)

_BATCH = 1024  # rows decoded at a time, at most
_BATCH_BYTES = 8 << 20  # ... and about this much text (from the row group's mean row size)
_WINDOW = 4 << 20  # bytes of a long row decoded at a time
_READ_BUFFER = 4 << 20  # column chunks are read through a buffer this big, not whole


@dataclass(frozen=True)
class RowGroup:
    index: int
    rows: int
    text_bytes: int  # uncompressed size of the text column: the item's share of the input


def _open(store: Store, name: str, size: int, version: str | None, source: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(
            io.BufferedReader(StoreFile(store, name, size, version), buffer_size=1 << 20),
            buffer_size=_READ_BUFFER,
            pre_buffer=False,
        )
    except (Changed, NotFound):
        raise
    except Exception as e:  # pyarrow.ArrowInvalid and kin: not Parquet, or a truncated file
        raise InputError(f"{source}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _column(pf, columns: str, source: str) -> None:
    """Each text column (``title,text``: each of them) is a string column of the file."""
    import pyarrow as pa

    schema = pf.schema_arrow
    for column in text_fields(columns):
        index = schema.get_field_index(column)
        if index < 0:
            raise InputError(
                f"{source}: no column {column!r} (columns: {', '.join(schema.names)}); "
                "name the text column with --text-column"
            )
        kind = schema.field(index).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InputError(f"{source}: column {column!r} holds {kind}, not text")


def _leaves(meta, columns: tuple[str, ...]) -> list[int]:
    """The leaf column index of each text column (their sizes weigh items and batches)."""
    return [next(i for i in range(meta.num_columns) if meta.schema.column(i).path == c) for c in columns]


def row_groups(store: Store, name: str, size: int, version: str | None, column: str, source: str) -> list[RowGroup]:
    """A Parquet file's row groups, after checking it has a text column of that name (at plan time)."""
    pf = _open(store, name, size, version, source)
    _column(pf, column, source)
    meta = pf.metadata
    leaves = _leaves(meta, text_fields(column))
    out = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        out.append(RowGroup(i, rg.num_rows, sum(rg.column(leaf).total_uncompressed_size for leaf in leaves)))
    return out


def plan_row_groups(groups: list[RowGroup], target: int) -> list[tuple[int, int, int]]:
    """Ranges of row groups, (first, end, text bytes), of about ``target`` bytes of text each."""
    out, first, size = [], 0, 0
    for g in groups:
        size += g.text_bytes
        if size >= target:
            out.append((first, g.index + 1, size))
            first, size = g.index + 1, 0
    if first < len(groups):
        out.append((first, len(groups), size))
    return out


def parquet_documents(
    store: Store,
    name: str,
    size: int,
    version: str | None,
    first: int,
    end: int,
    source: str,
    tally: Tally,
    options: ReadOptions,
) -> Iterator[list[str]]:
    """The documents of row groups [first, end): a row's text, split into lines (a long row in parts)."""
    try:
        pf = _open(store, name, size, version, source)
        _column(pf, options.text_column, source)
        yield from _assemble(
            _events(_rows(pf, first, end, options.text_column)), source, tally, options, "", by_line=False
        )
    except Changed as e:
        raise InputError(f"{e}; plan a new run for the new contents") from None
    except NotFound:
        raise InputError(f"{source}: input file is gone") from None


class _Long:
    """A row longer than MAX_DOCUMENT_CHARS, checked whole (UTF-8, line lengths): its lines."""

    def __init__(self, parts: Iterator[list[str]]):
        self.parts = parts


def _events(rows: Iterator[list[str] | Bad | _Long]) -> Iterator:
    """``formats._assemble``'s events: a row's lines (a long row's a window at a time), then _END."""
    for row in rows:
        if row.__class__ is Bad:
            yield row
            continue
        yield from row.parts if row.__class__ is _Long else (row,)
        yield _END


def _rows(pf, first: int, end: int, column: str) -> Iterator[list[str] | Bad | _Long]:
    """Each row of the row groups: its lines, or a Bad, or (a long one) a _Long."""
    import pyarrow as pa

    names = text_fields(column)
    meta = pf.metadata
    leaves = _leaves(meta, names)
    row = sum(meta.row_group(i).num_rows for i in range(first))
    for group in range(first, end):
        rg = meta.row_group(group)
        mean = sum(rg.column(leaf).total_uncompressed_size for leaf in leaves) // max(1, rg.num_rows)
        batch_size = max(1, min(_BATCH, _BATCH_BYTES // max(1, mean)))
        batches = pf.iter_batches(batch_size=batch_size, row_groups=[group], columns=list(names), use_threads=False)
        done = 0
        for batch in batches:
            arrays = batch.columns
            del batch
            n = len(arrays[0])
            done += n
            if done >= rg.num_rows and sum(a.nbytes for a in arrays) > _WINDOW:  # the group's last batch, a big one:
                batches.close()  # let the reader go, and its pages (the dictionary page, the decoded page)
                pa.default_memory_pool().release_unused()
            if len(names) == 1:
                rows = _batch_rows(arrays[0], row, column, pa.types.is_large_string(arrays[0].type))
                yield from cast("Iterator[list[str] | Bad | _Long]", rows)  # (no None: not ``every``)
            else:
                yield from _joined_rows(arrays, row, names)
            row += n
            del arrays


def _joined_rows(arrays: list, row: int, names: tuple[str, ...]) -> Iterator[list[str] | Bad | _Long]:
    """The rows of one batch of several text columns: each row's lines of each column, in order
    (a long value's a window at a time); a Bad for a row bad in any column or null in all."""
    import pyarrow as pa

    cells = [
        list(_batch_rows(a, row, name, pa.types.is_large_string(a.type), every=True)) for a, name in zip(arrays, names)
    ]
    for i, values in enumerate(zip(*cells)):
        bad = next((v for v in values if v.__class__ is Bad), None)
        if bad is not None:
            yield bad
        elif all(v is None for v in values):
            yield Bad(-1, f"row {row + i + 1} has no text in any of the columns {', '.join(map(repr, names))}")
        elif any(v.__class__ is _Long for v in values):
            yield _Long(_joined_parts(values))
        else:
            lines = [line for v in values if v for line in v]  # lists or None here
            if lines:
                yield lines


def _joined_parts(values) -> Iterator[list[str]]:
    for v in values:
        if v.__class__ is _Long:
            yield from v.parts
        elif v:
            yield v


def _batch_rows(
    array, row: int, column: str, large: bool, every: bool = False
) -> Iterator[list[str] | Bad | _Long | None]:
    """The rows of one batch (``row`` rows came before it): short ones through ``to_pylist``,
    a run at a time; long ones streamed from the Arrow buffer. ``every``: one value per row
    (one of several text columns), a null one None and a blank one [], not left out."""
    import numpy as np

    n = len(array)
    kind = np.int64 if large else np.int32
    offsets = (
        np.frombuffer(array.buffers()[1], kind, n + 1, array.offset * np.dtype(kind).itemsize)
        if n
        else np.zeros(1, kind)
    )
    special = np.diff(offsets) > MAX_DOCUMENT_CHARS  # bytes: a row of fewer bytes has fewer characters
    nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else np.zeros(n, bool)
    special |= nulls
    at = 0
    for i in [*np.flatnonzero(special).tolist(), n]:
        if i > at:
            yield from _short_rows(array.slice(at, i - at), row + at, column, every)
        if i == n:
            break
        at = i + 1
        if nulls[i]:
            yield None if every else Bad(-1, f"row {row + i + 1} has no text in column {column!r}")
        else:
            yield _long_row(array, i, int(offsets[i]), int(offsets[i + 1]), row + i + 1, column)


def _short_rows(array, row: int, column: str, every: bool = False) -> Iterator[list[str] | Bad]:
    try:
        texts = array.to_pylist()
    except UnicodeDecodeError:  # some row is not UTF-8: find it, keep the others
        texts = []
        for i in range(len(array)):
            try:
                texts.append(array[i].as_py())
            except UnicodeDecodeError as e:
                texts.append(Bad(-1, f"row {row + i + 1}: invalid UTF-8 in column {column!r} (at byte {e.start})"))
    for text in texts:
        if text.__class__ is Bad:
            yield text
            continue
        lines = [line for line in text.split("\n") if line.strip()]
        if lines or every:
            yield lines


def _long_row(array, i: int, start: int, end: int, row: int, column: str) -> _Long | Bad:
    """A long row, after reading it through once: valid UTF-8 (Arrow checks it, as strictly as
    Python decodes), no line over MAX_LINE_BYTES (the bytes between two newlines)."""
    import numpy as np
    import pyarrow as pa

    try:
        array.slice(i, 1).validate(full=True)
    except pa.ArrowInvalid:
        return Bad(-1, f"row {row}: invalid UTF-8 in column {column!r}")
    data = array.buffers()[2]
    line_start = start  # where the line read on into the next window started
    for at in range(start, end, _WINDOW):
        stop = min(end, at + _WINDOW)
        newlines = np.flatnonzero(np.frombuffer(data, np.uint8, stop - at, at) == 10) + at
        longest = 0
        if len(newlines):
            longest = int((np.diff(newlines, prepend=line_start - 1) - 1).max())
            line_start = int(newlines[-1]) + 1
        if max(longest, stop - line_start) > MAX_LINE_BYTES:
            return Bad(
                -1,
                f"row {row}: a line longer than {MAX_LINE_BYTES >> 20} MiB in column {column!r} "
                "(not line-oriented text?)",
            )
    return _Long(_row_parts(memoryview(data), start, end))


def _row_parts(data: memoryview, start: int, end: int) -> Iterator[list[str]]:
    """The non-blank lines of data[start:end], decoded a window of whole lines at a time (a
    newline byte is never inside a UTF-8 character); ``_assemble`` packs them into parts."""
    at = start
    while at < end:
        chunk = bytes(data[at : min(end, at + _WINDOW)])
        cut = chunk.rfind(b"\n") + 1
        if not cut and at + len(chunk) < end:  # a line longer than the window (at most MAX_LINE_BYTES)
            chunk = bytes(data[at : min(end, at + MAX_LINE_BYTES + 1)])
            cut = chunk.find(b"\n") + 1
        if not cut or at + len(chunk) == end:
            cut = len(chunk)
        lines = [line for line in chunk[:cut].decode("utf-8").split("\n") if line.strip()]
        del chunk
        at += cut
        if lines:
            yield lines

"""Parquet inputs (hub datasets such as wikimedia/wikipedia or FineWeb): a document per row.

A file's items are ranges of its row groups, so a 500 MB shard spreads over several
workers; each reads only its row groups' text column, by ranged reads pinned to the
version planned, one batch of rows at a time (bounded memory). A row's text splits
into lines at newlines; a row whose text is null or not a string is a bad record.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Iterator

from fleet.inputs.formats import Bad, ReadOptions, Tally, checked
from fleet.job import InputError
from fleet.store import Changed, NotFound, Store

_BATCH = 1024  # rows converted to Python strings at a time


class StoreFile(io.RawIOBase):
    """A seekable read-only file over one object version, by ranged reads (what pyarrow needs
    to read a footer and some column chunks without fetching the whole object)."""

    def __init__(self, store: Store, name: str, size: int, version: str | None):
        self.store, self.name, self.size, self.version = store, name, size, version
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        data = self.store.read(self.name, self.pos, end, version=self.version)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass(frozen=True)
class RowGroup:
    index: int
    rows: int
    text_bytes: int  # uncompressed size of the text column: the item's share of the input


def _open(store: Store, name: str, size: int, version: str | None, source: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(io.BufferedReader(StoreFile(store, name, size, version), buffer_size=1 << 20))
    except (Changed, NotFound):
        raise
    except Exception as e:  # pyarrow.ArrowInvalid and kin: not Parquet, or a truncated file
        raise InputError(f"{source}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _column(pf, column: str, source: str) -> int:
    import pyarrow as pa

    schema = pf.schema_arrow
    index = schema.get_field_index(column)
    if index < 0:
        raise InputError(f"{source}: no column {column!r} (columns: {', '.join(schema.names)}); "
                         "name the text column with --text-column")
    kind = schema.field(index).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{source}: column {column!r} holds {kind}, not text")
    return index


def row_groups(store: Store, name: str, size: int, version: str | None, column: str, source: str) -> list[RowGroup]:
    """A Parquet file's row groups, after checking it has a text column of that name (at plan time)."""
    pf = _open(store, name, size, version, source)
    _column(pf, column, source)
    meta = pf.metadata
    leaf = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == column)
    out = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        out.append(RowGroup(i, rg.num_rows, rg.column(leaf).total_uncompressed_size))
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


def parquet_documents(store: Store, name: str, size: int, version: str | None, first: int, end: int, source: str,
                      tally: Tally, options: ReadOptions) -> Iterator[list[str]]:
    """The documents of row groups [first, end): a row's text, split into lines."""
    try:
        pf = _open(store, name, size, version, source)
        _column(pf, options.text_column, source)
        yield from checked(_rows(pf, first, end, options.text_column), source, tally, options, "")
    except Changed as e:
        raise InputError(f"{e}; plan a new run for the new contents") from None
    except NotFound:
        raise InputError(f"{source}: input file is gone") from None


def _rows(pf, first: int, end: int, column: str) -> Iterator[list[str] | Bad]:
    row = sum(pf.metadata.row_group(i).num_rows for i in range(first))
    for batch in pf.iter_batches(batch_size=_BATCH, row_groups=list(range(first, end)), columns=[column]):
        for text in batch.column(0).to_pylist():
            row += 1
            if not isinstance(text, str):
                yield Bad(-1, f"row {row} has no text in column {column!r}")
                continue
            lines = [line for line in text.split("\n") if line.strip()]
            if lines:
                yield lines

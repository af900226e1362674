"""Where each document of an item comes from (``provenance=true``): its input file, the byte
offset of its record or its Parquet row, and its ordinal in the item.

The readers (formats.py, parquet.py) are tuned so that clean input pays no offset bookkeeping,
and a run that does not ask for places must not pay for them. So places are found by a second,
plain reading of the same bytes, only when asked: the records of the item, in order, each with
its place and the lines a document of it would hold, matched against the documents the real
reader yields. A document (or each part of a long one) is the next record's lines, or the
next lines of the record a part before it came from; a record that yields nothing (damaged,
blank, dropped as the reader drops it) is passed over. Lines are compared, not guessed, so a
place is exact wherever the reader and this module agree on what a record holds; a document
that matches no record (none is known) gets no place (``None``) rather than a wrong one.

What a place is, per format:

- text: the byte offset of the document's first line (a document is the lines between blank lines);
- JSON Lines: the offset of the document's JSON record (its line); CirrusSearch: of its content line;
- WikiExtractor: the offset of its ``<doc id=…>`` line;
- Parquet: its row, counted from the file's first row (0-based), over all row groups.

In an item of several small files (a grouped item: ``ItemInput.parts``), a place names the file
its document came from and counts the offset or row in that file; ``document`` counts on across
the item's files, in their order.

Offsets count bytes of the file as it is stored; in a compressed file (one item, read whole)
they count bytes of the decompressed stream (``zcat file | tail -c +$((offset + 1))`` shows the
record). A document longer than MAX_DOCUMENT_CHARS reaches the job in parts, each its own
document in the item's count; every part has its record's place.

Cost, only when asked: the item's bytes are read twice (a Parquet item's text column too), and
one record's lines are held while its documents are matched.
"""

from __future__ import annotations

import json
from itertools import chain
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator, Literal, overload

from fleet_jobs.text.inputs import formats
from fleet_jobs.text.inputs.formats import _DOC_OPEN, _SURROGATE, ReadOptions


@dataclass(frozen=True)
class Place:
    """One document's source: the file, where its record starts (``offset``, a byte of the file or
    of its decompressed stream) or its Parquet ``row``, and its ordinal in the item (``document``);
    ``fields``: the input fields asked for (``Places.fields``), by name, as text (``field_text``),
    None where none were asked."""

    file: str
    document: int
    offset: int | None = None
    row: int | None = None
    fields: dict[str, str | None] | None = None

    def as_json(self) -> dict:
        key, value = ("row", self.row) if self.row is not None else ("offset", self.offset)
        out: dict = {"file": self.file, key: value, "document": self.document}
        if self.fields is not None:
            out["fields"] = self.fields
        return out


class Places(list):
    """The places of an item's documents as they are handed on (a list of Place), and the input
    fields (JSON keys, Parquet columns) each place carries: what a reader asks ``read_slice`` for."""

    def __init__(self, fields: tuple[str, ...] = ()):
        super().__init__()
        self.fields = tuple(fields)


Record = tuple[int, list[str], "tuple[str | None, ...] | None"]  # (offset or row, lines, fields' values)


def field_text(value: object) -> str | None:
    """A field's value as the outputs carry it: a string as it is, null as None, anything else (a
    number, a list, a timestamp) as its JSON; a lone surrogate (a JSON escape of half a pair),
    which no UTF-8 output can hold, as U+FFFD."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return _SURROGATE.sub("\ufffd", text) if "\ud800" <= max(text, default="") else text


def placed(
    documents: Iterable[list[str]],
    records: Iterator[Record],
    file: str,
    parquet: bool,
    places: list[Place],
    first: int = 0,
) -> Iterator[list[str]]:
    """``documents`` unchanged, each one's Place appended to ``places`` before it is handed on;
    ``first``: the ordinal of the first in its item (a later file of a grouped item starts past 0).
    With ``Places.fields``, each Place carries its record's values of them (None: no record)."""
    match = _Matcher(records)
    names = getattr(places, "fields", ())
    for n, doc in enumerate(documents, first):
        where, values = match.place(doc)
        fields = dict(zip(names, values or (None,) * len(names))) if names else None
        places.append(
            Place(file, n, row=where, fields=fields) if parquet else Place(file, n, offset=where, fields=fields)
        )
        yield doc


class _Matcher:
    """Documents matched, in order, to the records that hold their lines. A record that yields
    nothing is passed over; a document that no record of the next LOOKAHEAD holds (a case the
    two readings see differently) gets no place, and the records stay for the next one."""

    def __init__(self, records: Iterator[Record]):
        self.records = records
        self.ahead: deque[Record] = deque()
        self.where, self.used = 0, 0  # the record being matched, and its lines matched
        self.lines: list[str] = []
        self.values: tuple[str | None, ...] | None = None

    def place(self, doc: list[str]) -> tuple[int | None, tuple[str | None, ...] | None]:
        """The document's record: where it starts and its fields' values ((None, None): none)."""
        if self.used and self.lines[self.used : self.used + len(doc)] == doc:  # the record's next part
            self.used += len(doc)
            return self.where, self.values
        n = len(doc)
        for i, (where, lines, values) in enumerate(self._ahead()):
            if lines[:n] == doc:
                for _ in range(i + 1):
                    self.ahead.popleft()
                self.where, self.lines, self.used, self.values = where, lines, n, values
                return where, values
        return None, None

    def _ahead(self) -> Iterator[Record]:
        yield from list(self.ahead)
        while len(self.ahead) < LOOKAHEAD:
            record = next(self.records, None)
            if record is None:
                return
            self.ahead.append(record)
            yield record


LOOKAHEAD = 4096  # records a document is looked for in, past the last one matched


@overload
def _lines(raw: BinaryIO, compression: str, base: int, whole: Literal[False]) -> Iterator[tuple[int, str | None]]: ...


@overload
def _lines(raw: BinaryIO, compression: str, base: int, whole: bool) -> Iterator[tuple[int, str | bytes | None]]: ...


def _lines(raw: BinaryIO, compression: str, base: int, whole: bool) -> Iterator[tuple[int, str | bytes | None]]:
    """(offset, line) for each line of the stream as the reader sees it (formats._lines): None
    for a line the reader drops (invalid UTF-8, or longer than MAX_LINE_BYTES); with ``whole``
    (JSON records), such a long line comes whole, as bytes, for it is read as a stream there. The same blocks as the reader's (formats._blocks), so a
    stream that breaks off ends the lines where the reader's end; a byte-order mark that opens
    the stream is in no line, and one of UTF-16 or UTF-32 has it read as UTF-8, as the reader does."""
    limit = formats.MAX_LINE_BYTES
    carry = b""
    offset = base  # of carry[0]
    skipping = False  # inside an over-long line (not ``whole``): its bytes are passed over
    blocks = formats._blocks(raw, compression)
    if offset == 0:  # as the reader: a byte-order mark says how the stream is encoded
        blocks, offset, _ = formats.opened(blocks, formats._BLOCK)
    for block in blocks:
        if block.__class__ is formats.Trailing:  # the stream's end, as the reader sees it
            break
        if block.__class__ is not bytes:  # broken off: a JSON record the reader was streaming gave it lines
            if whole and len(carry) > limit:
                yield offset, carry
            return
        data = carry + block if carry else block
        at = 0
        while True:
            nl = data.find(b"\n", at)
            if nl < 0:
                break
            if skipping:
                skipping = False
            else:
                yield offset + at, _decoded(data[at:nl], limit, whole)
            at = nl + 1
        offset += at
        carry = data[at:]
        if not whole and len(carry) > limit:
            if not skipping:
                yield offset, None
                skipping = True
            offset += len(carry)
            carry = b""
    if carry and not skipping:
        yield offset, _decoded(carry, limit, whole)


def _decoded(line: bytes, limit: int, whole: bool) -> str | bytes | None:
    if len(line) > limit:
        return line if whole else None
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return None


def line_records(
    raw: BinaryIO, fmt: str, compression: str, base: int, options: ReadOptions, fields: tuple[str, ...] = ()
) -> Iterator[Record]:
    """(offset, lines, values) of every record of a line format that may yield a document;
    ``values``: the record's ``fields`` (a JSON record's keys; plain text and WikiExtractor have
    none: every value None), or None when no field is asked for."""
    if fmt == "text":
        records = _text_records(_lines(raw, compression, base, False))
    elif fmt == "wikiextractor":
        records = _wikiextractor_records(_lines(raw, compression, base, False), options.keep_titles)
    else:
        return _json_records(_lines(raw, compression, base, True), options.text_column, fmt == "cirrus", fields)
    none = (None,) * len(fields) if fields else None
    return ((where, lines, none) for where, lines in records)


def _text_records(lines: Iterator[tuple[int, str | None]]) -> Iterator[tuple[int, list[str]]]:
    start = 0
    doc: list[str] = []
    for offset, line in lines:
        if line is None:  # a bad line is dropped; its document goes on
            continue
        if line.strip():
            if not doc:
                start = offset
            doc.append(line)
        elif doc:
            yield start, doc
            doc = []
    if doc:
        yield start, doc


def _wikiextractor_records(
    lines: Iterator[tuple[int, str | None]], keep_titles: bool
) -> Iterator[tuple[int, list[str]]]:
    """As formats._wikiextractor_events: a <doc> line opens (and drops an open one), </doc> closes."""
    outside, title, text = 0, 1, 2
    state, start = outside, 0
    doc: list[str] = []
    for offset, line in lines:
        if line is None:
            if state:
                state = text  # a bad line after <doc> is its title
            continue
        if line[:1] == "<":
            if state and (line == "</doc>" or line.startswith("</doc>") and not line[6:].strip()):
                if doc:
                    yield start, doc
                state, doc = outside, []
                continue
            if line.startswith("<doc") and _DOC_OPEN.match(line):
                if state and sum(map(len, doc)) > formats.MAX_DOCUMENT_CHARS:
                    yield start, doc  # unclosed: dropped, but for the parts handed on before
                state, start, doc = (text if keep_titles else title), offset, []
                continue
        if state == text:
            if line.strip():
                doc.append(line)
        elif state:
            state = text
    if state and sum(map(len, doc)) > formats.MAX_DOCUMENT_CHARS:
        yield start, doc


def _json_records(
    lines: Iterator[tuple[int, str | bytes | None]], column: str, cirrus: bool, fields: tuple[str, ...] = ()
) -> Iterator[Record]:
    names = formats.text_fields(column)
    for offset, line in lines:
        if line.__class__ is bytes:  # longer than a line: read as the reader streams it
            doc = _long_record(line, column)
            if doc:
                yield offset, doc, _long_fields(line, fields) if fields else None
            continue
        if line is None or not line.strip():
            continue
        try:
            record = json.loads(line)
        except Exception:  # whatever the decoder raises: the reader drops the record (formats._json_events)
            continue
        if not isinstance(record, dict) or cirrus and set(record) == {"index"}:
            continue
        text = record.get(column) if len(names) == 1 else formats.joined_text(record, names)
        if not isinstance(text, str) or text.__class__ is formats._NotText:
            continue
        if "\\u" in line and _SURROGATE.search(text):
            continue
        doc = [part for part in text.split("\n") if part.strip()]
        if doc:
            yield offset, doc, tuple(field_text(record.get(name)) for name in fields) if fields else None


def _long_fields(line: bytes, fields: tuple[str, ...]) -> tuple[str | None, ...]:
    """A long record's fields: the record decoded whole (its values, or None if it is damaged: not
    JSON, or not UTF-8, as the reader takes it; ``json.loads`` of bytes would let surrogates pass)."""
    try:
        record = json.loads(line.decode("utf-8"))
    except Exception:  # whatever the decoder raises: the parts handed on have no fields to give
        record = None
    return tuple(field_text(record.get(name)) if isinstance(record, dict) else None for name in fields)


def _long_record(line: bytes, column: str) -> list[str]:
    """The lines a JSON record longer than MAX_LINE_BYTES gives the reader (formats._LongRecord),
    up to where it fails, if it does: what the reader's assembler handed on before stays, what it
    held is dropped (a record that fails at its end, as one whose named field holds a number
    does once its other fields are read, gives nothing unless its parts filled before)."""
    record = formats._LongRecord(0, 0, column)
    events = chain(record.feed(line), record.close())
    doc: list[str] = []
    for part in formats._assemble(events, "", formats.Tally(), _ANY_SHARE, "", by_line=False):
        doc += part
    return doc


_ANY_SHARE = ReadOptions(max_bad_share=1.0)  # one record's bad lines never fail the reading


def parquet_records(pf, first: int, end: int, column: str, fields: tuple[str, ...] = ()) -> Iterator[Record]:
    """(row, lines, values) of every row of row groups [first, end) with text (rows counted from the
    file's first); ``values``: the row's ``fields`` columns (a column the file lacks: None), or None
    when no field is asked for."""
    meta = pf.metadata
    row = sum(meta.row_group(i).num_rows for i in range(first))
    names = set(pf.schema_arrow.names)
    text = formats.text_fields(column)
    present = [name for name in fields if name in names and name not in text]
    for group in range(first, end):
        batches = pf.iter_batches(batch_size=256, row_groups=[group], columns=[*text, *present], use_threads=False)
        for batch in batches:
            texts = [_texts(batch.column(k)) for k in range(len(text))]
            columns = {name: _values(batch.column(len(text) + k)) for k, name in enumerate(present)}
            for k, name in enumerate(text):
                if name in fields:
                    columns[name] = [None if t is _INVALID else t for t in texts[k]]
            for i, cells in enumerate(zip(*texts)):
                if _INVALID in cells:  # the reader drops a row any of whose text is not UTF-8
                    continue
                doc = [line for cell in cells if cell is not None for line in cell.split("\n") if line.strip()]
                if doc:
                    values = tuple(field_text(columns[n][i]) if n in columns else None for n in fields)
                    yield row + i, doc, values if fields else None
            row += batch.num_rows


def _values(array) -> list:
    try:
        return array.to_pylist()
    except (UnicodeDecodeError, ValueError, OverflowError):  # a value Python cannot hold: none, as missing
        return [None] * len(array)


_INVALID = object()  # a text value that is not UTF-8


def _texts(array) -> list:
    """A text column's values: strings, None where null, _INVALID where not UTF-8."""
    try:
        return array.to_pylist()
    except UnicodeDecodeError:  # some row is not UTF-8 (the reader drops it)
        return [_text(array, i) for i in range(len(array))]


def _text(array, i: int) -> object:
    try:
        return array[i].as_py()
    except UnicodeDecodeError:
        return _INVALID

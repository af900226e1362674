"""Documents from bytes, in the formats corpora come in.

- ``text``: one sentence or paragraph per line, a blank line between documents
  (BERT's format);
- ``jsonl``: JSON Lines, a document per record in its text field (WikiExtractor's
  ``--json`` output among them), or its text fields' texts joined (``--text-column
  title,text``: text_fields, joined_text);
- ``cirrus``: Wikipedia CirrusSearch dumps, Elasticsearch bulk files whose index
  lines alternate with content lines; documents are the content lines' text;
- ``wikiextractor``: WikiExtractor's ``<doc id=… url=… title=…>`` … ``</doc>``
  shards; blank lines inside a document separate paragraphs, not documents, and
  the title line that opens each is dropped unless asked for.

One bad record does not sink an item, and costs no more than itself (issue 17): in text
and WikiExtractor shards the unit of damage is the line (invalid UTF-8, or longer than
MAX_LINE_BYTES: the line is dropped, its document goes on); in JSON it is the record (not
JSON, no text field, invalid UTF-8, or a lone surrogate escape such as "\\ud800" in its
text, which no UTF-8 encoder takes later); a <doc> left open by the next <doc> or by the end
of the item drops the document it holds; a compressed stream that ends early keeps the
documents before the break, and bytes after its last complete member that start none are
counted as trailing garbage (their bytes, not a record) after every document is kept. Each is tallied with its byte offset. The item fails only when
more than ``max_bad_share`` of its records (lines, for text and WikiExtractor) are bad: then
the data is not in this format at all. NUL and other control characters are text (BERT's
cleaning drops them), not damage.

Documents are read as a stream: a document is handed on whole when it ends, or in parts of
MAX_DOCUMENT_CHARS characters (cut between lines) as soon as a part is full, so that memory is
bounded by a part and a line whatever the document; damage found later in a document drops
only what is not handed on yet. A JSON record longer than MAX_LINE_BYTES is read the same way
(longjson.py). What is read never depends on where blocks, chunks or items fall.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import tempfile
from itertools import chain
from dataclasses import dataclass, field
from typing import IO, BinaryIO, Iterator

from fleet.job import ConfigError, InputError

from fleet_jobs.text.inputs.compression import COMPRESSIONS, Trailing, decompressed, head_of
from fleet_jobs.text.inputs.encoding import head_text, opened
from fleet_jobs.text.inputs.longjson import NotJSON, TextField
from fleet_jobs.text.inputs.names import describe

_BLOCK = 4 << 20  # at most MAX_LINE_BYTES: then only a line that a block's carry starts can be over-long
MAX_LINE_BYTES = 16 << 20
MAX_DOCUMENT_CHARS = 4 << 20  # longer documents reach the job in parts: bounded memory per document
FORMATS = ("text", "jsonl", "cirrus", "wikiextractor", "parquet")
_EARLY = 100  # bad records before the share is judged while reading (a binary file fails fast)
# A WikiExtractor document starts with a line <doc id=…>: the reader and the item cutter
# (ranges.py) agree on it, so that a cut never changes what is read.
_DOC_OPEN = re.compile(r"<doc\s+id=.*>\s*$")
_EXAMPLES = 5


@dataclass(frozen=True)
class ReadOptions:
    """How documents are read from every input of a run (part of its plan)."""

    text_column: str = "text"  # the field of a JSON record or the column of a Parquet file; "title,text": joined
    keep_titles: bool = False  # WikiExtractor: keep the title line that opens each document
    max_bad_share: float = 0.5  # an item fails when more of its records than this are bad


TEXT_SEPARATOR = "\n\n"  # between the texts of several text fields: a blank line, which ends no document


def text_fields(column: str) -> tuple[str, ...]:
    """The text fields ``--text-column`` names: one name as it is, or several, comma-separated
    (``title,text``: each record's document is their texts joined, in that order, by a blank
    line). ConfigError, naming the option, for an empty or repeated name."""
    if "," not in column:
        if not column:
            raise ConfigError(f"--text-column {column!r}: give the name of a JSON field or Parquet column")
        return (column,)
    names = tuple(name.strip() for name in column.split(","))
    if not all(names):
        raise ConfigError(
            f"--text-column {column!r}: an empty name; give a field, or several comma-separated (title,text)"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"--text-column {column!r}: names a field twice")
    return names


def no_text(names: tuple[str, ...]) -> str:
    """What a record without text lacks, for its Bad: the text field, or each of several."""
    if len(names) == 1:
        return f"has no string field {names[0]!r}"
    return f"has no string in any of the fields {', '.join(map(repr, names))}"


class _NotText(str):
    """Why a record's text fields give no text (a named field holds a number, a list...)."""


def joined_text(record: dict, names: tuple[str, ...]) -> str | None | _NotText:
    """The text of several text fields of a JSON record: their strings joined in the order named,
    a blank line between them; a field missing or null gives nothing. None when none holds a
    string; a _NotText when one holds anything else (a number, a list, an object: a bad record,
    as a single text field holding one is)."""
    texts, found = [], False
    for name in names:
        value = record.get(name)
        if isinstance(value, str):
            found = True
            if value:
                texts.append(value)
        elif value is not None:
            return _NotText(f"field {name!r} holds {_kind(value)}, not text")
    return TEXT_SEPARATOR.join(texts) if found else None


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "a list" if isinstance(value, list) else "an object"


@dataclass
class Tally:
    """What reading an item found besides its documents, for its stats."""

    documents: int = 0
    records: int = 0  # good records the bad share is judged over: lines of text and WikiExtractor, else documents
    bad: int = 0
    examples: list[str] = field(default_factory=list)  # the first few bad records: where and why
    documents_cut: int = 0
    trailing: int = 0  # bytes after a complete compressed stream that start no member (compression.Trailing)

    def stats(self) -> dict:
        out: dict = {}
        if self.bad:
            out["bad_records"] = self.bad
        if self.examples:
            out["bad_examples"] = list(self.examples)
        if self.trailing:
            out["trailing_garbage_bytes"] = self.trailing
        if self.documents_cut:
            out["documents_cut"] = self.documents_cut
        return out

    def counts(self) -> dict[str, int]:
        """The exact counts of ``stats`` (a file's row of the run's manifest), without the examples."""
        return {k: v for k, v in self.stats().items() if isinstance(v, int)}

    def absorb(self, other: "Tally") -> None:
        """Add what another reading found (one file of a grouped item) to this one (the item's)."""
        self.documents += other.documents
        self.records += other.records
        self.bad += other.bad
        self.documents_cut += other.documents_cut
        self.trailing += other.trailing
        self.examples += other.examples[: max(0, _EXAMPLES - len(self.examples))]


@dataclass(frozen=True)
class Bad:
    """A bad record: where it starts (-1: no offset, ``why`` says where) and why; ``end`` is
    where the next line starts (None when unknown); ``final`` when nothing can be read after it."""

    offset: int
    why: str
    end: int | None = None
    final: bool = False


def _blocks(raw: BinaryIO, compression: str) -> Iterator[bytes | Exception | Trailing]:
    """Blocks of at most _BLOCK bytes; where a compressed stream breaks off, what it gave up to
    there, then the error (a plain read of a broken stream would lose the whole block); after
    the last block of one followed by trailing garbage, its compression.Trailing."""
    stream = decompressed(raw, compression)
    if compression == "none":
        while block := stream.read(_BLOCK):
            yield block
        return
    read = getattr(stream, "read1", stream.read)
    while True:
        parts, size, error = [], 0, None
        try:
            while size < _BLOCK:
                part = read(min(1 << 20, _BLOCK - size))
                if not part:
                    break
                parts.append(part)
                size += len(part)
        except Exception as e:  # EOFError, OSError, zlib.error; zstd raises its own ZstdError
            error = e
        if parts:
            yield b"".join(parts)
        if error is not None:
            yield error
            return
        if size < _BLOCK:
            trailing = getattr(stream, "trailing", None)
            if trailing is not None:
                yield trailing
            return


@dataclass(frozen=True)
class _LongLine:
    """A line longer than MAX_LINE_BYTES starts here; its bytes follow in chunks, then a _LongEnd."""

    offset: int


@dataclass(frozen=True)
class _LongEnd:
    end: int  # where the next line starts


# _lines hands clean lines on a block at a time, as a segment: a tuple (base, lines, chars,
# end) of consecutive decoded lines, the byte offset where the first starts, an upper bound
# of their characters, and the offset after the last one's newline (as if the stream's last
# line had one). A line's offset is counted only when a bad record needs it (_advance,
# _back), not line by line: clean input pays no offset bookkeeping.
def _lines(
    raw: BinaryIO, compression: str, base_offset: int, stream_long: bool = False, trailing: list | None = None
) -> Iterator[tuple | Bad | _LongLine | _LongEnd | bytes]:
    """Segments of decoded lines, and a Bad for each line that cannot be one (invalid UTF-8,
    or longer than MAX_LINE_BYTES) or where a compressed stream breaks off. With
    ``stream_long``, an over-long line is handed on as a _LongLine, its bytes in chunks and a
    _LongEnd instead of a Bad. Offsets are bytes of the (decompressed) stream; a byte-order
    mark that opens the stream is in no line, and one of UTF-16 or UTF-32 has the stream read
    as UTF-8 (encoding.py: offsets then count bytes of its text as UTF-8). Only the line that a block's carry starts can be
    over-long, as long as _BLOCK <= MAX_LINE_BYTES: lines are judged by their length alone,
    however the blocks fall. Trailing garbage after a compressed stream ends the lines as the
    end of the stream does, and its Trailing goes to ``trailing``: not a line's damage."""
    carry = b""
    offset = base_offset  # offset of carry[0], or of the next byte when carry is empty
    long_at = -1  # inside an over-long line that started there: its bytes are passed over
    blocks, encoding = _blocks(raw, compression), "UTF-8"
    if offset == 0:  # the stream's start: a byte-order mark says how it is encoded
        blocks, offset, encoding = opened(blocks, _BLOCK)
    for block in blocks:
        if block.__class__ is not bytes:
            if block.__class__ is Trailing:
                if trailing is not None:
                    trailing.append(block)
                break
            assert isinstance(block, Exception)  # neither bytes nor a Trailing: the stream's error (_blocks)
            if long_at >= 0:
                yield _LongEnd(offset) if stream_long else _too_long(long_at, None)
            yield Bad(
                offset + len(carry),
                f"corrupt or truncated {compression} data ({block}); the documents before it are kept",
                final=True,
            )
            return
        if long_at >= 0:
            nl = block.find(b"\n")
            if nl < 0:
                if stream_long:
                    yield block
                offset += len(block)
                continue
            if stream_long:
                yield block[:nl]
                yield _LongEnd(offset + nl + 1)
            else:
                yield _too_long(long_at, offset + nl + 1)
            block, offset, long_at = block[nl + 1 :], offset + nl + 1, -1
        data = carry + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE_BYTES:
                long_at = offset
                if stream_long:
                    yield _LongLine(offset)
                    yield data
                offset, carry = offset + len(data), b""
            else:
                carry = data
            continue
        head, base = data[:cut], offset
        if carry:  # only a line that began in an earlier block can be over-long
            nl = data.find(b"\n")
            if nl > MAX_LINE_BYTES:
                if stream_long:
                    yield _LongLine(offset)
                    yield data[:nl]
                    yield _LongEnd(offset + nl + 1)
                else:
                    yield _too_long(offset, offset + nl + 1)
                head, base = head[nl + 1 :], offset + nl + 1
        if head:
            try:
                text = head.decode("utf-8")
            except UnicodeDecodeError:
                yield from _line_by_line(head, base, encoding)
            else:
                lines = text.split("\n")
                lines.pop()  # the empty string after the final newline
                yield (base, lines, len(text), base + len(head))
        offset += cut
        carry = data[cut:]
    if long_at >= 0:
        yield _LongEnd(offset) if stream_long else _too_long(long_at, offset)
    elif carry:
        try:
            line = carry.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Bad(offset + e.start, f"invalid {encoding}", end=offset + len(carry))
        else:
            yield (offset, [line], len(line), offset + len(carry) + 1)


def _too_long(offset: int, end: int | None) -> Bad:
    return Bad(offset, f"a line longer than {MAX_LINE_BYTES >> 20} MiB (not line-oriented text?)", end=end)


def _line_by_line(head: bytes, base: int, encoding: str = "UTF-8") -> Iterator[tuple | Bad]:
    """A block that is not UTF-8 as a whole: its good lines in segments, a Bad for each other."""
    good: list[str] = []
    start = pos = base  # where the segment in progress starts; where the next line starts
    for raw_line in head.split(b"\n")[:-1]:
        try:
            good.append(raw_line.decode("utf-8"))
        except UnicodeDecodeError as e:
            if good:
                yield (start, good, sum(map(len, good)), pos)
                good = []
            yield Bad(pos + e.start, f"invalid {encoding}", end=pos + len(raw_line) + 1)
            start = pos + len(raw_line) + 1
        pos += len(raw_line) + 1
    if good:
        yield (start, good, sum(map(len, good)), pos)


def _advance(lines: list[str], i: int, at: int, j: int) -> int:
    """Where line j of a segment starts, from where its line i (i <= j) starts: ``at``."""
    for line in lines[i:j]:
        at += (len(line) if line.isascii() else len(line.encode())) + 1
    return at


def _back(lines: list[str], j: int, end: int) -> int:
    """Where line j of a segment starts, counted back from the segment's end."""
    for line in lines[j:]:
        end -= (len(line) if line.isascii() else len(line.encode())) + 1
    return end


# What the format readers hand the assembler (_assemble): a list of lines continues the
# document in progress; _END ends it (what it holds is handed on); _DROP ends it as damaged
# (what is not handed on yet is dropped: a document is held back until it ends or fills a
# part); a Bad is counted; a _Whole is a run of whole documents, each shorter than a part,
# that began and ended with nothing of theirs handed on before (the common case, handed on
# _WHOLE at a time rather than as a list and an _END each). A reader hands lines on in runs
# of about a part, never more.
_END = object()
_DROP = object()


class _Whole(list):
    """Whole documents, each shorter than a part: as if each came as a list then _END."""


_WHOLE = 64  # whole documents handed on at a time at most: held for a whole segment, they outlive
# the collector's young generation and cost full collections (a sixth of the time to read short text)


def _text_events(lines: Iterator) -> Iterator:
    """Plain text: blank lines end documents. A bad line is dropped and counted, and its
    document goes on: the unit of damage is the line (the share is judged over lines too);
    a stream that breaks off drops the document it breaks."""
    run: list[str] = []  # lines of the document in progress not handed on yet
    size = 0  # characters in run (counted only in a segment where a part can fill)
    sent = False  # some of the document in progress was handed on: it is not whole
    limit = MAX_DOCUMENT_CHARS
    for item in lines:
        if item.__class__ is tuple:
            seg = item[1]
            whole = _Whole()
            # Two copies of one loop, on purpose: the first (where no part can fill) leaves out the
            # per-line counting of the second, so that clean short text pays nothing per line for parts.
            if size + item[2] < limit:  # no part fills in this segment: no counting
                for line in seg:
                    if line.strip():
                        run.append(line)
                    elif run or sent:
                        if sent:  # (whole is empty: it is handed on before anything is sent)
                            if run:
                                yield run
                            yield _END
                            sent = False
                        else:
                            whole.append(run)
                            if len(whole) >= _WHOLE:
                                yield whole
                                whole = _Whole()
                        run = []
                size = sum(map(len, run))
            else:
                for line in seg:
                    if line.strip():
                        run.append(line)
                        size += len(line)
                        if size >= limit:
                            if whole:
                                yield whole
                                whole = _Whole()
                            yield run
                            run, size, sent = [], 0, True
                    elif run or sent:
                        if sent:
                            if run:
                                yield run
                            yield _END
                            sent = False
                        else:
                            whole.append(run)
                            if len(whole) >= _WHOLE:
                                yield whole
                                whole = _Whole()
                        run, size = [], 0
            if whole:
                yield whole
        elif item.final:
            yield _DROP
            yield item
            return
        else:
            if run:  # handed on first, so that the share is judged with the lines before
                yield run
                run, size, sent = [], 0, True
            yield item
    if run or sent:
        if run:
            yield run
        yield _END


def _json_events(lines: Iterator, column: str, cirrus: bool) -> Iterator:
    """JSON Lines: a record's text field is a document (blank lines in it separate paragraphs);
    several text fields (``title,text``): their texts joined (joined_text). A bad record (not
    JSON, no text, a named field holding a number or a list, invalid UTF-8 or a lone surrogate
    escape in its text) is one Bad with its offset. Not JSON is whatever the decoder raises on the record, not only
    ValueError: a record nested past the recursion limit (RecursionError) is the record's
    damage, not the item's. A record longer than MAX_LINE_BYTES is read as a stream
    (longjson): its text is handed on in parts as it is decoded, and damage found further on
    drops what is not handed on yet."""
    number = 0
    long: _LongRecord | None = None
    loads = json.loads
    limit = MAX_DOCUMENT_CHARS
    names = text_fields(column)
    joined = names if len(names) > 1 else None  # several text fields (else as ever: one, read as it is)
    for item in lines:
        cls = item.__class__
        if cls is tuple:
            seg = item[1]
            first = number + 1
            ci, co = 0, item[0]  # line ci of the segment starts at byte co
            whole = _Whole()
            for number, line in enumerate(seg, first):
                if not line.strip():
                    continue
                try:
                    record = loads(line)
                except Exception as e:  # ValueError; RecursionError (nested too deep), MemoryError...: its record's
                    why = f"record {number} is not JSON ({e.__class__.__name__}: {str(e)[:80]})"
                else:
                    if cirrus and isinstance(record, dict) and set(record) == {"index"}:
                        continue  # an Elasticsearch bulk action line: the content line follows
                    if joined is None:
                        text = record.get(column) if isinstance(record, dict) else None
                    else:
                        text = joined_text(record, joined) if isinstance(record, dict) else None
                    if not isinstance(text, str):
                        why = f"record {number} {no_text(names)}"
                    elif text.__class__ is _NotText:
                        why = f"record {number}: {text}"
                    elif "\\u" in line and _SURROGATE.search(text):
                        why = f"record {number}: {_LONE_SURROGATE}"
                    else:
                        doc = [line for line in text.split("\n") if line.strip()]
                        if not doc:  # blank lines separate paragraphs, as inside a WikiExtractor <doc>
                            continue
                        if len(text) <= limit:
                            whole.append(doc)
                            if len(whole) >= _WHOLE:
                                yield whole
                                whole = _Whole()
                            continue
                        if whole:
                            yield whole
                            whole = _Whole()
                        yield doc
                        yield _END
                        continue
                co, ci = _advance(seg, ci, co, number - first), number - first
                if whole:
                    yield whole
                    whole = _Whole()
                yield Bad(co, why)
            if whole:
                yield whole
        elif cls is bytes:
            assert long is not None  # a long record's bytes come between its _LongLine and _LongEnd (_lines)
            yield from long.feed(item)
        elif cls is _LongLine:
            number += 1
            long = _LongRecord(item.offset, number, column)
        elif cls is _LongEnd:
            assert long is not None  # after its _LongLine (_lines)
            yield from long.close()
            long = None
        else:
            number += 1
            if long is not None:
                yield _DROP
            yield Bad(item.offset, f"record {number}: {item.why}", final=item.final)
            if item.final:
                return


_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE_SURROGATE = "a lone surrogate escape in its text (half of a \\uD83D\\uDE00 pair): not Unicode"


class _LongRecord:
    """One over-long JSON record read as a stream: its text's lines, in runs.

    Several text fields: a field's text is handed on as it is decoded when every field named
    before it has been (title, then text, as records hold them); one that comes before a field
    named ahead of it, or after one that may still come, is held (a spooled temporary file:
    memory stays bounded) until the record's end settles the order; then the held ones follow,
    in the order named, each ending its last line as the blank line joining them would."""

    def __init__(self, offset: int, number: int, column: str | tuple[str, ...]):
        self.offset, self.number = offset, number
        self.names = text_fields(column) if isinstance(column, str) else tuple(column)
        self.field = TextField(self.names)
        self.partial: list[str] = []  # the line being read, in pieces
        self.size = 0
        self.skipping = False  # inside a line of its text longer than MAX_LINE_BYTES characters
        self.failed = False
        # Several text fields: the one being read (-1: none), handed on as read or held; the
        # fields handed on in full are the first ``next`` named; the held ones, by index.
        self.current, self.direct, self.next = -1, False, 0
        self.held: dict[int, tuple[IO[bytes], bool]] = {}  # index: (its text as UTF-8, read to its end)

    def feed(self, data: bytes) -> Iterator:
        if self.failed:
            return
        for at in range(0, len(data), _FEED):
            try:
                pieces = self.field.feed(data[at : at + _FEED])
            except NotJSON as e:
                yield from self._pieces(e.pieces)
                yield from self._fail(str(e))
                return
            yield from self._pieces(pieces)

    def close(self) -> Iterator:
        if self.failed:
            return
        try:
            pieces = self.field.close()
        except NotJSON as e:
            yield from self._pieces(e.pieces)
            yield from self._fail(str(e))
            return
        yield from self._pieces(pieces)
        if self.field.wrong is not None:
            yield from self._fail(self.field.wrong)
            return
        if not self.field.found:
            yield from self._fail(no_text(self.names))
            return
        for k in sorted(self.held):  # the held fields whose predecessors never came, in order
            yield from self._release(k)
        yield from self._split(["\n"])
        yield _END

    def _pieces(self, pieces: list) -> Iterator:
        """Pieces of the text (one field), or of several fields' texts with their marks."""
        if len(self.names) == 1:
            yield from self._split(pieces)
            return
        run: list[str] = []
        for piece in pieces:
            if piece.__class__ is str:
                if self.direct:
                    run.append(piece)
                else:
                    self.held[self.current][0].write(piece.encode("utf-8", "surrogatepass"))
                continue
            if run:
                yield from self._split(run)
                run = []
            if piece >= 0:  # a field's string starts
                self.current, self.direct = piece, piece == self.next
                if not self.direct:
                    self.held[piece] = (tempfile.SpooledTemporaryFile(_HELD), False)
                continue
            if not self.direct:  # its string ended
                self.held[self.current] = (self.held[self.current][0], True)
                continue
            yield from self._split(["\n"])
            self.next = self.current + 1
            while self.next in self.held and self.held[self.next][1]:
                yield from self._release(self.next)
                self.next += 1
        if run:
            yield from self._split(run)

    def _release(self, k: int) -> Iterator:
        """A held field's text, a window at a time, and the end of its last line."""
        spool, _ = self.held.pop(k)
        spool.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        while chunk := spool.read(_FEED):
            yield from self._split([decoder.decode(chunk)])
        spool.close()
        yield from self._split([decoder.decode(b"", True), "\n"])

    def _fail(self, why: str) -> Iterator:
        self.failed = True
        for spool, _ in self.held.values():
            spool.close()
        self.held.clear()
        yield _DROP
        yield Bad(self.offset, f"record {self.number} (longer than a line, read as a stream): {why}")

    def _split(self, pieces: list[str]) -> Iterator:
        run: list[str] = []
        for piece in pieces:
            parts = piece.split("\n")
            for n, part in enumerate(parts):
                if not self.skipping:
                    self.partial.append(part)
                    self.size += len(part)
                    if self.size > MAX_LINE_BYTES:  # dropped, and counted once
                        if run:
                            yield run
                            run = []
                        yield Bad(
                            self.offset,
                            f"record {self.number}: a line of its text longer than "
                            f"{MAX_LINE_BYTES >> 20} Mi characters (dropped)",
                        )
                        self.partial, self.size, self.skipping = [], 0, True
                if n == len(parts) - 1:
                    break
                if not self.skipping:
                    line = "".join(self.partial)
                    if line.strip():
                        run.append(line)
                self.partial, self.size, self.skipping = [], 0, False
        if run:
            yield run


_FEED = 1 << 20  # characters of an over-long record decoded at a time
_HELD = 4 << 20  # bytes of a held text field (several text fields) kept in memory before it spills to disk


_OUTSIDE, _TITLE, _TEXT = 0, 1, 2  # where a WikiExtractor reader is: between documents, before a title, in text


def _wikiextractor_events(lines: Iterator, keep_titles: bool) -> Iterator:
    """WikiExtractor: a document is a <doc id=…> line, its title line, its text, and </doc>.
    A <doc id=…> line always starts a document (where the item cutter may cut: ranges.py), so
    an unclosed <doc>, or one inside another, costs the one it interrupts (dropped and counted);
    text outside any <doc> is counted line by line; a bad line inside one is dropped and
    counted, and the document goes on, as in plain text."""
    run: list[str] = []  # lines of the document in progress not handed on yet
    size = 0  # characters in run (counted only in a segment where a part can fill)
    sent = False  # some of the document in progress was handed on: it is not whole
    state = _OUTSIDE
    opened = -1  # offset of the open <doc> line, once counted
    opening = _TEXT if keep_titles else _TITLE
    limit = MAX_DOCUMENT_CHARS
    for item in lines:
        if item.__class__ is tuple:
            seg = item[1]
            ci, co = 0, item[0]  # line ci of the segment starts at byte co
            open_i = -1  # the open <doc> is this line of the segment (its offset not counted yet)
            whole = _Whole()
            count = size + item[2] >= limit  # else no part fills in this segment: no counting
            for i, line in enumerate(seg):
                if line[:1] == "<":
                    if state and (line == "</doc>" or line.startswith("</doc>") and not line[6:].strip()):
                        if sent:  # (whole is empty: it is handed on before anything is sent)
                            if run:
                                yield run
                            yield _END
                            sent = False
                        elif run:
                            whole.append(run)
                            if len(whole) >= _WHOLE:
                                yield whole
                                whole = _Whole()
                        run = []
                        size = 0
                        state = _OUTSIDE
                        open_i = -1
                        continue
                    if line.startswith("<doc") and _DOC_OPEN.match(line):
                        if state:
                            if open_i >= 0:
                                co, ci = _advance(seg, ci, co, open_i), open_i
                                opened = co
                            if whole:
                                yield whole
                                whole = _Whole()
                            yield _DROP
                            yield _unclosed(opened, "the next <doc>")
                            sent = False
                        run = []
                        size = 0
                        open_i = i
                        state = opening
                        continue
                if state == _TEXT:
                    if line.strip():
                        run.append(line)
                        if count:
                            size += len(line)
                            if size >= limit:
                                if whole:
                                    yield whole
                                    whole = _Whole()
                                yield run
                                run, size, sent = [], 0, True
                elif state:  # the title line
                    state = _TEXT
                elif line.strip():
                    co, ci = _advance(seg, ci, co, i), i
                    if whole:
                        yield whole
                        whole = _Whole()
                    yield Bad(co, "a line outside any <doc>...</doc> (not WikiExtractor output?)")
            if whole:
                yield whole
            if open_i >= 0:
                opened = _back(seg, open_i, item[3])
            if not count:
                size = sum(map(len, run))
        elif item.final:
            if state:
                yield _DROP
            yield item
            return
        else:
            if state:
                state = _TEXT  # (a bad line after <doc> is its title)
            if run:
                yield run
                run, size, sent = [], 0, True
            yield item
    if state:
        yield _DROP
        yield _unclosed(opened, "the end of the item (a truncated file?)")


def _unclosed(offset: int, before: str) -> Bad:
    return Bad(offset, f"a <doc> that has no </doc> before {before}: its document is dropped")


def sniff(head: bytes) -> str | None:
    """The format the first bytes of a file show: ``parquet``, ``wikiextractor``, ``cirrus``,
    ``jsonl``, or None (plain text)."""
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head_text(head)
    lines = text.split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return None
    line = lines[first].strip()
    if _DOC_OPEN.match(line):
        return "wikiextractor"
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except Exception:  # ValueError, RecursionError...: whatever the decoder raises (formats._json_events)
        return "jsonl" if first == len(lines) - 1 else None  # a record longer than the sample, or not JSON
    if not isinstance(record, dict):
        return None
    return "cirrus" if set(record) == {"index"} else "jsonl"


FIELD_SAMPLE = 100  # the records of a JSON file's head that the plan looks at for its text field


def check_text_field(head: bytes, fmt: str, column: str, source: str) -> None:
    """Refuse, at plan time, a JSON Lines file none of whose first FIELD_SAMPLE records has the
    text field (any of them, for several): at run time each of its records would be bad and every item fail, which no retry
    mends. ``head`` is what the plan read already (the first bytes of the stream, no further
    request); a file where only some records lack the field is read, those counted bad. Records
    that are not JSON objects are the reader's to count: with none in the head, no verdict."""
    if fmt not in ("jsonl", "cirrus"):
        return
    names = text_fields(column)
    records: list[dict] = []
    for line in head.split(b"\n"):
        if len(records) >= FIELD_SAMPLE:
            break
        try:
            record = json.loads(line)
        except Exception:  # blank, cut off at the head's end, or damaged: not a verdict on the field
            continue
        if not isinstance(record, dict) or (fmt == "cirrus" and set(record) == {"index"}):
            continue
        if any(isinstance(record.get(name), str) for name in names):
            return
        records.append(record)
    if not records:
        return
    strings: dict[str, int] = {}
    for record in records:
        for key, value in record.items():
            if isinstance(value, str):
                strings[key] = strings.get(key, 0) + len(value)
    seen = sorted({key for record in records for key in record})
    shown = ", ".join(repr(k) for k in seen[:12]) + (f" and {len(seen) - 12} more" if len(seen) > 12 else "")
    best = max(strings, key=strings.get) if strings else None  # type: ignore[arg-type]
    advice = f"give --text-column {best}" if best is not None else "give --text-column the field that holds the text"
    lacks = f"the field {column!r}" if len(names) == 1 else f"any of the fields {', '.join(map(repr, names))}"
    raise ConfigError(f"{source}: no record of the first {len(records)} has {lacks} (fields seen: {shown}); {advice}")


def decide(name_format: str, name: str, head: bytes) -> str:
    """A file's format from its name and its first bytes: a name that says JSON may still be a
    CirrusSearch dump, one that says text may be WikiExtractor output, and a shard without an
    extension (wiki_00) is what its bytes show."""
    found = sniff(head)
    if name_format == "parquet" or found == "parquet":
        return "parquet"
    if name_format == "jsonl":
        return "cirrus" if found == "cirrus" else "jsonl"
    base = name.rsplit("/", 1)[-1].lower()
    for ext in COMPRESSIONS:
        base = base.removesuffix(ext)
    if "." in base:  # .txt, .text: text, unless it is WikiExtractor's
        return "wikiextractor" if found == "wikiextractor" else "text"
    return found or "text"


def iter_documents(
    raw: BinaryIO,
    fmt: str,
    compression: str,
    source: str,
    base_offset: int = 0,
    tally: Tally | None = None,
    options: ReadOptions = ReadOptions(),
) -> Iterator[list[str]]:
    """Documents (lists of lines) from an open binary file, read as a stream.

    Bad records are skipped and tallied (``tally``); an InputError ends the item when more
    than ``options.max_bad_share`` of the records are bad. A document of more than
    MAX_DOCUMENT_CHARS characters comes in parts cut at line boundaries as it is read, so
    that no document costs more memory than that whatever the input."""
    tally = tally if tally is not None else Tally()
    unit = "decompressed byte" if compression != "none" else "byte"
    trailing: list[Trailing] = []  # counted after the documents: the garbage is past every one
    if fmt in ("jsonl", "cirrus"):
        lines = _lines(raw, compression, base_offset, stream_long=True, trailing=trailing)
        events = _json_events(lines, options.text_column, fmt == "cirrus")
    elif fmt == "wikiextractor":
        events = _wikiextractor_events(_lines(raw, compression, base_offset, trailing=trailing), options.keep_titles)
    elif fmt == "text":
        events = _text_events(_lines(raw, compression, base_offset, trailing=trailing))
    else:
        raise InputError(f"{source}: format {fmt!r} is not read as lines")
    yield from _assemble(
        chain(events, trailing), source, tally, options, unit, by_line=fmt in ("text", "wikiextractor")
    )


def checked(
    docs: Iterator[list[str] | Bad], source: str, tally: Tally, options: ReadOptions, unit: str
) -> Iterator[list[str]]:
    """Whole documents and bad records of any format (a Parquet file's rows): bad records
    tallied (the share judged over records), long documents in parts."""

    def events():
        for doc in docs:
            yield doc
            if doc.__class__ is not Bad:
                yield _END

    yield from _assemble(events(), source, tally, options, unit, by_line=False)


def _assemble(
    events: Iterator, source: str, tally: Tally, options: ReadOptions, unit: str, by_line: bool
) -> Iterator[list[str]]:
    """Documents from a reader's events (see _END): handed on whole when they end, or in parts
    of at most MAX_DOCUMENT_CHARS characters (cut at line boundaries) as soon as a part is full.
    The bad share is judged over lines (``by_line``) or records."""
    part: list[str] = []
    size = 0  # characters in part
    total = 0  # characters in the document so far
    handed = False  # a part of the document in progress was handed on
    limit = MAX_DOCUMENT_CHARS
    for event in events:
        if event.__class__ is list:
            n = sum(map(len, event))
            total += n
            if size + n <= limit:
                if part:
                    part += event
                else:
                    part = event
                size += n
            else:
                for line in event:
                    if part and size + len(line) > limit:
                        if by_line:
                            tally.records += len(part)
                        yield part
                        handed, part, size = True, [], 0
                    part.append(line)
                    size += len(line)
            if total > limit and total - n <= limit:
                tally.documents_cut += 1
        elif event.__class__ is _Whole:  # as if each came as a list, then _END
            if by_line:
                for doc in event:
                    tally.records += len(doc)
                    yield doc
                    tally.documents += 1
            else:
                for doc in event:
                    yield doc
                    tally.documents += 1
                    tally.records += 1
        elif event is _END or event is _DROP:
            if event is _END and part:
                if by_line:
                    tally.records += len(part)
                yield part
                handed = True
            if handed:
                tally.documents += 1
                if not by_line:
                    tally.records += 1
            part, size, total, handed = [], 0, 0, False
        elif event.__class__ is Trailing:  # not a record: counted in bytes, not in the bad share
            tally.trailing += event.size
            if len(tally.examples) < _EXAMPLES:
                tally.examples.append(f"{source}: byte {event.offset}: {event.why}")
        else:
            tally.bad += 1
            if len(tally.examples) < _EXAMPLES:
                where = f"{unit} {event.offset}: " if event.offset >= 0 else ""
                tally.examples.append(f"{source}: {where}{event.why}")
            if tally.bad >= _EARLY:
                _judge(tally, source, options, len(part) if by_line else 0)
    if part:  # every reader ends its documents; this is for safety
        tally.records += len(part) if by_line else 1
        yield part
    _judge(tally, source, options)


def _judge(tally: Tally, source: str, options: ReadOptions, pending: int = 0) -> None:
    total = tally.records + pending + tally.bad
    if tally.bad and tally.bad > options.max_bad_share * total:
        raise InputError(
            f"{source}: {tally.bad} of {total} records are bad, more than the "
            f"{options.max_bad_share:.0%} allowed: not this format? (first: {tally.examples[0]})"
        )


def read_all(
    data: bytes, name: str, fmt: str | None = None, tally: Tally | None = None, options: ReadOptions = ReadOptions()
) -> list[list[str]]:
    """Documents of an in-memory file (tests, small tools); the format from the name, else sniffed."""
    by_name, compression = describe(name)
    if fmt is None:
        fmt = decide(by_name, name, head_of(data[: 1 << 20], compression))
    return list(iter_documents(io.BytesIO(data), fmt, compression, name, tally=tally, options=options))

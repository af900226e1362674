"""Documents from bytes, in the formats corpora come in.

- ``text``: one sentence or paragraph per line, a blank line between documents
  (BERT's format);
- ``jsonl``: JSON Lines, a document per record in its text field (WikiExtractor's
  ``--json`` output among them);
- ``cirrus``: Wikipedia CirrusSearch dumps, Elasticsearch bulk files whose index
  lines alternate with content lines; documents are the content lines' text;
- ``wikiextractor``: WikiExtractor's ``<doc id=… url=… title=…>`` … ``</doc>``
  shards; blank lines inside a document separate paragraphs, not documents, and
  the title line that opens each is dropped unless asked for.

One bad record does not sink an item: a document with invalid UTF-8 or a line over
MAX_LINE_BYTES, a record that is not JSON or has no text, a compressed stream that
ends early (the documents before the damage are kept) is skipped and tallied with
where it was. The item fails only when more than ``max_bad_share`` of its records
are bad: then the data is not in this format at all. NUL and other control
characters are text (BERT's cleaning drops them), not damage.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from fleet.inputs.compression import COMPRESSIONS, decompressed, head_of
from fleet.inputs.files import describe
from fleet.job import InputError

_BLOCK = 4 << 20
MAX_LINE_BYTES = 16 << 20
MAX_DOCUMENT_CHARS = 4 << 20  # longer documents reach the job in parts: bounded memory per document
_BOM = b"\xef\xbb\xbf"
FORMATS = ("text", "jsonl", "cirrus", "wikiextractor", "parquet")
_EARLY = 100  # bad records before the share is judged while reading (a binary file fails fast)
_DOC_OPEN = re.compile(r"^<doc(\s[^>]*)?>\s*$")
_EXAMPLES = 5


@dataclass(frozen=True)
class ReadOptions:
    """How documents are read from every input of a run (part of its plan)."""

    text_column: str = "text"  # the field of a JSON record or the column of a Parquet file
    keep_titles: bool = False  # WikiExtractor: keep the title line that opens each document
    max_bad_share: float = 0.5  # an item fails when more of its records than this are bad


@dataclass
class Tally:
    """What reading an item found besides its documents, for its stats."""

    documents: int = 0
    bad: int = 0
    examples: list[str] = field(default_factory=list)  # the first few bad records: where and why
    documents_cut: int = 0

    def stats(self) -> dict:
        out: dict = {}
        if self.bad:
            out.update(bad_records=self.bad, bad_examples=list(self.examples))
        if self.documents_cut:
            out["documents_cut"] = self.documents_cut
        return out


@dataclass(frozen=True)
class Bad:
    """A bad record: where it starts (-1: no offset, ``why`` says where) and why; ``end`` is
    where the next line starts (None when unknown); ``final`` when nothing can be read after it."""

    offset: int
    why: str
    end: int | None = None
    final: bool = False


def _blocks(raw: BinaryIO, compression: str) -> Iterator[bytes | Exception]:
    """Blocks of about _BLOCK bytes; where a compressed stream breaks off, what it gave up to
    there, then the error (a plain read of a broken stream would lose the whole block)."""
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
                part = read(1 << 20)
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
            return


def _lines(raw: BinaryIO, compression: str, base_offset: int) -> Iterator[str | Bad]:
    """Decoded lines, and a Bad for each line that cannot be one (invalid UTF-8, too long) or
    where a compressed stream breaks off. Offsets are bytes of the (decompressed) stream."""
    carry = b""
    offset = base_offset  # offset of carry[0], or of the next byte when carry is empty
    skipping = False  # inside an over-long line: drop bytes until it ends
    first = True
    for block in _blocks(raw, compression):
        if block.__class__ is not bytes:
            yield Bad(offset + len(carry), f"corrupt or truncated {compression} data ({block}); "
                      "the documents before it are kept", final=True)
            return
        if first:
            first = False
            if offset == 0 and block.startswith(_BOM):
                block, offset = block[len(_BOM):], len(_BOM)
        if skipping:
            nl = block.find(b"\n")
            if nl < 0:
                offset += len(block)
                continue
            block, offset, skipping = block[nl + 1:], offset + nl + 1, False
        data = carry + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE_BYTES:
                yield Bad(offset, f"a line longer than {MAX_LINE_BYTES >> 20} MiB (not line-oriented text?)")
                skipping, offset, carry = True, offset + len(data), b""
            else:
                carry = data
            continue
        head, base = data[:cut], offset
        if carry:  # only a line that began in an earlier block can be over-long
            nl = data.find(b"\n")
            if nl > MAX_LINE_BYTES:
                yield Bad(offset, f"a line longer than {MAX_LINE_BYTES >> 20} MiB (not line-oriented text?)",
                          end=offset + nl + 1)
                head, base = head[nl + 1:], offset + nl + 1
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            yield from _line_by_line(head, base)
        else:
            lines = text.split("\n")
            lines.pop()  # the empty string after the final newline
            yield from lines
        offset += cut
        carry = data[cut:]
    if carry and not skipping:
        try:
            yield carry.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Bad(offset + e.start, "invalid UTF-8", end=offset + len(carry))


def _line_by_line(head: bytes, base: int) -> Iterator[str | Bad]:
    pos = 0
    for raw_line in head.split(b"\n")[:-1]:
        try:
            yield raw_line.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Bad(base + pos + e.start, "invalid UTF-8", end=base + pos + len(raw_line) + 1)
        pos += len(raw_line) + 1


def _text_documents(lines: Iterator[str | Bad]) -> Iterator[list[str] | Bad]:
    doc: list[str] = []
    bad: Bad | None = None  # the first bad line of the document in progress: it is skipped whole
    for line in lines:
        if line.__class__ is str:
            if line.strip():
                if bad is None:
                    doc.append(line)
            elif bad is not None:
                yield bad
                doc, bad = [], None
            elif doc:
                yield doc
                doc = []
        elif line.final:  # the document in progress is cut short: dropped, and the break reported
            yield line
            return
        elif bad is None:
            bad = line
    if bad is not None:
        yield bad
    elif doc:
        yield doc


def _json_documents(lines: Iterator[str | Bad], base_offset: int, column: str,
                    cirrus: bool) -> Iterator[list[str] | Bad]:
    at = base_offset  # where the line starts
    number = 0
    for line in lines:
        number += 1
        if line.__class__ is not str:
            yield Bad(line.offset, f"record {number}: {line.why}", final=line.final)
            if line.final or line.end is None:
                return
            at = line.end
            continue
        start, at = at, at + len(line.encode()) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            yield Bad(start, f"record {number} is not JSON ({e.__class__.__name__}: {str(e)[:80]})")
            continue
        if cirrus and isinstance(record, dict) and set(record) == {"index"}:
            continue  # an Elasticsearch bulk action line: the content line follows
        text = record.get(column) if isinstance(record, dict) else None
        if not isinstance(text, str):
            yield Bad(start, f"record {number} has no string field {column!r}")
            continue
        lines = [line for line in text.split("\n") if line.strip()]
        if lines:  # blank lines separate paragraphs, as inside a WikiExtractor <doc>
            yield lines


def _wikiextractor_documents(lines: Iterator[str | Bad], keep_titles: bool) -> Iterator[list[str] | Bad]:
    doc: list[str] | None = None  # None: between documents
    bad: Bad | None = None
    title = False  # the next line is the title
    number = 0  # line number, where a line has no offset of its own
    for line in lines:
        number += 1
        if line.__class__ is not str:
            if line.final:
                yield line
                return
            if doc is None:
                yield line
            elif bad is None:
                bad = line
            continue
        if doc is None:
            if _DOC_OPEN.match(line):
                doc, bad, title = [], None, not keep_titles
            elif line.strip():
                yield Bad(-1, f"line {number} is outside any <doc>...</doc> (not WikiExtractor output?)")
            continue
        if line.startswith("</doc>") and not line[6:].strip():
            if bad is not None:
                yield bad
            elif doc:
                yield doc
            doc = None
        elif title:
            title = False
        elif line.strip():
            doc.append(line)
    if doc is not None:
        yield Bad(-1, "the last <doc> has no </doc> (a truncated file?)", final=True)


def sniff(head: bytes) -> str | None:
    """The format the first bytes of a file show: ``parquet``, ``wikiextractor``, ``cirrus``,
    ``jsonl``, or None (plain text)."""
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "ignore").lstrip("\ufeff")
    lines = text.split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return None
    line = lines[first].strip()
    if _DOC_OPEN.match(line) and "id=" in line:
        return "wikiextractor"
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return "jsonl" if first == len(lines) - 1 else None  # a record longer than the sample, or not JSON
    if not isinstance(record, dict):
        return None
    return "cirrus" if set(record) == {"index"} else "jsonl"


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


def iter_documents(raw: BinaryIO, fmt: str, compression: str, source: str, base_offset: int = 0,
                   tally: Tally | None = None, options: ReadOptions = ReadOptions()) -> Iterator[list[str]]:
    """Documents (lists of lines) from an open binary file.

    Bad records are skipped and tallied (``tally``); an InputError ends the item when more
    than ``options.max_bad_share`` of the records are bad. A document of more than
    MAX_DOCUMENT_CHARS characters comes in parts cut at line boundaries, so that no
    document costs more memory than that whatever the input."""
    tally = tally if tally is not None else Tally()
    unit = "decompressed byte" if compression != "none" else "byte"
    lines = _lines(raw, compression, base_offset)
    if fmt in ("jsonl", "cirrus"):
        docs = _json_documents(lines, base_offset, options.text_column, fmt == "cirrus")
    elif fmt == "wikiextractor":
        docs = _wikiextractor_documents(lines, options.keep_titles)
    elif fmt == "text":
        docs = _text_documents(lines)
    else:
        raise InputError(f"{source}: format {fmt!r} is not read as lines")
    yield from checked(docs, source, tally, options, unit)


def checked(docs: Iterator[list[str] | Bad], source: str, tally: Tally, options: ReadOptions,
            unit: str) -> Iterator[list[str]]:
    """Documents of any format: bad records tallied (the share judged), long documents in parts."""
    for doc in docs:
        if doc.__class__ is Bad:
            tally.bad += 1
            if len(tally.examples) < _EXAMPLES:
                where = f"{unit} {doc.offset}: " if doc.offset >= 0 else ""
                tally.examples.append(f"{source}: {where}{doc.why}")
            if tally.bad >= _EARLY:
                _judge(tally, source, options)
            continue
        tally.documents += 1
        size = 0
        for line in doc:
            size += len(line)
        if size <= MAX_DOCUMENT_CHARS:
            yield doc
            continue
        tally.documents_cut += 1
        yield from _parts(doc)
    _judge(tally, source, options)


def _judge(tally: Tally, source: str, options: ReadOptions) -> None:
    total = tally.documents + tally.bad
    if tally.bad and tally.bad > options.max_bad_share * total:
        raise InputError(f"{source}: {tally.bad} of {total} records are bad, more than the "
                         f"{options.max_bad_share:.0%} allowed: not this format? (first: {tally.examples[0]})")


def _parts(lines: list[str]) -> Iterator[list[str]]:
    """A document's lines in parts of at most MAX_DOCUMENT_CHARS characters (at least one line each)."""
    part: list[str] = []
    size = 0
    for line in lines:
        if part and size + len(line) > MAX_DOCUMENT_CHARS:
            yield part
            part, size = [], 0
        part.append(line)
        size += len(line)
    yield part


def read_all(data: bytes, name: str, fmt: str | None = None, tally: Tally | None = None,
             options: ReadOptions = ReadOptions()) -> list[list[str]]:
    """Documents of an in-memory file (tests, small tools); the format from the name, else sniffed."""
    by_name, compression = describe(name)
    if fmt is None:
        fmt = decide(by_name, name, head_of(data[: 1 << 20], compression))
    return list(iter_documents(io.BytesIO(data), fmt, compression, name, tally=tally, options=options))

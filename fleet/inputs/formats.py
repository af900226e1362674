"""Documents from bytes: plain text (blank lines between documents) and JSON Lines.

Input that cannot be right fails its item with an InputError naming the file
and the byte offset: invalid UTF-8, a NUL byte (a binary file, or UTF-16
text), a line longer than MAX_LINE_BYTES (no newlines: not line-oriented
text; one line is tokenized as one string), a corrupt or truncated
compressed stream, a .jsonl line that is not a JSON object with a string
``text``. A UTF-8 byte order mark at the start of a file is skipped.
"""

from __future__ import annotations

import io
import json
from typing import BinaryIO, Iterator, MutableMapping

from fleet.inputs.compression import decompressed
from fleet.inputs.files import describe
from fleet.job import InputError

_BLOCK = 4 << 20
MAX_LINE_BYTES = 16 << 20
MAX_DOCUMENT_CHARS = 4 << 20  # longer documents reach the job in parts: bounded memory per document
_BOM = b"\xef\xbb\xbf"


def _text_lines(raw: BinaryIO, source: str, base_offset: int, compression: str) -> Iterator[str]:
    """Decoded lines; invalid UTF-8 is an InputError naming the byte offset."""
    stream = decompressed(raw, compression)
    where = "decompressed byte" if compression != "none" else "byte"
    carry = b""
    offset = base_offset  # offset of carry[0] in the (decompressed) stream
    while True:
        try:
            block = stream.read(_BLOCK)
        except Exception as e:  # EOFError, OSError, zlib.error; zstd raises its own ZstdError
            raise InputError(f"{source}: corrupt or truncated {compression} data ({e})") from None
        if not block:
            break
        if offset == 0 and not carry and block.startswith(_BOM):
            block, offset = block[len(_BOM):], len(_BOM)
        nul = block.find(b"\x00")
        if nul >= 0:
            raise InputError(f"{source}: NUL byte at {where} {offset + len(carry) + nul} "
                             "(a binary file, or text that is not UTF-8?)")
        data = carry + block
        cut = data.rfind(b"\n") + 1
        first = data.find(b"\n") if carry else 0
        if cut == 0 and len(data) > MAX_LINE_BYTES or first > MAX_LINE_BYTES:
            raise InputError(f"{source}: the line at {where} {offset} is longer than {MAX_LINE_BYTES >> 20} MiB "
                             "(not line-oriented text?)")
        if cut == 0:
            carry = data
            continue
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{source}: invalid UTF-8 at {where} {offset + e.start}") from None
        lines = text.split("\n")
        lines.pop()  # the empty string after the final newline
        yield from lines
        offset += cut
        carry = data[cut:]
    if carry:
        try:
            yield carry.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{source}: invalid UTF-8 at {where} {offset + e.start}") from None


def iter_documents(raw: BinaryIO, fmt: str, compression: str, source: str, base_offset: int = 0,
                   counts: MutableMapping[str, int] | None = None) -> Iterator[list[str]]:
    """Documents (lists of lines) from an open binary file.

    A document of more than MAX_DOCUMENT_CHARS characters comes in parts cut at line
    boundaries, so that no document costs more memory than that whatever the input;
    ``counts["documents_cut"]`` counts the documents cut so."""
    cut = 0
    try:
        if fmt == "jsonl":
            for text in _json_texts(raw, compression, source, base_offset):
                for n, part in enumerate(_parts(text.split("\n"))):
                    cut += n == 1
                    yield part
            return
        doc: list[str] = []
        size, was_cut = 0, False
        for line in _text_lines(raw, source, base_offset, compression):
            if line.strip():
                if doc and size + len(line) > MAX_DOCUMENT_CHARS:
                    yield doc
                    doc, size, was_cut = [], 0, True
                doc.append(line)
                size += len(line)
            elif doc:
                yield doc
                cut += was_cut
                doc, size, was_cut = [], 0, False
        if doc:
            yield doc
            cut += was_cut
    finally:
        if counts is not None and cut:
            counts["documents_cut"] = counts.get("documents_cut", 0) + cut


def _parts(lines: list[str]) -> Iterator[list[str]]:
    """A record's lines in parts of at most MAX_DOCUMENT_CHARS characters (at least one line each)."""
    part: list[str] = []
    size = 0
    for line in lines:
        if part and size + len(line) > MAX_DOCUMENT_CHARS:
            yield part
            part, size = [], 0
        part.append(line)
        size += len(line)
    yield part


def _json_texts(raw: BinaryIO, compression: str, source: str, base_offset: int) -> Iterator[str]:
    at = base_offset  # offset of the line's first byte (in the decompressed stream, if compressed)
    unit = "decompressed byte" if compression != "none" else "byte"
    for number, line in enumerate(_text_lines(raw, source, base_offset, compression), 1):
        start, at = at, at + len(line.encode()) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise InputError(f"{source}: record {number} is not JSON at {unit} {start} "
                             f"({e.__class__.__name__}: {str(e)[:80]})") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise InputError(f"{source}: record {number} has no string field 'text' ({unit} {start})")
        yield text


def read_all(data: bytes, name: str) -> list[list[str]]:
    """Documents of an in-memory file (tests, small tools)."""
    fmt, compression = describe(name)
    return list(iter_documents(io.BytesIO(data), fmt, compression, name))

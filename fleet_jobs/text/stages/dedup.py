"""Exact deduplication of documents (``--dedup exact``), as pure functions over records.

The map turns each document into one keyed record (``document_record``): the key is the
first 8 bytes of a 128-bit BLAKE2b of the document's normalized text (``normalize``:
Unicode NFC, runs of whitespace one space), so every copy of a text lands in the same
reduce item; the value starts with the other 8 bytes, then the document's place (item id,
ordinal in the item) and the document itself. The reduce gets records sorted by
(key, value): the copies of one text are adjacent, the first in plan order (input file,
byte offset, ordinal) ahead, and ``unique_documents`` keeps that one.

Two texts are taken as equal when their 128-bit digests are: a collision among 10**12
documents has a chance near 10**-15. Nothing here reads or writes a file.
"""

from __future__ import annotations

import hashlib
import struct
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Iterator

DIGEST_BYTES = 16  # the key is the first 8, the value starts with the other 8
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def normalize(text: str) -> str:
    """The text two copies must share to count as one: NFC, whitespace runs (``str.split``'s)
    one space, no space at either end."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def document_text(lines: list[str]) -> str:
    """A document's text as its lines joined (what its bytes are counted over)."""
    return "\n".join(lines)


def document_digest(lines: list[str]) -> bytes:
    """The 128-bit BLAKE2b of the document's normalized text."""
    data = normalize(document_text(lines)).encode("utf-8", "surrogatepass")  # lines are Unicode: as encode()
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def document_record(lines: list[str], item_id: str, ordinal: int) -> tuple[int, bytes]:
    """(key, value) of the document ``ordinal`` (from 0) of item ``item_id``. The place sorts
    in plan order because a run's item ids all have one width (zero-padded numbers)."""
    digest = document_digest(lines)
    place = item_id.encode()
    return int.from_bytes(digest[:8], "big"), b"".join(
        [digest[8:], _U16.pack(len(place)), place, _U32.pack(ordinal), encode_lines(lines)]
    )


def encode_lines(lines: list[str]) -> bytes:
    """A document, losslessly: its line count, then each line's UTF-8 length and bytes."""
    parts = [_U32.pack(len(lines))]
    for line in lines:
        data = line.encode("utf-8", "surrogatepass")
        parts += (_U32.pack(len(data)), data)
    return b"".join(parts)


@dataclass(frozen=True)
class DocumentRecord:
    """A record's value, read back."""

    digest_tail: bytes  # digest bytes 8-16: with the key, the text's identity
    item_id: str
    ordinal: int
    lines: list[str]


def decode_value(value: bytes) -> DocumentRecord:
    """The inverse of ``document_record``'s value (ValueError if it is not one)."""
    try:
        at = 8
        (n,) = _U16.unpack_from(value, at)
        item_id = value[at + 2 : at + 2 + n].decode()
        at += 2 + n
        ordinal, count = _U32.unpack_from(value, at)[0], _U32.unpack_from(value, at + 4)[0]
        at += 8
        lines = []
        for _ in range(count):
            (size,) = _U32.unpack_from(value, at)
            at += 4
            if at + size > len(value):
                raise ValueError("a line runs past the record's end")
            lines.append(value[at : at + size].decode("utf-8", "surrogatepass"))
            at += size
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a document record: {e}") from None
    if at != len(value):
        raise ValueError(f"not a document record: {len(value) - at} bytes after its last line")
    return DocumentRecord(value[:8], item_id, ordinal, lines)


def text_bytes(value: bytes) -> int:
    """UTF-8 bytes of a record's document as its lines joined by newlines, from the lengths only."""
    (n,) = _U16.unpack_from(value, 8)
    at = 8 + 2 + n + 4
    (count,) = _U32.unpack_from(value, at)
    return len(value) - (at + 4) - 4 * count + max(count - 1, 0)


@dataclass
class DedupCounts:
    """What the reduce kept and dropped (its item's counters)."""

    kept: int = 0
    dropped: int = 0
    bytes_dropped: int = 0  # UTF-8 bytes of the dropped documents' texts (lines joined by newlines)

    def stats(self) -> dict[str, int]:
        return {
            "dedup_documents_kept": self.kept,
            "dedup_documents_dropped": self.dropped,
            "dedup_bytes_dropped": self.bytes_dropped,
        }


def unique_documents(records: Iterable[tuple[int, bytes]], counts: DedupCounts) -> Iterator[list[str]]:
    """The documents of records sorted by (key, value), each text once: the first record of a
    run with equal key and digest (the lowest place) is kept, the rest counted as dropped."""
    last: tuple[int, bytes] | None = None
    for key, value in records:
        identity = (key, value[:8])
        if identity == last:
            counts.dropped += 1
            counts.bytes_dropped += text_bytes(value)
            continue
        last = identity
        counts.kept += 1
        yield decode_value(value).lines

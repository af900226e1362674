"""Text in UTF-16 or UTF-32, told by its byte-order mark, read as the same documents as UTF-8.

The readers split lines and judge damage on UTF-8 bytes (formats.py). UTF-16 or UTF-32 read that
way is text with NULs between its characters and no blank line ("\\n\\x00\\n\\x00" is not one), so a
whole file became one document, without a word. A file in either says so by the mark it opens
with (UTF-32 is checked first: UTF-32-LE's mark starts with UTF-16-LE's): its blocks are decoded
and re-encoded as UTF-8 here, before lines are split, so that every reader after this one (and
provenance, places.py) reads it as it reads UTF-8. Offsets in such a file count bytes of its text
as UTF-8, its mark left out (what ``iconv -f UTF-16 -t UTF-8 FILE | tail -c +N`` shows). What is
not text in it (a lone surrogate, a code point past U+10FFFF, an odd last byte) becomes bytes that
are not UTF-8, so its line is dropped and counted as a bad line of a UTF-8 file is. A UTF-8 mark is
dropped. Only a stream's start is looked at: such a file is one item, as a compressed file is
(slices.cut_source), for its byte ranges cannot be cut where a UTF-8 reading sees a boundary.
"""

from __future__ import annotations

import codecs
from itertools import chain
from typing import Iterator

# Longest first: UTF-32-LE's mark (FF FE 00 00) starts with UTF-16-LE's (FF FE).
_WIDE = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)
UTF8_BOM = codecs.BOM_UTF8
_NOT_TEXT = "fleet.not-text"


def _not_text(error: UnicodeError) -> tuple[str, int]:
    """Not text: a lone surrogate, which UTF-8 ("surrogatepass") writes as bytes no UTF-8 reader takes."""
    assert isinstance(error, UnicodeDecodeError)  # _NOT_TEXT is the errors of decoders only (below)
    return "\udc80", error.end


codecs.register_error(_NOT_TEXT, _not_text)


def wide(head: bytes) -> tuple[bytes, str, str] | None:
    """(mark, codec, name) of a stream that opens with a UTF-32 or UTF-16 byte-order mark, else None."""
    for entry in _WIDE:
        if head.startswith(entry[0]):
            return entry
    return None


def head_text(head: bytes) -> str:
    """The first bytes of a stream as text, for telling its format (what a cut character costs is ignored)."""
    found = wide(head)
    if found:
        return head[len(found[0]) :].decode(found[1], "ignore")
    return head.decode("utf-8", "ignore").lstrip("\ufeff")


def opened(blocks: Iterator, size: int) -> tuple[Iterator, int, str]:
    """(blocks as UTF-8, offset of the first, the stream's encoding) for the blocks of a stream from
    its start (formats._blocks): a UTF-8 mark dropped, UTF-16 or UTF-32 re-encoded in blocks of at
    most ``size`` bytes. Anything not bytes (a broken stream's error, a compression.Trailing) is
    passed on where it comes."""
    first = next(blocks, None)
    if first is None:
        return iter(()), 0, "UTF-8"
    if first.__class__ is not bytes:
        return chain([first], blocks), 0, "UTF-8"
    if first.startswith(UTF8_BOM):
        return chain([first[len(UTF8_BOM) :]], blocks), len(UTF8_BOM), "UTF-8"
    found = wide(first)
    if found is None:
        return chain([first], blocks), 0, "UTF-8"
    mark, codec, name = found
    return _utf8(chain([first[len(mark) :]], blocks), codec, size), 0, name


def _utf8(blocks: Iterator, codec: str, size: int) -> Iterator:
    decoder = codecs.getincrementaldecoder(codec)(_NOT_TEXT)
    for block in blocks:
        if block.__class__ is bytes:
            text = decoder.decode(block)
        elif isinstance(block, Exception):  # broken off: what the stream gave is read, no more
            yield block
            return
        else:  # the end of the stream, and what followed it
            yield from _cut(decoder.decode(b"", True), size)
            yield block
            return
        yield from _cut(text, size)
    yield from _cut(decoder.decode(b"", True), size)


def _cut(text: str, size: int) -> Iterator[bytes]:
    data = text.encode("utf-8", "surrogatepass")
    for at in range(0, len(data), size):  # UTF-16 grows up to half again as UTF-8: blocks stay blocks
        yield data[at : at + size]

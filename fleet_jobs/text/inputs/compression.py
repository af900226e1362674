"""Compressed inputs: gzip, bzip2, xz and zstd streams of one or more members, that say so
when they end early, and count what follows their last complete member.

Each is read member by member here rather than by the standard library's file objects, for
what comes after a complete member: gzip takes it for a damaged member (so the reader dropped
the document in progress, and counted the whole as one bad record), bzip2 and xz pass over it
without a word. Here a member is what starts with its format's magic bytes; anything else
after a complete member (zero padding included) is trailing garbage: the stream ends there,
every document before it is kept, and its bytes are counted (``trailing``). A member that
starts but breaks off or is damaged raises, as before.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Protocol

COMPRESSIONS = {".gz": "gz", ".gzip": "gz", ".bz2": "bz2", ".xz": "xz", ".zst": "zst", ".zstd": "zst"}
# How a member starts: a zstd stream may also hold skippable frames (magic 0x184D2A5?).
_MAGIC = {
    "gz": (b"\x1f\x8b",),
    "bz2": (b"BZh",),
    "xz": (b"\xfd7zXZ\x00",),
    "zst": (b"\x28\xb5\x2f\xfd",) + tuple(bytes([n, 0x2A, 0x4D, 0x18]) for n in range(0x50, 0x60)),
}
_NAMES = {"gz": ("gzip", "member"), "bz2": ("bzip2", "stream"), "xz": ("xz", "stream"), "zst": ("zstd", "frame")}


@dataclass(frozen=True)
class Trailing:
    """Bytes after the last complete member that start no member: where (a byte of the
    compressed file) and how many, to the end of the file."""

    offset: int
    size: int
    compression: str

    @property
    def why(self) -> str:
        name, unit = _NAMES[self.compression]
        return (
            f"{self.size:,} bytes of trailing garbage after a complete {name} {unit} (not another {unit}): "
            "ignored, every document before them is kept"
        )


class _Member(Protocol):
    """What a member is decoded with: ``bz2.BZ2Decompressor``, ``lzma.LZMADecompressor``, or one below."""

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...

    @property
    def needs_input(self) -> bool: ...

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...


class _Zlib:
    """One gzip member (zlib takes no more input than the output asked for needs)."""

    def __init__(self):
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def decompress(self, data: bytes, limit: int) -> bytes:
        return self._d.decompress(data or self._d.unconsumed_tail, limit)

    @property
    def needs_input(self) -> bool:
        return not self._d.unconsumed_tail

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data


class _Zstd:
    """One zstd frame, fed a few bytes at a time: zstandard's decompressobj has no output limit,
    so the input of one step bounds its output (a zstd block holds at most 128 KiB and takes at
    least 4 bytes, an RLE block, so 256 bytes give at most 8 MiB, whatever the ratio)."""

    _FEED = 256

    def __init__(self):
        import zstandard

        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._input, self._in = b"", 0

    def decompress(self, data: bytes, limit: int) -> bytes:
        if data:
            self._input, self._in = self._input[self._in :] + data, 0
        feed = self._input[self._in : self._in + self._FEED]
        self._in += len(feed)
        return self._d.decompress(feed)

    @property
    def needs_input(self) -> bool:
        return self._in == len(self._input)

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data + self._input[self._in :]


_DECODERS: dict[str, Callable[[], _Member]] = {
    "gz": _Zlib,
    "bz2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
    "zst": _Zstd,
}


class _Members(io.RawIOBase):
    """A compressed stream of one or more members that ends only where a member ends (EOFError
    where one breaks off), and stops at bytes after a complete member that start none
    (``trailing``: a Trailing, once found)."""

    _STEP = 1 << 20  # decompressed bytes per step at most: memory goes with the read, not the ratio
    _RAW = 1 << 20

    def __init__(self, raw: BinaryIO, compression: str):
        self._raw, self._compression = raw, compression
        self._new, self._magic = _DECODERS[compression], _MAGIC[compression]
        self._member: _Member | None = None  # the member being decoded, None between members
        self._members = 0  # members begun
        self._input = b""  # compressed bytes read and not given to a member yet
        self._at = 0  # offset of _input[0] in the compressed file
        self._output, self._out = b"", 0  # decoded bytes, and how far they are handed on
        self.trailing: Trailing | None = None

    def readable(self) -> bool:
        return True

    def _more(self) -> bytes:
        data = self._raw.read(self._RAW)
        self._input += data
        return data

    def _start(self) -> bool:
        """Between members: a new one if the next bytes start one, else the end (and what follows counted)."""
        longest = max(map(len, self._magic))
        while len(self._input) < longest and self._more():
            pass
        if not self._input:
            return False
        if self._input.startswith(self._magic):
            self._member, self._members = self._new(), self._members + 1
            return True
        if not self._members:
            raise OSError("not {} data (no {} {} at its start)".format(self._compression, *_NAMES[self._compression]))
        size = len(self._input)
        while data := self._raw.read(self._RAW):
            size += len(data)
        self.trailing = Trailing(self._at, size, self._compression)
        self._input = b""
        return False

    def read(self, size: int = -1) -> bytes:
        while self._out == len(self._output):
            if self.trailing is not None:
                return b""
            if self._member is None and not self._start():
                return b""
            member = self._member
            assert member is not None  # the one being decoded, or the one _start() just began
            data = b""
            if member.needs_input:
                if not self._input and not self._more():
                    raise EOFError("the {} stream ends inside a {} (truncated)".format(*_NAMES[self._compression]))
                data, self._input = self._input, b""
                self._at += len(data)
            self._output, self._out = member.decompress(data, self._STEP), 0
            if member.eof:  # the next member starts in what this one did not use
                unused = member.unused_data
                self._input, self._at = unused + self._input, self._at - len(unused)
                self._member = None
        end = len(self._output) if size < 0 else min(len(self._output), self._out + size)
        out = self._output[self._out : end] if self._out or end < len(self._output) else self._output
        self._out = end
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def decompressed(f: BinaryIO, compression: str) -> BinaryIO:
    if compression in _DECODERS:
        return _Members(f, compression)  # type: ignore[return-value]
    return f


def head_of(prefix: bytes, compression: str, limit: int = 64 << 10) -> bytes:
    """The first decompressed bytes of a file's first bytes, for telling its format: as much as
    the prefix holds (never an error for a prefix that ends mid-stream, nor for a damaged one)."""
    try:
        if compression == "gz":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(prefix, limit)
        if compression == "bz2":
            return bz2.BZ2Decompressor().decompress(prefix, max_length=limit)
        if compression == "xz":
            return lzma.LZMADecompressor().decompress(prefix, max_length=limit)
        if compression == "zst":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(prefix)[:limit]
    except Exception:  # damaged: the reader will say so, item by item
        return b""
    return prefix[:limit]

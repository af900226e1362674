"""Compressed inputs: gzip, bzip2 and zstd streams that say so when they end early."""

from __future__ import annotations

import bz2
import gzip
import io
from typing import BinaryIO

COMPRESSIONS = {".gz": "gz", ".gzip": "gz", ".bz2": "bz2", ".zst": "zst", ".zstd": "zst"}


class _ZstdFrames(io.RawIOBase):
    """A zstd stream of one or more frames that ends only where a frame ends.

    zstandard's own stream reader returns a short read at a truncated frame as if the
    data had ended there; this one raises EOFError, as gzip and bz2 do."""

    # Compressed bytes per step, which bounds the output of one step: a zstd block holds at most
    # 128 KiB and takes at least 4 bytes (an RLE block), so 256 bytes give at most 8 MiB.
    _FEED = 256

    def __init__(self, raw: BinaryIO):
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._raw = raw
        self._frame = None  # the frame being decoded, None between frames
        self._input, self._in = b"", 0  # compressed bytes read, and how far they are decoded
        self._output, self._out = b"", 0  # decoded bytes, and how far they are handed on

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while self._out == len(self._output):
            if self._in == len(self._input):
                self._input, self._in = self._raw.read(1 << 20), 0
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("the zstd stream ends inside a frame (truncated)")
                    return b""
            if self._frame is None:
                self._frame = self._new()
            feed = self._input[self._in:self._in + self._FEED]
            self._in += len(feed)
            self._output, self._out = self._frame.decompress(feed), 0
            if self._frame.eof:  # the next frame starts in what this one did not use
                self._input, self._in = self._frame.unused_data + self._input[self._in:], 0
                self._frame = None
        end = len(self._output) if size < 0 else min(len(self._output), self._out + size)
        out = self._output[self._out:end] if self._out or end < len(self._output) else self._output
        self._out = end
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def decompressed(f: BinaryIO, compression: str) -> BinaryIO:
    if compression == "gz":
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    if compression == "bz2":
        return bz2.BZ2File(f)  # type: ignore[return-value]
    if compression == "zst":
        return _ZstdFrames(f)  # type: ignore[return-value]
    return f


def head_of(prefix: bytes, compression: str, limit: int = 64 << 10) -> bytes:
    """The first decompressed bytes of a file's first bytes, for telling its format: as much as
    the prefix holds (never an error for a prefix that ends mid-stream, nor for a damaged one)."""
    import zlib

    try:
        if compression == "gz":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(prefix, limit)
        if compression == "bz2":
            return bz2.BZ2Decompressor().decompress(prefix, max_length=limit)
        if compression == "zst":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(prefix)[:limit]
    except Exception:  # damaged: the reader will say so, item by item
        return b""
    return prefix[:limit]

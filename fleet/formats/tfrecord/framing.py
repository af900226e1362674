"""TFRecord framing: each record is its length, a checksum of the length, the data, a checksum
of the data; written one record at a time or many laid out at once, and read back checked.

One frame, byte by byte: the record's length (uint64 little-endian, 8 bytes); the masked crc32c
of those 8 bytes (uint32 LE); the record's bytes; the masked crc32c of the record's bytes
(uint32 LE): 16 bytes around every record, nothing between records and no file header. The
crc32c is Castagnoli's (``google_crc32c``), masked as TensorFlow's ``crc32c::Mask`` does:
rotated right by 15 bits, plus ``0xA282EAD8``, modulo 2**32.

The C core frames causal_lm's blocks the same way (``records.c``, beside this module, with a
portable crc32c of its own); ``blocks`` is its Python reference.
"""

from __future__ import annotations

import functools
import io
import struct
from typing import TYPE_CHECKING, Iterator

import google_crc32c
import numpy as np

if TYPE_CHECKING:
    from fleet.formats.writer import Readable

_CRC = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


class RecordError(ValueError):
    """The bytes are not TFRecords of Examples; the message says where."""


crc32c = google_crc32c.value
extend_crc = google_crc32c.extend  # crc32c of a + b from crc32c(a) and b (a cached head's, extended)
pack_crc = _CRC.pack  # a masked crc as a frame holds it


def mask_crc(crc):
    """TFRecord's masking of a crc32c: of an int, or of a numpy uint32 array (many records at once)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    return mask_crc(google_crc32c.value(data))


def frame(record: bytes) -> bytes:
    """One TFRecord: length (uint64 LE), its masked crc32c, the data, the data's masked crc32c."""
    return frame_header(len(record)) + record + pack_crc(masked_crc32c(record))


@functools.lru_cache(maxsize=8192)
def frame_header(length: int) -> bytes:
    """The 12 bytes before a record of ``length`` bytes: the length and its masked crc32c."""
    header = struct.pack("<Q", length)
    return header + pack_crc(masked_crc32c(header))


def frame_headers(count: int) -> np.ndarray:
    """``frame_header`` of every length below ``count``, as rows of a (count, 12) byte array."""
    return np.frombuffer(b"".join(frame_header.__wrapped__(n) for n in range(count)), np.uint8).reshape(-1, 12)


def checksum_frames(frames: np.ndarray, record_lengths: np.ndarray) -> bytes:
    """Framed records laid back to back in ``frames`` (a flat byte array), each record's data
    checksum left blank: the bytes with every checksum filled in (one crc32c call per record)."""
    ends = np.cumsum(np.asarray(record_lengths, np.int64) + 16)
    starts = ends - (np.asarray(record_lengths, np.int64) + 16)
    buf = frames.tobytes()
    crc = np.fromiter(
        (crc32c(buf[a:b]) for a, b in zip((starts + 12).tolist(), (ends - 4).tolist())), np.uint32, len(ends)
    )
    frames[(ends - 4)[:, None] + np.arange(4)] = mask_crc(crc).astype("<u4").view(np.uint8).reshape(-1, 4)
    return frames.tobytes()


# -- reading back: the fleet's one reader (fleet.core.outputs, the report, the Parquet writer, tests)


def frame_length(header: bytes, pos: int = 0) -> int:
    """The record length a frame's first 12 bytes give (the length and its checksum), checked;
    ``pos``, where the frame starts, for the message."""
    if len(header) < 12:
        raise RecordError(f"truncated record header at byte {pos}")
    (length,) = _LENGTH.unpack_from(header)
    if _CRC.unpack(header[8:12])[0] != masked_crc32c(header[:8]):
        raise RecordError(f"bad length checksum at byte {pos} (not a TFRecord file?)")
    return length


def records(f: Readable) -> Iterator[bytes]:
    """The records of a TFRecord stream, read as they are taken, both checksums checked."""
    pos = 0
    while header := f.read(12):
        length = frame_length(header, pos)
        body = f.read(length + 4)
        if len(body) < length + 4:
            raise RecordError(f"truncated record at byte {pos}")
        record = body[:length]
        if _CRC.unpack(body[length:])[0] != masked_crc32c(record):
            raise RecordError(f"bad data checksum at byte {pos}")
        yield record
        pos += 16 + length


def iter_records(data: bytes) -> Iterator[bytes]:
    """Records of a TFRecord file's bytes, both checksums checked (``RecordError``, a
    ValueError, if damaged)."""
    return records(io.BytesIO(data))


def count_frames(data: bytes) -> int:
    """How many framed TFRecords ``data`` holds (their lengths walked, nothing decoded)."""
    n = at = 0
    while at < len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        at += 16 + length
        n += 1
    if at != len(data):
        raise ValueError("a TFRecord frame runs past the end of the records")
    return n


def frames(data: bytes) -> Iterator[memoryview]:
    """The whole frames (length, checksums and payload) of framed TFRecords this process just
    encoded, as views (checksums not checked)."""
    view, at = memoryview(data), 0
    while at < len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        end = at + 16 + length
        if end > len(data):
            raise ValueError("a TFRecord frame runs past the end of the records")
        yield view[at:end]
        at = end

"""``tf.train.Example`` bytes and TFRecord framing, without TensorFlow or protobuf.

Every TFRecord byte a job writes comes from here: the wire format's pieces, the frame
(length, checksums) of one record, and of many laid out at once (``frame_headers``,
``checksum_frames``) for the batch encoders built on it (``token_records``, BERT's).

Writers need neither library: an Example of int64 lists is a few nested
length-prefixed fields, and building protobuf objects would cost more than
the tokenization. Varints of small values come from a precomputed table.

Wire layout (field numbers from tensorflow/core/example/{example,feature}.proto):
Example.features = 1; Features.feature = 1 (map entries: key = 1, value = 2);
Feature.bytes_list = 1, float_list = 2, int64_list = 3; each *List.value = 1,
packed for numbers.
"""

from __future__ import annotations

import functools
import io
import struct
from typing import BinaryIO, Iterable, Iterator, Mapping, Sequence

import google_crc32c
import numpy as np


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values take ten bytes, as in protobuf."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The varint of every value below 65536 (one, two or three bytes): callers that know
# their values are in range (token ids) may join ``map(VARINTS.__getitem__, ids)``.
# Made from the 256 one-byte pieces (3x faster than a bytes() per value: every process imports it).
_LAST = [bytes((i,)) for i in range(0x80)]  # a varint's last byte
_MORE = [bytes((i | 0x80,)) for i in range(0x80)]  # a byte with more to come
VARINTS = _LAST[:]
VARINTS += [low + high for high in _LAST[1:] for low in _MORE]  # 2**7 <= i < 2**14: i = high << 7 | low
VARINTS += [low + rest for rest in VARINTS[0x80:0x200] for low in _MORE]  # 2**14 <= i < 2**16: rest = VARINTS[i >> 7]


def _varint(value: int) -> bytes:
    return VARINTS[value] if 0 <= value < 0x10000 else encode_varint(value)


def varints(values: Sequence[int]) -> bytes:
    """Packed varints of int64 values (the payload of a packed repeated int64 field)."""
    if not values:
        return b""
    top = max(values)
    if top < 0x80:
        try:
            return bytes(values)  # one byte each: the varint is the value itself
        except ValueError:  # a negative value
            pass
    elif top < 0x10000 and min(values) >= 0:
        return b"".join(map(VARINTS.__getitem__, values))
    return b"".join(map(encode_varint, values))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2); the field numbers used here are all below 16."""
    return VARINTS[number << 3 | 2] + _varint(len(payload)) + payload


def int64_feature(values: Sequence[int]) -> bytes:
    """A serialized ``Feature`` holding an ``Int64List``."""
    return _field(3, _field(1, varints(values)) if len(values) else b"")


def packed_int64_feature(payload: bytes) -> bytes:
    """An ``Int64List`` feature from already packed varints (e.g. ``bytes(mask)`` for 0/1 values)."""
    return _field(3, _field(1, payload) if payload else b"")


def float_feature(values: Sequence[float]) -> bytes:
    """A serialized ``Feature`` holding a ``FloatList`` (float32, packed)."""
    return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)) if len(values) else b"")


def bytes_feature(values: Iterable[bytes]) -> bytes:
    """A serialized ``Feature`` holding a ``BytesList``."""
    return _field(1, b"".join(_field(1, v) for v in values))


@functools.lru_cache(maxsize=1024)
def _key(name: str) -> bytes:
    return _field(1, name.encode())


def feature_entry(name: str, feature: bytes) -> bytes:
    """One ``name -> Feature`` entry of ``Features``; entries that never change can be cached."""
    return _field(1, _key(name) + _field(2, feature))


def example_from_entries(entries: Iterable[bytes]) -> bytes:
    """A serialized ``Example`` from ``feature_entry`` results (in the order given)."""
    return _field(1, b"".join(entries))


def example(features: Mapping[str, bytes]) -> bytes:
    """A serialized ``Example`` from serialized ``Feature``s, keys in sorted order for stable bytes."""
    return example_from_entries([feature_entry(name, features[name]) for name in sorted(features)])


def int64_example(features: Mapping[str, Sequence[int]]) -> bytes:
    return example({name: int64_feature(values) for name, values in features.items()})


def varint_rows(values: np.ndarray) -> tuple[bytes, list[int]]:
    """Packed varints of every row of a 2-D array of values in [0, 2**35), in one pass:
    one buffer and the row offsets into it (row i is ``buffer[offsets[i]:offsets[i + 1]]``).

    Values below 2**16 (token ids, positions) are looked up in a table of their varint
    bytes (``np.take`` and ``np.compress`` on flat arrays are the fast numpy paths)."""
    v = np.asarray(values)
    if v.size and (v.min() < 0 or v.max() >= 1 << 16):
        return _varint_rows_wide(v.astype(np.int64))
    table, table_lengths = _varint_table()
    n_bytes = np.take(table_lengths, v)
    parts = np.take(table, v.ravel(), axis=0)  # (values, 3) bytes
    keep = np.ones(parts.shape, bool)
    keep[:, 1] = n_bytes.ravel() >= 2
    keep[:, 2] = n_bytes.ravel() >= 3
    data = np.compress(keep.ravel(), parts.ravel()).tobytes()
    offsets = np.zeros(len(v) + 1, np.int64)
    np.cumsum(n_bytes.sum(axis=1, dtype=np.int64), out=offsets[1:])
    return data, offsets.tolist()


def varint_runs(values: np.ndarray, lengths: Sequence[int]) -> tuple[bytes, list[int]]:
    """Packed varints of consecutive runs of a 1-D array of values in [0, 2**16) (run i is the
    next ``lengths[i]`` values), in one pass: one buffer and the run offsets into it, as
    ``varint_rows`` gives for rows, without padding the runs to one width first."""
    v = np.asarray(values)
    if v.size and (v.min() < 0 or v.max() >= 1 << 16):
        raise ValueError("varint_runs takes values in [0, 2**16)")
    table, table_lengths = _varint_table()
    n_bytes = np.take(table_lengths, v)
    parts = np.take(table, v, axis=0)  # (values, 3) bytes
    keep = np.ones(parts.shape, bool)
    keep[:, 1] = n_bytes >= 2
    keep[:, 2] = n_bytes >= 3
    data = np.compress(keep.ravel(), parts.ravel()).tobytes()
    ends = np.zeros(len(v) + 1, np.int64)
    np.cumsum(n_bytes, out=ends[1:])
    at = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=at[1:])
    return data, ends[at].tolist()


@functools.cache
def _varint_table() -> tuple[np.ndarray, np.ndarray]:
    """(varint bytes, padded to 3, of every value below 2**16; their lengths)."""
    a = np.arange(1 << 16)
    lengths = (1 + (a >= 1 << 7) + (a >= 1 << 14)).astype(np.int8)
    table = np.stack([(a & 0x7F) | np.where(a >= 1 << 7, 0x80, 0),
                      ((a >> 7) & 0x7F) | np.where(a >= 1 << 14, 0x80, 0),
                      a >> 14], axis=1).astype(np.uint8)
    return table, lengths


def _varint_rows_wide(v: np.ndarray) -> tuple[bytes, list[int]]:
    if v.size and (v.min() < 0 or v.max() >= 1 << 35):
        raise ValueError("varint_rows takes values in [0, 2**35)")
    n_bytes = np.ones(v.shape, np.int64)
    for k in range(1, 5):
        n_bytes += v >= 1 << (7 * k)
    width = int(n_bytes.max()) if v.size else 1
    parts = np.empty(v.shape + (width,), np.uint8)
    for k in range(width):
        parts[..., k] = ((v >> (7 * k)) & 0x7F) | np.where(n_bytes > k + 1, 0x80, 0)
    data = parts[np.arange(width) < n_bytes[..., None]].tobytes()
    offsets = np.zeros(len(v) + 1, np.int64)
    np.cumsum(n_bytes.sum(axis=1), out=offsets[1:])
    return data, offsets.tolist()


@functools.lru_cache(maxsize=4096)
def int64_entry_prefix(name: str, payload_length: int) -> bytes:
    """The bytes of ``feature_entry(name, packed_int64_feature(payload))`` before the payload,
    for a non-empty payload of that length: the entry is this prefix plus the payload."""
    inner = VARINTS[1 << 3 | 2] + _varint(payload_length)
    mid = VARINTS[3 << 3 | 2] + _varint(len(inner) + payload_length) + inner
    value = VARINTS[2 << 3 | 2] + _varint(len(mid) + payload_length) + mid
    key = _key(name)
    return VARINTS[1 << 3 | 2] + _varint(len(key) + len(value) + payload_length) + key + value


def example_prefix(body_length: int) -> bytes:
    """What ``example_from_entries`` puts before the joined entries."""
    return VARINTS[1 << 3 | 2] + _varint(body_length)


crc32c = google_crc32c.value
extend_crc = google_crc32c.extend  # crc32c of a + b from crc32c(a) and b (a cached head's, extended)
pack_crc = struct.Struct("<I").pack  # a masked crc as a frame holds it


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
    crc = np.fromiter((crc32c(buf[a:b]) for a, b in zip((starts + 12).tolist(), (ends - 4).tolist())), np.uint32,
                      len(ends))
    frames[(ends - 4)[:, None] + np.arange(4)] = mask_crc(crc).astype("<u4").view(np.uint8).reshape(-1, 4)
    return frames.tobytes()


# -- reading back (the report, the Parquet writer, tests): the fleet's reader, one copy ---------


def iter_records(data: bytes) -> Iterator[bytes]:
    """Records of a TFRecord file's bytes, both checksums checked (ValueError if damaged)."""
    return iter_file_records(io.BytesIO(data))


def iter_file_records(f: BinaryIO) -> Iterator[bytes]:
    """The records of a TFRecord file object, both checksums checked, read as they are taken
    (the report wants the first few thousand records of files that may hold hundreds of MB)."""
    from fleet.job import tfrecord_records

    return tfrecord_records(f)


def parse_example(data: bytes) -> dict[str, "np.ndarray | list[bytes]"]:
    """A serialized ``tf.train.Example`` -> {name: int64 or float32 array, or list of bytes}."""
    from fleet.job import parse_example as parse

    return parse(data)

"""``tf.train.Example`` bytes and TFRecord framing, without TensorFlow or protobuf.

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
import struct
from typing import Iterable, Mapping, Sequence

import google_crc32c


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
VARINTS = [bytes((i,)) for i in range(0x80)]
VARINTS += [bytes((i & 0x7F | 0x80, i >> 7)) for i in range(0x80, 0x4000)]
VARINTS += [bytes((i & 0x7F | 0x80, (i >> 7) & 0x7F | 0x80, i >> 14)) for i in range(0x4000, 0x10000)]


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


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One TFRecord: length (uint64 LE), its masked crc32c, the data, the data's masked crc32c."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc32c(length)) + record + struct.pack("<I", masked_crc32c(record))


def iter_records(data: bytes) -> Iterable[bytes]:
    """Records of a TFRecord file, checking both checksums (for tests and checks)."""
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"truncated record header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if crc != masked_crc32c(header):
            raise ValueError(f"bad length checksum at byte {pos}")
        end = pos + 12 + length
        if end + 4 > len(data):
            raise ValueError(f"truncated record at byte {pos}")
        record = data[pos + 12 : end]
        if struct.unpack("<I", data[end : end + 4])[0] != masked_crc32c(record):
            raise ValueError(f"bad data checksum at byte {pos}")
        yield record
        pos = end + 4

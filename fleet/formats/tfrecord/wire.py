"""``tf.train.Example`` bytes, without TensorFlow or protobuf: encoded (every Example a job
writes) and decoded (the fleet's readers of a run, the report, tests).

Writers need neither library: an Example of int64 lists is a few nested
length-prefixed fields, and building protobuf objects would cost more than
the tokenization. Varints of small values come from a precomputed table. The batch
encoders built on these pieces (``blocks`` here, ``fleet_jobs.text.token_records``, BERT's)
lay out many records at once.

Wire layout (field numbers from tensorflow/core/example/{example,feature}.proto):
Example.features = 1; Features.feature = 1 (map entries: key = 1, value = 2);
Feature.bytes_list = 1, float_list = 2, int64_list = 3; each *List.value = 1,
packed for numbers. The reader also takes unpacked numbers (one field per value),
as protobuf writes them when asked to.
"""

from __future__ import annotations

import functools
import struct
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from .framing import RecordError


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
    table, table_lengths = varint_table()
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
    table, table_lengths = varint_table()
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
def varint_table() -> tuple[np.ndarray, np.ndarray]:
    """(varint bytes, padded to 3, of every value below 2**16; their lengths): the table the
    batch encoders look values up in (``varint_rows``, ``varint_runs``, BERT's)."""
    a = np.arange(1 << 16)
    lengths = (1 + (a >= 1 << 7) + (a >= 1 << 14)).astype(np.int8)
    table = np.stack(
        [(a & 0x7F) | np.where(a >= 1 << 7, 0x80, 0), ((a >> 7) & 0x7F) | np.where(a >= 1 << 14, 0x80, 0), a >> 14],
        axis=1,
    ).astype(np.uint8)
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


# -- decoding ------------------------------------------------------------------------------------


def parse_example(data: bytes) -> dict[str, "np.ndarray | list[bytes]"]:
    """A serialized ``tf.train.Example`` -> {name: int64 or float32 array, or list of bytes}."""
    features: dict[str, np.ndarray | list[bytes]] = {}
    for number, wire, start, end in _fields(data, 0, len(data)):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, es, ee in _fields(data, start, end):
            if entry_number != 1 or entry_wire != 2:
                continue
            name, value = "", None
            for key_number, _, ks, ke in _fields(data, es, ee):
                if key_number == 1:
                    name = data[ks:ke].decode("utf-8")
                elif key_number == 2:
                    value = _feature(data, ks, ke)
            features[name] = value if value is not None else np.zeros(0, np.int64)
    return features


def _feature(data: bytes, start: int, end: int) -> "np.ndarray | list[bytes]":
    result: np.ndarray | list[bytes] = np.zeros(0, np.int64)
    for kind, _, ls, le in _fields(data, start, end):
        if kind == 1:  # BytesList
            result = [data[s:e] for n, _, s, e in _fields(data, ls, le) if n == 1]
        elif kind == 2:  # FloatList: packed, or one fixed32 per value
            parts = [data[s:e] for n, _, s, e in _fields(data, ls, le) if n == 1]
            result = np.frombuffer(b"".join(parts), "<f4").astype(np.float32)
        elif kind == 3:  # Int64List: packed, or one varint per value
            packed, single = [], []
            for n, wire, s, e in _fields(data, ls, le):
                if n == 1 and wire == 2:
                    packed.append(decode_varints(data[s:e]))
                elif n == 1 and wire == 0:
                    single.append(np.array([s], np.uint64).view(np.int64))
            result = np.concatenate(packed + single) if packed or single else np.zeros(0, np.int64)
    return result


def decode_varints(payload: bytes) -> np.ndarray:
    """Packed varints -> int64 values (two's complement for ten-byte negatives), in numpy."""
    b = np.frombuffer(payload, np.uint8)
    if not len(b):
        return np.zeros(0, np.int64)
    last = b < 0x80
    if not last[-1]:
        raise RecordError("truncated varint")
    if last.all():
        return b.astype(np.int64)
    group = np.zeros(len(b), np.int64)
    np.cumsum(last[:-1], out=group[1:])
    starts = np.flatnonzero(np.concatenate([[True], last[:-1]]))
    shift = (7 * (np.arange(len(b)) - starts[group])).astype(np.uint64)
    values = np.zeros(len(starts), np.uint64)
    np.add.at(values, group, (b & 0x7F).astype(np.uint64) << shift)
    return values.view(np.int64)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise RecordError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field; for varints start is the value."""
    pos = start
    while pos < end:
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            yield number, wire, value, pos
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise RecordError("truncated field")
            yield number, wire, pos, pos + length
            pos += length
        elif wire == 5:
            yield number, wire, pos, pos + 4
            pos += 4
        elif wire == 1:
            yield number, wire, pos, pos + 8
            pos += 8
        else:
            raise RecordError(f"unexpected wire type {wire}")

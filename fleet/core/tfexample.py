"""TFRecord files of ``tf.train.Example``s read back without TensorFlow or protobuf.

The readers of a run (``fleet.core.follow``) hand a trainer its examples as numpy arrays;
the fleet must not import a job to do so, so the read side of the format lives here:
the framing (a length, the data, each with a masked crc32c) and the few protobuf
fields of an Example of int64, float and bytes lists.

Wire layout (field numbers from tensorflow/core/example/{example,feature}.proto):
Example.features = 1; Features.feature = 1 (map entries: key = 1, value = 2);
Feature.bytes_list = 1, float_list = 2, int64_list = 3; each *List.value = 1.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, Iterator

import google_crc32c
import numpy as np

_CRC = struct.Struct("<I")


class RecordError(ValueError):
    """The bytes are not TFRecords of Examples; the message says where."""


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(f: BinaryIO) -> Iterator[bytes]:
    """The records of a TFRecord stream, read as they are taken, both checksums checked."""
    pos = 0
    while header := f.read(12):
        if len(header) < 12:
            raise RecordError(f"truncated record header at byte {pos}")
        (length,) = struct.unpack("<Q", header[:8])
        if _CRC.unpack(header[8:])[0] != masked_crc32c(header[:8]):
            raise RecordError(f"bad length checksum at byte {pos} (not a TFRecord file?)")
        body = f.read(length + 4)
        if len(body) < length + 4:
            raise RecordError(f"truncated record at byte {pos}")
        record = body[:length]
        if _CRC.unpack(body[length:])[0] != masked_crc32c(record):
            raise RecordError(f"bad data checksum at byte {pos}")
        yield record
        pos += 16 + length


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


def _varint(data: bytes, pos: int) -> tuple[int, int]:
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
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value, pos
        elif wire == 2:
            length, pos = _varint(data, pos)
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

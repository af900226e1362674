"""TFRecord files of ``tf.train.Example``s, written and read without TensorFlow or protobuf.

A file is records back to back, each framed (``framing``): the record's length (uint64 LE), the
masked crc32c of those 8 bytes (uint32 LE), the record, the masked crc32c of the record (uint32
LE). A masked crc32c is Castagnoli's crc32c rotated right by 15 bits plus ``0xA282EAD8`` (mod
2**32), as TensorFlow masks it. No file header, nothing between records; ``.tfrecord.gz`` is
the same bytes in one GZIP member.

Each record is a serialized ``tf.train.Example`` (``wire``): Example.features = 1;
Features.feature = 1, a map entry per feature (key = 1, the name; value = 2, a Feature);
Feature.bytes_list = 1, float_list = 2, int64_list = 3; each *List.value = 1, packed for
numbers (varints for int64, little-endian float32). Writers put the features in name order,
so the same values give the same bytes.

Here: ``wire``, the Example's bytes encoded and decoded; ``framing``, the frames, their
checksums and the reader; ``writer``, the TFRecord writer of a job's examples; ``blocks``,
causal_lm's block records many at a time, the Python reference of ``records.c`` (beside it:
the same frames in C, built into the text jobs' C library by setup.py). The names of ``wire``
and ``framing`` are the package's too: ``tfrecord.frame``, ``tfrecord.parse_example``.
"""

from .framing import (
    RecordError,
    checksum_frames,
    count_frames,
    crc32c,
    extend_crc,
    frame,
    frame_header,
    frame_length,
    frame_headers,
    frames,
    iter_records,
    mask_crc,
    masked_crc32c,
    pack_crc,
    records,
)
from .wire import (
    VARINTS,
    bytes_feature,
    decode_varints,
    encode_varint,
    example,
    example_from_entries,
    example_prefix,
    feature_entry,
    float_feature,
    int64_entry_prefix,
    int64_example,
    int64_feature,
    packed_int64_feature,
    parse_example,
    varint_rows,
    varint_runs,
    varint_table,
    varints,
)

__all__ = [
    # framing
    "RecordError",
    "records",
    "iter_records",
    "count_frames",
    "frames",
    "frame",
    "frame_header",
    "frame_length",
    "frame_headers",
    "checksum_frames",
    "crc32c",
    "extend_crc",
    "mask_crc",
    "masked_crc32c",
    "pack_crc",
    # an Example's bytes
    "VARINTS",
    "encode_varint",
    "varints",
    "varint_rows",
    "varint_runs",
    "varint_table",
    "int64_feature",
    "packed_int64_feature",
    "float_feature",
    "bytes_feature",
    "feature_entry",
    "example_from_entries",
    "example",
    "int64_example",
    "int64_entry_prefix",
    "example_prefix",
    "parse_example",
    "decode_varints",
]

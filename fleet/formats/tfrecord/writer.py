"""A job's examples as one TFRecord file (``TFRecordWriter``): records it encoded itself, framed,
or rows of values, encoded here (``encode_rows``) to the bytes ``wire.example`` gives.

The file is the frames back to back (the package's docstring); a GZIP file is the same bytes
compressed, which the caller arranges (``fleet_jobs.text.output.open_writer``).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from fleet.formats import tfrecord
from fleet.formats.writer import Column, ExampleWriter, Writable, row_count


class TFRecordWriter(ExampleWriter):
    def __init__(self, out: Writable, columns: Sequence[Column]):
        super().__init__(columns)
        self.out = out
        self.order = sorted(columns, key=lambda c: c.name)  # tfrecord.example's order: stable bytes

    def write(self, records: bytes, count: Optional[int] = None) -> None:
        self.examples += tfrecord.count_frames(records) if count is None else count
        self.out.write(records)

    def write_columns(self, values: Mapping[str, np.ndarray]) -> None:
        rows = encode_rows(self.order, values)
        self.examples += len(rows)
        self.out.write(b"".join(rows))


def encode_rows(columns: Sequence[Column], values: Mapping[str, np.ndarray]) -> list[bytes]:
    """One framed TFRecord per row, features in the order given; the bytes ``tfrecord.example``
    gives for the same values, with each int column's varints made in one numpy pass."""
    n = row_count(columns, values)
    per_column = []
    for column in columns:
        array = np.asarray(values[column.name])
        if column.kind == "float":
            per_column.append(
                [tfrecord.feature_entry(column.name, tfrecord.float_feature(row.tolist())) for row in array]
            )
            continue
        data, at = tfrecord.varint_rows(array.reshape(n, -1))
        entries = []
        for i in range(n):
            payload = data[at[i] : at[i + 1]]
            entries.append(
                tfrecord.int64_entry_prefix(column.name, len(payload)) + payload
                if payload
                else tfrecord.feature_entry(column.name, tfrecord.packed_int64_feature(b""))
            )
        per_column.append(entries)
    out = []
    for row_entries in zip(*per_column):
        body = b"".join(row_entries)
        out.append(tfrecord.frame(tfrecord.example_prefix(len(body)) + body))
    return out

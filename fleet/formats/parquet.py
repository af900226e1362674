"""Parquet files of examples (``output=parquet``): an item's examples as one file, one row per
example; written here (``ParquetExampleWriter``) and read back (``read_columns``).

Every feature is a list column: ``list<int32>`` for integer features (token ids,
masks, positions: all far below 2**31; a value that is not raises) and
``list<float>`` for float ones (BERT's ``masked_lm_weights``); an input field carried along
(``fields``, a Column of kind "text") is ``list<string>``; zstd-compressed, in
row groups of ``ROW_GROUP_ROWS`` rows. The file's bytes depend on the rows only
(pyarrow writes no time stamp), so a retried item rewrites the same file.

The reader takes any list (or plain) columns of integers or floats, a row group at a time, as
2-D arrays in the dtypes a layout asks for (``fleet.core.outputs``: a run's committed outputs).
"""

from __future__ import annotations

import io
from typing import BinaryIO, Iterator, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fleet.formats import tfrecord
from fleet.formats.writer import Column, ExampleWriter, row_count

ROW_GROUP_ROWS = 16_384  # 8 MB of int32 at 128 tokens per row: readers stream a group at a time
COMPRESSION = "zstd"
_INT32 = np.iinfo(np.int32)


def schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([(c.name, pa.list_(_VALUE_TYPES[c.kind]())) for c in columns])


_VALUE_TYPES = {"int": pa.int32, "float": pa.float32, "text": pa.string}


class ParquetExampleWriter(ExampleWriter):
    def __init__(self, out: BinaryIO, columns: Sequence[Column]):
        super().__init__(columns)
        self.schema = schema(columns)
        self.writer = pq.ParquetWriter(out, self.schema, compression=COMPRESSION)
        self.rows: dict[str, list] = {c.name: [] for c in columns}
        self.text = {c.name for c in columns if c.kind == "text"}  # rows of Python lists of str
        self.pending = 0

    def write(self, records: bytes, count: Optional[int] = None) -> None:
        """Framed TFRecords decoded back into rows (for jobs that encode records themselves)."""
        names = set(self.rows)
        for raw in tfrecord.iter_records(records):
            example = tfrecord.parse_example(raw)
            if set(example) != names:
                raise ValueError(f"a record has the features {sorted(example)}, the writer {sorted(names)}")
            for name, rows in self.rows.items():
                value = example[name]
                if not isinstance(value, np.ndarray):  # (a bytes feature: no column of this writer holds one)
                    raise ValueError(f"a record's feature {name} holds bytes, the writer's column numbers")
                rows.append(value)
            self.pending += 1
            self.examples += 1
            if self.pending >= ROW_GROUP_ROWS:
                self._flush()

    def write_columns(self, values: Mapping[str, np.ndarray]) -> None:
        n = row_count(self.columns, values)
        for name, rows in self.rows.items():
            rows.extend(values[name] if name in self.text else np.asarray(values[name]).reshape(n, -1))
        self.pending += n
        self.examples += n
        if self.pending >= ROW_GROUP_ROWS:
            self._flush()

    def write_examples(self, values: Mapping[str, np.ndarray]) -> None:
        """Rows as ``write`` would add them from their records: a row group ends after exactly
        ``ROW_GROUP_ROWS`` rows (``write_columns`` ends one only after a whole call)."""
        n = row_count(self.columns, values)
        if not n:
            return
        arrays = {
            name: values[name] if name in self.text else np.asarray(values[name]).reshape(n, -1) for name in self.rows
        }
        self.examples += n
        done = 0
        while done < n:
            take = min(n - done, ROW_GROUP_ROWS - self.pending)
            for name, rows in self.rows.items():
                rows.extend(arrays[name][done : done + take])
            self.pending += take
            done += take
            if self.pending >= ROW_GROUP_ROWS:
                self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        arrays = []
        for column in self.columns:
            rows = self.rows[column.name]
            if column.kind == "text":
                arrays.append(pa.array(rows, type=pa.list_(pa.string())))
                rows.clear()
                continue
            lengths = np.fromiter(map(len, rows), np.int64, len(rows))
            offsets = np.zeros(len(rows) + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.concatenate(rows) if rows else np.zeros(0)
            if column.kind == "float":
                values = pa.array(flat.astype(np.float32))
            else:
                if flat.size and (flat.min() < _INT32.min or flat.max() > _INT32.max):
                    raise ValueError(f"feature {column.name}: a value does not fit the int32 Parquet column")
                values = pa.array(flat.astype(np.int32))
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets), values))
            rows.clear()
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
        self.pending = 0

    def close(self) -> None:
        self._flush()
        self.writer.close()


def read_rows(path_or_file) -> dict[str, list[list]]:
    """A Parquet output's columns as Python lists (for checks and tests)."""
    return pq.read_table(path_or_file).to_pydict()


class ParquetError(ValueError):
    """The bytes are not a Parquet file of the examples asked for; the message says why."""


def read_columns(data: bytes, layout: Mapping) -> Iterator[dict[str, np.ndarray]]:
    """The rows of a Parquet file's bytes, a row group at a time, as ``{name: 2-D array}`` (row i
    of every array is example i). ``layout``: the features wanted, ``{name: feature}`` where a
    feature has a ``length`` (values a row) and a ``dtype`` ("float32" or an integer dtype), as
    ``fleet.core.sink.Feature``. ``ParquetError`` when the file is not that."""
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        schema = pf.schema_arrow
        missing = sorted(set(layout) - set(schema.names))
        if missing:
            raise ParquetError(f"no column {', '.join(missing)} (not this run's examples?)")
        for fname, feature in layout.items():
            kind = schema.field(fname).type
            values = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else kind
            if not (pa.types.is_floating(values) if feature.dtype == "float32" else pa.types.is_integer(values)):
                raise ParquetError(
                    f"column {fname} is {kind}, the run's job says lists of {feature.dtype} (not this run's examples?)"
                )
        for group in range(pf.num_row_groups):
            table = pf.read_row_group(group, columns=list(layout))
            columns = {}
            for fname, feature in layout.items():
                flat = table.column(fname).combine_chunks().flatten().to_numpy(zero_copy_only=False)
                if len(flat) != len(table) * feature.length:
                    raise ParquetError(
                        f"column {fname} does not hold {feature.length} values a row, "
                        "as the run's job says (not this run's examples?)"
                    )
                columns[fname] = flat.astype(feature.dtype).reshape(len(table), feature.length)
            yield columns
    except (pa.ArrowException, OSError) as e:
        raise ParquetError(f"cannot read as Parquet ({e})") from None

"""One committed output read back as a job's examples, checked against its lease.

A run's readers (``fleet.core.follow``) get from the job only its feature layout
(``Job.features``); what is generic is here: the file is read through fleet's store
(local folder or ``gs://``, one pinned object version), its sha256 compared with the
one its lease recorded at commit, and its examples checked against the layout.

- ``.tfrecord`` / ``.tfrecord.gz``: streamed in ranged reads (bounded memory), GZIP
  decompressed on the way, each record's checksums checked (``fleet.formats.tfrecord``);
- ``.parquet``: read whole (a third of its TFRecords' size), checked, then handed
  over a row group at a time as 2-D arrays, one per feature (``fleet.formats.parquet``);
- ``.mds`` / ``.mds.zstd``: an MDS shard (at most 64 MiB raw), read whole, checked, its
  columns checked against the layout, handed over as 2-D arrays (``fleet.formats.mds``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from fleet.core.sink import Feature
from fleet.core.store import Store, StoreError, StoreFile, locate
from fleet.formats import tfrecord

_BUFFER = 8 << 20  # bytes per ranged read of an output
PARQUET_SUFFIX = ".parquet"
MDS_SUFFIXES = (".mds", ".mds.zstd")
_MDS_ROWS = 4096  # rows handed over at a time from an MDS shard


@dataclass(frozen=True)
class Output:
    """A committed output of a run, as its lease names it (fleet.core.follow hands these out)."""

    url: str  # where to read it: gs://... or a local path
    item: str
    committed: float  # when its item was committed (the lease's finish time)
    size: int
    sha256: str


class OutputError(Exception):
    """An output cannot be read as the run's examples; the message names it and why."""


def is_parquet(out: "Output") -> bool:
    return out.url.endswith(PARQUET_SUFFIX)


def is_rows(out: "Output") -> bool:
    """Whether the output holds rows of values (Parquet, MDS), not TFRecords."""
    return out.url.endswith((PARQUET_SUFFIX, *MDS_SUFFIXES))


def row_columns(out: "Output", layout: Mapping[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """``parquet_columns`` or ``mds_columns``, by the output's name."""
    return parquet_columns(out, layout) if is_parquet(out) else mds_columns(out, layout)


def read_records(out: "Output") -> Iterator[bytes]:
    """The serialized Examples of one committed TFRecord output, streamed, framing checksums
    checked, and the whole file's sha256 checked against the one its lease recorded."""
    store, name = locate(out.url)
    blob = store.stat(name)
    if blob is None:
        raise OutputError(f"{out.url}: committed output is gone")
    raw = _HashingObject(store, name, blob.size, blob.version or None)
    stream = io.BufferedReader(raw, _BUFFER)
    data = gzip.GzipFile(fileobj=stream, mode="rb") if out.url.endswith(".gz") else stream
    try:
        yield from tfrecord.records(data)
        data.read()  # a gzip trailer, or nothing: the whole file passes through the hash
    except tfrecord.RecordError as e:
        raise OutputError(f"{out.url}: {e}") from None
    except (OSError, EOFError, StoreError) as e:
        raise OutputError(f"{out.url}: cannot read ({e.__class__.__name__}: {e})") from None
    _check_digest(out, raw.hash.hexdigest())


def record_examples(out: "Output", layout: Mapping[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """``{name: array}`` per record of a TFRecord output, each feature checked against the layout."""
    for number, record in enumerate(read_records(out), 1):
        try:
            example = tfrecord.parse_example(record)
        except tfrecord.RecordError as e:
            raise OutputError(f"{out.url}: record {number}: not a tf.train.Example ({e})") from None
        checked: dict[str, np.ndarray] = {}
        for name, feature in layout.items():
            value = example.get(name)
            if not isinstance(value, np.ndarray) or len(value) != feature.length or value.dtype != feature.dtype:
                got = "missing" if value is None else f"{len(value)} values of {_dtype(value)}"
                raise OutputError(
                    f"{out.url}: record {number}: feature {name} is {got}, the run's job says "
                    f"{feature.length} of {feature.dtype} (not this run's records?)"
                )
            checked[name] = value
        yield checked


def parquet_columns(out: "Output", layout: Mapping[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """The rows of one committed Parquet output, a row group at a time, as ``{name: 2-D array}``
    (row i of every array is example i) in the layout's dtypes; the file's sha256 checked first."""
    from fleet.formats import parquet  # pyarrow loads only when asked for

    data = _read_whole(out)
    try:
        yield from parquet.read_columns(data, layout)
    except parquet.ParquetError as e:
        raise OutputError(f"{out.url}: {e}") from None


def mds_columns(out: "Output", layout: Mapping[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """The rows of one committed MDS shard as ``{name: 2-D array}`` in the layout's dtypes, its
    sha256 checked first and its columns against the layout (``ndarray:<dtype>:<length>``)."""
    from fleet.formats import mds

    data = _read_whole(out)
    try:
        config, samples = mds.read_shard(data)
        codes = dict(zip(config["column_names"], config["column_encodings"]))
        for fname, feature in layout.items():
            kind = "float32" if feature.dtype == "float32" else "int32"
            if codes.get(fname) != f"ndarray:{kind}:{feature.length}":
                raise OutputError(
                    f"{out.url}: column {fname} is {codes.get(fname, 'missing')}, the run's job says "
                    f"ndarray:{kind}:{feature.length} (not this run's examples?)"
                )
        rows: list[dict] = []
        for sample in samples:
            rows.append(sample)
            if len(rows) >= _MDS_ROWS:
                yield _stacked(rows, layout)
                rows = []
        if rows:
            yield _stacked(rows, layout)
    except mds.MDSError as e:
        raise OutputError(f"{out.url}: {e}") from None


def _read_whole(out: "Output") -> bytes:
    """An output's bytes, read whole, checked against the sha256 its lease recorded."""
    store, name = locate(out.url)
    try:
        data = store.read(name)
    except StoreError as e:
        raise OutputError(f"{out.url}: cannot read ({e})") from None
    _check_digest(out, hashlib.sha256(data).hexdigest())
    return data


def _stacked(rows: list[dict], layout: Mapping[str, Feature]) -> dict[str, np.ndarray]:
    return {fname: np.stack([row[fname] for row in rows]).astype(feature.dtype) for fname, feature in layout.items()}


def row_examples(out: "Output", layout: Mapping[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """``row_columns`` a row at a time: ``{name: 1-D array}`` per example."""
    for columns in row_columns(out, layout):
        rows = len(next(iter(columns.values()))) if columns else 0
        for row in range(rows):
            yield {fname: values[row] for fname, values in columns.items()}


def _dtype(value) -> str:
    return str(value.dtype) if isinstance(value, np.ndarray) else "bytes"


def _check_digest(out: "Output", digest: str) -> None:
    if out.sha256 and digest != out.sha256:
        raise OutputError(
            f"{out.url}: not the bytes committed (sha256 {digest[:12]}, the lease says "
            f"{out.sha256[:12]}): changed since its item was committed"
        )


class _HashingObject(StoreFile):
    """One object version read front to back in ranged reads, hashed as it goes by."""

    def __init__(self, store: Store, name: str, size: int, version: str | None):
        super().__init__(store, name, size, version)
        self.hash = hashlib.sha256()

    def seekable(self) -> bool:
        return False  # the hash holds only if every byte passes once, in order

    def readinto(self, buffer) -> int:
        n = super().readinto(buffer)
        self.hash.update(memoryview(buffer)[:n])
        return n

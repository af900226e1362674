"""Train while the run goes on: a run's examples, parsed, as its items are committed.

Built on ``fleet.follow``: each committed output is read once, in commit order, and
the reading ends when the run drains. Two front doors over the same records:

- ``follow_examples(...)``: a plain-Python iterator of ``{feature: numpy array}``
  (PyTorch users: no torch, no TensorFlow; the TFRecord framing and the
  ``tf.train.Example`` protobuf are parsed by ``tfrecord``);
- ``follow_dataset(...)``: a ``tf.data.Dataset`` of parsed examples with the job's
  own feature spec (``feature_spec``).

The feature layout (``format=electra`` or ``bert``, ``max_seq_length``, ...) comes from
the run's config in ``run.json``. Outputs are read through fleet's store, so a local
folder and ``gs://`` behave alike (and use the same credentials as the fleet); GZIP
outputs are decompressed as they stream. Each output's bytes are checked against the
sha256 its lease recorded at commit, and each record's checksums as it is read.
``output=parquet`` runs are read too: an item's Parquet file (a third of its TFRecords'
size) is read whole, checked, and handed over a row group at a time.

Items that failed are what ``fleet follow`` reports: once everything else is read,
the iterator raises ``FollowError`` naming them (and the dataset fails with it).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np

from fleet.follow import Follower, Output
from fleet.run import PlanError, list_runs, load_spec
from fleet.store import StoreError, StoreFile, locate, open_store

from jobs.text import tfrecord
from .bert_records import feature_names

if TYPE_CHECKING:
    import tensorflow as tf

_BUFFER = 8 << 20  # bytes per ranged read of an output
_CHUNK = 256  # records per element handed from Python to tf.data (then unbatched)


class FollowError(Exception):
    """Items of the run failed, or an output cannot be read as the run's records; the
    message names them."""


@dataclass(frozen=True)
class Feature:
    length: int
    dtype: str  # "int64" or "float32"


def feature_layout(config) -> dict[str, Feature]:
    """The features every record of a run with this config holds (its ElectraConfig)."""
    seq = config.max_seq_length
    if config.format != "bert":
        return {name: Feature(seq, "int64") for name in ("input_ids", "input_mask", "segment_ids")}
    names = feature_names(config.v2_feature_names)
    preds = config.max_predictions_per_seq
    lengths = {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": preds,
               "masked_lm_ids": preds, "masked_lm_weights": preds, "next_sentence_labels": 1}
    return {names[name]: Feature(n, "float32" if name == "masked_lm_weights" else "int64")
            for name, n in lengths.items()}


def feature_spec(config) -> dict:
    """``{name: tf.io.FixedLenFeature}`` for ``tf.io.parse_example`` (imports TensorFlow)."""
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([f.length], tf.float32 if f.dtype == "float32" else tf.int64)
            for name, f in feature_layout(config).items()}


def resolve_run(source: str, run: str | None = None) -> tuple[str, str]:
    """(bucket, run) from a bucket URL, a local bucket folder or an output folder of
    ``fleet local``; the run may be left out when the bucket holds only one."""
    from fleet.local import STATE_DIR

    bucket = source
    state = os.path.join(source, STATE_DIR)
    if "://" not in source and os.path.isdir(state):
        bucket = state
    if run:
        return bucket, run
    try:
        runs = list_runs(open_store(bucket))
    except (StoreError, OSError) as e:
        raise FollowError(f"{source}: cannot list its runs ({e})") from None
    if len(runs) != 1:
        raise FollowError(f"{source}: {'no runs' if not runs else 'several runs: ' + ', '.join(runs)}; "
                          f"name one with run=")
    return bucket, runs[0]


@dataclass
class RunReader:
    """A run's records, as its items are committed. Each iteration follows the run anew
    (from the start, or from the time it begins when ``from_start`` is false)."""

    source: str  # gs://BUCKET, a local bucket folder, or an output folder of fleet local
    run: str | None = None
    from_start: bool = True
    poll: float = 2.0
    # (index, count): read only the items of this share, e.g. one per DataLoader worker or
    # per host; the shares of 0..count-1 are disjoint and together the whole run.
    shard: tuple[int, int] = (0, 1)
    bucket: str = field(init=False)
    config: object = field(init=False)  # the run's ElectraConfig
    layout: dict[str, Feature] = field(init=False)

    def __post_init__(self) -> None:
        from . import JOB

        index, count = self.shard
        if not 0 <= index < count:
            raise FollowError(f"shard {index} of {count}: the index must be in 0..{count - 1}")
        self.bucket, self.run = resolve_run(self.source, self.run)
        try:
            spec = load_spec(open_store(self.bucket), self.run)
        except (PlanError, StoreError) as e:
            raise FollowError(str(e)) from None
        if spec.job.split(":")[0].rsplit(".", 1)[-1] != JOB.name:
            raise FollowError(f"run {self.run} in {self.bucket} is a {spec.job} run, not {JOB.name}")
        self.config = JOB.parse_config(spec.config)
        self.layout = feature_layout(self.config)

    # -- the outputs, then their records ------------------------------------------------
    def outputs(self) -> Iterator[Output]:
        """Each committed output once, in commit order; FollowError at the end if items failed."""
        follower = Follower(self.bucket, self.run, self.from_start, self.poll)
        index, count = self.shard
        for out in follower:
            if count == 1 or _share(out.item, count) == index:
                yield out
        if follower.failed:
            listed = "; ".join(f"{item}: {error}" for item, error in follower.failed)
            raise FollowError(f"run {self.run}: {len(follower.failed)} item(s) failed: {listed}")

    @property
    def parquet(self) -> bool:
        return getattr(self.config, "output", "tfrecord") == "parquet"

    def record_chunks(self, size: int = _CHUNK) -> Iterator[list[bytes]]:
        """Serialized ``tf.train.Example``s in lists of at most ``size``, never across outputs."""
        if self.parquet:
            raise FollowError(f"run {self.run} wrote Parquet (output=parquet): its examples are rows, "
                              "not records; read them with examples() or dataset()")
        for out in self.outputs():
            chunk: list[bytes] = []
            for record in read_output(out):
                chunk.append(record)
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk

    def records(self) -> Iterator[bytes]:
        for chunk in self.record_chunks():
            yield from chunk

    def examples(self) -> Iterator[dict[str, np.ndarray]]:
        """``{name: array}`` per example: int64 arrays (float32 for masked_lm_weights) of the
        run's lengths, as ``tf.io.parse_single_example`` with ``feature_spec`` gives them."""
        layout = self.layout
        for out in self.outputs():
            if self.parquet:
                yield from parquet_examples(out, layout)
                continue
            for number, record in enumerate(read_output(out), 1):
                example = tfrecord.parse_example(record)
                for name, feature in layout.items():
                    value = example.get(name)
                    if not isinstance(value, np.ndarray) or len(value) != feature.length:
                        got = "missing" if value is None else f"{len(value)} values"
                        raise FollowError(f"{out.url}: record {number}: feature {name} is {got}, the run's "
                                          f"config says {feature.length} (not this run's records?)")
                yield {name: example[name] for name in layout}

    def dataset(self) -> "tf.data.Dataset":
        """A ``tf.data.Dataset`` of parsed examples (``feature_spec``) that ends when the run
        drains; it fails with the FollowError's message when items failed."""
        import tensorflow as tf

        if self.parquet:
            signature = {name: tf.TensorSpec([f.length], tf.float32 if f.dtype == "float32" else tf.int64)
                         for name, f in self.layout.items()}
            return tf.data.Dataset.from_generator(self.examples, output_signature=signature)
        spec = feature_spec(self.config)
        chunks = tf.data.Dataset.from_generator(self.record_chunks,
                                                output_signature=tf.TensorSpec([None], tf.string))
        return chunks.map(lambda c: tf.io.parse_example(c, spec)).unbatch()


def _share(item: str, count: int) -> int:
    """Items are numbered: consecutive ones go to different shares (else a stable hash)."""
    return int(item) % count if item.isdigit() else zlib.crc32(item.encode()) % count


def read_output(out: Output) -> Iterator[bytes]:
    """The records of one committed output, streamed (bounded memory), framing checksums
    checked, and the whole file's sha256 checked against the one its lease recorded."""
    stream = _HashingReader(_open_url(out.url))
    data = gzip.GzipFile(fileobj=stream, mode="rb") if out.url.endswith(".gz") else stream
    try:
        yield from _framed(data, out.url)
        data.read()  # a gzip trailer, or nothing: the whole file passes through the hash
    except (OSError, EOFError, StoreError) as e:
        raise FollowError(f"{out.url}: cannot read ({e.__class__.__name__}: {e})") from None
    digest = stream.hash.hexdigest()
    if out.sha256 and digest != out.sha256:
        raise FollowError(f"{out.url}: not the bytes committed (sha256 {digest[:12]}, the lease says "
                          f"{out.sha256[:12]}): changed since its item was committed")


def parquet_examples(out: Output, layout: dict[str, Feature]) -> Iterator[dict[str, np.ndarray]]:
    """The rows of one committed Parquet output as ``{name: array}``, the file's sha256
    checked against its lease first, then a row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    store, name = locate(out.url)
    try:
        data = store.read(name)
    except StoreError as e:
        raise FollowError(f"{out.url}: cannot read ({e})") from None
    digest = hashlib.sha256(data).hexdigest()
    if out.sha256 and digest != out.sha256:
        raise FollowError(f"{out.url}: not the bytes committed (sha256 {digest[:12]}, the lease says "
                          f"{out.sha256[:12]}): changed since its item was committed")
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        missing = sorted(set(layout) - set(pf.schema_arrow.names))
        if missing:
            raise FollowError(f"{out.url}: no column {', '.join(missing)} (not this run's examples?)")
        for group in range(pf.num_row_groups):
            table = pf.read_row_group(group, columns=list(layout))
            columns = {}
            for fname, feature in layout.items():
                column = table.column(fname).combine_chunks()
                flat = column.flatten().to_numpy(zero_copy_only=False)
                if len(flat) != len(table) * feature.length:
                    raise FollowError(f"{out.url}: column {fname} does not hold {feature.length} values a row, "
                                      "as the run's config says (not this run's examples?)")
                columns[fname] = flat.astype(feature.dtype).reshape(len(table), feature.length)
            for row in range(len(table)):
                yield {fname: values[row] for fname, values in columns.items()}
    except (pa.ArrowException, OSError) as e:
        raise FollowError(f"{out.url}: cannot read as Parquet ({e})") from None


def _framed(f, url: str) -> Iterator[bytes]:
    pos = 0
    while header := f.read(12):
        if len(header) < 12:
            raise FollowError(f"{url}: truncated record header at byte {pos}")
        length, crc = struct.unpack("<QI", header)
        if crc != tfrecord.masked_crc32c(header[:8]):
            raise FollowError(f"{url}: bad length checksum at byte {pos} (not a TFRecord file?)")
        body = f.read(length + 4)
        if len(body) < length + 4:
            raise FollowError(f"{url}: truncated record at byte {pos}")
        record = body[:length]
        if struct.unpack("<I", body[length:])[0] != tfrecord.masked_crc32c(record):
            raise FollowError(f"{url}: bad data checksum at byte {pos}")
        yield record
        pos += 16 + length


def _open_url(url: str) -> io.BufferedReader:
    store, name = locate(url)
    blob = store.stat(name)
    if blob is None:
        raise FollowError(f"{url}: committed output is gone")
    return io.BufferedReader(StoreFile(store, name, blob.size, blob.version or None), _BUFFER)


class _HashingReader(io.RawIOBase):
    """Passes reads through and hashes what went by."""

    def __init__(self, raw: io.BufferedReader):
        self.raw = raw
        self.hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.hash.update(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data


def follow_examples(source: str, run: str | None = None, from_start: bool = True, poll: float = 2.0,
                    shard: tuple[int, int] = (0, 1)) -> Iterator[dict[str, np.ndarray]]:
    """``for ex in follow_examples("gs://b", "wiki"): ...``: the run's examples as dicts of
    numpy arrays, as items finish; ends when the run drains (FollowError if items failed)."""
    return RunReader(source, run, from_start, poll, shard).examples()


def follow_dataset(source: str, run: str | None = None, from_start: bool = True, poll: float = 2.0,
                   shard: tuple[int, int] = (0, 1)) -> "tf.data.Dataset":
    """The same as a ``tf.data.Dataset`` of parsed examples (see ``RunReader.dataset``)."""
    return RunReader(source, run, from_start, poll, shard).dataset()

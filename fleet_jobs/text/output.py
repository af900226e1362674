"""The output options every text job shares, and the writer of an item's examples in the
format the run asks for (``open_writer``), or of its token sequences (``open_sequence_writer``:
causal_lm's ``output=megatron`` / ``tokens``). The formats themselves, the writers and the
interface they share (``Column``, ``ExampleWriter``), are ``fleet.formats``' (``tfrecord``,
``parquet``, ``token_files``, ``writer``); ``Column`` is a job's to use from here, with ``open_writer``.

``output=tfrecord`` (the default) writes ``tf.train.Example`` records, one TFRecord
file per item (``.tfrecord``, or ``.tfrecord.gz`` with ``compression=GZIP``);
``output=parquet`` writes one Parquet file per item (``.parquet``, zstd inside),
one row per example with a list column per feature, which is what the Hugging
Face hub, ``datasets`` and PyTorch loaders read; ``output=mds`` writes MosaicML Streaming's
MDS shards (``part-<item>.<k>.mds``, ``.mds.zstd`` with ``compression=zstd``), and the job's
``run_files`` (``mds_run_files``) the ``index.json`` over all of them that ``StreamingDataset``
reads (``fleet.formats.mds``).

A job describes its features once (``Column``) and hands the writer either
framed TFRecords it encoded (``write``: with a fast batch encoder,
``token_records`` or BERT's) or rows of values (``write_columns``). Either way both
formats hold the same values. Bytes depend on the examples only (no time stamp,
no file name), so a retried item rewrites identical bytes.

In a run with stages (``--shards``) an item's examples feed the next stage instead
of a file: ``example_sink`` wraps the KeyedSink, and ``open_writer`` then gives a
writer that emits each ``tf.train.Example``, keyed by ``shuffle_key``: records or rows,
it encodes them as ``TFRecordWriter`` does, so the shuffle carries the bytes an
``output=tfrecord`` run holds whatever the run's output, and the shard that writes
them in the end gives the file the run asks for.
"""

from __future__ import annotations

import contextlib
import gzip
from typing import Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from fleet.formats import tfrecord
from fleet.formats.tfrecord.writer import TFRecordWriter, encode_rows
from fleet.formats.token_files import BIN_SUFFIX, INDEX_SUFFIXES, SequenceWriter
from fleet.formats.writer import Column, ExampleWriter
from fleet.job import ConfigError, Feature, ItemContext, KeyedSink, RunManifest, Sink, shuffle_key

OUTPUTS = ("tfrecord", "parquet", "mds")
COMPRESSIONS = {"none": ".tfrecord", "gzip": ".tfrecord.gz"}  # option value (any case) -> file suffix
PARQUET_SUFFIX = ".parquet"
MDS_SUFFIXES = (".mds", ".mds.zstd")  # fleet.formats.mds: part-<item>.<k>.mds[.zstd]
SUFFIXES = (*COMPRESSIONS.values(), PARQUET_SUFFIX, *MDS_SUFFIXES)  # every output file a text job writes ends so
GZIP_LEVEL = 6  # zlib's default, as TensorFlow's TFRecordWriter uses for GZIP


def check_output(output: str, compression: str, known: Sequence[str] = OUTPUTS) -> None:
    """The shared options' plan-time check (``ConfigError`` names the option); ``known``: the
    outputs of the job (causal_lm adds the token-sequence files of ``fleet.formats.token_files``)."""
    if output not in known:
        if output in ("megatron", "tokens"):
            raise ConfigError(
                f"option output: {output} holds token sequences, which this job does not make "
                f"(causal_lm does); known here: {', '.join(known)}"
            )
        raise ConfigError(f"option output: {output!r} is not supported (known: {', '.join(known)})")
    if output == "mds":
        from fleet.formats import mds

        try:
            mds.check_compression(compression)
        except ValueError as e:
            raise ConfigError(f"option compression: {e}") from None
        return
    if str(compression).lower() not in COMPRESSIONS:
        raise ConfigError(f"option compression: {compression!r} is not supported (known: none, GZIP)")
    if output != "tfrecord" and str(compression).lower() != "none":
        raise ConfigError(
            "option compression applies to output=tfrecord; "
            + (
                "Parquet files are zstd-compressed inside"
                if output == "parquet"
                else f"output={output} files are memory-mapped, so never compressed"
            )
        )


def output_suffix(output: str, compression: str) -> str:
    """The end of an item's output file name: ``part-<item>`` + this (tfrecord, parquet)."""
    return PARQUET_SUFFIX if output == "parquet" else COMPRESSIONS[str(compression).lower()]


def writes_columns(output: str) -> bool:
    """Whether the output takes rows of values best (``write_examples``): every format but
    TFRecord, which takes the records a job encodes itself."""
    return output != "tfrecord"


def feature_columns(features: Mapping[str, Feature]) -> list[Column]:
    """The writer's columns of a job's features (``Job.features``), in their order, with their lengths."""
    return [
        Column(name, "float" if feature.dtype == "float32" else "int", feature.length)
        for name, feature in features.items()
    ]


def mds_run_files(
    output: str,
    compression: str,
    features: Mapping[str, Feature],
    manifest: RunManifest,
    text: Sequence[Column] = (),
) -> dict[str, bytes]:
    """``Job.run_files`` of a text job: with output=mds, the root ``index.json`` over every shard
    of the run (from the counts each shard's item recorded), which ``StreamingDataset`` reads;
    ``text``: the columns of the input fields carried along (``fields``)."""
    if output != "mds":
        return {}
    from fleet.formats import mds

    columns = [*feature_columns(features), *text]
    config = mds.ShardConfig.of({c.name: mds.encoding(c) for c in columns}, mds.check_compression(compression))
    return {mds.INDEX: mds.root_index(config, manifest.outputs)}


class ShuffledExamples(KeyedSink):
    """A KeyedSink that examples go to keyed by ``shuffle_key`` of the run's seed: what a text
    job's item writes to when its outputs feed a stage (``example_sink``)."""

    def __init__(self, inner: KeyedSink, run_seed: int):
        self.inner, self.run_seed = inner, run_seed
        self.partitions = inner.partitions

    def emit(self, key: int, value: bytes) -> None:
        self.inner.emit(key, value)

    def emit_example(self, example: bytes) -> None:
        """One serialized ``tf.train.Example`` (no TFRecord framing)."""
        self.emit_framed(memoryview(tfrecord.frame(example)))

    def emit_framed(self, framed: memoryview) -> None:
        """One TFRecord frame of an Example: keyed by the Example's bytes, and handed on framed, so
        that the stage that writes it as a TFRecord only joins frames (their checksums made once)."""
        self.inner.emit(shuffle_key(self.run_seed, framed[12:-4]), bytes(framed))


ExampleSink = Union[Sink, ShuffledExamples]  # where a text job's examples go: an item's files, or the shuffle


def example_sink(sink: Union[Sink, KeyedSink], ctx: ItemContext) -> ExampleSink:
    """Where an item's examples go: its sink, or, when its outputs feed a stage, the shuffle."""
    if not ctx.feeds:
        if not isinstance(sink, Sink):
            raise TypeError(f"item {ctx.item_id} feeds no stage but its sink is a KeyedSink")
        return sink
    if not isinstance(sink, KeyedSink):
        raise TypeError(f"item {ctx.item_id} feeds stage {ctx.feeds!r} but its sink is not a KeyedSink")
    return ShuffledExamples(sink, ctx.run_seed)


class KeyedExampleWriter(ExampleWriter):
    """Examples to the shuffle: each the record a TFRecord file of them would hold."""

    def __init__(self, sink: ShuffledExamples, columns: Sequence[Column]):
        super().__init__(columns)
        self.sink = sink
        self.order = sorted(columns, key=lambda c: c.name)  # as TFRecordWriter: the same bytes

    def write(self, records: bytes, count: Optional[int] = None) -> None:
        for framed in tfrecord.frames(records):
            self.sink.emit_framed(framed)

    def write_columns(self, values: Mapping[str, np.ndarray]) -> None:
        for framed in encode_rows(self.order, values):
            self.sink.emit_framed(memoryview(framed))


@contextlib.contextmanager
def open_writer(sink: ExampleSink, output: str, compression: str, columns: Sequence[Column]) -> Iterator[ExampleWriter]:
    """The item's output file and its writer; the file is complete when the block ends. A
    ShuffledExamples sink (``example_sink``) gets the examples keyed instead of a file."""
    if isinstance(sink, ShuffledExamples):
        yield KeyedExampleWriter(sink, columns)
        return
    if isinstance(sink, KeyedSink):
        raise TypeError("open_writer: a KeyedSink takes examples through example_sink(sink, ctx)")
    if output == "mds":
        yield from _mds_writer(sink, compression, columns)
        return
    suffix = output_suffix(output, compression)
    with sink.open(suffix) as raw:
        if output == "parquet":
            from fleet.formats.parquet import ParquetExampleWriter  # pyarrow loads only when asked for

            writer: ExampleWriter = ParquetExampleWriter(raw, columns)
            yield writer
            writer.close()
        elif suffix.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as out:
                writer = TFRecordWriter(out, columns)
                yield writer
        else:
            writer = TFRecordWriter(raw, columns)
            yield writer
    sink.count(suffix, {**writer.counts, "examples": writer.examples})  # the file's exact counts (RunManifest)


def _mds_writer(sink: Sink, compression: str, columns: Sequence[Column]) -> Iterator[ExampleWriter]:
    from fleet.formats import mds

    def shard(suffix: str, data: bytes, counts: Mapping[str, int]) -> None:
        with sink.open(suffix) as raw:
            raw.write(data)
        sink.count(suffix, counts)  # samples and bytes: what index.json says of the shard (mds_run_files)

    writer = mds.MDSExampleWriter(shard, columns, mds.check_compression(compression))
    yield writer
    writer.close()


@contextlib.contextmanager
def open_sequence_writer(sink: Sink, output: str, vocab_size: int) -> Iterator[SequenceWriter]:
    """``output``: megatron or tokens. An item's (or shard's) ``.bin`` and its index (``.idx`` or ``.npy``), complete when the block
    ends; their exact tokens and documents are counted on the ``.bin`` (``Sink.count``)."""
    with sink.open(BIN_SUFFIX) as raw:
        writer = SequenceWriter(raw, output, vocab_size)
        yield writer
    with sink.open(INDEX_SUFFIXES[output]) as raw:
        writer.write_index(raw)
    sink.count(BIN_SUFFIX, {"tokens": writer.tokens, "documents": writer.documents})


def mask_and_segments(lengths, first_lengths, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``input_mask`` and ``segment_ids`` rows (int64, ``width`` wide) of examples from their
    lengths: 1 on the real positions; 1 from the second segment's start to the end of the real ones."""
    position = np.arange(width)
    real = position < np.asarray(lengths, np.int64).reshape(-1, 1)
    second = real & (position >= np.asarray(first_lengths, np.int64).reshape(-1, 1))
    return real.astype(np.int64), second.astype(np.int64)

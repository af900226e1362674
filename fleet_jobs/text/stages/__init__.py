"""The stages a text job asks of the fleet after its map: ``--dedup exact`` and ``--shards N``.

``--dedup exact``: the map emits each document as a record keyed by the digest of its
normalized text (``dedup``), and the "dedup" stage (one reduce item per map item) keeps
the first copy of each text and converts the documents it kept as the map would have.
``--shards N``: every example goes to the "shards" stage keyed by ``shuffle_key`` (the map's,
or the dedup's, writer emits them: ``output.example_sink``), and its N items each write an
equal share of them, in key order: a global shuffle into balanced shards. Without packing,
electra and causal_lm examples depend on their document only, so the shards do not depend
on how the corpus was cut into items.

The records between stages are always serialized ``tf.train.Example``s, whatever the run's
output; the shard writes them in the run's format (``.tfrecord``, ``.tfrecord.gz``, ``.parquet``).

A package, so the two ideas sit together: this module wires the stages (what ``job`` and
causal_lm's job import), ``dedup`` holds the pure functions of ``--dedup exact`` beside it.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence, TypeVar

from fleet.job import ConfigError, Feature, ItemContext, KeyedSink, Reducer, Sink, Stage, StageOptions

from .dedup import DedupCounts, document_record, document_text, unique_documents
from ..converter import CHECK_EVERY, DocumentConverter
from ..output import Column, example_sink, open_writer

DEDUP, SHARDS = "dedup", "shards"  # the stages' names (ItemContext.stage, .feeds)
DEDUP_MODES = ("exact",)
SHARD_BATCH = 1024  # records framed and written at a time

T = TypeVar("T")


def text_stages(options: StageOptions, map_items: int) -> list[Stage]:
    """``Job.stages`` of a text job: dedup (a reduce item per map item) before shards (balanced)."""
    if options.dedup not in ("", *DEDUP_MODES):
        raise ConfigError(f"--dedup {options.dedup!r}: unknown mode; known: {', '.join(DEDUP_MODES)}")
    stages = [Stage(DEDUP, map_items)] if options.dedup else []
    if options.shards:
        stages.append(Stage(SHARDS, options.shards, balanced=True))
    return stages


def checkpointed(items: Iterable[T], ctx: ItemContext) -> Iterator[T]:
    """``items`` with ctx.checkpoint before the first and every CHECK_EVERY after (a lost lease
    stops the item soon, at a small cost per item)."""
    checkpoint = ctx.checkpoint
    for n, item in enumerate(items):
        if not n % CHECK_EVERY:
            checkpoint()
        yield item


def dedup_map(documents: Iterable[list[str]], ctx: ItemContext, sink: KeyedSink) -> dict[str, float]:
    """A map item of a dedup run: each document one record (``dedup.document_record``), no conversion."""
    n_docs = n_bytes = 0
    for ordinal, lines in enumerate(documents):
        sink.emit(*document_record(lines, ctx.item_id, ordinal))
        n_docs += 1
        n_bytes += len(document_text(lines).encode("utf-8", "surrogatepass"))
    return {"documents_read": n_docs, "text_bytes_read": n_bytes}


class DedupReducer(Reducer):
    """A "dedup" item: the first copy of each text in its key range, converted by the job."""

    def __init__(self, converter: DocumentConverter):
        self.converter = converter

    def reduce(
        self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
    ) -> dict[str, float]:
        counts = DedupCounts()
        documents = unique_documents(checkpointed(records, ctx), counts)
        stats = dict(self.converter.convert(documents, ctx, example_sink(sink, ctx)))
        stats.update(counts.stats())
        return stats


class ShardReducer(Reducer):
    """A "shards" item: its share of the shuffled examples, in the order given, as one output file."""

    def __init__(self, output: str, compression: str, columns: Sequence[Column]):
        self.output, self.compression, self.columns = output, compression, list(columns)

    def reduce(
        self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
    ) -> dict[str, float]:
        n = 0
        with open_writer(example_sink(sink, ctx), self.output, self.compression, self.columns) as out:
            batch: list[bytes] = []
            for _key, framed in checkpointed(records, ctx):  # TFRecord frames of Examples (ShuffledExamples)
                batch.append(framed)
                if len(batch) >= SHARD_BATCH:
                    out.write(b"".join(batch))
                    n += len(batch)
                    batch.clear()
            if batch:
                out.write(b"".join(batch))
                n += len(batch)
        return {"shard_examples": n}


def feature_columns(features: Mapping[str, Feature]) -> list[Column]:
    """The writer's columns of a job's features (``Job.features``), in their order."""
    return [Column(name, "float" if feature.dtype == "float32" else "int") for name, feature in features.items()]


def text_reducer(job: Any, config: Any, opener: Any, stage: str) -> Reducer:
    """``Job.reducer`` of a text job (``job``: a TextJob, whose converter and features it uses)."""
    if stage == DEDUP:
        return DedupReducer(job.document_converter(config, opener))
    if stage == SHARDS:
        return ShardReducer(config.output, config.compression, feature_columns(job.features(config)))
    raise ConfigError(f"job {job.name} has no stage {stage!r} (a text job's: {DEDUP}, {SHARDS})")

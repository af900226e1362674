"""The stages a text job asks of the fleet after its map: ``--dedup exact|near`` and ``--shards N``.

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

``--dedup near`` (``exact,near``: both): the map emits each document's LSH band records
(``near``: its MinHash signature's band keys and sketch), and the stages ``near_bands``,
``near_links``, ``near_jump_1..JUMPS`` and ``near_clusters`` find which documents are near
duplicates of earlier ones and their clusters from small records (``clusters``: the rule, the
records, memory and stages); the last, ``near`` (one item per map item), reads each map item's
documents again and converts those kept. Its parameters are the job's options ``near_*``.

A package, so the ideas sit together: this module wires the stages (what ``job`` and
causal_lm's job import), ``dedup`` holds the pure functions of ``--dedup exact``, ``near`` the
signatures of ``--dedup near`` and ``clusters`` its stages' records.
"""

from __future__ import annotations

import json

import numpy as np
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from fleet.job import (
    ConfigError,
    ItemContext,
    KeyedSink,
    Reducer,
    Sink,
    Stage,
    StageOptions,
)

from . import clusters
from .clusters import JUMPS, NearCounts
from . import near
from .dedup import DedupCounts, document_digest, document_record, document_text, unique_documents
from .near import DEFAULT_BANDS, DEFAULT_NGRAM, DEFAULT_ROWS, DEFAULT_THRESHOLD, NearParams, parse_bands
from ..converter import CHECK_EVERY, DocumentConverter
from ..inputs import Tally
from ..output import Column, example_sink, feature_columns, open_writer

DEDUP, SHARDS = "dedup", "shards"  # the stages' names (ItemContext.stage, .feeds)
NEAR_BANDS, NEAR_BANDS_EXACT = "near_bands", "near_bands_exact"  # the first near stage (the latter: with exact)
NEAR_LINKS, NEAR_CLUSTERS, NEAR = "near_links", "near_clusters", "near"
NEAR_JUMPS = tuple(f"near_jump_{k}" for k in range(1, JUMPS + 1))
MAP_FEEDS = (DEDUP, NEAR_BANDS, NEAR_BANDS_EXACT)  # stages the map feeds documents (or their bands) to
DEDUP_MODES = ("exact", "near")
GRAPH_ITEMS_PER_MAP_ITEM = 8  # the graph stages' records are ~36 bytes a dropped document: fewer items
NEAR_SIDECAR = ".near.jsonl"  # near_clusters=true: part-<item>.near.jsonl
SHARD_BATCH = 1024  # records framed and written at a time

T = TypeVar("T")


def dedup_modes(dedup: str) -> tuple[str, ...]:
    """``--dedup``'s modes: "exact", "near" or both, comma-separated (ConfigError on anything else)."""
    modes = tuple(sorted({m.strip() for m in dedup.split(",")})) if dedup else ()
    bad = [m for m in modes if m not in DEDUP_MODES]
    if bad or "" in modes:
        raise ConfigError(f"--dedup {dedup!r}: unknown mode; known: exact, near, or exact,near")
    return modes


def near_params(config: Any) -> NearParams:
    """The job's ``near_*`` options as NearParams (ConfigError naming the option that is wrong)."""
    try:
        bands, rows = parse_bands(str(getattr(config, "near_bands", f"{DEFAULT_BANDS}x{DEFAULT_ROWS}")))
        params = NearParams(
            float(getattr(config, "near_threshold", DEFAULT_THRESHOLD)),
            int(getattr(config, "near_ngram", DEFAULT_NGRAM)),
            bands,
            rows,
        )
        params.check()
    except ValueError as e:
        raise ConfigError(f"option {e}") from None
    return params


def text_stages(options: StageOptions, map_items: int, config: Any = None) -> list[Stage]:
    """``Job.stages`` of a text job: dedup (a reduce item per map item) or near-dedup's stages,
    before shards (balanced)."""
    modes = dedup_modes(options.dedup)
    stages = []
    if "near" in modes:
        near_params(config)
        if getattr(config, "near_clusters", False) and options.shards:
            raise ConfigError(
                "option near_clusters: not with --shards (the sidecar is written beside each "
                "part the near stage writes; run without --shards to audit the clusters)"
            )
        graph = max(1, -(-map_items // GRAPH_ITEMS_PER_MAP_ITEM))
        stages += [Stage(NEAR_BANDS_EXACT if "exact" in modes else NEAR_BANDS, map_items), Stage(NEAR_LINKS, graph)]
        stages += [Stage(name, graph) for name in NEAR_JUMPS]
        stages += [Stage(NEAR_CLUSTERS, graph), Stage(NEAR, map_items, rereads=True)]
    elif modes:
        stages.append(Stage(DEDUP, map_items))
    elif getattr(config, "near_clusters", False):
        raise ConfigError("option near_clusters: give --dedup near (it writes near-dedup's clusters)")
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


NEAR_BATCH_CHARS = 1 << 18  # a near map item's documents signed a batch at a time (near.signatures): ~20 MB of arrays


def near_map(
    documents: Iterable[list[str]], ctx: ItemContext, sink: KeyedSink, params: NearParams, exact: bool
) -> dict[str, float]:
    """A map item of a near-dedup run: each document's band records (and with ``exact``, one
    keyed by its exact text's digest), no conversion; ``near`` reads the documents again."""
    item = int(ctx.item_id)
    counts = {"documents_read": 0, "text_bytes_read": 0, "near_documents_short": 0, "near_documents_without_words": 0}
    batch: list[list[str]] = []
    size = ordinal = 0
    for lines in documents:
        batch.append(lines)
        size += sum(map(len, lines))
        if size >= NEAR_BATCH_CHARS or len(batch) >= 4096:
            _near_batch(batch, ordinal, item, sink, params, exact, counts)
            ordinal += len(batch)
            batch, size = [], 0
    if batch:
        _near_batch(batch, ordinal, item, sink, params, exact, counts)
    return dict(counts)


def _near_batch(
    batch: list[list[str]],
    first: int,
    item: int,
    sink: KeyedSink,
    params: NearParams,
    exact: bool,
    counts: dict[str, int],
) -> None:
    texts = [document_text(lines) for lines in batch]
    sigs, words = near.signatures(texts, params.ngram, params.hashes)
    signed = [(i, sig) for i, sig in enumerate(sigs) if sig is not None]
    emit = sink.emit
    if signed:
        keys = near.band_key_rows(np.array([sig for _i, sig in signed]), params.bands, params.rows).tolist()
        for (i, sig), row in zip(signed, keys):
            value = clusters.band_record(clusters.node_id(item, first + i), clusters.NEAR, near.sketch(sig))
            for key in row:
                emit(key, value)
    if exact:
        for i, lines in enumerate(batch):
            key = int.from_bytes(document_digest(lines)[:8], "big")
            emit(key, clusters.band_record(clusters.node_id(item, first + i), clusters.EXACT, b""))
    counts["documents_read"] += len(batch)
    counts["text_bytes_read"] += sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    counts["near_documents_short"] += sum(1 for w in words if 0 < w < params.ngram)
    counts["near_documents_without_words"] += len(batch) - len(signed)


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


class GraphReducer(Reducer):
    """An item of near-dedup's graph stages (bands, links, jumps, clusters): records in, records
    for the next stage out (``clusters``' functions)."""

    def __init__(self, step: Callable[[Iterable[tuple[int, bytes]], KeyedSink, NearCounts], None]):
        self.step = step

    def reduce(
        self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
    ) -> dict[str, float]:
        if not isinstance(sink, KeyedSink):
            raise ConfigError(f"stage {ctx.stage}: it feeds a later stage, but the run ends here: its plan is damaged")
        counts = NearCounts()
        self.step(checkpointed(records, ctx), sink, counts)
        return dict(counts.stats())


ReadDocuments = Callable[..., tuple[Iterable[list[str]], Any]]  # fleet_jobs.text.job.read_documents


class NearReducer(Reducer):
    """A "near" item: map item i's documents read again, those its member records drop left out,
    the rest converted by the job; with ``sidecar``, every member's line in ``part-<i>.near.jsonl``."""

    def __init__(self, converter: DocumentConverter, read: ReadDocuments, sidecar: bool):
        self.converter, self.read, self.sidecar = converter, read, sidecar

    def reduce(
        self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
    ) -> dict[str, float]:
        if ctx.input is None:
            raise ConfigError(f"stage {ctx.stage}: its items reread the map's inputs, and this one got none")
        places: list | None = [] if self.sidecar and isinstance(sink, Sink) else None
        documents, _group = self.read(ctx.input, ctx, Tally(), "documents", places)  # the map counted the input
        tally = NearTally()
        members = clusters.read_members(checkpointed(records, ctx))
        out = sink.open(NEAR_SIDECAR) if places is not None and isinstance(sink, Sink) else None
        try:
            kept = _kept(documents, members, tally, places, out, ctx.source)
            stats = dict(self.converter.convert(kept, ctx, example_sink(sink, ctx)))
        finally:
            if out is not None:
                out.close()
        stats.update(tally.stats())
        return stats


class NearTally:
    """What a "near" item dropped and kept."""

    def __init__(self) -> None:
        self.counts = {"near_documents_kept": 0}

    def add(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def stats(self) -> dict[str, int]:
        return dict(self.counts)


def _kept(
    documents: Iterable[list[str]],
    members: Iterator[clusters.Member],
    tally: NearTally,
    places: list | None,
    out: Any,
    source: str,
) -> Iterator[list[str]]:
    """The documents no member record drops, in order; the dropped ones counted (an exact copy's
    as ``dedup_*``, the others as ``near_*``), and with ``out``, each member's sidecar line."""
    member = next(members, None)
    n = 0
    for ordinal, lines in enumerate(documents):
        n = ordinal + 1
        place = places.pop() if places else None
        if member is None or member.ordinal != ordinal:
            tally.add("near_documents_kept", 1)
            yield lines
            continue
        if out is not None and place is not None:
            line = {**place.as_json(), "kept": not member.dropped, "cluster": member.cluster}
            if not member.dropped:
                line["size"] = member.size
            out.write(
                (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
            )
        current, member = member, next(members, None)
        if member is not None and member.ordinal <= ordinal:
            raise ConfigError(
                f"{source}: near-dedup's records name document {ordinal} twice: the run's state is damaged"
            )
        if not current.dropped:
            tally.add("near_documents_kept", 1)
            yield lines
            continue
        prefix = "dedup" if current.kind == clusters.EXACT else "near"
        tally.add(f"{prefix}_documents_dropped", 1)
        tally.add(f"{prefix}_bytes_dropped", len(document_text(lines).encode("utf-8", "surrogatepass")))
    if member is not None:
        raise ConfigError(
            f"{source}: near-dedup's records name document {member.ordinal}, but it has {n}: "
            "the input is not what the map read"
        )


def text_reducer(job: Any, config: Any, opener: Any, stage: str, read: ReadDocuments | None = None) -> Reducer:
    """``Job.reducer`` of a text job (``job``: a TextJob, whose converter and features it uses;
    ``read``: how it reads an item's documents, for the "near" stage)."""
    if stage == DEDUP:
        return DedupReducer(job.document_converter(config, opener))
    if stage == SHARDS:
        return ShardReducer(config.output, config.compression, feature_columns(job.features(config)))
    if stage in (NEAR_BANDS, NEAR_BANDS_EXACT):
        params = near_params(config)
        least = near.min_equal(params.threshold, params.hashes)
        return GraphReducer(lambda records, sink, counts: clusters.bucket_links(records, least, sink.emit, counts))
    if stage == NEAR_LINKS:
        return GraphReducer(lambda records, sink, counts: clusters.parents(records, sink.emit))
    if stage in NEAR_JUMPS:
        return GraphReducer(lambda records, sink, counts: clusters.jump(records, sink.emit))
    if stage == NEAR_CLUSTERS:
        return GraphReducer(lambda records, sink, counts: clusters.members(records, sink.partitions, sink.emit, counts))
    if stage == NEAR and read is not None:
        return NearReducer(job.document_converter(config, opener), read, bool(getattr(config, "near_clusters", False)))
    raise ConfigError(f"job {job.name} has no stage {stage!r} (a text job's: {DEDUP}, {SHARDS}, near-dedup's)")

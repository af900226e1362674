"""A text job: the fleet's item API read as documents.

The text jobs (electra_zh_en, causal_lm) turn documents, each a list of lines, into
records. ``TextJob`` does the rest once for all of them: it takes only corpus files
from a folder, cuts each file into items at document boundaries (whole compressed
files, row groups of Parquet files), checks the run's read options (``--text-column``,
``--keep-titles``, ``--max-bad-share``), and hands the converter a job names in
``document_converter`` each item's documents, with the bad records counted in the
item's stats. A document is never split between items, except one longer than an item.
The formats themselves are fleet_jobs.text.inputs'. ``--dedup exact|near`` and ``--shards N`` are
stages every text job has the same way (fleet_jobs.text.stages).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterable, Iterator, Mapping

from fleet.job import (
    ConfigError,
    Converter,
    ItemContext,
    ItemInput,
    Job,
    KeyedSink,
    Opener,
    Piece,
    Reducer,
    RunManifest,
    Sink,
    Source,
    Stage,
    StageOptions,
)

from fleet_jobs.text.converter import CHECK_EVERY, DocumentConverter
from fleet_jobs.text.inputs import ReadOptions, Slice, Tally, corpus_file, cut_source, read_slice
from fleet_jobs.text.inputs.formats import text_fields
from fleet_jobs.text.inputs.names import skip_reason
from fleet_jobs.text.inputs.places import Place, Places
from fleet_jobs.text.output import example_sink, mds_run_files
from fleet_jobs.text.parts import GroupReading, item_slice
from fleet_jobs.text.provenance import PlacedDocuments, check_provenance, field_columns, parse_fields
from fleet_jobs.text.stages import (
    DEDUP,
    MAP_FEEDS,
    NEAR_BANDS,
    NEAR_BANDS_EXACT,
    NearParams,
    dedup_map,
    near_map,
    near_params,
    text_reducer,
    text_stages,
)


def read_options(read: Mapping[str, Any]) -> ReadOptions:
    """The run's read options (RunSpec.read, as check_read stored them)."""
    return ReadOptions(**read) if read else ReadOptions()


def check_read_options(read: Mapping[str, Any]) -> ReadOptions:
    """The options as given (``fleet plan``/``local`` flags), checked: one line naming the flag."""
    known = {f.name for f in dataclasses.fields(ReadOptions)}
    unknown = sorted(set(read) - known)
    if unknown:
        raise ConfigError(f"read option {unknown[0]!r}: a text job knows {', '.join(sorted(known))}")
    options = ReadOptions(**read)
    share = options.max_bad_share
    if isinstance(share, bool) or not isinstance(share, (int, float)):
        raise ConfigError(f"--max-bad-share {share!r}: give a number from 0 to 1 (a share of the records)")
    if not 0 <= share <= 1:  # NaN and inf too
        raise ConfigError(f"--max-bad-share {share:g}: give 0 to 1 (a share of the records)")
    if not isinstance(options.text_column, str):
        raise ConfigError(f"--text-column {options.text_column!r}: give the name of a JSON field or Parquet column")
    text_fields(options.text_column)  # one name, or several comma-separated: none empty, none twice
    if not isinstance(options.keep_titles, bool):
        raise ConfigError(f"--keep-titles {options.keep_titles!r}: a flag, true or false")
    return options


class TextJob(Job):
    """A job over text corpora: plain text, JSON Lines, WikiExtractor, CirrusSearch, Parquet.
    Files smaller than an item share one (``group_small_files``), read file by file
    (fleet_jobs.text.parts): a converter gets their documents in order, as one stream."""

    group_small_files = True

    def accepts(self, name: str) -> bool:
        return corpus_file(name)

    def skip_reason(self, name: str) -> str | None:
        return skip_reason(name)

    def check_read(self, read: Mapping[str, Any]) -> dict[str, Any]:
        return dataclasses.asdict(check_read_options(read))

    def cut(self, source: Source, item_bytes: int, config: Any, read: Mapping[str, Any]) -> list[Piece]:
        """Byte ranges of a plain file cut at document boundaries, the whole of a compressed one,
        ranges of row groups of a Parquet file."""
        return [_piece(s) for s in cut_source(source, item_bytes, read_options(read))]

    def converter(self, config: Any, opener: Opener) -> Converter:
        return _Documents(self.document_converter(config, opener), near_params(config))

    def stages(self, config: Any, options: StageOptions, map_items: int) -> list[Stage]:
        """``--dedup exact`` and ``--shards N`` (fleet_jobs.text.stages). Shards hold examples: a job
        whose outputs are not examples of fixed features (Job.features) cannot shard them."""
        check_provenance(getattr(config, "provenance", False), options)
        check_provenance(bool(parse_fields(getattr(config, "fields", ""))), options, "fields")
        if options.shards and not self.features(config):
            raise ConfigError(
                f"--shards: job {self.name} writes no examples of fixed features (Job.features), "
                "so it cannot shard them"
            )
        return text_stages(options, map_items, config)

    def run_files(self, config: Any, manifest: RunManifest) -> dict[str, bytes]:
        """output=mds: the root ``index.json`` over every MDS shard of the run (``StreamingDataset``'s)."""
        fields = field_columns(parse_fields(getattr(config, "fields", "")))
        return mds_run_files(
            getattr(config, "output", ""),
            getattr(config, "compression", "none"),
            self.features(config),
            manifest,
            fields,
        )

    def reducer(self, config: Any, opener: Opener, stage: str) -> Reducer:
        """The "dedup" and "near" stages convert with ``document_converter``; "shards" writes ``features``."""
        return text_reducer(self, config, opener, stage, read_documents)

    @abc.abstractmethod
    def document_converter(self, config: Any, opener: Opener) -> DocumentConverter:
        """Per worker process: load what every item needs (a vocab) once."""


def _piece(s: Slice) -> Piece:
    """A slice as the fleet keeps it in an item: what the reader needs to know goes in meta."""
    meta: dict[str, Any] = {"format": s.format, "compression": s.compression}
    if s.cuts_document:
        meta["cuts_document"] = True
    if s.format == "parquet":
        meta["unit"] = "row groups"
    return Piece(s.start, s.end, s.size, meta)


def item_documents(
    item: ItemInput, ctx: ItemContext, tally: Tally, places: list[Place] | None = None
) -> Iterator[list[str]]:
    """The item's documents, read as the run's options say, with ctx.checkpoint before the first
    and every CHECK_EVERY after: a call per document costs short-document corpora 4% of the CPU
    (bench_before_after); a lost lease still stops the item within CHECK_EVERY documents.
    With ``places``, each document's Place is appended to it before it is handed on. (A grouped
    item's: GroupReading.)"""
    checkpoint = ctx.checkpoint
    for n, doc in enumerate(read_slice(item_slice(item), ctx.workdir, tally, read_options(ctx.read), places)):
        if not n % CHECK_EVERY:
            checkpoint()
        yield doc


def read_documents(
    item: ItemInput, ctx: ItemContext, tally: Tally, counter: str, places: list[Place] | None = None
) -> tuple[Iterable[list[str]], GroupReading | None]:
    """The item's documents, as ``item_documents`` reads them, a grouped item's file by file (each
    file's documents counted in its row under ``counter``), and the GroupReading if grouped."""
    if not item.grouped:
        return item_documents(item, ctx, tally, places), None
    group = GroupReading(item, ctx.workdir, read_options(ctx.read), tally, counter, ctx.checkpoint, CHECK_EVERY)
    return group.documents(places) if places is not None else group.documents(), group


class _Documents(Converter):
    def __init__(self, inner: DocumentConverter, near: NearParams | None = None):
        self.inner = inner
        self.near = near

    def convert(self, item: ItemInput, ctx: ItemContext, sink: Sink | KeyedSink) -> dict[str, float]:
        """The item's documents converted; in a dedup run, emitted for the dedup stage instead
        (``sink`` is a KeyedSink when ``ctx.feeds`` names a stage)."""
        tally = Tally()
        places: Places | None = None
        fields = tuple(getattr(self.inner, "fields", ()))  # a converter of any class may go without
        if (getattr(self.inner, "provenance", False) or fields) and not ctx.feeds:
            places = Places(fields)
        read, group = read_documents(
            item, ctx, tally, "documents_read" if ctx.feeds in MAP_FEEDS else "documents", places
        )
        documents: Iterable[list[str]] = PlacedDocuments(read, places) if places is not None else read
        if ctx.feeds == DEDUP:
            assert isinstance(sink, KeyedSink)  # the map feeds the dedup stage
            stats = dedup_map(documents, ctx, sink)
        elif ctx.feeds in (NEAR_BANDS, NEAR_BANDS_EXACT):
            assert isinstance(sink, KeyedSink) and self.near is not None  # the map feeds near-dedup's bands
            stats = near_map(documents, ctx, sink, self.near, exact=ctx.feeds == NEAR_BANDS_EXACT)
        else:
            stats = dict(self.inner.convert(documents, ctx, example_sink(sink, ctx)))
        tally.documents_cut += int(bool(item.meta.get("cuts_document")))
        stats.update(tally.stats())
        if group:
            stats.update(group.stats())
        return stats

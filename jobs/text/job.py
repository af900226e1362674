"""A text job: the fleet's item API read as documents.

The text jobs (electra_zh_en, causal_lm) turn documents, each a list of lines, into
records. ``TextJob`` does the rest once for all of them: it takes only corpus files
from a folder, cuts each file into items at document boundaries (whole compressed
files, row groups of Parquet files), and hands the converter a job names in
``document_converter`` each item's documents, with the bad records counted in the
item's stats. A document is never split between items, except one longer than an item.
"""

from __future__ import annotations

import abc
import logging
from typing import Any, Iterable, Iterator, Mapping

from fleet.job import Converter, ItemContext, ItemInput, Job, Opener, Piece, Sink, Source

from fleet.inputs import ReadOptions, Tally, describe, file_format, plan_ranges
from fleet.inputs.files import _corpus_file
from fleet.inputs.parquet import plan_row_groups, row_groups
from fleet.inputs.slices import Slice, read_slice

log = logging.getLogger("fleet.plan")


class DocumentConverter(abc.ABC):
    """The pure part of a text job: one item's documents to outputs, and counters."""

    @abc.abstractmethod
    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: Sink) -> dict[str, float]:
        """Turn one item's documents (each a list of lines) into outputs; return counters."""


def read_options(read: Mapping[str, Any]) -> ReadOptions:
    return ReadOptions(**read) if read else ReadOptions()


class TextJob(Job):
    """A job over text corpora: plain text, JSON Lines, WikiExtractor, CirrusSearch, Parquet."""

    def accepts(self, name: str) -> bool:
        return _corpus_file(name)

    def cut(self, source: Source, item_bytes: int, config: Any, read: Mapping[str, Any]) -> list[Piece]:
        """Byte ranges of a plain file cut at document boundaries, the whole of a compressed one,
        ranges of row groups of a Parquet file."""
        store = source_store(source)
        _, compression = describe(source.name)
        fmt = file_format(store, source.name, source.size)
        if fmt == "parquet":
            groups = row_groups(store, source.name, source.size, source.version or None,
                                read_options(read).text_column, source.display)
            return [Piece(first, end, max(1, size), _meta(fmt, "none", False, "row groups"))
                    for first, end, size in plan_row_groups(groups, item_bytes)]
        if compression != "none":
            return [Piece(0, source.size, source.size, _meta(fmt, compression, False))]
        ranges = plan_ranges(store, source.name, source.size, fmt, item_bytes)
        cuts = sum(cut for _, _, cut in ranges)
        if cuts:
            log.warning("warning: %s: %d document(s) longer than an item (%s bytes) cut between items at a "
                        "line boundary", source.display, cuts, f"{item_bytes:,}")
        return [Piece(start, end, end - start, _meta(fmt, compression, cut)) for start, end, cut in ranges]

    def converter(self, config: Any, opener: Opener) -> Converter:
        return _Documents(self.document_converter(config, opener))

    @abc.abstractmethod
    def document_converter(self, config: Any, opener: Opener) -> DocumentConverter:
        """Per worker process: load what every item needs (a vocab) once."""


def _meta(fmt: str, compression: str, cuts_document: bool, unit: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"format": fmt, "compression": compression}
    if cuts_document:
        meta["cuts_document"] = True
    if unit:
        meta["unit"] = unit
    return meta


def source_store(source: Source):
    from fleet.store import open_store
    return open_store(source.url)


def item_documents(item: ItemInput, ctx: ItemContext, tally: Tally) -> Iterator[list[str]]:
    """The item's documents, read as the run's options say, with ctx.checkpoint between them."""
    piece = Slice(item.url, item.name, item.start, item.end, item.meta.get("format", "text"),
                  item.meta.get("compression", "none"), item.version, bool(item.meta.get("cuts_document")),
                  0)
    for doc in read_slice(piece, ctx.workdir, tally, read_options(ctx.read)):
        ctx.checkpoint()
        yield doc


class _Documents(Converter):
    def __init__(self, inner: DocumentConverter):
        self.inner = inner

    def convert(self, item: ItemInput, ctx: ItemContext, sink: Sink) -> dict[str, float]:
        tally = Tally()
        stats = dict(self.inner.convert(item_documents(item, ctx, tally), ctx, sink))
        tally.documents_cut += int(bool(item.meta.get("cuts_document")))
        stats.update(tally.stats())
        return stats

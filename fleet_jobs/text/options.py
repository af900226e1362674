"""The options the WordPiece example jobs (``electra_zh_en``, ``bert``) share, their checks, and
what ``split_sentences`` does where documents enter a job.

A job's config builds on ``TextOptions`` and adds its own fields after these (the fleet lists
them in field order; a run's ``run.json`` holds them all). Each field's help is the comment
at the end of its line, as in every job's config (``fleet.core.options.describe_options``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from fleet.job import ConfigError, ItemContext, Opener

from .job import DocumentConverter
from .output import ExampleSink, check_output
from .provenance import PlacedDocuments
from .tokenizers.tokenization import BertTokenizer
from .tokenizers.tokenizer_cache import bert_tokenizer

MAX_SEQ_LENGTHS = (5, 1 << 16)  # [CLS] a [SEP] b [SEP] at least; positions in 16 bits


@dataclass
class TextOptions:
    vocab_file: str = ""  # URL or path of a BERT vocab.txt (required)
    max_seq_length: int = 128  # tokens per example, [CLS] and [SEP] included
    do_lower_case: bool = True  # lower-case and strip accents (as the vocab was made)
    seed: int = 12345  # the run's seed: each item's seed derives from it
    compression: str = "none"  # none | GZIP (files end .tfrecord.gz; TFRecordDataset(compression_type="GZIP")) | zstd[:level] (output=mds)
    output: str = "tfrecord"  # tfrecord | parquet (one row per example, list columns, zstd; files end .parquet) | mds (MosaicML Streaming shards + index.json)
    pack_documents: bool = False  # fill examples across document boundaries (corpora of short documents)
    split_sentences: bool = False  # cut each line into sentences first (inputs with a paragraph per line)
    near_threshold: float = 0.8  # --dedup near: estimated Jaccard similarity that makes a near copy
    near_ngram: int = 5  # --dedup near: words a shingle (a document with fewer is one shingle of all)
    near_bands: str = "14x8"  # --dedup near: LSH bands x rows; the MinHash signature holds bands x rows values
    near_clusters: bool = False  # --dedup near: part-<item>.near.jsonl, each cluster's documents (docs/outputs.md)


def check_text_options(config: TextOptions) -> None:
    """The shared options' plan-time check (``ConfigError`` names the option)."""
    if not config.vocab_file:
        raise ConfigError(
            "option vocab_file is required (a BERT vocab.txt; make one with: python -m fleet_jobs.text vocab)"
        )
    low, high = MAX_SEQ_LENGTHS
    if not low <= config.max_seq_length <= high:
        raise ConfigError(f"option max_seq_length: must be between {low} and {high}, got {config.max_seq_length}")
    check_output(config.output, config.compression)


def masking_tokenizer(config: TextOptions, opener: Opener, needs: str) -> BertTokenizer:
    """The run's tokenizer, refused without a [MASK] token: ELECTRA's generator input and BERT's
    records both mask with it (``needs`` names who asks, for the message)."""
    tokenizer = bert_tokenizer(config.vocab_file, config.do_lower_case, opener)
    if "[MASK]" not in tokenizer.vocab:
        raise ConfigError(
            f"{config.vocab_file}: {needs} needs a [MASK] token in the vocab (pre-training masks with it)"
        )
    return tokenizer


def with_sentences(converter: DocumentConverter, config: TextOptions) -> DocumentConverter:
    """The job's converter, cutting lines into sentences first when ``split_sentences`` asks."""
    return SentenceSplitting(converter) if config.split_sentences else converter


class SentenceSplitting(DocumentConverter):
    """split_sentences: where documents enter the job, each line is cut into its sentences
    (``sentences.split_sentences``), so examples are built from sentences, not paragraphs.
    The counters' ``lines`` are then sentences."""

    def __init__(self, inner: DocumentConverter):
        self.inner = inner
        self.provenance, self.fields = inner.provenance, inner.fields

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: ExampleSink) -> dict[str, float]:
        from .sentences import split_lines  # its patterns cost every worker 10 ms to compile: only here

        if isinstance(documents, PlacedDocuments):  # provenance=true: a document's sentences keep its place
            return self.inner.convert(documents.mapped(split_lines), ctx, sink)
        return self.inner.convert(map(split_lines, documents), ctx, sink)

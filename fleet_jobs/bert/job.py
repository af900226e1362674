"""The fleet glue: options, plan-time checks, and one item's documents -> BERT records.

An item becomes one output file (``fleet_jobs.text.output``: ``.tfrecord``, ``.tfrecord.gz`` or
``.parquet``) of masked-LM + next-sentence examples, as google-research/bert's
``create_pretraining_data.py`` makes them (``examples``). Pairs mix documents (a random
next sentence comes from another one), so an item is seeded as a whole (``ctx.seed``):
a retried item rewrites the same bytes. As BERT shuffles its instances, an item's
examples are written in a random order seeded by the item (``shuffle``), unless they
feed a later stage (``ctx.feeds``), whose shuffle orders them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from fleet.job import ConfigError, Feature, ItemContext, Opener

from fleet_jobs.text.job import DocumentConverter, TextJob

from fleet_jobs.text.options import TextOptions, check_text_options, masking_tokenizer, with_sentences
from fleet_jobs.text.output import ExampleSink, feature_columns, open_writer, writes_columns
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

from .examples import BertCounters, BertExamples, BertOptions
from .features import bert_features
from .shuffle import ShuffledExamples
from .spill import SpillingBatches

REPORT_RECORDS = 2_000  # records the report at the end of fleet local reads: 60-130 µs each, paid by every run


@dataclass
class BertConfig(TextOptions):
    # google-research/bert's create_pretraining_data.py flags (dupe_factor 1, not its 10):
    masked_lm_prob: float = 0.15  # share of an example's tokens masked (up to max_predictions_per_seq)
    max_predictions_per_seq: int = 20  # masked positions an example holds, at most
    short_seq_prob: float = 0.1  # share of examples given a shorter target length than max_seq_length
    dupe_factor: int = 1  # build the item's examples this many times, each with other randomness
    whole_word_masking: bool = True  # ## pieces with their word; Chinese words (rjieba) all characters
    v2_feature_names: bool = False  # tf-models' input_word_ids / input_type_ids


def _validate(config: BertConfig) -> None:
    check_text_options(config)
    if not 0 < config.masked_lm_prob <= 1:
        raise ConfigError(f"option masked_lm_prob: must be in (0, 1], got {config.masked_lm_prob}")
    if not 1 <= config.max_predictions_per_seq <= 1 << 16:
        raise ConfigError(
            f"option max_predictions_per_seq: must be between 1 and 65536, got {config.max_predictions_per_seq}"
        )
    if not 0 <= config.short_seq_prob <= 1:
        raise ConfigError(f"option short_seq_prob: must be in [0, 1], got {config.short_seq_prob}")
    if not 1 <= config.dupe_factor <= 1000:
        raise ConfigError(f"option dupe_factor: must be between 1 and 1000, got {config.dupe_factor}")


def _tokenizer(config: BertConfig, opener: Opener) -> BertTokenizer:
    return masking_tokenizer(config, opener, "the bert job")


class BertConverter(DocumentConverter):
    """BERT masked-LM + next-sentence records (see ``examples``)."""

    def __init__(self, config: BertConfig, tokenizer: BertTokenizer):
        self.config = config
        options = BertOptions(
            config.max_seq_length,
            config.masked_lm_prob,
            config.max_predictions_per_seq,
            config.short_seq_prob,
            config.dupe_factor,
            config.whole_word_masking,
            config.v2_feature_names,
            config.pack_documents,
        )
        self.examples = BertExamples(tokenizer, options, _chinese_words() if config.whole_word_masking else None)
        self.id_bound = max(tokenizer.vocab.values()) + 1
        self.columns = feature_columns(bert_features(config))

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: ExampleSink) -> dict[str, float]:
        counters = BertCounters()
        config = self.config
        with (
            open_writer(sink, config.output, config.compression, self.columns) as out,
            SpillingBatches() as keep,
            ShuffledExamples(ctx.seed, ctx.workdir, id_bound=self.id_bound) as shuffle,
        ):
            order = None if ctx.feeds else shuffle  # (records that feed a stage are ordered by its shuffle)
            if writes_columns(config.output):  # rows as they are, not records the writer would parse back
                for values in self.examples.rows(documents, ctx.seed, counters, keep, order):
                    out.write_examples(values)
            else:
                for chunk in self.examples.records(documents, ctx.seed, counters, keep, order):
                    out.write(chunk)
            out.note(documents=counters.documents, tokens=counters.tokens)  # exact, with the file (the manifest)
        return {**dataclasses.asdict(counters), "positions": counters.examples * config.max_seq_length}


def _chinese_words():
    """rjieba's ``cut`` (jieba in Rust: fast where plain jieba is pure Python), loaded once."""
    import rjieba

    return rjieba.cut


class BertJob(TextJob):
    name = "bert"
    config_type = BertConfig

    def check(self, config: BertConfig, opener: Opener) -> None:
        _validate(config)
        _tokenizer(config, opener)

    def document_converter(self, config: BertConfig, opener: Opener) -> DocumentConverter:
        _validate(config)
        return with_sentences(BertConverter(config, _tokenizer(config, opener)), config)

    def features(self, config: BertConfig) -> dict[str, Feature]:
        return bert_features(config)

    def summarize(self, totals) -> dict[str, float]:
        positions, tokens, examples = totals.get("positions", 0), totals.get("tokens", 0), totals.get("examples", 0)
        return {
            "fill_ratio": tokens / positions if positions else 0.0,
            "masked_share": totals.get("masked_lm_predictions", 0) / tokens if tokens else 0.0,
            "random_next_share": totals.get("random_next", 0) / examples if examples else 0.0,
        }

    def report(self, output_url: str, config: BertConfig) -> str | None:
        """The records' summary (``python -m fleet_jobs.text report``) for a local output folder."""
        from fleet_jobs.text.tools.report import local_report

        return local_report(output_url, config.vocab_file, REPORT_RECORDS)

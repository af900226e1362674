"""The fleet glue: options, plan-time checks, and the per-item conversion.

An item becomes one ``.tfrecord`` file of ELECTRA examples. Seeds come from
the item (``ctx.seed``), so a retried item rewrites the same bytes.
Within a document, blank lines carry no tokens and do not split it: the
fleet's inputs already cut documents (for ``.txt`` at blank lines, which is
what ELECTRA's builder does with ``--blanks-separate-docs``).
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass
from typing import Iterable

from fleet.job import ConfigError, Converter, ItemContext, Job, Opener, Sink

from . import tfrecord
from .builder import Example, ExampleBuilder
from .tfrecord import VARINTS
from .tokenization import BertTokenizer, VocabError

FORMATS = ("electra",)


@dataclass
class ElectraConfig:
    vocab_file: str = ""  # URL or path of a BERT vocab.txt (required)
    max_seq_length: int = 128
    do_lower_case: bool = True
    seed: int = 12345  # the run's seed; each item's own seed derives from it and the item id
    format: str = "electra"


def _validate(config: ElectraConfig) -> None:
    if not config.vocab_file:
        raise ConfigError(
            "option vocab_file is required (a BERT vocab.txt; make one with: python -m jobs.electra_zh_en vocab)"
        )
    if config.format not in FORMATS:
        raise ConfigError(f"option format: {config.format!r} is not supported (known: {', '.join(FORMATS)})")
    if not 5 <= config.max_seq_length <= 1 << 16:
        raise ConfigError(f"option max_seq_length: must be between 5 and 65536, got {config.max_seq_length}")


# Per process, keyed by (vocab digest, do_lower_case): a tokenizer's cache stays warm across converters.
_TOKENIZERS: dict[tuple[str, bool], BertTokenizer] = {}


def _load_tokenizer(config: ElectraConfig, opener: Opener) -> BertTokenizer:
    try:
        data = opener(config.vocab_file)
    except Exception as e:  # the opener's errors differ by store; all mean "cannot read it"
        raise ConfigError(f"cannot read vocab_file {config.vocab_file}: {e}") from None
    key = (hashlib.sha256(data).hexdigest(), config.do_lower_case)
    if key not in _TOKENIZERS:
        try:
            _TOKENIZERS[key] = BertTokenizer.from_bytes(data, config.vocab_file, do_lower_case=config.do_lower_case)
        except VocabError as e:
            raise ConfigError(str(e)) from None
    return _TOKENIZERS[key]


class ElectraConverter(Converter):
    def __init__(self, config: ElectraConfig, tokenizer: BertTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.cls_id = tokenizer.vocab["[CLS]"]
        self.sep_id = tokenizer.vocab["[SEP]"]
        self.small_ids = max(tokenizer.vocab.values()) < len(VARINTS)
        self._mask_entry = functools.lru_cache(maxsize=None)(self._mask_entry_uncached)
        self._segment_entry = functools.lru_cache(maxsize=4096)(self._segment_entry_uncached)

    def record(self, ex: Example) -> bytes:
        """One framed TFRecord, as ``tfrecord.int64_example`` would make it, only faster:
        the mask and segment entries depend only on the lengths, so they are cached."""
        ids = b"".join(map(VARINTS.__getitem__, ex.input_ids)) if self.small_ids else tfrecord.varints(ex.input_ids)
        entries = (
            tfrecord.feature_entry("input_ids", tfrecord.packed_int64_feature(ids)),
            self._mask_entry(ex.length),
            self._segment_entry(ex.first_length, ex.length),
        )
        return tfrecord.frame(tfrecord.example_from_entries(entries))

    def _mask_entry_uncached(self, n: int) -> bytes:
        payload = b"\x01" * n + b"\x00" * (self.config.max_seq_length - n)  # varints of 0/1 are the bytes 0/1
        return tfrecord.feature_entry("input_mask", tfrecord.packed_int64_feature(payload))

    def _segment_entry_uncached(self, n_first: int, n: int) -> bytes:
        payload = b"\x00" * n_first + b"\x01" * (n - n_first) + b"\x00" * (self.config.max_seq_length - n)
        return tfrecord.feature_entry("segment_ids", tfrecord.packed_int64_feature(payload))

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: Sink) -> dict[str, float]:
        max_length = self.config.max_seq_length
        builder = ExampleBuilder(max_length, self.cls_id, self.sep_id, random.Random(ctx.seed))
        tokenize_lines = self.tokenizer.tokenize_lines
        record = self.record
        n_docs = n_lines = n_examples = n_tokens = n_bytes = 0
        with sink.open(".tfrecord") as out:
            for document in documents:
                n_docs += 1
                n_lines += len(document)
                n_bytes += sum(map(len, map(str.encode, document)))
                examples = builder.add_document(tokenize_lines(document))
                n_tokens += sum([ex.length for ex in examples])
                records = list(map(record, examples))
                n_examples += len(records)
                out.write(b"".join(records))
        return {
            "documents": n_docs,
            "lines": n_lines,
            "examples": n_examples,
            "tokens": n_tokens,
            "positions": n_examples * max_length,
            "text_bytes": n_bytes,
        }


class ElectraJob(Job):
    name = "electra_zh_en"
    config_type = ElectraConfig

    def check(self, config: ElectraConfig, opener: Opener) -> None:
        _validate(config)
        _load_tokenizer(config, opener)

    def converter(self, config: ElectraConfig, opener: Opener) -> ElectraConverter:
        _validate(config)
        return ElectraConverter(config, _load_tokenizer(config, opener))

    def summarize(self, totals) -> dict[str, float]:
        positions = totals.get("positions", 0)
        return {"fill_ratio": totals.get("tokens", 0) / positions if positions else 0.0}

"""The fleet glue: options, plan-time checks, and the per-item conversion.

An item becomes one ``.tfrecord`` file (``.tfrecord.gz`` with GZIP, ``.parquet``
with ``output=parquet``: ``jobs.text.output``) of ELECTRA examples (``format=electra``, the default) or BERT masked-LM examples
(``format=bert``, see ``bert_converter``). With ``format=electra`` (without
``pack_documents``) each document draws from its own stream, seeded by the run
seed and the document's text (``builder.DocumentRandom``): the multiset of
examples depends only on the documents and the seed, not on how the corpus was
cut into items, how many workers ran or which input format carried it. BERT
and ``pack_documents`` mix documents, so they are seeded per item (``ctx.seed``).
Either way a retried item rewrites the same bytes.
Within a document, blank lines carry no tokens and do not split it: the
fleet's inputs already cut documents (for ``.txt`` at blank lines, which is
what ELECTRA's builder does with ``--blanks-separate-docs``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import struct
from dataclasses import dataclass
from itertools import accumulate, chain

import google_crc32c
import numpy as np
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator

from fleet.job import ConfigError, Feature, ItemContext, Opener, Sink

from jobs.text.job import DocumentConverter, TextJob
from jobs.text import tfrecord
from jobs.text.groups import document_groups
from jobs.text.output import Column, check_output, mask_and_segments, open_writer
from jobs.text.tfrecord import VARINTS
from jobs.text.tokenization import BertTokenizer
from jobs.text.tokenizer_cache import bert_tokenizer

from .builder import CLS_RUN, SEP_RUN, DocumentRandom, Example, ExampleBuilder, FlatExamples, seeded_document_runs

if TYPE_CHECKING:
    from .bert_builder import DocBatch

# format=bert's modules (bert_converter, bert_builder, bert_records, masking) load only when a
# BertConverter is made: a format=electra worker does not pay for importing them.

FORMATS = ("electra", "bert")
REPORT_RECORDS = 2_000  # records the report at the end of fleet local reads: 60-130 µs each, paid by every run


@dataclass
class ElectraConfig:
    vocab_file: str = ""  # URL or path of a BERT vocab.txt (required)
    max_seq_length: int = 128
    do_lower_case: bool = True
    seed: int = 12345  # the run's seed: electra seeds each document from it and its text, bert each item
    format: str = "electra"  # electra | bert
    compression: str = "none"  # none | GZIP (files end .tfrecord.gz; TFRecordDataset(compression_type="GZIP"))
    output: str = "tfrecord"  # tfrecord | parquet (one row per example, list columns, zstd; files end .parquet)
    pack_documents: bool = False  # fill examples across document boundaries (corpora of short documents)
    split_sentences: bool = False  # cut each line into sentences first (inputs with a paragraph per line)
    # format=bert only (google-research/bert's create_pretraining_data.py flags; dupe_factor 1, not its 10):
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    short_seq_prob: float = 0.1
    dupe_factor: int = 1  # build the item's examples this many times, each with other randomness
    whole_word_masking: bool = True  # ## pieces with their word; Chinese words (rjieba) all characters
    v2_feature_names: bool = False  # tf-models' input_word_ids / input_type_ids


BERT_ONLY = ("masked_lm_prob", "max_predictions_per_seq", "short_seq_prob", "dupe_factor", "whole_word_masking",
             "v2_feature_names")


def _validate(config: ElectraConfig) -> None:
    if not config.vocab_file:
        raise ConfigError(
            "option vocab_file is required (a BERT vocab.txt; make one with: python -m jobs.electra_zh_en vocab)"
        )
    if config.format not in FORMATS:
        raise ConfigError(f"option format: {config.format!r} is not supported (known: {', '.join(FORMATS)})")
    if not 5 <= config.max_seq_length <= 1 << 16:
        raise ConfigError(f"option max_seq_length: must be between 5 and 65536, got {config.max_seq_length}")
    check_output(config.output, config.compression)
    if config.format != "bert":
        defaults = ElectraConfig()
        for name in BERT_ONLY:
            if getattr(config, name) != getattr(defaults, name):
                raise ConfigError(f"option {name} applies to format=bert only (format is {config.format})")
        return
    if not 0 < config.masked_lm_prob <= 1:
        raise ConfigError(f"option masked_lm_prob: must be in (0, 1], got {config.masked_lm_prob}")
    if not 1 <= config.max_predictions_per_seq <= 1 << 16:
        raise ConfigError(f"option max_predictions_per_seq: must be between 1 and 65536, "
                          f"got {config.max_predictions_per_seq}")
    if not 0 <= config.short_seq_prob <= 1:
        raise ConfigError(f"option short_seq_prob: must be in [0, 1], got {config.short_seq_prob}")
    if not 1 <= config.dupe_factor <= 1000:
        raise ConfigError(f"option dupe_factor: must be between 1 and 1000, got {config.dupe_factor}")


ELECTRA_COLUMNS = (Column("input_ids"), Column("input_mask"), Column("segment_ids"))


def _output(sink: Sink, config: ElectraConfig, columns) -> Iterator:
    """The item's output file, in the format and compression the config names (``jobs.text.output``)."""
    return open_writer(sink, config.output, config.compression, columns)


def _load_tokenizer(config: ElectraConfig, opener: Opener) -> BertTokenizer:
    tokenizer = bert_tokenizer(config.vocab_file, config.do_lower_case, opener)
    if "[MASK]" not in tokenizer.vocab:  # both trainers mask with it: ELECTRA's generator input, BERT's records
        raise ConfigError(f"{config.vocab_file}: format={config.format} needs a [MASK] token in the vocab "
                          "(pre-training masks with it)")
    return tokenizer


class ElectraConverter(DocumentConverter):
    def __init__(self, config: ElectraConfig, tokenizer: BertTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.cls_id = tokenizer.vocab["[CLS]"]
        self.sep_id = tokenizer.vocab["[SEP]"]
        self.small_ids = max(tokenizer.vocab.values()) < len(VARINTS)
        self._mask_entry = functools.lru_cache(maxsize=None)(self._mask_entry_uncached)
        self._segment_entry = functools.lru_cache(maxsize=4096)(self._segment_entry_uncached)
        self._ids_prefix = functools.lru_cache(maxsize=None)(
            functools.partial(tfrecord.int64_entry_prefix, "input_ids"))
        self._heads: dict[int, tuple[bytes, int]] = {}  # records(): by the length of the ids' varints
        self._tails: dict[int, bytes] = {}  # records(): by (first segment length << 17 | length)

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

    def records(self, examples: list[Example]) -> bytes:
        """``record`` of every example, joined, in a few steps per record: the ids'
        varints of all rows in one numpy pass, then cached pieces. A record is head + tail + crc:
        the head (frame header, example prefix, prefix of the ids' entry) depends only on the
        length of the ids' varints, as the mask and segment entries have the same length in every
        record; the tail (the ids' varints, the padding's zeros, the mask and segment entries) on
        the ids and the two lengths; the record's crc32c extends the head's, which is cached."""
        if not examples:
            return b""
        lengths = [ex.length for ex in examples]
        ids = np.fromiter(chain.from_iterable([ex.input_ids for ex in examples]), np.int64)
        if len(ids) != sum(lengths):  # padded examples (ExampleBuilder(pad=True)): their real ids
            ids = np.fromiter(chain.from_iterable([ex.input_ids[:ex.length] for ex in examples]), np.int64)
        return self.records_of(ids, lengths, [ex.first_length for ex in examples])

    def records_of(self, ids: np.ndarray, lengths: list[int], first_lengths: list[int]) -> bytes:
        """``records`` of examples given as all their ids (unpadded, end to end) and their two lengths."""
        if not lengths:
            return b""
        width = self.config.max_seq_length
        if self.small_ids:  # the usual: ids below 2**16, the padding's zeros go with the tail
            data, at = tfrecord.varint_runs(ids, lengths)
            padded = 0
        else:
            rows = np.zeros((len(lengths), width), np.int64)  # [PAD] is 0
            rows[np.arange(width) < np.array(lengths)[:, None]] = ids
            data, at = tfrecord.varint_rows(rows)
            padded = 1
        heads, tails = self._heads, self._tails
        extend, pack, mask = google_crc32c.extend, struct.Struct("<I").pack, tfrecord.mask_crc
        out: list[bytes] = []
        add = out.extend
        a = 0
        for n, n_first, b in zip(lengths, first_lengths, at[1:]):
            size = b - a + (width - n) * (1 - padded)  # bytes of the ids' varints, padding included
            head = heads.get(size) or self._head(size)
            tail = data[a:b] + (tails.get(n_first << 17 | n) or self._tail(n_first, n, padded))
            crc = extend(head[1], tail)
            add((head[0], tail, pack(mask(crc))))
            a = b
        return b"".join(out)

    def columns(self, examples: list[Example]) -> dict[str, np.ndarray]:
        """The examples as one row per example of each feature (the values ``records`` encodes)."""
        ids = np.fromiter(chain.from_iterable([ex.input_ids[:ex.length] for ex in examples]), np.int64)
        return self.columns_of(ids, [ex.length for ex in examples], [ex.first_length for ex in examples])

    def columns_of(self, ids: np.ndarray, lengths: list[int], first_lengths: list[int]) -> dict[str, np.ndarray]:
        """``columns`` of examples given as ``records_of`` takes them."""
        width = self.config.max_seq_length
        input_mask, segment_ids = mask_and_segments(lengths, first_lengths, width)
        input_ids = np.zeros((len(lengths), width), np.int64)  # [PAD] is 0
        input_ids[input_mask.astype(bool)] = ids
        return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}

    def _head(self, ids_length: int) -> tuple[bytes, int]:
        """(frame header + example prefix + prefix of the ids' entry, crc32c of all but the frame
        header) of a record whose ids take ``ids_length`` bytes of varints."""
        width = self.config.max_seq_length
        fixed = len(self._mask_entry(width)) + len(self._segment_entry(0, width))
        prefix = self._ids_prefix(ids_length)
        example = tfrecord.example_prefix(len(prefix) + ids_length + fixed) + prefix
        head = (tfrecord._frame_header(len(example) + ids_length + fixed) + example, google_crc32c.value(example))
        self._heads[ids_length] = head
        return head

    def _tail(self, n_first: int, n: int, padded: int) -> bytes:
        """What follows a record's ids: the padding's zeros (unless the ids came padded), the mask
        and segment entries. A bounded cache: with a long max_seq_length the pairs are many."""
        width = self.config.max_seq_length
        if len(self._tails) * 3 * width > 64 << 20:
            self._tails.clear()
        tail = b"\x00" * ((width - n) * (1 - padded)) + self._mask_entry(n) + self._segment_entry(n_first, n)
        self._tails[n_first << 17 | n] = tail
        return tail

    def _mask_entry_uncached(self, n: int) -> bytes:
        payload = b"\x01" * n + b"\x00" * (self.config.max_seq_length - n)  # varints of 0/1 are the bytes 0/1
        return tfrecord.feature_entry("input_mask", tfrecord.packed_int64_feature(payload))

    def _segment_entry_uncached(self, n_first: int, n: int) -> bytes:
        payload = b"\x00" * n_first + b"\x01" * (n - n_first) + b"\x00" * (self.config.max_seq_length - n)
        return tfrecord.feature_entry("segment_ids", tfrecord.packed_int64_feature(payload))

    def _gather(self, flat: np.ndarray, runs: FlatExamples) -> np.ndarray:
        """The examples' ids end to end (int64), from ``tokenize_flat``'s array and their runs."""
        if not runs.run_starts:
            return np.zeros(0, np.int64)
        source = np.concatenate([flat.astype(np.int64), [self.cls_id, self.sep_id]])
        starts = np.array(runs.run_starts, np.int64)
        sizes = np.array(runs.run_lengths, np.int64)
        starts[starts == CLS_RUN] = len(flat)
        starts[starts == SEP_RUN] = len(flat) + 1
        ends = np.cumsum(sizes)
        return source[np.repeat(starts - ends + sizes, sizes) + np.arange(int(ends[-1]))]

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: Sink) -> dict[str, float]:
        max_length = self.config.max_seq_length
        builder = ExampleBuilder(max_length, self.cls_id, self.sep_id, random.Random(ctx.seed), pad=False)
        seed_key = DocumentRandom.seed_key(self.config.seed)
        n_docs = n_lines = n_examples = n_tokens = n_bytes = 0
        parquet = self.config.output == "parquet"
        with _output(sink, self.config, ELECTRA_COLUMNS) as out:
            for group in _groups(documents):
                lines = [line for document in group for line in document]
                n_docs += len(group)
                n_lines += len(lines)
                if not self.config.pack_documents:  # each document seeded by its own text: examples do not
                    # depend on how items were cut. Packed from the lines' lengths, ids gathered in numpy.
                    texts = ["\n".join(document).encode() for document in group]
                    # UTF-8 bytes of the lines: each text is its lines and a newline between two
                    n_bytes += sum(map(len, texts)) - len(lines) + len(group) - group.count(_EMPTY)
                    flat, line_lengths = self.tokenizer.tokenize_flat(lines)  # one normalization for the group
                    runs = seeded_document_runs(line_lengths.tolist(), accumulate(map(len, group)), texts, seed_key,
                                                max_length)
                    ids, lengths, firsts = self._gather(flat, runs), runs.lengths, runs.first_lengths
                else:
                    sentences = self.tokenizer.tokenize_lines(lines)  # one normalization for the group
                    n_bytes += len("\n".join(lines).encode()) - max(0, len(lines) - 1)
                    examples = builder.add_sentences(sentences)
                    last = builder.end_document() if group is _LAST else None  # what packing holds
                    if last is not None:
                        examples.append(last)
                    ids = np.fromiter(chain.from_iterable([ex.input_ids for ex in examples]), np.int64)
                    lengths, firsts = [ex.length for ex in examples], [ex.first_length for ex in examples]
                n_tokens += sum(lengths)
                n_examples += len(lengths)
                if parquet:  # rows as they are, not records the writer would parse back
                    if lengths:
                        out.write_examples(self.columns_of(ids, lengths, firsts))
                else:
                    out.write(self.records_of(ids, lengths, firsts))
        return {
            "documents": n_docs,
            "lines": n_lines,
            "examples": n_examples,
            "tokens": n_tokens,
            "positions": n_examples * max_length,
            "text_bytes": n_bytes,
        }


GROUP_CHARS = 1 << 16  # format=electra tokenizes documents this many characters at a time (bert: bert_converter)
_LAST: list[list[str]] = []  # the empty group _groups ends with
_EMPTY: list[str] = []  # an empty document (no line): its text is b"", no newline to take off


def _groups(documents: Iterable[list[str]]) -> Iterator[list[list[str]]]:
    """Groups of about GROUP_CHARS characters, then ``_LAST`` (the end, for what packing holds)."""
    yield from document_groups(documents, GROUP_CHARS)
    yield _LAST


class BertConverter(DocumentConverter):
    """format=bert: BERT masked-LM + next-sentence records (see ``bert_converter``)."""

    def __init__(self, config: ElectraConfig, tokenizer: BertTokenizer):
        from .bert_converter import BertExamples, BertOptions

        self.config = config
        options = BertOptions(config.max_seq_length, config.masked_lm_prob, config.max_predictions_per_seq,
                              config.short_seq_prob, config.dupe_factor, config.whole_word_masking,
                              config.v2_feature_names, config.pack_documents)
        self.examples = BertExamples(tokenizer, options, _chinese_words() if config.whole_word_masking else None)

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: Sink) -> dict[str, float]:
        from .bert_converter import BertCounters
        from .bert_records import FEATURES, feature_names

        counters = BertCounters()
        names = feature_names(self.config.v2_feature_names)
        columns = [Column(names[f], "float" if f == "masked_lm_weights" else "int") for f in FEATURES]
        with _output(sink, self.config, columns) as out, SpillingBatches() as keep:
            if self.config.output == "parquet":  # rows as they are, not records the writer would parse back
                for values in self.examples.rows(documents, ctx.seed, counters, keep):
                    out.write_examples(values)
            else:
                for chunk in self.examples.records(documents, ctx.seed, counters, keep):
                    out.write(chunk)
        return {**dataclasses.asdict(counters), "positions": counters.examples * self.config.max_seq_length}


class SentenceSplitting(DocumentConverter):
    """split_sentences: where documents enter the job, each line is cut into its sentences
    (``sentences.split_sentences``), so both formats build examples from sentences, not
    paragraphs. The counters' ``lines`` are then sentences."""

    def __init__(self, inner: Converter):
        self.inner = inner

    def convert(self, documents: Iterable[list[str]], ctx: ItemContext, sink: Sink) -> dict[str, float]:
        from .sentences import split_lines  # its patterns cost every worker 10 ms to compile: only here

        return self.inner.convert(map(split_lines, documents), ctx, sink)


class SpillingBatches:
    """An item's token batches for dupe_factor > 1: in memory up to ``limit`` bytes (a 64 MB
    item needs about 80 MB), then in a temporary file, so a worker's memory stays bounded
    whatever the item size (a compressed file is one item, however big). 64 MB, not more: a
    worker should stay under 300 MB in all (issue 17)."""

    def __init__(self, limit: int = 64 << 20):
        self.limit = limit
        self.in_memory: list[DocBatch] = []
        self.bytes = 0
        self.spilled = 0
        self.file: BinaryIO | None = None

    def __enter__(self) -> "SpillingBatches":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()

    def append(self, batch: DocBatch) -> None:
        arrays = (batch.ids, batch.sentence_starts, batch.doc_starts, batch.doc_numbers)
        size = sum(a.nbytes for a in arrays)
        if self.file is None and self.bytes + size <= self.limit:  # (once spilling, always: keep the order)
            self.in_memory.append(batch)
            self.bytes += size
            return
        if self.file is None:
            import tempfile

            self.file = tempfile.TemporaryFile(prefix="fleet-bert-")
        self.file.seek(0, os.SEEK_END)
        for a in arrays:
            np.save(self.file, a, allow_pickle=False)
        self.spilled += 1

    def __iter__(self) -> Iterator[DocBatch]:
        from .bert_builder import DocBatch

        yield from self.in_memory
        if self.file is not None:
            self.file.seek(0)
            for _ in range(self.spilled):  # np.load leaves the file at the end of the array it read
                yield DocBatch(*(np.load(self.file, allow_pickle=False) for _ in range(4)))


def _chinese_words():
    """rjieba's ``cut`` (jieba in Rust: fast where plain jieba is pure Python), loaded once."""
    import rjieba

    return rjieba.cut


class ElectraJob(TextJob):
    name = "electra_zh_en"
    config_type = ElectraConfig

    def check(self, config: ElectraConfig, opener: Opener) -> None:
        _validate(config)
        _load_tokenizer(config, opener)

    def document_converter(self, config: ElectraConfig, opener: Opener) -> DocumentConverter:
        _validate(config)
        tokenizer = _load_tokenizer(config, opener)
        converter = BertConverter(config, tokenizer) if config.format == "bert" else ElectraConverter(config, tokenizer)
        return SentenceSplitting(converter) if config.split_sentences else converter

    def features(self, config: ElectraConfig) -> dict[str, Feature]:
        from .features import feature_layout

        return feature_layout(config)

    def summarize(self, totals) -> dict[str, float]:
        positions = totals.get("positions", 0)
        derived = {"fill_ratio": totals.get("tokens", 0) / positions if positions else 0.0}
        if "masked_lm_predictions" in totals:
            tokens, examples = totals.get("tokens", 0), totals.get("examples", 0)
            derived["masked_share"] = totals["masked_lm_predictions"] / tokens if tokens else 0.0
            derived["random_next_share"] = totals.get("random_next", 0) / examples if examples else 0.0
        return derived

    def report(self, output_url: str, config: ElectraConfig) -> str | None:
        """The records' summary (``python -m jobs.electra_zh_en report``) for a local output folder."""
        from jobs.text.report import local_report

        return local_report(output_url, config.vocab_file, REPORT_RECORDS)

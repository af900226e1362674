"""One item's documents to BERT pre-training records: tokenize, pair, mask, encode.

Documents are tokenized as they stream in and collected into batches of
about 256k tokens (``DocBatcher``); each batch becomes examples with a few
numpy passes (``builder``, ``masking``, ``records``; ``rows`` gives
the same examples unencoded, as arrays, for a Parquet writer). Memory is
bounded by the batch, the negative pool and, when ``dupe_factor`` > 1, the
item's token ids kept as compact arrays (about 4 bytes per token: 80 MB for a
64 MB item) to build its examples again with other randomness; the job's
converter moves them to a temporary file beyond 64 MB (``SpillingBatches``).

Randomness: pass ``d`` (of ``dupe_factor``) uses ``random.Random`` and a numpy
``Generator`` seeded from (item seed, d), so the output is a pure function of
the documents, the config and the item seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

from .builder import DocBatch, DocBatcher, NegativePool, PairOptions, assemble, build_spans, truncate_pairs
from .records import FEATURES, BertLayout, BertRecordEncoder, feature_names
from .masking import MaskingOptions, mask_batch
from .shuffle import Chunk, ShuffledExamples
from fleet_jobs.text.groups import line_groups
from fleet_jobs.text.output import mask_and_segments
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer

ROWS_PER_CHUNK = 1024  # examples assembled, masked and encoded together
LINE_CHARS_PER_CALL = 1 << 20  # a huge document is tokenized in parts this big (bounded Python lists)
GROUP_CHARS = 1 << 17  # short documents are tokenized together, this many characters at a time


@dataclass(frozen=True)
class BertOptions:
    max_seq_length: int = 128
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    whole_word_masking: bool = True
    v2_feature_names: bool = False
    pack_documents: bool = False


@dataclass
class BertCounters:
    documents: int = 0
    lines: int = 0
    text_bytes: int = 0
    examples: int = 0
    tokens: int = 0
    masked_lm_predictions: int = 0
    random_next: int = 0


def random_ids(vocab: dict[str, int]) -> np.ndarray:
    """Ids a random replacement may take: the vocab minus bracketed tokens ([PAD], [CLS], [unused0]...)."""
    ids = [i for token, i in vocab.items() if not (token.startswith("[") and token.endswith("]") and len(token) > 2)]
    return np.array(sorted(ids) or sorted(vocab.values()), np.int32)


class KeptBatches(Protocol):
    """Where an item's batches wait for the dupe_factor passes: a list, or a store that spills."""

    def append(self, batch: DocBatch) -> None: ...

    def __iter__(self) -> Iterator[DocBatch]: ...


class BertExamples:
    """The pure text -> records core: no I/O; randomness only from the seed given."""

    def __init__(self, tokenizer: BertTokenizer, opts: BertOptions, cut: Callable[[str], list[str]] | None):
        self.tokenizer = tokenizer
        self.opts = opts
        self.cut = cut
        vocab = tokenizer.vocab
        self.cls_id, self.sep_id = vocab["[CLS]"], vocab["[SEP]"]
        self.pairs = PairOptions(opts.max_seq_length, opts.short_seq_prob, opts.pack_documents)
        self.masking = MaskingOptions(
            vocab["[MASK]"],
            random_ids(vocab),
            opts.masked_lm_prob,
            opts.max_predictions_per_seq,
            opts.whole_word_masking,
        )
        self.encoder = BertRecordEncoder(
            BertLayout(opts.max_seq_length, opts.max_predictions_per_seq, opts.v2_feature_names)
        )

    def tokenize(self, lines: list[str]) -> list[list[int]]:
        if self.opts.whole_word_masking:
            return self.tokenizer.tokenize_lines_words(lines, self.cut)
        return self.tokenizer.tokenize_lines(lines)

    def records(
        self,
        documents: Iterable[list[str]],
        seed: int,
        counters: BertCounters,
        keep: KeptBatches | None = None,
        shuffle: ShuffledExamples | None = None,
    ) -> Iterator[bytes]:
        """Framed TFRecords, a batch at a time (each yield is the bytes of many records).
        With dupe_factor > 1 the item's batches go to ``keep`` (default: a list in memory);
        with ``shuffle`` the records come in its order, else in the order they were built."""
        for chunk in self._chunks(documents, seed, counters, keep, shuffle):
            yield self.encoder.encode(chunk.masked, chunk.lengths, chunk.first_lengths, chunk.random_next)

    def rows(
        self,
        documents: Iterable[list[str]],
        seed: int,
        counters: BertCounters,
        keep: KeptBatches | None = None,
        shuffle: ShuffledExamples | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The examples ``records`` encodes, in its order, as one 2-D array per feature (by its
        written name, row i of each is example i), a chunk at a time: for a writer of rows
        (Parquet), which would otherwise parse the records back."""
        names = feature_names(self.opts.v2_feature_names)
        preds = self.opts.max_predictions_per_seq
        prediction = np.arange(preds)
        for chunk in self._chunks(documents, seed, counters, keep, shuffle):
            masked = chunk.masked
            input_mask, segment_ids = mask_and_segments(chunk.lengths, chunk.first_lengths, self.opts.max_seq_length)
            values = {
                "input_ids": masked.input_ids,
                "input_mask": input_mask,
                "segment_ids": segment_ids,
                "masked_lm_positions": masked.positions,
                "masked_lm_ids": masked.labels,
                "masked_lm_weights": (prediction < np.asarray(masked.counts)[:, None]).astype(np.float32),
                "next_sentence_labels": np.asarray(chunk.random_next, np.int64).reshape(-1, 1),
            }
            yield {names[name]: values[name] for name in FEATURES}

    def _chunks(
        self,
        documents: Iterable[list[str]],
        seed: int,
        counters: BertCounters,
        keep: KeptBatches | None,
        shuffle: ShuffledExamples | None,
    ) -> Iterator[Chunk]:
        """Every chunk of examples, in the order of the records."""
        built = self._built(documents, seed, counters, keep)
        return built if shuffle is None else shuffle.shuffled(built)

    def _built(
        self, documents: Iterable[list[str]], seed: int, counters: BertCounters, keep: KeptBatches | None
    ) -> Iterator[Chunk]:
        """Every chunk of examples, in the order they are built: batch by batch, pass by pass."""
        if self.opts.dupe_factor > 1 and keep is None:
            keep = []
        elif self.opts.dupe_factor == 1:
            keep = None
        rngs = self._rngs(seed, 0)
        pool = NegativePool()
        for batch in self._batches(documents, counters):
            yield from self._batch_chunks(batch, pool, rngs, counters, keep)
        for dupe in range(1, self.opts.dupe_factor):
            assert keep is not None  # dupe_factor > 1: a list, above
            rngs, pool = self._rngs(seed, dupe), NegativePool()
            for batch in keep:
                yield from self._batch_chunks(batch, pool, rngs, counters, None)

    def _batches(self, documents: Iterable[list[str]], counters: BertCounters) -> Iterator[DocBatch]:
        """The item's documents as ``DocBatch``es, cut where adding them one by one to a
        ``DocBatcher`` cuts. Short documents are tokenized a group at a time (one
        ``tokenize_flat`` call: the per-document cost is what short documents pay for);
        a document bigger than ``LINE_CHARS_PER_CALL`` alone, in parts."""
        batcher = DocBatcher()
        group: list[str] = []
        group_docs: list[int] = []  # lines of each document of the group
        group_numbers: list[int] = []
        chars = 0

        def flush() -> Iterator[DocBatch]:
            text = "\n".join(group)
            counters.text_bytes += len(text.encode()) - max(0, len(group) - 1)  # (newlines not counted)
            ids, lengths = self.tokenizer.tokenize_flat(group, self.opts.whole_word_masking, self.cut)
            numbers, doc_lines = np.array(group_numbers, np.int64), np.array(group_docs, np.int64)
            while len(doc_lines):
                n = batcher.add_many(numbers, ids, lengths, doc_lines)
                if batcher.full:
                    yield batcher.take()
                used_lines = int(doc_lines[:n].sum())
                used_tokens = int(lengths[:used_lines].sum())
                numbers, doc_lines = numbers[n:], doc_lines[n:]
                ids, lengths = ids[used_tokens:], lengths[used_lines:]
            group.clear()
            group_docs.clear()
            group_numbers.clear()

        for number, document in enumerate(documents):
            counters.documents += 1
            counters.lines += len(document)
            size = sum(map(len, document))
            if size > LINE_CHARS_PER_CALL:
                yield from flush()
                chars = 0
                counters.text_bytes += sum(map(len, map(str.encode, document)))
                for lines in line_groups(document, LINE_CHARS_PER_CALL):
                    batcher.add(number, self.tokenize(lines))
                    if batcher.full:
                        yield batcher.take()
                continue
            group += document
            group_docs.append(len(document))
            group_numbers.append(number)
            chars += size
            if chars >= GROUP_CHARS:
                yield from flush()
                chars = 0
        yield from flush()
        yield batcher.take()

    @staticmethod
    def _rngs(seed: int, dupe: int) -> tuple[random.Random, np.random.Generator]:
        return random.Random(f"{seed}:{dupe}"), np.random.default_rng([seed & (2**64 - 1), dupe])

    def _batch_chunks(
        self, batch: DocBatch, pool: NegativePool, rngs, counters: BertCounters, keep: KeptBatches | None
    ):
        if not batch.n_docs:
            return
        if keep is not None:
            keep.append(batch)
        rng, gen = rngs
        merged, first = pool.merge(batch)
        spans = build_spans(merged, first, self.pairs, rng)
        spans = truncate_pairs(spans, self.opts.max_seq_length - 3, gen).take(gen.permutation(len(spans)))
        pool.keep(merged)
        for start in range(0, len(spans), ROWS_PER_CHUNK):
            pairs = assemble(
                merged.ids,
                spans.take(np.arange(start, min(len(spans), start + ROWS_PER_CHUNK))),
                self.opts.max_seq_length,
                self.cls_id,
                self.sep_id,
            )
            masked = mask_batch(pairs.tokens, pairs.lengths, pairs.first_lengths, self.masking, gen)
            counters.examples += len(pairs.lengths)
            counters.tokens += int(pairs.lengths.sum())
            counters.masked_lm_predictions += int(masked.counts.sum())
            counters.random_next += int(pairs.random_next.sum())
            yield Chunk(masked, pairs.lengths, pairs.first_lengths, pairs.random_next)

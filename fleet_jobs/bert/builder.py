"""BERT's sentence-pair examples (next-sentence prediction) from token ids, as numpy spans.

The algorithm is google-research/bert's ``create_pretraining_data.py``: per
document a target length (``max_seq_length - 3``, or with ``short_seq_prob`` a
random one from 2), sentences accumulate into a chunk until the target is
reached or the document ends, segment A takes a random number of the chunk's
leading sentences, and B is either the rest of the chunk (label 0) or, half
the time and always for a one-sentence chunk, sentences from a random other
document (label 1; the chunk's unused sentences are put back). The pair is
then truncated to fit, one token at a time from the longer segment, at its
front or back by a coin flip.

What differs, and why:

- Tokens never become Python lists per example: a batch of documents is one
  flat ``int32`` array, and an example is four offsets into it (A and B are
  contiguous there), so examples are built with a few numpy operations per
  batch. Truncation draws the front/back split of each segment's removals as
  one binomial, which is the distribution of BERT's coin flips.
- Random next segments come from a bounded window, not from every document
  of the input held in RAM (BERT: 649 MiB for 5 MB of text). See ``NegativePool``.
- ``pack_documents``: chunks run across document boundaries (for corpora of
  short documents, where BERT's builder fills under half of each sequence).
  The target is then drawn per chunk; an "actual next" pair is split at a
  sentence boundary inside a document when the chunk has one (else B is the
  next document and the label is 1: it is not A's continuation); a random B
  may run on into the documents after the one drawn.
- With no other document within reach (an item of one document), a random
  next B cannot be made: the chunk's actual next sentences are used, or a
  lone sentence is cut in two (label 0).
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Sequence

import numpy as np

from fleet_jobs.text.tokenizers.tokenization import WORD_CONTINUES

ID_BITS = WORD_CONTINUES - 1  # ids & ID_BITS drops the word-continues flag


@dataclass(frozen=True)
class PairOptions:
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    pack_documents: bool = False


@dataclass
class DocBatch:
    """Consecutive documents as flat arrays: compact enough to keep a whole item (dupe_factor)."""

    ids: np.ndarray  # int32 (T,): every non-empty sentence's ids, WORD_CONTINUES flags kept
    sentence_starts: np.ndarray  # int64 (S+1,): sentence s is ids[sentence_starts[s]:sentence_starts[s+1]]
    doc_starts: np.ndarray  # int64 (D+1,): document d is sentences doc_starts[d]..doc_starts[d+1]
    doc_numbers: np.ndarray  # int64 (D,): the document's number in the item (parts of one document share it)

    @classmethod
    def empty(cls) -> "DocBatch":
        return cls(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64))

    @property
    def n_docs(self) -> int:
        return len(self.doc_numbers)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @classmethod
    def concat(cls, first: "DocBatch", second: "DocBatch") -> "DocBatch":
        if not first.n_docs:
            return second
        if not second.n_docs:
            return first
        return cls(
            np.concatenate([first.ids, second.ids]),
            np.concatenate([first.sentence_starts, second.sentence_starts[1:] + first.n_tokens]),
            np.concatenate([first.doc_starts, second.doc_starts[1:] + first.doc_starts[-1]]),
            np.concatenate([first.doc_numbers, second.doc_numbers]),
        )

    def tail(self, max_tokens: int) -> "DocBatch":
        """The last documents holding at most ``max_tokens`` (copied, so the batch can go).
        If the last document alone is bigger, its first sentences that fit (at least one)."""
        if not self.n_docs or max_tokens <= 0:
            return DocBatch.empty()
        ss, ds = self.sentence_starts, self.doc_starts
        doc_token_starts = ss[ds]
        first = int(np.searchsorted(doc_token_starts, self.n_tokens - max_tokens, side="left"))
        if first < self.n_docs:
            s0 = int(ds[first])
            return DocBatch(
                self.ids[ss[s0] :].copy(), ss[s0:] - ss[s0], ds[first:] - s0, self.doc_numbers[first:].copy()
            )
        s0, s1 = int(ds[-2]), int(ds[-1])
        t0 = int(ss[s0])
        s_end = max(s0 + 1, int(np.searchsorted(ss[s0 : s1 + 1], t0 + max_tokens, side="right")) - 1 + s0)
        return DocBatch(
            self.ids[t0 : ss[s_end]].copy(),
            ss[s0 : s_end + 1] - t0,
            np.array([0, s_end - s0], np.int64),
            self.doc_numbers[-1:].copy(),
        )


@dataclass
class DocBatcher:
    """Collects tokenized documents into ``DocBatch``es of about ``batch_tokens`` tokens.
    Lines without tokens are dropped, as BERT drops them."""

    batch_tokens: int = 1 << 18
    _ids: list[np.ndarray] = field(default_factory=list)
    _lengths: list[np.ndarray] = field(default_factory=list)  # non-empty sentences' lengths
    _doc_sentences: list[np.ndarray] = field(default_factory=list)  # sentences per document (part)
    _numbers: list[np.ndarray] = field(default_factory=list)
    tokens: int = 0

    def add(self, doc_number: int, sentences: Sequence[Sequence[int]]) -> None:
        """Sentences of one document (or of a part of it: same number, added in order)."""
        lengths = [n for n in map(len, sentences) if n]
        if not lengths:
            return
        total = sum(lengths)
        self._ids.append(np.fromiter(chain.from_iterable(sentences), np.int32, total))
        self._lengths.append(np.array(lengths, np.int64))
        self._doc_sentences.append(np.array([len(lengths)], np.int64))
        self._numbers.append(np.array([doc_number], np.int64))
        self.tokens += total

    def add_many(self, numbers: np.ndarray, ids: np.ndarray, line_lengths: np.ndarray, doc_lines: np.ndarray) -> int:
        """Documents given flat (``tokenizer.tokenize_flat`` of their lines; document d has
        ``doc_lines[d]`` of the lines), added one after the other as ``add`` would, up to the
        one that makes the batch ``full``. Returns how many documents were taken: the caller
        takes the batch and gives the rest again."""
        line_ends = np.cumsum(doc_lines)
        token_ends = np.concatenate([[0], np.cumsum(line_lengths)])
        doc_tokens = token_ends[line_ends] - token_ends[line_ends - doc_lines]
        reach = self.tokens + np.cumsum(doc_tokens)
        n = min(len(doc_lines), int(np.searchsorted(reach, self.batch_tokens, side="left")) + 1)
        if n == 0:
            return 0
        lines = line_ends[n - 1]
        keep = doc_tokens[:n] > 0  # a document of empty lines leaves no trace, as in add
        kept_lines = line_lengths[:lines]
        nonempty = kept_lines > 0
        sentence_ends = np.concatenate([[0], np.cumsum(nonempty)])
        per_doc = sentence_ends[line_ends[:n]] - sentence_ends[line_ends[:n] - doc_lines[:n]]
        if keep.any():
            self._ids.append(ids[: token_ends[lines]])
            self._lengths.append(kept_lines[nonempty])
            self._doc_sentences.append(per_doc[keep].astype(np.int64))
            self._numbers.append(np.asarray(numbers[:n], np.int64)[keep])
            self.tokens += int(doc_tokens[:n].sum())
        return n

    @property
    def full(self) -> bool:
        return self.tokens >= self.batch_tokens

    def take(self) -> DocBatch:
        """Everything added so far, as one batch; the batcher starts empty again."""
        if not self._ids:
            return DocBatch.empty()
        ids = np.concatenate(self._ids)
        lengths = np.concatenate(self._lengths)
        sentence_starts = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=sentence_starts[1:])
        numbers = np.concatenate(self._numbers)
        ends = np.cumsum(np.concatenate(self._doc_sentences))
        last_part = np.append(numbers[1:] != numbers[:-1], True)  # parts of one document merge
        doc_starts = np.concatenate([[0], ends[last_part]]).astype(np.int64)
        self._ids, self._lengths, self._doc_sentences, self._numbers, self.tokens = [], [], [], [], 0
        return DocBatch(ids, sentence_starts, doc_starts, numbers[last_part])


class NegativePool:
    """Where random next segments come from: the current batch and recent documents.

    BERT draws a random document from the whole input, which it keeps in RAM.
    Here a random document is drawn from the documents of the batch being
    built (about 256k tokens, earlier and later ones alike) plus the last
    ``max_tokens`` tokens' worth of documents of earlier batches, kept as one
    compact array. Memory stays bounded whatever the item size, the choice
    depends only on the item's documents and the seed (so a retry rewrites the
    same bytes), and a negative is still from another document. Neighbouring
    documents of a shard are a little more alike than random ones; for the
    next-sentence task only "another document" matters.
    """

    def __init__(self, max_tokens: int = 1 << 20):
        self.max_tokens = max_tokens
        self.kept = DocBatch.empty()

    def merge(self, batch: DocBatch) -> tuple[DocBatch, int]:
        """The kept documents followed by the batch's, and the index of the batch's first."""
        return DocBatch.concat(self.kept, batch), self.kept.n_docs

    def keep(self, merged: DocBatch) -> None:
        self.kept = merged.tail(self.max_tokens)


@dataclass
class Spans:
    """Sentence pairs as offsets into a ``DocBatch``'s ids: A = ids[a_start:a_end], B likewise."""

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    random_next: np.ndarray  # int64 0/1: next_sentence_labels

    def __len__(self) -> int:
        return len(self.a_start)

    def take(self, index: np.ndarray) -> "Spans":
        return Spans(
            self.a_start[index], self.a_end[index], self.b_start[index], self.b_end[index], self.random_next[index]
        )


def fast_randint(rng: random.Random) -> Callable[[int, int], int]:
    """``rng.randint``, drawing the same bits (``Random._randbelow_with_getrandbits``, the
    same in Python 3.10 to 3.13) without its layers of calls: a pair costs a few draws."""
    getrandbits = rng.getrandbits

    def randint(a: int, b: int) -> int:
        n = b - a + 1
        if n <= 0:
            raise ValueError(f"empty range for randint({a}, {b})")
        k = n.bit_length()
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        return a + r

    return randint


def build_spans(batch: DocBatch, first_doc: int, opts: PairOptions, rng: random.Random) -> Spans:
    """BERT's sentence pairs for the documents ``first_doc..`` of ``batch`` (the earlier
    ones are only drawn from for random next segments). Untruncated: see ``truncate_pairs``."""
    ss = batch.sentence_starts.tolist()
    ds = batch.doc_starts.tolist()
    numbers = batch.doc_numbers.tolist()
    n_docs = len(numbers)
    several_docs = len(set(numbers)) > 1
    sentence_doc = np.repeat(np.arange(n_docs), np.diff(batch.doc_starts)).tolist()
    max_num_tokens = opts.max_seq_length - 3
    short_prob, pack = opts.short_seq_prob, opts.pack_documents
    pairs: list[tuple[int, int, int, int, int]] = []  # (a0, a1, b0, b1, label)
    add = pairs.append

    randint, random_float = fast_randint(rng), rng.random

    def target_length() -> int:
        return randint(2, max_num_tokens) if random_float() < short_prob else max_num_tokens

    def other_document(first: int, last: int, tries: int = 10) -> int | None:
        """A random document outside ``first..last`` (the chunk's) and not a part of one of
        them (same number); None if there is none. (``tries`` of 10 left: the loop inlines the first.)"""
        if not several_docs:
            return None
        avoid_a, avoid_b = numbers[first], numbers[last]
        for _ in range(tries):
            k = randint(0, n_docs - 1)
            if not first <= k <= last and numbers[k] != avoid_a and numbers[k] != avoid_b:
                return k
        others = [
            k for k in range(n_docs) if not first <= k <= last and numbers[k] != avoid_a and numbers[k] != avoid_b
        ]
        return others[randint(0, len(others) - 1)] if others else None

    streams = [(ds[first_doc], ds[-1])] if pack else [(ds[d], ds[d + 1]) for d in range(first_doc, n_docs)]
    for s0, s1 in streams:
        target = target_length()
        chunk = s0
        while chunk < s1:
            # The chunk's last sentence: the first whose end brings it to the target, or the stream's last.
            i = bisect_left(ss, ss[chunk] + target, chunk + 1, s1) - 1
            n = i - chunk + 1
            label = 0
            if not pack:  # BERT: A's sentences, then a coin flip (a one-sentence chunk: random next)
                a_end = chunk + 1 if n == 1 else chunk + randint(1, n - 1)
                random_next = n == 1 or random_float() < 0.5
            else:  # the flip first: an actual next B must continue A's document
                random_next = n == 1 or random_float() < 0.5
                inside = (
                    []
                    if random_next
                    else [j for j in range(chunk + 1, i + 1) if sentence_doc[j] == sentence_doc[j - 1]]
                )
                if inside:
                    a_end = inside[randint(0, len(inside) - 1)]
                else:
                    a_end = chunk + 1 if n == 1 else chunk + randint(1, n - 1)
            a0, a1 = ss[chunk], ss[a_end]
            first, last = sentence_doc[chunk], sentence_doc[i]
            k: int | None
            if random_next and several_docs:  # other_document's first try, inline (the usual case)
                k = randint(0, n_docs - 1)
                if first <= k <= last or numbers[k] == numbers[first] or numbers[k] == numbers[last]:
                    k = other_document(first, last, 9)
            else:
                k = None
            if k is not None:
                start = randint(ds[k], ds[k + 1] - 1)
                limit = ds[k + 1]
                if pack:  # B may run on into the following documents, up to the chunk's own
                    limit = ds[first] if k < first else ds[-1]
                end = bisect_left(ss, ss[start] + target - (a1 - a0), start + 1, limit)
                b0, b1, label = ss[start], ss[end], 1
                i = a_end - 1  # put the chunk's unused sentences back
            elif not random_next or n > 1:  # (or no other document within reach) the actual next
                b0, b1 = a1, ss[i + 1]
                if pack and sentence_doc[a_end] != sentence_doc[a_end - 1]:
                    label = 1  # B is the next document: not A's continuation
            elif a1 - a0 > 1:  # no other document and one sentence: cut it in two
                a1 = b0 = a0 + randint(1, a1 - a0 - 1)
                b1 = ss[i + 1]
            else:  # a one-token sentence alone: A only
                b0 = b1 = a1
            add((a0, a1, b0, b1, label))
            chunk = i + 1
            if pack:
                target = target_length()
    columns = np.array(pairs, np.int64).reshape(-1, 5).T
    return Spans(*(np.ascontiguousarray(c) for c in columns))


def truncate_pairs(spans: Spans, max_num_tokens: int, gen: np.random.Generator) -> Spans:
    """BERT's ``truncate_seq_pair`` for all pairs at once.

    BERT removes one token at a time from the longer segment (B on a tie)
    until the pair fits, each from the front or the back by a coin flip. The
    number removed from each segment follows from the two lengths; how many
    of them come off the front is a binomial draw.
    """
    la = spans.a_end - spans.a_start
    lb = spans.b_end - spans.b_start
    excess = np.maximum(la + lb - max_num_tokens, 0)
    to_longer = np.minimum(excess, np.abs(la - lb))  # until both are as long
    rest = excess - to_longer  # then alternately, B first
    cut_a = np.where(la > lb, to_longer, 0) + rest // 2
    cut_b = np.where(la > lb, 0, to_longer) + rest - rest // 2
    front_a = gen.binomial(cut_a, 0.5)
    front_b = gen.binomial(cut_b, 0.5)
    return Spans(
        spans.a_start + front_a,
        spans.a_end - (cut_a - front_a),
        spans.b_start + front_b,
        spans.b_end - (cut_b - front_b),
        spans.random_next,
    )


@dataclass
class Pairs:
    """``[CLS] A [SEP] B [SEP]`` zero padded, one row per example; flags kept on the ids."""

    tokens: np.ndarray  # int32 (N, max_seq_length)
    lengths: np.ndarray  # int64 (N,): non-padding positions
    first_lengths: np.ndarray  # int64 (N,): positions of "[CLS] A [SEP]" (segment 0)
    random_next: np.ndarray  # int64 (N,)


def assemble(ids: np.ndarray, spans: Spans, max_seq_length: int, cls_id: int, sep_id: int) -> Pairs:
    """Rows of token ids from (truncated) spans; B may be empty (then no second [SEP]).
    Each segment's tokens are copied by one gather and one scatter over the tokens
    themselves (not over every position of every row: short examples are mostly padding)."""
    la = spans.a_end - spans.a_start
    lb = spans.b_end - spans.b_start
    n_rows = len(la)
    b_first = la + 2
    row_start = np.arange(n_rows) * max_seq_length
    tokens: np.ndarray = np.zeros(n_rows * max_seq_length, np.int32)  # flat here, (n_rows, max_seq_length) below
    for start, length, at in ((spans.a_start, la, row_start + 1), (spans.b_start, lb, row_start + b_first)):
        total = int(length.sum())
        if total:
            before = np.cumsum(length) - length
            within = np.arange(total) - np.repeat(before, length)
            tokens[np.repeat(at, length) + within] = ids[np.repeat(start, length) + within]
    tokens[row_start] = cls_id
    tokens[row_start + la + 1] = sep_id
    has_b = lb > 0
    tokens[(row_start + b_first + lb)[has_b]] = sep_id
    tokens = tokens.reshape(n_rows, max_seq_length)
    lengths = b_first + np.where(has_b, lb + 1, 0)
    return Pairs(tokens, lengths, b_first, spans.random_next)

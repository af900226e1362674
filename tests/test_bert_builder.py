"""BERT sentence pairs as spans: BERT's rules, truncation, the negative pool, batching."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_jobs.bert.builder import (
    DocBatch,
    DocBatcher,
    NegativePool,
    PairOptions,
    Spans,
    assemble,
    build_spans,
    fast_randint,
    truncate_pairs,
)

CLS, SEP = 2, 3


def batch_of(lengths_per_doc: list[list[int]], numbers: list[int] | None = None) -> DocBatch:
    """Documents of sentences with the given lengths; token ids are unique and count up from 100."""
    batcher = DocBatcher(batch_tokens=1 << 40)
    next_id = 100
    for d, lengths in enumerate(lengths_per_doc):
        sentences = []
        for n in lengths:
            sentences.append(list(range(next_id, next_id + n)))
            next_id += n
        batcher.add(numbers[d] if numbers else d, sentences)
    return batcher.take()


def bert_truncate(la: int, lb: int, max_num_tokens: int, rng: random.Random) -> tuple[int, int, int, int]:
    """BERT's truncate_seq_pair on lengths: (front cut a, back cut a, front cut b, back cut b)."""
    cuts = [0, 0, 0, 0]
    while la + lb > max_num_tokens:
        a_longer = la > lb
        front = rng.random() < 0.5
        cuts[(0 if a_longer else 2) + (0 if front else 1)] += 1
        if a_longer:
            la -= 1
        else:
            lb -= 1
    return tuple(cuts)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.integers(0, 400), st.integers(2, 300))
def test_truncation_removes_what_bert_removes(la, lb, max_num_tokens):
    spans = Spans(*(np.array([v]) for v in (1000, 1000 + la, 5000, 5000 + lb, 0)))
    out = truncate_pairs(spans, max_num_tokens, np.random.default_rng(la * 1000 + lb))
    fa, ba, fb, bb = bert_truncate(la, lb, max_num_tokens, random.Random(0))
    new_a = int(out.a_end[0] - out.a_start[0])
    new_b = int(out.b_end[0] - out.b_start[0])
    assert (new_a, new_b) == (la - fa - ba, lb - fb - bb)  # the same amounts, whatever the coin flips
    assert 1000 <= out.a_start[0] <= out.a_end[0] <= 1000 + la and 5000 <= out.b_start[0] <= out.b_end[0] <= 5000 + lb
    assert new_a >= 1 and new_a + new_b <= max(max_num_tokens, 1)


def test_truncation_cuts_front_and_back_about_equally():
    n = 20000
    spans = Spans(np.zeros(n, np.int64), np.full(n, 300), np.full(n, 1000), np.full(n, 1010), np.zeros(n, np.int64))
    out = truncate_pairs(spans, 125, np.random.default_rng(3))
    front = out.a_start.mean()
    assert (out.a_end - out.a_start == 115).all() and (out.b_end - out.b_start == 10).all()
    assert abs(front - 92.5) < 1.5  # 185 removals, half from the front


docs_strategy = st.lists(st.lists(st.integers(0, 70), min_size=1, max_size=10), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(docs_strategy, st.integers(8, 64), st.booleans(), st.integers(0, 2**32))
def test_pairs_follow_bert_rules(lengths, max_seq_length, pack, seed):
    batch = batch_of(lengths)
    opts = PairOptions(max_seq_length, short_seq_prob=0.2, pack_documents=pack)
    spans = build_spans(batch, 0, opts, random.Random(seed))
    ss = batch.sentence_starts.tolist()
    doc_of_token = np.repeat(np.arange(batch.n_docs), np.diff(batch.sentence_starts[batch.doc_starts]))
    boundaries = set(ss)
    own = np.zeros(batch.n_tokens, int)  # how often each token is in an A, or in a B that continues its A
    for a0, a1, b0, b1, label in zip(
        *(x.tolist() for x in (spans.a_start, spans.a_end, spans.b_start, spans.b_end, spans.random_next))
    ):
        assert a1 > a0 and a0 in boundaries and label in (0, 1)
        own[a0:a1] += 1
        if b1 == b0:
            continue
        assert b0 in boundaries or (b0 == a1 and label == 0)  # or a lone sentence cut in two
        next_document = b0 == a1 and doc_of_token[b0] != doc_of_token[a1 - 1]
        if label == 0 or (pack and next_document):  # the actual next sentences (packing: maybe the next document)
            assert b0 == a1 and label == int(next_document)
            own[b0:b1] += 1
        else:  # a random next segment: sentences of another document
            assert doc_of_token[b0] != doc_of_token[a0] and doc_of_token[b0] != doc_of_token[a1 - 1]
            assert pack or doc_of_token[b1 - 1] == doc_of_token[b0]
    # Every sentence goes to exactly one example: BERT puts a random pair's unused sentences back, and a
    # lone sentence with no other document is cut in two. (Packing: a random B that happens to be the next
    # document from its start is also counted here, so at least once.)
    assert (own >= 1).all() if pack else (own == 1).all()


def test_random_next_about_half_on_long_documents():
    rng = random.Random(5)
    batch = batch_of([[rng.randint(5, 40) for _ in range(200)] for _ in range(20)])
    spans = build_spans(batch, 0, PairOptions(128), random.Random(1))
    assert 0.45 < spans.random_next.mean() < 0.6  # a one-sentence chunk is always random next, as in BERT
    short = PairOptions(128, short_seq_prob=1.0)
    lengths = (spans.a_end - spans.a_start) + (spans.b_end - spans.b_start)
    short_lengths = [x.a_end - x.a_start for x in [build_spans(batch, 0, short, random.Random(1))]][0]
    assert short_lengths.mean() < lengths.mean() / 2  # targets drawn from 2..125


def test_one_document_alone_gets_actual_next_or_a_cut_sentence():
    batch = batch_of(
        [
            [50],
        ]
    )
    spans = build_spans(batch, 0, PairOptions(128), random.Random(2))
    assert len(spans) == 1 and spans.random_next[0] == 0
    assert spans.a_start[0] == 0 and spans.a_end[0] == spans.b_start[0] and spans.b_end[0] == 50
    single = build_spans(batch_of([[1]]), 0, PairOptions(128), random.Random(2))
    assert (single.a_end - single.a_start).tolist() == [1] and (single.b_end - single.b_start).tolist() == [0]


def test_parts_of_one_document_are_never_each_others_negatives():
    batch = batch_of([[30] * 10, [30] * 10], numbers=[7, 7])  # one document cut in two parts
    assert batch.n_docs == 1  # consecutive parts merge
    pool = NegativePool()
    pool.keep(batch)
    merged, first = pool.merge(batch_of([[30] * 10], numbers=[7]))
    spans = build_spans(merged, first, PairOptions(64), random.Random(3))
    assert spans.random_next.sum() == 0  # no other document anywhere


def test_assemble_layout():
    batch = batch_of([[5, 7], [4]])
    spans = Spans(np.array([0, 12]), np.array([5, 16]), np.array([5, 0]), np.array([12, 0]), np.array([0, 1]))
    pairs = assemble(batch.ids, spans, 16, CLS, SEP)
    ids = batch.ids.tolist()
    assert pairs.tokens[0].tolist() == [CLS, *ids[0:5], SEP, *ids[5:12], SEP, 0]
    assert pairs.lengths.tolist() == [15, 6] and pairs.first_lengths.tolist() == [7, 6]
    assert pairs.tokens[1].tolist() == [CLS, *ids[12:16], SEP] + [0] * 10  # B empty: no second [SEP]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(4, 40))
def test_assemble_is_cls_a_sep_b_sep_on_random_spans(seed, seq):
    """assemble gathers only the segments' tokens: every row must still be [CLS] A [SEP] B [SEP]
    (no second [SEP] when B is empty), zero padded, with A and B anywhere in the ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 1000, 300).astype(np.int32)
    n_rows = 25
    la = rng.integers(1, seq - 2, n_rows)
    lb = np.minimum(rng.integers(0, seq, n_rows), seq - 3 - la)
    a0, b0 = rng.integers(0, 300 - seq, n_rows), rng.integers(0, 300 - seq, n_rows)
    pairs = assemble(ids, Spans(a0, a0 + la, b0, b0 + lb, np.zeros(n_rows, np.int64)), seq, CLS, SEP)
    for i in range(n_rows):
        b = ids[b0[i] : b0[i] + lb[i]].tolist()
        row = [CLS, *ids[a0[i] : a0[i] + la[i]].tolist(), SEP, *(b + [SEP] if b else [])]
        assert pairs.tokens[i].tolist() == row + [0] * (seq - len(row))
        assert pairs.lengths[i] == len(row) and pairs.first_lengths[i] == la[i] + 2
    assert pairs.tokens.dtype == np.int32


def test_batcher_drops_empty_lines_and_merges_parts():
    b = DocBatcher(batch_tokens=10)
    b.add(0, [[], [5, 6], []])
    assert not b.full
    b.add(0, [[7, 8, 9]])
    b.add(1, [[], []])  # a document without tokens is no document
    b.add(2, [[1] * 6])
    assert b.full
    batch = b.take()
    assert batch.ids.tolist() == [5, 6, 7, 8, 9] + [1] * 6
    assert batch.sentence_starts.tolist() == [0, 2, 5, 11]
    assert batch.doc_starts.tolist() == [0, 2, 3] and batch.doc_numbers.tolist() == [0, 2]
    assert b.take().n_docs == 0 and b.tokens == 0


def test_pool_keeps_a_bounded_tail():
    batch = batch_of([[10] * 3, [10] * 5, [10] * 2])  # 30, 50, 20 tokens
    pool = NegativePool(max_tokens=75)
    pool.keep(batch)
    assert pool.kept.n_tokens == 70 and pool.kept.doc_numbers.tolist() == [1, 2]
    assert pool.kept.ids.tolist() == batch.ids[30:].tolist()
    pool = NegativePool(max_tokens=15)
    pool.keep(batch)  # the last document alone is bigger: its first sentences that fit
    assert pool.kept.ids.tolist() == batch.ids[80:90].tolist() and pool.kept.sentence_starts.tolist() == [0, 10]
    merged, first = pool.merge(batch)
    assert first == 1 and merged.n_tokens == 110 and merged.doc_starts.tolist() == [0, 1, 4, 9, 11]
    assert merged.ids[10:].tolist() == batch.ids.tolist()


def test_same_seed_same_pairs():
    batch = batch_of([[random.Random(i).randint(1, 40) for i in range(60)] for _ in range(5)])
    run = lambda seed: build_spans(batch, 0, PairOptions(128), random.Random(seed))  # noqa: E731
    a, b, c = run(4), run(4), run(5)
    assert all((x == y).all() for x, y in zip(vars(a).values(), vars(b).values()))
    assert any(len(x) != len(y) or (x != y).any() for x, y in zip(vars(a).values(), vars(c).values()))


@pytest.mark.parametrize("pack", [False, True])
def test_packing_fills_sequences_of_short_documents(pack):
    rng = random.Random(9)
    batch = batch_of([[rng.randint(3, 15) for _ in range(rng.randint(1, 3))] for _ in range(400)])
    spans = truncate_pairs(
        build_spans(batch, 0, PairOptions(128, pack_documents=pack), random.Random(1)), 125, np.random.default_rng(1)
    )
    fill = ((spans.a_end - spans.a_start) + (spans.b_end - spans.b_start) + 3).mean() / 128
    assert (fill > 0.85) if pack else (fill < 0.5)
    if pack:  # an actual next pair is split inside a document when it can be: labels stay balanced
        assert 0.4 < spans.random_next.mean() < 0.65


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 40), max_size=5), max_size=30),
    st.integers(1, 120),
    st.lists(st.integers(1, 7), min_size=1, max_size=6),
)
def test_add_many_cuts_batches_where_adding_one_by_one_does(docs, batch_tokens, group_sizes):
    """Documents (lists of sentence lengths; a number repeated makes parts of one document)."""
    numbers = [d // 2 if d % 5 == 0 else d for d in range(len(docs))]
    ids = iter(range(100, 10**6))

    def sentences(lengths):
        return [[next(ids) for _ in range(n)] for n in lengths]

    docs_ids = [sentences(lengths) for lengths in docs]
    one = DocBatcher(batch_tokens=batch_tokens)
    expected = []
    for number, doc in zip(numbers, docs_ids):
        one.add(number, doc)
        if one.full:
            expected.append(one.take())
    expected.append(one.take())

    many = DocBatcher(batch_tokens=batch_tokens)
    got, start, k = [], 0, 0
    while start < len(docs):
        size = group_sizes[k % len(group_sizes)]
        k += 1
        group = docs_ids[start : start + size]
        flat = np.array([i for doc in group for line in doc for i in line], np.int32)
        lengths = np.array([len(line) for doc in group for line in doc], np.int64)
        doc_lines = np.array([len(doc) for doc in group], np.int64)
        g_numbers = np.array(numbers[start : start + size], np.int64)
        start += size
        while len(doc_lines):
            n = many.add_many(g_numbers, flat, lengths, doc_lines)
            if many.full:
                got.append(many.take())
            used = int(doc_lines[:n].sum())
            flat, lengths = flat[int(lengths[:used].sum()) :], lengths[used:]
            g_numbers, doc_lines = g_numbers[n:], doc_lines[n:]
    got.append(many.take())
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        for name in ("ids", "sentence_starts", "doc_starts", "doc_numbers"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist(), name


def test_fast_randint_draws_what_random_randint_draws():
    """build_spans calls its own randint (the Random's layers of calls cost more than the pair):
    the same values and the same generator state after, for ranges of one value (which still
    draw bits) up to wide ones, so the records stay those of ``random.Random.randint``."""
    ranges = [(0, 0), (5, 5), (1, 2), (0, 9), (2, 125), (0, 7121), (3, 2**40)]
    ours, theirs = random.Random(11), random.Random(11)
    randint = fast_randint(ours)
    for i in range(3000):
        a, b = ranges[i % len(ranges)]
        assert randint(a, b) == theirs.randint(a, b)
    assert ours.getstate() == theirs.getstate()
    with pytest.raises(ValueError):
        randint(3, 2)

"""ELECTRA example packing: layout, the segment rules, and determinism."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_jobs.electra_zh_en.builder import Example, ExampleBuilder, build_examples

CLS, SEP = 2, 3


def numbered(lengths_per_doc: list[list[int]]) -> list[list[list[int]]]:
    """Documents of sentences with the given lengths; every token id is unique (from 100 up)."""
    next_id, docs = 100, []
    for lengths in lengths_per_doc:
        doc = []
        for n in lengths:
            doc.append(list(range(next_id, next_id + n)))
            next_id += n
        docs.append(doc)
    return docs


def segments(ex: Example) -> tuple[list[int], list[int]]:
    a = ex.input_ids[1 : ex.first_length - 1]
    b = ex.input_ids[ex.first_length : ex.length - 1]
    return a, b


def check_layout(ex: Example, max_length: int) -> None:
    n, n0 = ex.length, ex.first_length
    assert len(ex.input_ids) == len(ex.input_mask) == len(ex.segment_ids) == max_length
    assert ex.input_ids[0] == CLS and ex.input_ids[n0 - 1] == SEP and ex.input_ids[n - 1] == SEP
    assert 2 <= n0 <= n <= max_length and n != n0 + 1  # a second segment is never empty
    assert ex.input_mask == [1] * n + [0] * (max_length - n)
    assert ex.segment_ids == [0] * n0 + [1] * (n - n0) + [0] * (max_length - n)
    assert ex.input_ids[n:] == [0] * (max_length - n)
    a, b = segments(ex)
    assert CLS not in a + b and SEP not in a + b


docs_strategy = st.lists(st.lists(st.integers(0, 60), max_size=12), max_size=6)


@settings(max_examples=150, deadline=None)
@given(docs_strategy, st.integers(5, 64), st.integers(0, 2**32))
def test_layout_and_token_order(lengths, max_length, seed):
    docs = numbered(lengths)
    examples = list(build_examples(docs, max_length, CLS, SEP, random.Random(seed)))
    position = {t: i for i, t in enumerate(t for doc in docs for s in doc for t in s)}
    last = -1
    for ex in examples:
        check_layout(ex, max_length)
        a, b = segments(ex)
        assert a, "the first segment always gets the first sentence"
        # Each segment keeps token order; a later short sentence may still join `a` after
        # one went to `b` (ELECTRA's rule 2), so they may interleave, but examples do not.
        pa, pb = [position[t] for t in a], [position[t] for t in b]
        assert pa == sorted(pa) and pb == sorted(pb) and min(pa + pb) > last
        assert pa[0] == min(pa + pb)
        last = max(pa + pb)
    docs_with_tokens = sum(1 for lens in lengths if sum(lens))
    assert len(examples) >= docs_with_tokens  # a document boundary always flushes


def test_documents_never_share_an_example():
    docs = numbered([[3], [4], [5]])
    examples = list(build_examples(docs, 128, CLS, SEP, random.Random(1)))
    assert [sorted(a + b) for a, b in map(segments, examples)] == [sorted(s) for doc in docs for s in doc]


def test_long_document_gives_several_full_examples():
    docs = numbered([[50] * 20])  # 1000 tokens
    examples = list(build_examples(docs, 128, CLS, SEP, random.Random(7)))
    assert len(examples) >= 5
    full = [ex for ex in examples if ex.length == 128]
    assert len(full) >= 4


def test_empty_inputs_give_nothing():
    assert list(build_examples([], 128, CLS, SEP, random.Random(1))) == []
    assert list(build_examples([[], [[]], [[], [], []]], 128, CLS, SEP, random.Random(1))) == []


def test_same_seed_same_examples_other_seed_differs():
    docs = numbered([[random.Random(i).randint(1, 40) for i in range(300)]])
    run = lambda seed: list(build_examples(docs, 128, CLS, SEP, random.Random(seed)))  # noqa: E731
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_numpy_friendly():
    examples = list(build_examples(numbered([[30] * 30]), 64, CLS, SEP, random.Random(3)))
    for field in ("input_ids", "input_mask", "segment_ids"):
        array = np.asarray([getattr(ex, field) for ex in examples])
        assert array.shape == (len(examples), 64) and array.dtype == np.int64


class Scripted(random.Random):
    """Returns the scripted values from random(), to pin down each rule."""

    def __init__(self, *values: float):
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0) if self.values else super().random()


def build(sentence_lengths: list[int], rng: random.Random, max_length: int = 128) -> list[Example]:
    builder = ExampleBuilder(max_length, CLS, SEP, rng)
    return builder.add_document(numbered([sentence_lengths])[0])


def test_first_segment_rules():
    # Not one-segment (0.5 >= 0.1): first target (128-3)//2 = 62. 30 -> a; 30+30 = 60 < 62 -> a;
    # 90 >= 62, b empty, 60 < 62: coin flip 0.3 < 0.5 -> a; 0.99 -> no random target.
    (ex,) = build([30, 30, 30], Scripted(0.5, 0.3, 0.99))
    assert segments(ex)[1] == [] and ex.length == 92
    # Same with the coin flip 0.7 -> b, and the next one goes to b without a flip.
    (ex,) = build([30, 30, 30, 10], Scripted(0.5, 0.7, 0.99))
    assert [len(s) for s in segments(ex)] == [60, 40]
    # One-segment case (0.05 < 0.1): everything goes to a.
    (ex,) = build([30, 30, 30, 10], Scripted(0.05, 0.99))
    assert [len(s) for s in segments(ex)] == [100, 0]


def test_truncation():
    (ex,) = build([300], Scripted(0.5, 0.99))
    assert ex.length == 128 and segments(ex)[0] == list(range(100, 226))
    # a = 100 (one sentence, first target 62), b keeps 128 - 100 - 3 = 25 of its 50.
    (ex,) = build([100, 50], Scripted(0.5, 0.99))
    assert [len(s) for s in segments(ex)] == [100, 25] and ex.length == 128


def test_random_target_length():
    builder = ExampleBuilder(128, CLS, SEP, Scripted(0.5, 0.01))
    first = builder.add_sentence(list(range(100, 300)))  # 0.01 < 0.05: next target = randint(5, 128)
    assert first is not None
    target = builder._target
    assert 5 <= target <= 128
    assert builder.add_sentence(list(range(300, 300 + target - 1))) is None
    assert builder.add_sentence([999]) is not None


def test_random_shares_are_about_right():
    examples = list(build_examples(numbered([[8] * 20000]), 128, CLS, SEP, random.Random(11)))
    one_segment = sum(1 for ex in examples if ex.length == ex.first_length) / len(examples)
    short = sum(1 for ex in examples if ex.length < 120) / len(examples)
    assert 0.05 < one_segment < 0.2
    assert 0.02 < short < 0.1


def test_max_length_too_small():
    with pytest.raises(ValueError):
        ExampleBuilder(4, CLS, SEP, random.Random(0))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 90), max_size=6), max_size=25), st.integers(0, 2**32))
def test_add_documents_is_add_document_for_each(docs, seed):
    """Many documents in one call, unpadded, give each document's examples as one by one, padded."""
    documents = numbered(docs)
    one = ExampleBuilder(64, CLS, SEP, random.Random(seed))
    expected = [ex for doc in documents for ex in one.add_document(doc)]
    many = ExampleBuilder(64, CLS, SEP, random.Random(seed), pad=False)
    ends = list(itertools.accumulate(map(len, documents)))
    got = many.add_documents([s for doc in documents for s in doc], ends)
    assert [(ex.input_ids + [0] * (64 - ex.length), ex.length, ex.first_length) for ex in got] == expected


def seeded_case(docs, seed):
    """The documents' seed key, texts, lines and ends, as electra_zh_en hands them to the builder."""
    from fleet_jobs.electra_zh_en.builder import DocumentRandom

    documents = numbered(docs)
    texts = [b"document %d of seed %d" % (i, seed) for i in range(len(documents))]
    sentences = [s for doc in documents for s in doc]
    return DocumentRandom.seed_key(seed), texts, sentences, list(itertools.accumulate(map(len, documents)))


def per_document(max_length, sentences, ends, texts, key):
    """The reference: ``add_documents`` with one ``DocumentRandom`` per document."""
    from fleet_jobs.electra_zh_en.builder import DocumentRandom

    return ExampleBuilder(max_length, CLS, SEP, random.Random(0), pad=False).add_documents(
        sentences, ends, [DocumentRandom(key, t) for t in texts]
    )


def gathered(runs, flat: list[int]) -> list[list[int]]:
    """Each example's ids from ``FlatExamples`` runs into ``flat`` (plain Python)."""
    from fleet_jobs.electra_zh_en.builder import CLS_RUN, SEP_RUN

    ids = []
    for start, n in zip(runs.run_starts, runs.run_lengths):
        ids += [CLS] if start == CLS_RUN else [SEP] if start == SEP_RUN else flat[start : start + n]
    out, at = [], 0
    for n in runs.lengths:
        out.append(ids[at : at + n])
        at += n
    assert at == len(ids)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 90), max_size=6), max_size=25), st.integers(5, 64), st.integers(0, 2**32))
def test_seeded_document_runs_are_add_documents_with_a_document_random_each(docs, max_length, seed):
    """electra_zh_en packs from the lines' lengths alone (runs into the flat ids): the examples
    of the generic path, draw for draw, truncation and empty lines included (one-line documents
    and a last example whose lines all fit the first segment skip draws nobody sees)."""
    from fleet_jobs.electra_zh_en.builder import seeded_document_runs

    key, texts, sentences, ends = seeded_case(docs, seed)
    expected = per_document(max_length, sentences, ends, texts, key)
    runs = seeded_document_runs([len(s) for s in sentences], ends, texts, key, max_length)
    assert gathered(runs, [t for s in sentences for t in s]) == [ex.input_ids for ex in expected]
    assert runs.lengths == [ex.length for ex in expected]
    assert runs.first_lengths == [ex.first_length for ex in expected]


@pytest.mark.parametrize("max_length", [5, 8, 13, 21, 34])
def test_seeded_document_runs_on_many_small_documents(max_length):
    """The same, on many documents of short lines (ties of a segment's length with its target,
    which random lists rarely hit, are many here)."""
    from fleet_jobs.electra_zh_en.builder import DocumentRandom, seeded_document_runs

    rng = random.Random(max_length)
    documents = numbered([[rng.randint(0, max_length // 2) for _ in range(rng.randint(0, 9))] for _ in range(1500)])
    key = DocumentRandom.seed_key(max_length)
    texts = [b"%d" % i for i in range(len(documents))]
    sentences = [s for doc in documents for s in doc]
    ends = list(itertools.accumulate(map(len, documents)))
    expected = per_document(max_length, sentences, ends, texts, key)
    runs = seeded_document_runs([len(s) for s in sentences], ends, texts, key, max_length)
    assert gathered(runs, [t for s in sentences for t in s]) == [ex.input_ids for ex in expected]
    assert (runs.lengths, runs.first_lengths) == ([ex.length for ex in expected], [ex.first_length for ex in expected])
    assert len({ex.first_length < ex.length for ex in expected}) == 2  # examples of one and of two segments

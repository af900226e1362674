"""causal_lm's speed-ups change no byte: the byte-level BPE word cache gives ``Tokenizer.encode``'s
ids on any text (whitespace runs, digits, punctuation, contractions, emoji, CJK, code points
the two regex engines class differently, added tokens' text), is refused for configurations it
does not reproduce, and the converter writes the same bytes with it as without it; blocks' records
from cached heads are the generic writer's."""

from __future__ import annotations

import dataclasses
import io
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.job import ItemContext
from fleet_jobs.causal_lm import JOB, CausalLMConverter
from fleet_jobs.causal_lm.blocks import BlockCutter, BlockOptions
from fleet_jobs.causal_lm.records import BlockRecords
from fleet_jobs.causal_lm.word_cache import WordCache, word_cache
from fleet_jobs.text.output import Column, encode_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_LETTERS = "".join(chr(c) for c in range(0x10940, 0x10946))  # Garay letters (Unicode 16)


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    return read_documents("sample_en.txt")[:60] + read_documents("sample_zh.txt")[:60]


@pytest.fixture(scope="module")
def bpe_json(documents) -> str:
    """A GPT-2 style byte-level BPE (no normalizer, ByteLevel pre-tokenizer) of 1,500 tokens, with
    merges between punctuation and letters of Unicode 16, which the regex module knows and
    tokenizers' Oniguruma does not: the regex's split there gives other ids."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    odd = [f"!{NEW_LETTERS} ?{NEW_LETTERS[:2]}"] * 200  # (Oniguruma: punctuation runs, merged)
    bpe.train_from_iterator(["\n".join(d) for d in documents] + odd, vocab_size=1500,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return bpe.to_str()


@pytest.fixture(scope="module")
def tokenizer(bpe_json):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(bpe_json)


def library_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]


def cached_ids(cache: WordCache, texts: list[str]) -> list[list[int]]:
    ids, counts = cache.encode(texts)
    assert ids.dtype == np.int32 and len(counts) == len(texts) and counts.sum() == len(ids)
    return [part.tolist() for part in np.split(ids, np.cumsum(counts)[:-1])] if texts else []


# Pieces the GPT-2 regex treats each its own way, and any code point at all (new letters the
# regex module knows and Oniguruma does not, controls, private use, astral planes).
SPECIAL = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\u180e",
           "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "ſ", "'", "0", "42", "٣", "１２", "½", "Ⅷ",
           "!", "?!", "...", "—", "«", "€", "😀", "👩‍👩‍👧", "\u200d", "\ufe0f", "中文", "日本語です", "한국어",
           "\u0301", "e\u0301", "<|endoftext|>", "<|end", "\U000107bb", "\U00010940", "\u0558", "\U000e0001"]
texts_strategy = st.lists(
    st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=6),
                       st.text(st.characters(blacklist_categories=("Cs",)), max_size=4)), max_size=12)
    .map("".join), max_size=8)


@settings(max_examples=150, deadline=None)
@given(texts=texts_strategy)
def test_the_word_cache_gives_the_librarys_ids_on_any_text(tokenizer, texts):
    cache = word_cache(tokenizer)
    assert cache is not None
    assert cached_ids(cache, texts) == library_ids(tokenizer, texts)
    assert cached_ids(cache, texts) == library_ids(tokenizer, texts)  # the second time from the cache


def test_a_full_cache_starts_over_and_gives_the_same_ids(tokenizer, documents, monkeypatch):
    from fleet_jobs.causal_lm import word_cache as module

    monkeypatch.setattr(module, "MAX_WORDS", 50)
    cache = word_cache(tokenizer)
    texts = ["\n".join(d) for d in documents[:30]]
    for at in range(0, len(texts), 10):
        assert cached_ids(cache, texts[at:at + 10]) == library_ids(tokenizer, texts[at:at + 10])
        assert len(cache.index) <= 50 + sum(len(cache.pattern.findall(t)) for t in texts[at:at + 10])


def test_a_character_the_engines_class_differently_sends_its_text_to_the_library(tokenizer):
    cache = word_cache(tokenizer)
    texts = ["plain words", f"x!{NEW_LETTERS} ?{NEW_LETTERS[:2]}y", "more words"]
    assert cached_ids(cache, texts) == library_ids(tokenizer, texts)
    if NEW_LETTERS[0] in cache.differ:  # (so while tokenizers' Unicode tables are older than regex's)
        ids, counts = cache._cached(texts[1:2])  # what the regex's split alone would give: other ids
        assert ids.tolist() != library_ids(tokenizer, texts[1:2])[0]
    for c in cache.differ:  # what the probe found really splits otherwise in the library
        probe = f"a{c}1{c}!{c} {c}\n{c}  "
        spans = [s for _, s in tokenizer.pre_tokenizer.pre_tokenize_str(probe)]
        assert spans != [m.span() for m in cache.pattern.finditer(probe)]
    assert " " in cache.checked and "中" not in cache.differ


def test_only_configurations_it_reproduces_get_a_cache(bpe_json):
    from tokenizers import Tokenizer

    def variant(**changes) -> Tokenizer:
        spec = json.loads(bpe_json)
        for path, value in changes.items():
            node, *keys = path.split("__")
            target = spec[node] if keys else spec
            target[keys[-1] if keys else node] = value
        return Tokenizer.from_str(json.dumps(spec))

    assert word_cache(variant()) is not None
    assert word_cache(variant(normalizer={"type": "Lowercase"})) is None
    assert word_cache(variant(pre_tokenizer__add_prefix_space=True)) is None
    assert word_cache(variant(pre_tokenizer__use_regex=False)) is None
    assert word_cache(variant(model__dropout=0.1)) is None
    assert word_cache(variant(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                                          "stride": 0})) is None
    assert word_cache(variant(pre_tokenizer={"type": "Whitespace"})) is None


class MemorySink:
    def __init__(self):
        self.files: dict[str, io.BytesIO] = {}
        self.counts: dict[str, dict] = {}

    def open(self, suffix):
        buffer = self.files[suffix] = io.BytesIO()
        buffer.close = lambda: None
        return buffer

    def count(self, suffix, counts):
        self.counts[suffix] = counts


@pytest.mark.parametrize("options", [{"max_seq_length": "32"}, {"output": "megatron"},
                                     {"max_seq_length": "16", "pack_documents": "true", "last_block": "drop"}])
def test_the_converter_writes_the_same_bytes_and_counts_with_the_cache_as_without(tmp_path, bpe_json, documents,
                                                                                  options):
    path = tmp_path / "tokenizer.json"
    path.write_text(bpe_json, encoding="utf-8")
    config = JOB.parse_config({"tokenizer_file": str(path), **options})
    cached = JOB.document_converter(config, lambda p: open(p, "rb").read())
    assert cached.tokenizer.flat is not None
    plain = CausalLMConverter(config, dataclasses.replace(cached.tokenizer, flat=None))  # the library's encode
    docs = documents + [[""], ["<|endoftext|> inside", "a line"], ["\U00010940\U00010941 new letters"]]
    results = []
    for converter in (cached, plain):
        sink = MemorySink()
        stats = converter.convert(iter(docs), ItemContext("i", 1, "r"), sink)
        results.append((stats, {k: v.getvalue() for k, v in sink.files.items()}, sink.counts))
    assert results[0] == results[1]
    assert results[0][0]["documents"] == len(docs)
    assert results[0][0]["text_bytes"] == sum(len(line.encode()) for d in docs for line in d)


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 99), max_size=40), max_size=12), size=st.integers(2, 9),
       pack=st.booleans(), last=st.sampled_from(["pad", "drop"]))
def test_blocks_from_ids_end_to_end_are_the_blocks_from_lists(docs, size, pack, last):
    opts = BlockOptions(size, 100, 101, last, pack)
    lists, flat = BlockCutter(opts), BlockCutter(opts)
    a = [lists.add(docs), lists.finish()]
    counts = np.array([len(d) for d in docs], np.int64)
    ids = np.array([i for d in docs for i in d], np.int32)
    b = [flat.add_flat(ids, counts), flat.finish()]
    for x, y in zip(a, b):
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.lengths, y.lengths)
    assert lists.dropped == flat.dropped


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 9), st.lists(st.sampled_from([0, 1, 127, 128, 16383, 16384, 65535, 65536,
                                                                          1 << 31]), min_size=9, max_size=9)),
                     min_size=1, max_size=8),
       padded=st.booleans())
def test_block_records_are_the_writers_records_of_the_same_columns(rows, padded):
    width = 9
    ids = np.array([r for _, r in rows], np.int64).reshape(-1, width)
    lengths = np.array([n for n, _ in rows], np.int32)
    columns = {"input_ids": ids}
    if padded:
        columns["attention_mask"] = (np.arange(width) < lengths[:, None]).astype(np.int32)
    order = sorted([Column(name) for name in columns], key=lambda c: c.name)
    encoder = BlockRecords(width, padded)
    for _ in range(2):  # the second time from the cached heads
        assert encoder.records(ids, lengths) == b"".join(encode_rows(order, columns))

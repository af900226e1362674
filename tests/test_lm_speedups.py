"""causal_lm's speed-ups change no byte: the byte-level BPE word cache gives ``Tokenizer.encode``'s
ids on any text (whitespace runs, digits, punctuation, contractions, emoji, CJK, code points
the two regex engines class differently, added tokens' text), is refused for configurations it
does not reproduce, and the converter writes the same bytes with it as without it; blocks' records
from cached heads are the generic writer's, and the C core's (``records.c``) are the Python path's,
which TensorFlow reads back, checksums included."""

from __future__ import annotations

import ctypes
import dataclasses
import io
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.job import ItemContext
from fleet_jobs.causal_lm import JOB, CausalLMConverter
from fleet_jobs.causal_lm.blocks import BlockCutter, BlockOptions
from fleet_jobs.causal_lm.records import BlockRecords
from fleet_jobs.causal_lm.word_cache import WordCache, word_cache
from fleet.formats import tfrecord
from fleet.formats.tfrecord.writer import encode_rows
from fleet.formats.writer import Column
from fleet_jobs.text.tokenizers import native

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
    bpe.train_from_iterator(
        ["\n".join(d) for d in documents] + odd, vocab_size=1500, special_tokens=["<|endoftext|>"], show_progress=False
    )
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
SPECIAL = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u3000",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\xa0",
    "\u2028",
    "\u180e",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "ſ",
    "'",
    "0",
    "42",
    "٣",
    "１２",
    "½",
    "Ⅷ",
    "!",
    "?!",
    "...",
    "—",
    "«",
    "€",
    "😀",
    "👩‍👩‍👧",
    "\u200d",
    "\ufe0f",
    "中文",
    "日本語です",
    "한국어",
    "\u0301",
    "e\u0301",
    "<|endoftext|>",
    "<|end",
    "\U000107bb",
    "\U00010940",
    "\u0558",
    "\U000e0001",
]
texts_strategy = st.lists(
    st.lists(
        st.one_of(
            st.sampled_from(SPECIAL),
            st.text(max_size=6),
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=4),
        ),
        max_size=12,
    ).map("".join),
    max_size=8,
)


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
        assert cached_ids(cache, texts[at : at + 10]) == library_ids(tokenizer, texts[at : at + 10])
        assert len(cache.index) <= 50 + sum(len(cache.pattern.findall(t)) for t in texts[at : at + 10])


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
    assert (
        word_cache(variant(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}))
        is None
    )
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


@pytest.mark.parametrize(
    "options",
    [
        {"max_seq_length": "32"},
        {"output": "megatron"},
        {"max_seq_length": "16", "pack_documents": "true", "last_block": "drop"},
    ],
)
def test_the_converter_writes_the_same_bytes_and_counts_with_the_cache_as_without(
    tmp_path, bpe_json, documents, options
):
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
@given(
    docs=st.lists(st.lists(st.integers(0, 99), max_size=40), max_size=12),
    size=st.integers(2, 9),
    pack=st.booleans(),
    last=st.sampled_from(["pad", "drop"]),
)
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
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 9),
            st.lists(st.sampled_from([0, 1, 127, 128, 16383, 16384, 65535, 65536, 1 << 31]), min_size=9, max_size=9),
        ),
        min_size=1,
        max_size=8,
    ),
    padded=st.booleans(),
)
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


# -- the C core's block records (records.c) ----------------------------------------------------


def _loads() -> bool:
    try:
        return bool(native.load())
    except native.NativeError:
        return False


needs_native = pytest.mark.skipif(not _loads(), reason="no C core here (fleet built without a C compiler)")
MAX_ID = (1 << 31) - 1


def c_and_python(width: int, padded: bool, ids: np.ndarray, lengths: np.ndarray) -> tuple[bytes, bytes]:
    """The records of the C path (ids as int32 and as int64: the same bytes) and of the Python path."""
    c = BlockRecords(width, padded, use_native=True)
    out = c.records(ids.astype(np.int32), lengths)
    assert c.records(ids.astype(np.int64), lengths) == out
    return out, BlockRecords(width, padded, use_native=False).records(ids, lengths)


@needs_native
@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    width=st.integers(2, 40),
    rows=st.integers(1, 8),
    padded=st.booleans(),
    top=st.sampled_from([127, 16383, 65535, MAX_ID]),
)
def test_c_block_records_are_the_python_paths_bytes(data, width, rows, padded, top):
    """Ids of one, two, three bytes and up to five (a row with an id of 2^14 or more goes C's
    general way), full blocks and padded ones (their lengths any in [0, width])."""
    ids = np.array(
        data.draw(
            st.lists(st.lists(st.integers(0, top), min_size=width, max_size=width), min_size=rows, max_size=rows)
        ),
        np.int64,
    )
    lengths = np.array(
        data.draw(st.lists(st.one_of(st.just(width), st.integers(0, width)), min_size=rows, max_size=rows)), np.int32
    )
    c, python = c_and_python(width, padded, ids, lengths)
    assert c == python
    assert len(list(tfrecord.iter_records(c))) == rows  # (both checksums of every frame checked)


@needs_native
@pytest.mark.parametrize("width", [128, 1025])
@pytest.mark.parametrize("padded", [True, False])
def test_c_block_records_of_long_blocks_and_many_rows(width, padded):
    """Many rows of real widths: the C path's varints, written where the previous row's head
    ended, are moved when a row's head has another size (lengths crossing 128 and 16384 bytes)."""
    rng = np.random.default_rng(width)
    ids = np.concatenate(
        [
            rng.integers(0, 128, (40, width)),
            rng.integers(0, 8_000, (40, width)),
            rng.integers(0, MAX_ID, (20, width), endpoint=True),
        ]
    )
    ids[rng.permutation(len(ids))[:30], 0] = rng.integers(16_384, MAX_ID, 30)  # one wide id in a row
    ids = ids[rng.permutation(len(ids))]
    lengths = np.where(rng.random(len(ids)) < 0.5, width, rng.integers(1, width, len(ids))).astype(np.int32)
    c, python = c_and_python(width, padded, ids, lengths)
    assert c == python


@needs_native
def test_tensorflow_reads_the_c_records_back():
    tf = pytest.importorskip("tensorflow")
    width, rng = 16, np.random.default_rng(0)
    ids = rng.integers(0, MAX_ID, (50, width), endpoint=True).astype(np.int32)
    ids[::3] = rng.integers(0, 300, (17, width))
    lengths = rng.integers(1, width + 1, 50).astype(np.int32)
    spec = {
        "input_ids": tf.io.FixedLenFeature([width], tf.int64),
        "attention_mask": tf.io.FixedLenFeature([width], tf.int64),
    }
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "part.tfrecord")
        with open(path, "wb") as f:
            f.write(BlockRecords(width, True, use_native=True).records(ids, lengths))
        read = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
    assert len(read) == len(ids)
    for example, row, n in zip(read, ids, lengths):
        assert example["input_ids"].numpy().tolist() == row.tolist()
        assert example["attention_mask"].numpy().tolist() == [1] * n + [0] * (width - n)


@needs_native
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), start=st.integers(0, 7), seed=st.integers(0, (1 << 32) - 1))
def test_the_c_crc32c_is_google_crc32cs_so_a_damaged_record_is_noticed(data, start, seed):
    """From any starting crc and at any alignment (the slicing-by-8 loop reads 8 bytes at a time
    from an 8-byte boundary)."""
    crc = native.load().lib.rec_crc32c
    buf = bytes(start) + data
    at = ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value + start
    assert crc(0, at, len(data)) == tfrecord.crc32c(data)
    assert crc(seed, at, len(data)) == tfrecord.extend_crc(seed, data)


@needs_native
@pytest.mark.parametrize("at", [0, 9, 13, 40, -1])  # the length, its crc, the example, the example's crc
def test_a_flipped_bit_in_a_c_record_fails_its_checksum(at):
    ids = np.arange(24, dtype=np.int32).reshape(2, 12) * 1000
    data = bytearray(BlockRecords(12, True, use_native=True).records(ids, np.array([12, 5])))
    assert len(list(tfrecord.iter_records(bytes(data)))) == 2
    data[at] ^= 0x10
    with pytest.raises(ValueError):
        list(tfrecord.iter_records(bytes(data)))


@pytest.mark.parametrize("use_native", [pytest.param(True, marks=needs_native), False])
@pytest.mark.parametrize("bad", [-1, 1 << 35])
def test_an_id_out_of_range_is_refused_both_ways(use_native, bad):
    ids = np.full((3, 4), 7, np.int64)
    ids[1, 2] = bad
    with pytest.raises(ValueError, match=r"\[0, 2\*\*35\)"):
        BlockRecords(4, True, use_native=use_native).records(ids, np.array([4, 4, 4]))


@needs_native
def test_a_block_length_past_its_width_is_refused():
    with pytest.raises(ValueError, match="length 5 is not in"):
        BlockRecords(4, True, use_native=True).records(np.zeros((2, 4), np.int32), np.array([4, 5]))


@needs_native
def test_the_converter_writes_the_same_bytes_with_the_c_records_as_without(tmp_path, bpe_json, documents, monkeypatch):
    path = tmp_path / "tokenizer.json"
    path.write_text(bpe_json, encoding="utf-8")
    results = []
    for available in (native.available, lambda: None):
        monkeypatch.setattr(native, "available", available)
        converter = JOB.document_converter(
            JOB.parse_config({"tokenizer_file": str(path), "max_seq_length": "48"}), lambda p: open(p, "rb").read()
        )
        sink = MemorySink()
        stats = converter.convert(iter(documents), ItemContext("i", 1, "r"), sink)
        results.append((stats, {k: v.getvalue() for k, v in sink.files.items()}, sink.counts))
    assert results[0] == results[1]
    assert results[0][0]["examples"] > 100

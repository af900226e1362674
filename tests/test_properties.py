"""Property-based tests (hypothesis) across module boundaries.

- Arbitrary Unicode documents through the electra_zh_en job's public API
  (tokenizer, example builder, converter), the records read back by
  TensorFlow: fixed lengths, [CLS] first, [SEP] placement, segment ids,
  padding after the mask, ids within the vocab, no token invented.
  (tests/test_tokenization.py and tests/test_builder.py hold each module's
  own properties: equality with BERT's reference, the packing rules.)
- Arbitrary bytes as a vocab or as input: a one-line error of the right
  kind, never a crash.
- Cutting a file into items at document boundaries: the items' documents
  are exactly the file's, each once, whatever the sizes.
- A local store never resolves an object name outside its root.
"""

from __future__ import annotations

import io
import os
import random
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from fleet.job import ConfigError, InputError, ItemContext, Sink
from fleet.core.store import StoreError
from fleet.core.store.local import LocalStore
from fleet_jobs.electra_zh_en import JOB, ElectraConfig
from fleet_jobs.text.inputs import iter_documents, plan_ranges, read_all
from fleet_jobs.electra_zh_en.builder import ExampleBuilder
from fleet_jobs.text.tokenizers.tokenization import BertTokenizer, VocabError, load_vocab
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# Controls, format characters, odd whitespace and line separators, combining marks,
# CJK (BMP, astral, compatibility), punctuation of several scripts, case oddities,
# private use, unassigned, the replacement character, a BOM.
ODD = (
    "aZ9 .,!?'#[]\t\r\x00\x01\x0b\x0c\x1c\x7f\x85\xa0\xad\u200b\u2028\u2029\u3000\ufffd\ufeff\u0301\u0345"
    "éÉßİıΣς中文数据\u3400\U00020000\uf900\ufa6c，。！？…《》ＡＢ１\U0001f600ぁカ한\ue000\u0378"
)
text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=ODD, max_size=30),
    st.text(alphabet="hello world 数据 模型 the of and", max_size=60),
)
documents = st.lists(st.lists(text, min_size=1, max_size=8), max_size=6)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory) -> str:
    lines = []
    for name in ("sample_en.txt", "sample_zh.txt"):
        with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
            lines += f.read().splitlines()[:1500]
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab(lines, 3000), path)
    return path


@pytest.fixture(scope="module")
def tokenizers(vocab_path):
    return {lower: BertTokenizer.from_file(vocab_path, do_lower_case=lower) for lower in (True, False)}


class MemorySink(Sink):
    def __init__(self):
        self.files: dict[str, io.BytesIO] = {}

    def open(self, suffix):
        f = self.files[suffix] = io.BytesIO()
        f.close = lambda: None  # keep the bytes readable after the converter closes it
        return f


def read_records_with_tensorflow(data: bytes) -> list[dict[str, list[int]]]:
    """TensorFlow's own reader: checks the framing CRCs and parses the Examples."""
    import tensorflow as tf

    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
        f.write(data)
        f.flush()
        out = []
        for raw in tf.data.TFRecordDataset(f.name):
            ex = tf.train.Example.FromString(raw.numpy())
            out.append({k: list(v.int64_list.value) for k, v in ex.features.feature.items()})
    return out


# -- tokenizer and builder, through the job ------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(
    docs=documents, max_length=st.sampled_from([5, 6, 9, 16, 33, 128]), seed=st.integers(0, 2**63), lower=st.booleans()
)
@example(docs=[["\x00\ufffd\u200b", " \t"], ["中" * 300]], max_length=5, seed=1, lower=True)
@example(docs=[["a" * 101 + " b"]], max_length=6, seed=2, lower=False)
@example(docs=[["01", "0"]], max_length=5, seed=0, lower=False)  # the second segment cut away entirely
def test_any_unicode_becomes_well_formed_records(vocab_path, tokenizers, docs, max_length, seed, lower):
    config = ElectraConfig(vocab_file=vocab_path, max_seq_length=max_length, do_lower_case=lower)
    converter = JOB.document_converter(config, lambda url: open(url, "rb").read())
    sink = MemorySink()
    stats = converter.convert(iter(docs), ItemContext("00001", seed, "prop"), sink)
    data = sink.files[".tfrecord"].getvalue()
    records = read_records_with_tensorflow(data)

    tok = tokenizers[lower]
    vocab = tok.vocab
    specials = {vocab[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    cls, sep, size = vocab["[CLS]"], vocab["[SEP]"], len(vocab)
    assert stats["examples"] == len(records)
    assert stats["documents"] == len(docs) and stats["lines"] == sum(map(len, docs))
    content = Counter()
    full = False
    for r in records:
        ids, mask, seg = r["input_ids"], r["input_mask"], r["segment_ids"]
        assert sorted(r) == ["input_ids", "input_mask", "segment_ids"]
        assert len(ids) == len(mask) == len(seg) == max_length
        n = sum(mask)
        assert mask == [1] * n + [0] * (max_length - n)  # the mask is a prefix
        assert ids[n:] == [0] * (max_length - n) and seg[n:] == [0] * (max_length - n)  # zeros after it
        assert ids[0] == cls and ids[n - 1] == sep
        n0 = seg.index(1) if 1 in seg else n
        assert seg[:n] == [0] * n0 + [1] * (n - n0)
        assert ids[n0 - 1] == sep and n0 >= 3  # [CLS] a [SEP], a never empty
        assert n == n0 or n >= n0 + 2  # b, when present, is never empty and ends with [SEP]
        inner = ids[1 : n0 - 1] + ids[n0 : n - 1]
        assert all(0 <= i < size for i in ids)
        assert not specials & set(inner)  # [CLS]/[SEP]/[PAD]/[MASK] only where the layout puts them
        content.update(inner)
        # Truncation leaves an example full, or one short of it when the second segment is cut away.
        full = full or n >= max_length - 1
    assert stats["tokens"] == sum(sum(r["input_mask"]) for r in records)
    # No token is invented; none is dropped unless some example was cut to fit max_length.
    wanted = Counter(i for doc in docs for line in tok.tokenize_lines(doc) for i in line)
    assert not content - wanted
    if not full:
        assert content == wanted
    # A pure function of (documents, config, seed).
    again = MemorySink()
    converter.convert(iter(docs), ItemContext("00001", seed, "prop"), again)
    assert again.files[".tfrecord"].getvalue() == data


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURES)
@given(line=text, lower=st.booleans())
def test_token_ids_stay_inside_the_vocab_and_never_forge_special_tokens(tokenizers, line, lower):
    tok = tokenizers[lower]
    ids = tok.tokenize_ids(line)
    size = len(tok.vocab)
    assert all(0 <= i < size for i in ids)
    assert not {tok.vocab[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")} & set(ids)
    assert all(t and not any(c.isspace() for c in t) for t in tok.basic_tokens(line))
    assert tok.tokenize_lines([line, line]) == [ids, ids]


@settings(max_examples=200, deadline=None)
@given(
    sentences=st.lists(st.lists(st.integers(5, 999), max_size=40), max_size=30),
    max_length=st.integers(5, 70),
    seed=st.integers(0, 2**32),
)
def test_builder_examples_have_the_layout_whatever_the_sentences(sentences, max_length, seed):
    builder = ExampleBuilder(max_length, 2, 3, random.Random(seed))
    examples = builder.add_document(sentences)
    total = sum(map(len, sentences))
    assert bool(examples) == bool(total)
    for ex in examples:
        n, n0 = ex.length, ex.first_length
        assert len(ex.input_ids) == len(ex.input_mask) == len(ex.segment_ids) == max_length
        assert ex.input_ids[0] == 2 and ex.input_ids[n0 - 1] == 3 and ex.input_ids[n - 1] == 3
        assert ex.input_mask == [1] * n + [0] * (max_length - n)
        assert ex.segment_ids == [0] * n0 + [1] * (n - n0) + [0] * (max_length - n)
        assert ex.input_ids[n:] == [0] * (max_length - n)
    assert sum(ex.length - (2 if ex.length == ex.first_length else 3) for ex in examples) <= total


# -- vocab and input bytes ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.sampled_from(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "", " ", "中"]), max_size=12
        ).map(lambda t: "\n".join(t).encode()),
    )
)
def test_any_bytes_as_a_vocab_load_or_give_a_one_line_error(data):
    try:
        vocab = load_vocab(data, "gs://b/vocab.txt")
    except VocabError as e:
        assert str(e).startswith("gs://b/vocab.txt: ") and "\n" not in str(e)
        return
    assert vocab["[PAD]"] == 0 and {"[UNK]", "[CLS]", "[SEP]"} <= set(vocab)


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES)
@given(st.binary(max_size=120))
def test_the_job_turns_any_bad_vocab_into_a_config_error_naming_it(tmp_path_factory, data):
    path = str(tmp_path_factory.mktemp("v") / "vocab.txt")
    with open(path, "wb") as f:
        f.write(data)
    try:
        JOB.check(ElectraConfig(vocab_file=path), lambda url: open(url, "rb").read())
    except ConfigError as e:
        assert path in str(e) and "\n" not in str(e)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["x.txt", "x.jsonl", "x.txt.gz", "x.jsonl.bz2", "x.zst"]))
def test_any_bytes_as_input_give_documents_or_an_input_error(data, name):
    try:
        docs = read_all(data, name)
    except InputError as e:
        assert str(e).startswith(f"{name}: ") and "\n" not in str(e)
        return
    assert all(isinstance(line, str) for doc in docs for line in doc)


line_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n"), max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(
    lines=st.lists(st.one_of(line_text, st.just(""), st.just("  ")), max_size=60),
    target=st.integers(1, 400),
    jsonl=st.booleans(),
    final_newline=st.booleans(),
)
def test_items_cover_every_document_exactly_once(tmp_path_factory, lines, target, jsonl, final_newline):
    """Whatever the text and item size, the items' documents, in order, are the file's."""
    import json

    if jsonl:
        body = "\n".join(json.dumps({"text": line}) if line.strip() else line for line in lines)
    else:
        body = "\n".join(lines)
    data = (body + ("\n" if final_newline and body else "")).encode()
    name = "c.jsonl" if jsonl else "c.txt"
    assume(data)
    folder = str(tmp_path_factory.mktemp("cut"))
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    store = LocalStore(folder)
    ranges = plan_ranges(store, name, len(data), "jsonl" if jsonl else "text", target)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a < b for a, b, _ in ranges) and all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))
    assert_pieces_are_the_documents(data, name, ranges, target)


def assert_pieces_are_the_documents(data: bytes, name: str, ranges, target: int) -> None:
    """Read range by range, then joined again where a range ends inside a document, the
    pieces are the file's documents; and a document is cut only when it is longer than an item."""
    fmt = "jsonl" if name.endswith(".jsonl") else "text"
    merged: list[list[str]] = []
    glue = False
    for start, end, cuts in ranges:
        docs = list(iter_documents(io.BytesIO(data[start:end]), fmt, "none", name, start))
        if glue and docs and merged:
            merged[-1] = merged[-1] + docs.pop(0)
            assert sum(len(line.encode()) + 1 for line in merged[-1]) >= target
        merged += docs
        glue = cuts
        assert not (cuts and fmt == "jsonl")
    assert merged == read_all(data, name)


# -- the local store's names -----------------------------------------------------------------------

name_parts = st.one_of(
    st.sampled_from(["..", ".", "", "a", "b.txt", ".fleet-tmp-x", "~", "...", "\\", "%2e%2e"]), st.text(max_size=6)
)


@settings(max_examples=500, deadline=None, suppress_health_check=FIXTURES)
@given(parts=st.lists(name_parts, min_size=1, max_size=5), lead=st.sampled_from(["", "/", "//", "./", "../"]))
def test_a_local_store_never_resolves_a_name_outside_its_root(tmp_path_factory, parts, lead):
    root = str(tmp_path_factory.mktemp("root"))
    store = LocalStore(root)
    name = lead + "/".join(parts)
    try:
        path = store._path(name)
    except StoreError as e:
        assert "\n" not in str(e)
        return
    real = os.path.realpath(path)
    assert real.startswith(os.path.realpath(root) + os.sep), (name, real)


ESCAPES = ["../x", "a/../../x", "/etc/passwd", "..", "a/./b", "a//b", "\\..\\x", "x\x00y"]


@pytest.mark.parametrize("name", ESCAPES)
def test_every_local_store_call_refuses_an_escaping_name(tmp_path, name):
    """The contract suite covers write/read/stat/delete; the other calls and list prefixes too."""
    store = LocalStore(str(tmp_path / "root"))
    src = tmp_path / "src.bin"
    src.write_bytes(b"data")
    store.write("ok/obj", b"inside")
    for call in (
        lambda: store.read_generation(name),
        lambda: store.upload_file(name, str(src)),
        lambda: store.download_file(name, str(tmp_path / "dst.bin")),
        lambda: store.write(name, b"x", if_generation_match=0),
    ):
        with pytest.raises(StoreError):
            call()
    for prefix in (name, name + "/"):
        try:
            listed = [b.name for b in store.list(prefix)]
        except StoreError:
            continue
        assert set(listed) <= {"ok/obj"}, (prefix, listed)  # a prefix filters the store; it never leaves it
    if "/" in name:  # the folder part of an escaping prefix is refused outright
        with pytest.raises(StoreError):
            list(store.list(name))
    assert not (tmp_path / "x").exists() and not (tmp_path / "dst.bin").exists()
    assert [b.name for b in store.list()] == ["ok/obj"]

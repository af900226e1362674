"""The C unigram encoder (fleet_jobs/causal_lm/unigram.py, fleet_jobs/text/tokenizers/unigram.c) gives
``SentencePieceProcessor.encode``'s ids on any text and any model it accepts:

- on models made piece by piece, whose scores tie exactly or nearly (a near tie is decided by
  float rounding, which depends on the score the document reached: the cache must not answer
  there), deep into documents whose scores pass the library's reset at 1e5;
- on models trained with each normalizer option (the precompiled NFKC maps, case folding, kept
  whitespace, no dummy prefix, byte fallback) over random Unicode;
- it is refused for models and library versions it does not follow, and the converter writes
  the same bytes with it as with the library alone."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2 as pb

from fleet.job import ItemContext
from fleet_jobs.causal_lm import JOB, CausalLMConverter
from fleet_jobs.causal_lm import unigram as module
from fleet_jobs.causal_lm.unigram import UnigramEncoder, model_proto, unigram_encoder, why_not
from fleet_jobs.text.tokenizers import native

from tests.helpers.trained import built_once
from tests.test_lm_speedups import SPECIAL, MemorySink, read_documents

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
pytestmark = pytest.mark.skipif(native.available() is None, reason="no C core built here")


def crafted(pieces: list[tuple[str, float]], byte_fallback: bool = False, **normalizer) -> spm.SentencePieceProcessor:
    """A unigram model of these NORMAL pieces and scores, with the identity normalizer."""
    m = pb.ModelProto()
    m.trainer_spec.model_type = 1
    m.trainer_spec.byte_fallback = byte_fallback
    spec = m.normalizer_spec
    spec.name = "identity"
    spec.add_dummy_prefix = normalizer.get("add_dummy_prefix", True)
    spec.remove_extra_whitespaces = normalizer.get("remove_extra_whitespaces", True)
    spec.escape_whitespaces = normalizer.get("escape_whitespaces", True)
    m.trainer_spec.treat_whitespace_as_suffix = normalizer.get("treat_whitespace_as_suffix", False)
    special = [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)]
    if byte_fallback:
        special += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    for piece, score, kind in special + [(p, s, normalizer.get("kind", NORMAL)) for p, s in pieces]:
        entry = m.pieces.add()
        entry.piece, entry.score, entry.type = piece, score, kind
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def encoder(sp) -> UnigramEncoder:
    proto = model_proto(sp)
    assert why_not(proto, spm.__version__) is None
    return UnigramEncoder(sp, proto, native.load())


def split(ids: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    assert ids.dtype == np.int32 and counts.sum() == len(ids)
    return [part.tolist() for part in np.split(ids, np.cumsum(counts)[:-1])] if len(counts) else []


def library(sp, texts: list[str]) -> list[list[int]]:
    return sp.encode(texts, out_type=int) if texts else []


# -- models made piece by piece: ties, near ties, long documents --------------------------------

WORDS = ["a", "b", "aa", "ab", "ba", "bb", "aab", "aba", "abb", "baa", "bab", "bba", "aaa", "bbb"]
# Scores with exact ties between segmentations (integers), and near ties at every scale float
# rounding reaches: deep into a document (|score| ~ 1e5) a float's step is 2^-7.
EPSILONS = [0.0, 1e-7, 3e-7, 1e-6, 4e-6, 1e-5, 1e-4, 0.0078125, 0.01, 0.3]
scores = st.builds(
    lambda k, e, sign: -(k + sign * e), st.integers(1, 6), st.sampled_from(EPSILONS), st.sampled_from([1, -1])
)
models = st.fixed_dictionaries(
    {
        "pieces": st.dictionaries(st.sampled_from(WORDS + ["▁" + w for w in WORDS]), scores, min_size=3),
        "space": scores,
        "byte_fallback": st.booleans(),
    }
)
texts = st.lists(
    st.lists(st.sampled_from(WORDS + ["c", "é", "aac", " ", "  "]), max_size=8).map(" ".join), min_size=1, max_size=4
)


@settings(max_examples=120, deadline=None)
@given(
    model=models,
    texts=texts,
    depth=st.sampled_from([0, 1, 300, 9_000, 14_000, 40_000]),
    filler=st.sampled_from(["ab", "a b", "bba ab a"]),
)
def test_ties_and_near_ties_anywhere_in_a_document_give_the_librarys_ids(model, texts, depth, filler):
    """Each text also comes after ``depth`` words of filler: the score the document reached then
    runs from 0 past the library's reset (1e5), so every near tie meets every rounding."""
    sp = crafted([("▁", model["space"]), *model["pieces"].items()], model["byte_fallback"])
    enc = encoder(sp)
    deep = [" ".join([filler] * depth + [t]) for t in texts]
    for batch in (texts, deep, texts + deep, deep + texts):  # (the cache filled by one, asked by the next)
        assert split(*enc.encode(batch)) == library(sp, batch)


def test_a_tie_keeps_the_first_candidate_as_the_library_does():
    """ "aaa": a+aa and aa+a score the same; the library keeps the path found first."""
    sp = crafted([("▁", -1.0), ("a", -2.0), ("aa", -3.0)])
    enc = encoder(sp)
    for text in ["aaa", "b aaa aaa", "aaa " * 50]:
        assert split(*enc.encode([text])) == library(sp, [text])


def test_a_near_tie_the_library_decides_otherwise_deep_in_a_document_is_not_taken_from_the_cache():
    """ "ab" alone is ▁ + ab; after 1,650 words (the document's score near -4,100, where a
    float's step is 2^-11) the library's rounding makes it ▁ + a + b, its two paths 1e-4 apart
    (the smallest depth for such a margin among 400 random models). The word cached from the
    first document must not answer the second: a bound on rounding some 70x too lax would."""
    sa, sb = -3.802463077401336, -2.869795260177617
    sp = crafted([("▁", -1.5), ("a", sa), ("b", sb), ("ab", sa + sb + 1e-4), ("▁c", -2.5)])
    deep = " ".join(["c"] * 1650 + ["ab"])
    alone, in_deep = library(sp, ["ab"])[0], library(sp, [deep])[0][-3:]
    assert [sp.id_to_piece(i) for i in alone] == ["▁", "ab"]
    assert [sp.id_to_piece(i) for i in in_deep] == ["▁", "a", "b"]  # (the library's own rounding)
    enc = encoder(sp)
    assert split(*enc.encode(["ab", deep])) == library(sp, ["ab", deep])
    assert enc.stats()["computed"] >= 1  # the deep "ab" computed again, not looked up


def test_unknown_characters_merge_or_become_bytes_as_the_library_spells_them():
    for byte_fallback in (False, True):
        sp = crafted([("▁", -1.0), ("a", -2.0)], byte_fallback)
        enc = encoder(sp)
        batch = ["xyz a", "a éé a", "€€ x", "  ", "", "a\x00b"]
        assert split(*enc.encode(batch)) == library(sp, batch)


def test_the_cache_answers_words_it_has_seen():
    sp = crafted([("▁", -1.0), ("a", -2.0), ("b", -2.5), ("▁ab", -3.0)])
    enc = encoder(sp)
    batch = ["ab ab ba ab"] * 20
    assert split(*enc.encode(batch)) == library(sp, batch)
    stats = enc.stats()
    assert stats["added"] <= 3 and stats["hits"] >= 75


def test_a_full_cache_starts_over_and_gives_the_same_ids(monkeypatch):
    monkeypatch.setattr(module, "MAX_WORDS", 8)
    sp = crafted([("▁", -1.0), ("a", -2.0), ("b", -2.5), ("ab", -3.9), ("▁b", -2.6)])
    enc = encoder(sp)
    words = [a + b + c for a in "ab" for b in "ab" for c in ["", "a", "b", "ab", "ba"]]
    batch = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    assert split(*enc.encode(batch)) == library(sp, batch)


# -- models trained with each normalizer option, random Unicode ----------------------------------

NFKC = [
    "ﬁ",
    "ﬀ",
    "㍿",
    "①",
    "Ⅷ",
    "ｶ",
    "ｶﾞ",
    "Ａ",
    "１２",
    "™",
    "…",
    "ǆ",
    "ẞ",
    "İ",
    "Σ",
    "ς",
    "\u00a0",
    "\u3000",
    "\u200b",
    "\ufeff",
    "\u2028",
    "\x85",
    "\x7f",
    "\x01",
    "\t",
    "\r",
    "\u0301",
    "e\u0301",
    "\u1100\u1161",
    "가",
    "ㄱ",
    "\ufffd",
]
unicode_texts = st.lists(
    st.lists(
        st.one_of(
            st.sampled_from(SPECIAL + NFKC),
            st.text(max_size=6),
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=4),
        ),
        max_size=14,
    ).map("".join),
    max_size=6,
)

TRAINED = {
    "nmt_nfkc": {},
    "nfkc_cf": {"normalization_rule_name": "nmt_nfkc_cf"},
    "kept whitespace": {"remove_extra_whitespaces": False},
    "no dummy prefix": {"add_dummy_prefix": False},
    "byte fallback": {"byte_fallback": True},
    "identity": {"normalization_rule_name": "identity"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, spm.SentencePieceProcessor]:
    """The six models, trained once a session (~20 s of CPU) whichever xdist workers run these tests."""
    docs = read_documents("sample_en.txt")[:150] + read_documents("sample_zh.txt")[:150]
    lines = [line for d in docs for line in d] + ["ﬁne ｶﾞ １２ Ａ™ 가 ①"] * 20
    files = {name: f"{i}.model" for i, name in enumerate(TRAINED)}

    def train(folder: Path) -> None:
        for name, options in TRAINED.items():
            out = io.BytesIO()
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=out,
                vocab_size=900,
                minloglevel=2,
                character_coverage=0.995,
                num_threads=1,  # (its 16 threads by default cost CPU on a 2-core machine, and time nothing)
                num_sub_iterations=1,  # (a model as good a test as with two: a third less CPU)
                **options,
            )
            (folder / files[name]).write_bytes(out.getvalue())

    key = repr((spm.__version__, TRAINED, lines)).encode()
    folder = built_once(tmp_path_factory, "unigram-models", key, train)
    return {name: spm.SentencePieceProcessor(model_proto=(folder / files[name]).read_bytes()) for name in TRAINED}


@settings(max_examples=60, deadline=None)
@given(texts=unicode_texts)
@pytest.mark.parametrize("name", list(TRAINED))
def test_trained_models_give_the_librarys_ids_on_any_text(trained, name, texts):
    sp = trained[name]
    enc = encoder(sp)
    assert split(*enc.encode(texts)) == library(sp, texts)
    assert split(*enc.encode(texts)) == library(sp, texts)  # the second time from the cache


def test_trained_models_give_the_librarys_ids_on_the_sample(trained):
    docs = ["\n".join(d) for d in read_documents("sample_en.txt") + read_documents("sample_zh.txt")]
    long = "\n".join(docs * 3)  # (one document past the library's reset, many times)
    for name, sp in trained.items():
        enc = encoder(sp)
        assert split(*enc.encode(docs + [long])) == library(sp, docs + [long]), name


# -- what it refuses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda: crafted([("▁", -1.0), ("a", -2.0)], escape_whitespaces=False), "whitespace not escaped"),
        (lambda: crafted([("▁", -1.0), ("a", -2.0)], treat_whitespace_as_suffix=True), "whitespace as a suffix"),
        (lambda: crafted([("a", -2.0), ("▁a", -2.0)]), "'▁' is not a piece"),
        (lambda: crafted([("▁", -1.0), ("a▁b", -2.0)]), "a piece holds '▁' past its first character"),
        (lambda: crafted([("▁", -1.0), ("a", -2.0)], kind=USER_DEFINED), "user-defined pieces"),
    ],
)
def test_models_it_does_not_follow_are_left_to_the_library(change, reason):
    sp = change()
    assert why_not(model_proto(sp), spm.__version__) == reason
    assert unigram_encoder(sp) is None


def test_a_bpe_model_another_library_version_or_no_c_core_leave_it_to_the_library(trained, monkeypatch):
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["some words here", "and more words there"] * 50),
        model_writer=out,
        vocab_size=30,
        model_type="bpe",
        minloglevel=2,
    )
    bpe = spm.SentencePieceProcessor(model_proto=out.getvalue())
    assert why_not(model_proto(bpe), spm.__version__) == "not a unigram model" and unigram_encoder(bpe) is None
    sp = trained["nmt_nfkc"]
    assert unigram_encoder(sp) is not None
    assert why_not(model_proto(sp), "0.2.0").startswith("sentencepiece 0.2.0 (the C encoder follows ")
    monkeypatch.setattr(spm, "__version__", "0.2.0")
    assert unigram_encoder(sp) is None
    monkeypatch.setattr(spm, "__version__", module.SENTENCEPIECE[0])
    monkeypatch.setenv("FLEET_NATIVE", "0")
    assert unigram_encoder(sp) is None


def test_text_python_cannot_spell_in_utf8_goes_to_the_library(trained):
    sp = trained["nmt_nfkc"]
    enc = encoder(sp)
    texts = ["ok", "lone \ud800 surrogate"]
    try:
        expected = library(sp, texts)
    except Exception as e:  # (the library refuses it too: the same error reaches the caller)
        with pytest.raises(type(e)):
            enc.encode(texts)
    else:
        assert split(*enc.encode(texts)) == expected


@pytest.mark.parametrize("options", [{"max_seq_length": "32"}, {"output": "megatron"}])
def test_the_converter_writes_the_same_bytes_and_counts_with_the_c_encoder_as_without(
    tmp_path, trained, options, monkeypatch
):
    from fleet_jobs.causal_lm import tokenizer as tokenizer_module

    made = []
    monkeypatch.setattr(tokenizer_module, "unigram_encoder", lambda sp: made.append(unigram_encoder(sp)) or made[-1])
    path = tmp_path / "spm.model"
    path.write_bytes(trained["nmt_nfkc"].serialized_model_proto())
    config = JOB.parse_config({"tokenizer_file": str(path), **options})
    fast = JOB.document_converter(config, lambda p: open(p, "rb").read())
    assert fast.tokenizer.flat is not None and made == []  # (made by the first batch, not at load)
    plain = CausalLMConverter(config, dataclasses.replace(fast.tokenizer, flat=None))  # the library's encode
    docs = read_documents("sample_en.txt")[:40] + read_documents("sample_zh.txt")[:40] + [[""], ["  ", " x "]]
    results = []
    for converter in (fast, plain):
        sink = MemorySink()
        stats = converter.convert(iter(docs), ItemContext("i", 1, "r"), sink)
        results.append((stats, {k: v.getvalue() for k, v in sink.files.items()}, sink.counts))
    assert results[0] == results[1]
    assert results[0][0]["documents"] == len(docs)
    assert len(made) == 1 and made[0] is not None  # the C encoder ran, once

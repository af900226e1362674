"""The fast tokenizer equals BERT's FullTokenizer semantics and Hugging Face ``tokenizers``.

Two references:
- ``bert_reference`` below: BERT's algorithm spelled out character by character
  (slow, obviously right); compared on arbitrary Unicode with no filtering.
- ``tokenizers.BertWordPieceTokenizer``: compared on every line of the sample
  corpus, and on arbitrary text minus its known divergences from BERT, where
  we follow BERT:
  * it deletes private-use (Co) and unassigned (Cn) characters; BERT keeps
    them (so their word usually becomes [UNK]);
  * it lower-cases a final capital sigma to "σ"; BERT (Python) gives "ς";
  * its CJK range starts at U+2B920 where BERT's starts at U+2B820;
  * its Unicode tables are older than Python's (new marks/punctuation differ);
  * it matches "[CLS]", "[MASK]"... in raw text as special tokens; BERT splits them.
  Hence the filter: characters whose category is the same in Unicode 3.2, no Σ, no "[".
"""

from __future__ import annotations

import os
import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleet_jobs.text.tokenizers.tokenization import SPECIAL_TOKENS, BertTokenizer, VocabError, load_vocab
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, params=["native", "python"])
def tokenizer_path(request, monkeypatch):
    """Every test here runs twice: as users run it (FLEET_NATIVE unset: the C core of
    fleet_jobs/text/tokenizers/native.py when it builds) and on the Python path (FLEET_NATIVE=0).
    A tokenizer reads FLEET_NATIVE at each call, so the session-wide ones switch too."""
    if request.param == "python":
        monkeypatch.setenv("FLEET_NATIVE", "0")
    else:
        monkeypatch.delenv("FLEET_NATIVE", raising=False)


def _read(name: str) -> list[str]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8", newline="") as f:
        return f.read().split("\n")


@pytest.fixture(scope="session")
def sample_lines() -> dict[str, list[str]]:
    return {"zh": _read("sample_zh.txt"), "en": _read("sample_en.txt")}


@pytest.fixture(scope="session")
def vocabs(tmp_path_factory, sample_lines) -> dict[str, str]:
    """A full-size vocab, and a small one (few characters kept) so ## pieces and [UNK]s abound."""
    lines = sample_lines["zh"] + sample_lines["en"]
    folder = tmp_path_factory.mktemp("vocab")
    paths = {"full": str(folder / "full.txt"), "small": str(folder / "small.txt")}
    write_vocab(train_vocab(lines, 21128), paths["full"])
    write_vocab(train_vocab(lines, 1500, limit_alphabet=300), paths["small"])
    return paths


@pytest.fixture(scope="session")
def small(vocabs) -> BertTokenizer:
    return BertTokenizer.from_file(vocabs["small"])


def reference_tokenizer(vocab_path: str, lowercase: bool):
    """tokenizers' BERT pipeline with BERT's 200-character word limit (its default is 100)."""
    from tokenizers import BertWordPieceTokenizer

    reference = BertWordPieceTokenizer(vocab_path, lowercase=lowercase)
    reference._tokenizer.model.max_input_chars_per_word = 200
    return reference


@pytest.fixture(scope="session")
def reference_small(vocabs):
    return reference_tokenizer(vocabs["small"], lowercase=True)


# -- BERT, spelled out ----------------------------------------------------------

CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _cjk(c: str) -> bool:
    return any(a <= ord(c) <= b for a, b in CJK)


def _punct(c: str) -> bool:
    cp = ord(c)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or unicodedata.category(c)[0] == "P"


def bert_basic(text: str, lower: bool = True) -> list[str]:
    kept = []
    for c in text:
        cat = unicodedata.category(c)
        if c in "\x00\ufffd" or (cat in ("Cc", "Cf") and c not in "\t\n\r"):
            continue
        kept.append(" " if c in " \t\n\r" or cat == "Zs" else c)
    spaced = "".join(f" {c} " if _cjk(c) else c for c in kept)
    tokens = []
    for word in spaced.split():
        if lower:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        run = ""
        for c in word:
            if _punct(c):
                tokens += [run, c] if run else [c]
                run = ""
            else:
                run += c
        if run:
            tokens.append(run)
    return tokens


def bert_wordpiece(word: str, vocab: dict[str, int]) -> list[int]:
    if len(word) > 200:
        return [vocab["[UNK]"]]
    ids, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                ids.append(vocab[piece])
                start = end
                break
        else:
            return [vocab["[UNK]"]]
    return ids


def bert_reference(text: str, vocab: dict[str, int], lower: bool = True) -> list[int]:
    return [i for word in bert_basic(text, lower) for i in bert_wordpiece(word, vocab)]


# -- the sample corpus ------------------------------------------------------------


@pytest.mark.parametrize("size", ["full", "small"])
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_equals_tokenizers_on_every_sample_line(vocabs, sample_lines, size, lang):
    reference = reference_tokenizer(vocabs[size], lowercase=True)
    ours = BertTokenizer.from_file(vocabs[size])
    lines = sample_lines[lang]
    expected = [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]
    got = [ours.tokenize_ids(line) for line in lines]
    mismatched = [(line, e, g) for line, e, g in zip(lines, expected, got) if e != g]
    assert not mismatched[:3]
    assert ours.tokenize_lines(lines) == expected
    flat = [i for ids in got for i in ids]
    if size == "small":  # the small vocab really exercises pieces and [UNK]
        assert flat.count(ours.unk_id) > 100
        assert sum(ours.inv_vocab[i].startswith("##") for i in flat) > 1000


def test_lower_case_off_equals_tokenizers(vocabs, sample_lines):
    reference = reference_tokenizer(vocabs["full"], lowercase=False)
    ours = BertTokenizer.from_file(vocabs["full"], do_lower_case=False)
    lines = sample_lines["en"][:2000] + sample_lines["zh"][:2000] + ["Café ÜBER naïve Ⅻ"]
    expected = [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]
    assert ours.tokenize_lines(lines) == expected


def test_unk_share_on_chinese_is_tiny_with_default_size(vocabs, sample_lines):
    ours = BertTokenizer.from_file(vocabs["full"])
    ids = [i for ids in ours.tokenize_lines(sample_lines["zh"]) for i in ids]
    assert ids.count(ours.unk_id) / len(ids) < 0.001


def test_vocab_starts_with_the_special_tokens(vocabs):
    for path in vocabs.values():
        with open(path, encoding="utf-8") as f:
            assert [next(f).rstrip("\n") for _ in range(5)] == list(SPECIAL_TOKENS)


# -- arbitrary text ------------------------------------------------------------------

# Characters that stress each rule: controls, format characters, odd whitespace,
# marks, CJK (BMP, astral, compatibility ideographs that NFD maps to astral ones),
# punctuation (ASCII, full-width, astral), case oddities, private use, unassigned.
TRICKY = (
    "aZ09 .,!?'#$^`~_-\t\n\r\x00\x01\x0b\x0c\x1c\x1f\x7f\x85\xa0\xad\u200b\u200d\u2028\u2029\u3000\u202f"
    "\ufffd\ufeff\U000e0001\u0301\u0316\u0345\u20dd\u0488éÉñÑçÀ\u1e9eßİıΣσςΑΟǅǈﬀⅫ"
    "中文字你好\u3400\u9fff\U00020000\U0002b820\U0002b91f\U0002ceaf\uf900\ufa6c\U0002f800"
    "，。！？（）【】「」、：；…—·“”‘’《》％＃＠ＡＢＣａｂｃ１２３\U00010100\U0001f600"
    "ぁカ한글\ue000\U000f0000\u0378\U0010ffff"
)
texts = st.one_of(st.text(max_size=40), st.text(alphabet=TRICKY, max_size=40))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
@example("")
@example("ΟΔΟΣ ΑΣ.Β Α中Σ")
@example("\ufa6c\u0301x")
@example("a" * 101)
def test_equals_bert_reference_on_any_text(small, text):
    assert small.tokenize_ids(text) == bert_reference(text, small.vocab)
    assert small.basic_tokens(text) == bert_basic(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_lower_case_off_equals_bert_reference(vocabs, text):
    ours = BertTokenizer.from_file(vocabs["small"], do_lower_case=False)
    assert ours.tokenize_ids(text) == bert_reference(text, ours.vocab, lower=False)


def _stable(c: str) -> bool:
    """Outside tokenizers' known divergences (see the module docstring)."""
    cat = unicodedata.category(c)
    return cat not in ("Co", "Cn", "Cs") and unicodedata.ucd_3_2_0.category(c) == cat and c not in "Σ["


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_equals_tokenizers_on_any_text_outside_known_divergences(small, reference_small, text):
    text = "".join(filter(_stable, text))
    assert small.tokenize_ids(text) == reference_small.encode(text, add_special_tokens=False).ids


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, max_size=8))
def test_tokenize_lines_equals_line_by_line(small, lines):
    assert small.tokenize_lines(lines) == [small.tokenize_ids(line) for line in lines]


def test_known_divergences_follow_bert(small, reference_small):
    for text in ("abc\ue000def", "ΟΔΟΣ", "\U0002b820x", "[MASK]"):
        assert small.tokenize_ids(text) == bert_reference(text, small.vocab)
    assert reference_small.encode("[MASK]", add_special_tokens=False).ids == [small.vocab["[MASK]"]]
    assert small.tokenize("[MASK]")[0] == "["  # BERT splits it like any text


# -- edge cases -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> BertTokenizer:
    tokens = list(SPECIAL_TOKENS) + [
        "hello",
        "world",
        "cafe",
        "uber",
        "un",
        "##aff",
        "##able",
        "a",
        "##a",
        "中",
        "文",
        "，",
        "（",
        "）",
        "!",
        ",",
        "x",
    ]
    return BertTokenizer.from_bytes("\n".join(tokens) + "\n")


def test_empty_and_control_only(tiny):
    assert tiny.tokenize_ids("") == []
    assert tiny.tokenize_ids("\x00\x01\x02\x7f\u200b\ufeff\ufffd") == []
    assert tiny.tokenize_ids(" \t\r\n\u3000 ") == []
    assert tiny.tokenize_lines([]) == []
    assert tiny.tokenize_lines(["", "\x01"]) == [[], []]


def test_mixed_chinese_english(tiny):
    assert tiny.tokenize("Hello中文World，unaffable!") == [
        "hello",
        "中",
        "文",
        "world",
        "，",
        "un",
        "##aff",
        "##able",
        "!",
    ]


def test_long_words(tiny):
    assert tiny.tokenize("a" * 201) == ["[UNK]"]  # BERT's limit: 200 characters
    assert tiny.tokenize("a" * 200) == ["a"] + ["##a"] * 199
    assert tiny.tokenize("a" * 150) == ["a"] + ["##a"] * 149
    assert tiny.tokenize("x" * 3) == ["[UNK]"]  # x, then no ##x: the whole word is unknown


def test_accents_and_case(tiny):
    assert tiny.tokenize("Café ÜBER") == ["cafe", "uber"]
    assert tiny.tokenize("cafe\u0301") == ["cafe"]
    cased = BertTokenizer(tiny.vocab, do_lower_case=False)
    assert cased.tokenize("Café cafe") == ["[UNK]", "cafe"]


def test_full_width_punctuation(tiny):
    assert tiny.tokenize("（中）！") == ["（", "中", "）", "[UNK]"]
    assert tiny.basic_tokens("ｘ，ｙ") == ["ｘ", "，", "ｙ"]  # not folded to ASCII, unlike NFKC


def test_line_with_its_own_newline(tiny):
    assert tiny.tokenize_lines(["hello\nworld", "x"]) == [[5, 6], [tiny.vocab["x"]]]


def test_small_cache_gives_same_ids(vocabs, sample_lines):
    lines = sample_lines["en"][:500]
    assert BertTokenizer.from_file(vocabs["small"], cache_limit=8).tokenize_lines(lines) == BertTokenizer.from_file(
        vocabs["small"]
    ).tokenize_lines(lines)


def test_load_vocab_errors():
    with pytest.raises(VocabError, match="v.txt: the vocab file is empty"):
        load_vocab(b"", "v.txt")
    with pytest.raises(VocabError, match="missing .*CLS"):
        load_vocab(b"[PAD]\n[UNK]\n[SEP]\n", "v.txt")
    with pytest.raises(VocabError, match="not UTF-8"):
        load_vocab(b"[PAD]\n\xff\n", "v.txt")
    with pytest.raises(VocabError, match="id 0"):
        load_vocab(b"[UNK]\n[PAD]\n[CLS]\n[SEP]\n", "v.txt")
    assert load_vocab("[PAD]\r\n[UNK]\n[CLS]\n[SEP]")["[SEP]"] == 3


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, max_size=8))
def test_tokenize_flat_is_tokenize_lines_concatenated(small, lines):
    for words in (False, True):
        expected = small.tokenize_lines_words(lines) if words else small.tokenize_lines(lines)
        ids, lengths = small.tokenize_flat(lines, words)
        assert ids.tolist() == [i for line in expected for i in line]
        assert lengths.tolist() == [len(line) for line in expected]


def test_tokenize_flat_after_the_cache_was_cleared(tiny):
    tok = BertTokenizer(tiny.vocab, cache_limit=2)  # the newline entry is dropped and made again
    lines = ["hello world", "", "中文 x", "unaffable !"]
    for _ in range(3):
        ids, lengths = tok.tokenize_flat(lines)
        assert ids.tolist() == [i for line in tiny.tokenize_lines(lines) for i in line]
        assert lengths.tolist() == [2, 0, 3, 4]


def test_unicode_table_of_this_python_is_the_scan():
    """Start-up reads the character classes from a table; it must be what a scan of Unicode gives."""
    from fleet_jobs.text.tokenizers import unicode_classes

    version = unicodedata.unidata_version
    assert version in unicode_classes.TABLES, (
        f"add Unicode {version}: python -m fleet_jobs.text.tokenizers.unicode_classes"
    )
    assert unicode_classes.TABLES[version] == tuple(map(unicode_classes.to_ranges, unicode_classes.scan()))


def _marked_by_regex(text: str, cut) -> str:
    """The definition _mark_words computes with numpy: each run of 2+ CJK characters cut into
    words, a marker before every character that continues a word."""
    import re

    from fleet_jobs.text.tokenizers.tokenization import _MARK, CJK_RANGES

    cjk = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in CJK_RANGES)
    pieces = re.split(f"([{cjk}]{{2,}})", text)
    for k in range(1, len(pieces), 2):
        pieces[k] = "".join(word[0] + "".join(_MARK + c for c in word[1:]) for word in cut(pieces[k]))
    return "".join(pieces)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="中文分词测试服务器性能工具的是了我人在有这个abc 1,.\n\U00020000\U0002a6d6é", max_size=60))
@example("服务器性能测试工具 unaffordable\n中文")
def test_mark_words_marks_what_the_segmenter_joins(small, text):
    rjieba = pytest.importorskip("rjieba")
    normalized, pats = small._normalize_pats(text)
    if normalized.isascii():
        return
    assert small._mark_words(normalized, pats, rjieba.cut) == _marked_by_regex(normalized, rjieba.cut)

"""The C tokenizer core (fleet_jobs/text/tokenizers/wordpiece.c through fleet_jobs/text/tokenizers/native.py) gives exactly the
ids of the Python path, in every mode, on the sample corpus and on arbitrary Unicode; the library
the install built (setup.py) is found beside native.py and shared safely; and without it (no
compiler at install time), or with one built from another wordpiece.c, everything still works in
Python (one warning), unless FLEET_NATIVE=1 asked for native. tests/test_wheel.py builds it as
a user's pip does.

Silently different ids would cost TPU weeks: the Python path is the reference here, and
tests/test_tokenization.py checks that reference against BERT's (and runs with both paths).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleet_jobs.text.tokenizers import native
from fleet_jobs.text.tokenizers.tokenization import SPECIAL_TOKENS, WORD_CONTINUES, BertTokenizer
from fleet_jobs.text.tokenizers.vocab import train_vocab
from tests.helpers.sinks import MemorySink

ROOT = Path(__file__).resolve().parent.parent

# Entries a trained vocab never has: "##" alone (an empty continuation piece), an empty token,
# "#"/"###" (never reachable: "#" is punctuation), upper case (unreachable when lower-casing),
# a token with a space, astral and compatibility CJK, a combining mark alone and as a piece,
# a lone "\x00" (the mark of whole-word masking), tokens longer than any word may be, pieces
# longer than the heads, a duplicate (the later id wins, as in load_vocab's dict), and the
# pieces of a word of exactly the word limit.
ODD = [
    "##",
    "",
    "#",
    "###",
    "Hello",
    "HELLO",
    "a b",
    "\U0002b820",
    "##\U0002b820",
    "\U00020000",
    "\uf900",
    "\u0301",
    "##\u0301",
    "\x00",
    "ς",
    "##ς",
    "σ",
    "x" * 250,
    "##" + "y" * 40,
    "zz",
    "##zz",
    "##z",
    "z",
    "中文",
    "##文",
    "ab",
    "##ab",
    "abab",
    "qq",
    "##qq",
    "\u3000",
    "##\u3000",
    "\ue000",
    "##\ue000",
    "\U0010ffff",
    "ab",
]


def _lines(name: str) -> list[str]:
    with open(ROOT / "corpus" / name, encoding="utf-8", newline="") as f:
        return f.read().split("\n")


@pytest.fixture(scope="module")
def sample() -> dict[str, list[str]]:
    return {"zh": _lines("sample_zh.txt"), "en": _lines("sample_en.txt")}


@pytest.fixture(scope="module")
def vocabs(sample) -> dict[str, list[str]]:
    lines = sample["zh"] + sample["en"]
    small = train_vocab(lines, 1500, limit_alphabet=300)
    return {
        "full": train_vocab(lines, 21128),
        "small": small,
        "odd": list(SPECIAL_TOKENS) + [t for t in small if t not in SPECIAL_TOKENS] + ODD,
    }


def _tokenizer(tokens: list[str], **kwargs) -> BertTokenizer:
    return BertTokenizer.from_bytes("\n".join(tokens) + "\n", **kwargs)


@pytest.fixture(scope="module")
def odd(vocabs) -> BertTokenizer:
    return _tokenizer(vocabs["odd"])


def _native_on(monkeypatch, tok: BertTokenizer) -> None:
    monkeypatch.setenv("FLEET_NATIVE", "1")  # native, or fail: never a silent Python-vs-Python comparison
    assert tok._native() is not None


def all_modes(tok: BertTokenizer, lines: list[str], cut=None) -> dict:
    """Every public result the native path serves, as plain lists."""
    out = {
        "lines": tok.tokenize_lines(lines),
        "ids": [tok.tokenize_ids(line) for line in lines],
        "words": tok.tokenize_lines_words(lines),
    }
    for words in (False, True):
        ids, lengths = tok.tokenize_flat(lines, words)
        assert ids.dtype == np.int32 and lengths.dtype == np.int64
        out[f"flat{words}"] = (ids.tolist(), lengths.tolist())
    if cut is not None:
        out["words_cut"] = tok.tokenize_lines_words(lines, cut)
        ids, lengths = tok.tokenize_flat(lines, True, cut)
        out["flat_cut"] = (ids.tolist(), lengths.tolist())
    return out


def same_both_ways(monkeypatch, tok: BertTokenizer, lines: list[str], cut=None) -> dict:
    monkeypatch.setenv("FLEET_NATIVE", "0")
    python = all_modes(tok, lines, cut)
    _native_on(monkeypatch, tok)
    fast = all_modes(tok, lines, cut)
    for mode in python:
        assert fast[mode] == python[mode], mode
    return fast


# -- the sample corpus ------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", ["full", "small", "odd"])
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_every_sample_line_gives_the_same_ids(monkeypatch, vocabs, sample, vocab, lang):
    rjieba = pytest.importorskip("rjieba")
    tok = _tokenizer(vocabs[vocab])
    got = same_both_ways(monkeypatch, tok, sample[lang], rjieba.cut)
    flat = [i & (WORD_CONTINUES - 1) for line in got["words_cut"] for i in line]
    assert flat == [i for line in got["lines"] for i in line]
    assert sum(i >= WORD_CONTINUES for line in got["words_cut"] for i in line) > 1000  # flags really compared
    if vocab != "full":
        assert flat.count(tok.unk_id) > 50


def test_sample_cased_and_with_a_short_word_limit(monkeypatch, vocabs, sample):
    lines = sample["en"][:3000] + sample["zh"][:3000]
    for kwargs in ({"do_lower_case": False}, {"max_input_chars_per_word": 6}):
        same_both_ways(monkeypatch, _tokenizer(vocabs["small"], **kwargs), lines)


# -- arbitrary text ----------------------------------------------------------------------------

# Every class boundary: whitespace as re's \s has it (\x1c-\x1f, \x85, \u2028, \u3000...), CJK at
# each range's ends (astral too, U+2B820), punctuation (ASCII, full-width, astral), controls and
# format characters (dropped), combining marks, final sigma, private use, unassigned, U+10FFFF.
TRICKY = (
    "abxyzq#ab中文 \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000"
    "\x00\x01\x7f\xad\u200b\u200d\ufeff\ufffd\U000e0001\u0301\u0345\u20dd\u0488éÉİıΣσςΑΟǅﬀⅫẞ"
    "\u3400\u4dbf\u4e00\u9fff\U00020000\U0002a6df\U0002a700\U0002b73f\U0002b740\U0002b81f\U0002b820"
    "\U0002b91f\U0002ceaf\U0002ceb0\uf900\ufa6c\ufaff\U0002f800\U0002fa1f\u3001\u3002\u33ff"
    "，。！？（）「」…—“”％＃ＡＢａ１\U00010100\U0001f600\U000110bd!\"$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    "ぁカ한\ue000\U000f0000\U0010fffd\u0378\U0010ffff"
)
chars = st.one_of(st.characters(), st.sampled_from(TRICKY))
words = st.one_of(
    st.text(chars, max_size=12),
    st.text(st.sampled_from("abqz中文\u0301#"), max_size=30),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "ab", "zz", "y", "中", "é"]), st.integers(95, 260)),
)  # around the 200-character word limit
texts = st.lists(words, max_size=8).map(" ".join) | st.text(chars, max_size=40)
line_lists = st.lists(st.one_of(texts, st.sampled_from(["", " ", "\u3000\t", "\x85", "中文"])), max_size=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line_lists)
@example(["", "   ", "\u3000\u2028\x85"])
@example(["x" * 200 + " " + "x" * 201, "ab" * 100, "ab" * 100 + "a", "y" * 42])
@example(["ΣΑΣ Σ.Σ ΑΣ中Σ", "\U0002b820\U0002b81f\U0002ceb0", "\ufa6c\u0301x", "zzz qqq ##", "a\x00b 中\x00文"])
@example(["hello\nworld", "x"])  # a line holding its own newline: the line-by-line fallback
@example(["\ud800 a", "b"])  # a lone surrogate: UTF-32 cannot hold it, that call goes the Python way
def test_any_text_gives_the_same_ids(monkeypatch, odd, lines):
    rjieba = pytest.importorskip("rjieba")
    cut = rjieba.cut if not any("\ud800" <= c <= "\udfff" for line in lines for c in line) else None
    same_both_ways(monkeypatch, odd, lines, cut)


def _regex_ids(tok: BertTokenizer, text: str, words: bool) -> list[int]:
    """The Python path's ids of already normalized (and marked) text, -1 at each newline."""
    from fleet_jobs.text.tokenizers.tokenization import _patterns

    pats = _patterns(0x110000)
    found = (pats.marked_tokens_nl if words else pats.tokens_nl).findall(text)
    return (tok._word_codes if words else tok._codes).flat(found).tolist()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.one_of(chars, st.sampled_from("\x00\x00\n中\U0002b820，a")), max_size=60))
@example("\x00中\x00，\x00a\x00\x00中\x00\n\x00\U0002b820 a\x00")
def test_the_scanner_on_any_text_with_marks_anywhere(monkeypatch, odd, text):
    """The C scanner against the regexes on text as it reaches them (normalized, marked): here
    with what normalization would drop and a mark anywhere, not only before a CJK character."""
    _native_on(monkeypatch, odd)
    for words in (False, True):
        done = odd._native().run(text, native.WP_LINES | (native.WP_WORDS if words else 0), text.count("\n") + 1)
        if done is None:  # UTF-32 cannot hold a lone surrogate: the callers go the Python way
            assert any("\ud800" <= c <= "\udfff" for c in text)
            return
        ids, lengths, got = done[0].tolist(), done[1].tolist(), []
        for n in lengths:
            got += ids[:n] + [-1]
            ids = ids[n:]
        assert got[:-1] == _regex_ids(odd, text, words)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.one_of(chars, st.sampled_from("中文\U0002b820\uf900 a\n，")), max_size=60), st.randoms())
def test_marks_given_as_positions_equal_marks_in_the_text(monkeypatch, odd, text, rnd):
    """The words modes pass the C core the positions of the marks (run_marked), not the marked text."""
    from fleet_jobs.text.tokenizers.tokenization import _MARK, _class_table

    text = text.replace(_MARK, "")
    if any("\ud800" <= c <= "\udfff" for c in text):
        return
    _native_on(monkeypatch, odd)
    table = odd._native()
    cjk = [i for i, c in enumerate(text) if _class_table()[ord(c)] & native.CLS_CJK]
    marks = sorted(rnd.sample(cjk, rnd.randint(0, len(cjk))))
    marked = "".join(_MARK + c if i in set(marks) else c for i, c in enumerate(text))
    n_lines = text.count("\n") + 1
    ids, lengths = table.run(marked, native.WP_LINES | native.WP_WORDS, n_lines)
    expected = ids.tolist(), lengths.tolist()
    chars = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    ids, lengths = table.run_marked(chars, np.array(marks, np.int64), n_lines)
    assert (ids.tolist(), lengths.tolist()) == expected
    assert expected[0] == _regex_ids_lines(odd, marked)


def _regex_ids_lines(tok: BertTokenizer, marked: str) -> list[int]:
    return [i for i in _regex_ids(tok, marked, True) if i != -1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line_lists, st.sampled_from([1, 2, 3, 7, 200]))
def test_any_text_with_any_word_limit_cased_or_not(monkeypatch, vocabs, lines, limit):
    for lower in (True, False):
        tok = _tokenizer(vocabs["odd"], do_lower_case=lower, max_input_chars_per_word=limit)
        same_both_ways(monkeypatch, tok, lines)


def test_the_class_table_is_the_regexes_on_every_code_point():
    """One source for both paths: each code point alone is a token of the regex exactly as
    its class in the C table says (BMP and all-Unicode patterns, marked and not)."""
    from fleet_jobs.text.tokenizers.tokenization import _MARK, _class_table, _patterns

    table = _class_table()
    everything = np.arange(0x110000, dtype="<u4")
    everything[0xD800:0xE000] = ord("a")
    text = " ".join(everything.tobytes().decode("utf-32-le"))  # each code point between spaces
    for pats in (_patterns(0x110000), _patterns(0x10000)):
        n = pats.limit
        part = text[: 2 * n - 1] if n < 0x110000 else text
        found = np.array([ord(t) for t in pats.tokens.findall(part) if len(t) == 1 and t != " "])
        kinds = np.zeros(n, bool)
        kinds[found] = True  # every code point is its own token but whitespace
        kinds[0xD800:0xE000] = True  # (surrogates: "a" stood in for them; no class, as "a")
        assert np.array_equal(
            kinds, (table[:n] & native.CLS_WS == 0) | (table[:n] & (native.CLS_CJK | native.CLS_PUNCT) != 0)
        )
        # and the single-character branches: CJK and punctuation, never a run
        single = pats.tokens.findall(" ".join(f"{c}{c}" for c in part[::2]))
        alone = np.zeros(n, bool)
        alone[[ord(t) for t in single if len(t) == 1]] = True  # CJK and punctuation come alone, never in runs
        assert not alone[0xD800:0xE000].any() and not table[0xD800:0xE000].any()
        assert np.array_equal(alone, table[:n] & (native.CLS_CJK | native.CLS_PUNCT) != 0)
        marked = pats.marked_tokens.findall(" ".join(f"{_MARK}{c}" for c in part[::2]))
        cjk = np.zeros(n, bool)
        cjk[[ord(t[1]) for t in marked if len(t) == 2 and t[0] == _MARK]] = True
        assert np.array_equal(cjk, table[:n] & native.CLS_CJK != 0)
    assert table[0] == native.CLS_MARK


# -- finding, sharing, falling back --------------------------------------------------------------


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state as if nothing was loaded yet, and native.py's folder an empty one holding
    only copies of the C sources (as in a package installed where no compiler was)."""
    monkeypatch.setattr(native, "_LOADED", None)
    monkeypatch.setattr(native, "_WARNED", False)
    monkeypatch.delenv("FLEET_NATIVE", raising=False)
    folder = tmp_path / "text"
    folder.mkdir()
    for source in native.source_paths():
        (folder / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(native, "SOURCE", folder / "wordpiece.c")
    monkeypatch.setattr(native, "RECORDS_SOURCE", folder / "records.c")
    return folder


def test_the_installed_library_is_beside_native_py_and_built_from_its_source():
    """setup.py built it (pip install -e . in place): plain C, loaded under this Python whatever
    Python built it (abi3), carrying the sha256 of the wordpiece.c it was built from."""
    path = native.library_path()
    assert path.parent == native.SOURCE.parent and path.name.startswith("_ccore.")
    lib = ctypes.CDLL(str(path))
    assert lib.wp_abi_version() == native.ABI_VERSION
    lib.wp_source_sha256.restype = ctypes.c_char_p
    assert [p.relative_to(ROOT).as_posix() for p in native.source_paths()] == [
        "fleet_jobs/text/tokenizers/wordpiece.c",
        "fleet_jobs/text/tokenizers/unigram.c",
        "fleet/formats/tfrecord/records.c",
    ]  # setup.py's order
    sources = b"".join(p.read_bytes() for p in native.source_paths())
    assert lib.wp_source_sha256().decode() == hashlib.sha256(sources).hexdigest()
    assert native.load().path == path


def test_without_the_library_python_does_the_work_after_one_warning(fresh, monkeypatch, capsys, odd):
    expected = odd.tokenize_lines(["Hello 中文 world", "x"])
    fresh_tok = BertTokenizer(odd.vocab)
    reason = f"no _ccore.abi3.so in {fresh} (no C compiler when fleet was installed): {native.REINSTALL}"
    for _ in range(3):
        assert fresh_tok.tokenize_lines(["Hello 中文 world", "x"]) == expected
        assert BertTokenizer(odd.vocab).tokenize_flat(["Hello 中文 world"])[0].tolist() == expected[0]
    err = capsys.readouterr().err.splitlines()
    assert err == [f"fleet: {reason}: tokenizing in Python, about 3x slower"]
    assert fresh_tok._table is None
    monkeypatch.setenv("FLEET_NATIVE", "1")
    with pytest.raises(
        native.NativeError, match=re.escape(f"FLEET_NATIVE=1 but the C tokenizer is unavailable: {reason}")
    ):
        BertTokenizer(odd.vocab).tokenize_lines(["x"])
    monkeypatch.setenv("FLEET_NATIVE", "0")
    assert BertTokenizer(odd.vocab).tokenize_lines(["Hello 中文 world", "x"]) == expected
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("source", ["wordpiece.c", "unigram.c", "records.c"])
def test_a_library_built_from_another_source_is_not_loaded(fresh, source):
    """A checkout whose wordpiece.c, unigram.c or records.c changed since its last pip install -e .:
    its ids (or records) could differ."""
    built = native.library_path(Path(native.__file__).parent)
    shutil.copy2(built, fresh / built.name)
    assert native.load().path == fresh / built.name  # the same sources: it loads from there
    native._LOADED = None
    (fresh / source).write_bytes((fresh / source).read_bytes() + b"\n/* changed */\n")
    with pytest.raises(native.NativeError, match=f"{re.escape(built.name)} was built from other sources than"):
        native.load()


def test_a_file_that_is_no_library_for_this_machine_is_one_line(fresh, capsys):
    (fresh / "_ccore.abi3.so").write_bytes(b"\x7fELF but not really")
    assert native.main([]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("fleet: cannot load the C tokenizer: ") and out.err.count("\n") == 1


def test_a_bad_fleet_native_value_is_one_clear_error(monkeypatch, odd):
    monkeypatch.setenv("FLEET_NATIVE", "yes")
    with pytest.raises(native.NativeError, match="FLEET_NATIVE='yes': use 0"):
        BertTokenizer(odd.vocab).tokenize_ids("x")


def test_fleet_native_0_switches_an_existing_tokenizer_to_python(monkeypatch, odd):
    _native_on(monkeypatch, odd)
    monkeypatch.setenv("FLEET_NATIVE", "0")
    assert odd._native() is None


def test_cli_says_which_path_runs():
    """What a VM's startup.sh logs: the library's path (exit 0), or why Python (exit 1, one line)."""
    environ = {k: v for k, v in os.environ.items() if k != "FLEET_NATIVE"}
    done = subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text.tokenizers.native"],
        env={**environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and Path(done.stdout.strip()) == native.library_path(), done.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text.tokenizers.native", "build"],
        env={**environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and wrong.stderr == "usage: python -m fleet_jobs.text.tokenizers.native\n"


def test_threads_share_one_table(monkeypatch, odd, sample):
    """The C tables are read-only and each thread has its own output buffers."""
    from concurrent.futures import ThreadPoolExecutor

    _native_on(monkeypatch, odd)
    docs = [sample["en"][i : i + 3] for i in range(0, 3000, 3)] + [sample["zh"][i : i + 3] for i in range(0, 3000, 3)]
    expected = [odd.tokenize_lines(d) for d in docs]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(odd.tokenize_lines, docs)) == expected


def test_a_tokenizer_pickles_without_its_c_tables(monkeypatch, odd):
    import pickle

    _native_on(monkeypatch, odd)
    copy = pickle.loads(pickle.dumps(odd))
    assert copy._table is None and copy.tokenize_lines(["Hello 中文"]) == odd.tokenize_lines(["Hello 中文"])
    assert copy._table is not None and copy._table is not odd._table


def test_big_calls_do_not_keep_big_buffers(monkeypatch, odd):
    _native_on(monkeypatch, odd)
    odd.tokenize_lines(["x"])
    big = ["hello world " * 1000] * 200  # 2.4 M characters: over what a thread keeps
    ids, lengths = odd.tokenize_flat(big)
    assert lengths.tolist() == [len(odd.tokenize_ids(big[0]))] * 200 and len(ids) == lengths.sum()
    assert len(odd._table._local.buffers[0]) <= native.Table._KEEP


@pytest.mark.parametrize(
    "options",
    [
        {"format": "electra"},
        {"format": "bert", "whole_word_masking": True},
        {"format": "electra", "pack_documents": True},
    ],
)
def test_the_job_writes_the_same_records_either_way(monkeypatch, tmp_path, vocabs, sample, options):
    """End to end in one process (the docs' job on short documents of the sample): the same
    bytes with FLEET_NATIVE=0 and =1. bench proves it with ``fleet local`` on whole corpora."""
    from fleet_jobs.text.inputs import read_all
    from fleet.core.discovery import load_configured
    from fleet.job import ItemContext

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(vocabs["small"]) + "\n", encoding="utf-8")
    text = "".join(
        "\n".join(sample[lang][i : i + 1 + i % 3]) + "\n\n" for lang in ("zh", "en") for i in range(0, 3000, 4)
    )  # documents of 1-3 lines
    docs = read_all(text.encode(), "short.txt")
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("FLEET_NATIVE", mode)
        # (format=bert: the bert job, under the name the docs gave it)
        job, config = load_configured("electra_zh_en", {"vocab_file": str(vocab), "max_seq_length": 64, **options})
        converter = job.document_converter(config, lambda path: Path(path).read_bytes())
        sink = MemorySink()
        converter.convert(docs, ItemContext("item", 7, "short.txt"), sink)
        out[mode] = sink.files
    assert out["0"] == out["1"] and sum(map(len, out["0"].values())) > 10_000


def test_results_do_not_change_when_the_next_call_comes(monkeypatch, odd):
    """The C core writes into per-thread buffers: what a call returns must not be a view of them."""
    _native_on(monkeypatch, odd)
    ids, lengths = odd.tokenize_flat(["Hello 中文 world", "x y"])
    words_ids, words_lengths = odd.tokenize_flat(["中文 abab", "z"], True)
    kept = ids.tolist(), lengths.tolist(), words_ids.tolist(), words_lengths.tolist()
    odd.tokenize_flat(["a b c d e f g", "", "q q q", "中"] * 10)
    odd.tokenize_flat(["a b c d e f g", "", "q q q", "中"] * 10, True)
    assert (ids.tolist(), lengths.tolist(), words_ids.tolist(), words_lengths.tolist()) == kept

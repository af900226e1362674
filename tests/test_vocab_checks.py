"""Vocab files and the jobs' own command lines (issue 17: 12b, 12c, 12d, item 1's tools, invariant (e)).

Every bad vocab file or argument is one line naming it and exit 2; a vocab that loads gives
the ids BERT's ``load_vocab`` gives, with the C core and in Python.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleet.job import ConfigError
from fleet_jobs.electra_zh_en import JOB, ElectraConfig
from fleet_jobs.text.tools.cli import app
from fleet_jobs.text.tokenizers.tokenization import SPECIAL_TOKENS, BertTokenizer, VocabError, load_vocab
from tests.helpers.cli import one_line_job_error as one_line_error

DOCS = [
    "Hello world, this is English text.\nIt has two lines.",
    "第二个文档。中文和 English 混合。",
    "Another file; more words, more words.",
]
BOM = b"\xef\xbb\xbf"


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def bert_load_vocab(data: bytes) -> dict[str, int]:
    """google-research/bert's ``load_vocab``: ``readline`` (lines end at "\\n" only), each stripped."""
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for index, line in enumerate(lines):
        vocab[line.strip()] = index
    return vocab


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text("\n\n".join(DOCS) + "\n", encoding="utf-8")
    return folder / "a.txt"


@pytest.fixture(scope="module")
def vocab(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    result = run("vocab", corpus, "--size", 200, "--out", out)
    assert result.exit_code == 0, result.output
    return out


# -- 12b: --size is a bound ---------------------------------------------------------------


def test_a_size_below_what_the_corpus_needs_is_refused_not_exceeded(corpus, tmp_path):
    out = tmp_path / "v.txt"
    one_line_error(run("vocab", corpus, "--size", 3, "--out", out), "--size 3")
    assert not out.exists()
    line = one_line_error(run("vocab", corpus, "--size", 20, "--out", out), "--size 20", "needs at least")
    assert not out.exists()
    needed = int(re.search(r"needs at least (\d+) tokens", line).group(1))
    result = run("vocab", corpus, "--size", needed, "--out", out)
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == needed


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 150))
def test_the_vocab_written_never_exceeds_the_size(corpus, size):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "v.txt")
        result = run("vocab", corpus, "--size", size, "--out", out)
        if result.exit_code == 0:
            tokens = read_file(out).decode("utf-8").splitlines()
            assert tokens[:5] == list(SPECIAL_TOKENS) and len(tokens) <= size
        else:
            one_line_error(result, f"--size {size}")
            assert not os.path.exists(out)


def test_vocab_trains_on_every_document_not_a_sample(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("plain ascii words here\n\n" * 20_000 + "最后的文档\n", encoding="utf-8")  # Chinese last
    out = tmp_path / "v.txt"
    result = run("vocab", big, "--size", 100, "--min-frequency", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert {"最", "后", "的", "文", "档"} <= set(out.read_text(encoding="utf-8").splitlines())


def _told(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("wrote ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("min_frequency", [1, 2])
def test_a_vocab_smaller_than_its_size_says_why_in_one_line(corpus, tmp_path, min_frequency):
    """Issue 30: ``vocab --size 21128`` wrote 10,126 tokens and said nothing of why. Fewer tokens
    than --size is no error (exit 0, the README's first command), and one line says how many and
    which of the trainer's stops it met: with --min-frequency 1 it ran out of pairs (every word a
    token; only a bigger corpus gives more), with 2 the pairs left are seen once."""
    out = tmp_path / "v.txt"
    result = run("vocab", corpus, "--size", 21128, "--min-frequency", min_frequency, "--out", out)
    assert result.exit_code == 0, result.output
    written = len(out.read_text(encoding="utf-8").splitlines())
    line = _told(result)
    assert line.startswith(f"wrote {written} tokens to {out}, fewer than --size 21128: "), line
    if min_frequency == 1:
        assert "every word of the corpus is a token already" in line and "only a bigger corpus" in line
    else:
        assert "--min-frequency 2" in line and "a bigger corpus gives more tokens" in line
        assert "a lower --min-frequency" in line and re.search(r"the \d+ words still in pieces", line)
    full = run("vocab", corpus, "--size", 60, "--out", out)  # as many as asked: the plain line
    assert full.exit_code == 0 and _told(full) == f"wrote 60 tokens to {out}"


@settings(max_examples=15, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=8), min_size=1, max_size=60))
def test_without_a_min_frequency_the_trainer_stops_only_when_every_word_is_a_token(words):
    """What the message rests on: with --min-frequency 1, a vocab smaller than its size holds
    every word whole (words_in_pieces is 0); with 2, every word left in pieces occurs once."""
    from collections import Counter

    from fleet_jobs.text.tokenizers.vocab import train_vocab, words_in_pieces

    texts = [" ".join(words[i : i + 5]) for i in range(0, len(words), 5)]
    tokens = train_vocab(texts, 5000, min_frequency=1)
    assert len(tokens) < 5000 and words_in_pieces(tokens, texts) == 0
    tokens = train_vocab(texts, 5000, min_frequency=2)
    whole = set(tokens)
    assert all(count == 1 for word, count in Counter(words).items() if word not in whole)


# -- 12c: what each format needs of the vocab -----------------------------------------------


@pytest.mark.parametrize("name", ["electra_zh_en", "bert"])
def test_a_vocab_without_mask_is_refused_at_plan_time(tmp_path, name):
    from fleet.job import load_job

    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\n")
    job = load_job(name)
    config = job.parse_config({"vocab_file": str(no_mask)})
    with pytest.raises(ConfigError) as e:
        job.check(config, read_file)
    message = str(e.value)
    assert "\n" not in message and "no_mask.txt" in message and f"the {name} job needs a [MASK]" in message
    with pytest.raises(ConfigError):
        job.document_converter(config, read_file)


def test_causal_lm_needs_an_end_of_document_token(tmp_path):
    from fleet_jobs.causal_lm import JOB as CAUSAL, CausalLMConfig

    path = tmp_path / "v.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\n")
    CAUSAL.check(CausalLMConfig(vocab_file=str(path)), read_file)  # [SEP] ends documents
    with pytest.raises(ConfigError, match=r"eod_token: '</s>' is not in .*v\.txt"):
        CAUSAL.check(CausalLMConfig(vocab_file=str(path), eod_token="</s>"), read_file)


def test_a_repeated_special_token_is_refused_other_repeats_load_as_bert_reads_them():
    with pytest.raises(VocabError, match=r"v\.txt: \[SEP\] is on lines 4 and 6"):
        load_vocab(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n[SEP]\n", "v.txt")
    data = b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\na \n"  # published vocabs repeat a stripped token
    assert load_vocab(data) == bert_load_vocab(data) and load_vocab(data)["a"] == 7


# -- 12d: a byte order mark -----------------------------------------------------------------


def test_a_leading_bom_is_dropped_and_every_other_id_is_berts(vocab, tmp_path, corpus):
    data = read_file(vocab)
    with_bom = tmp_path / "bom.txt"
    with_bom.write_bytes(BOM + data.replace(b"\n", b"\r\n"))
    loaded, reference = load_vocab(read_file(with_bom), "bom.txt"), bert_load_vocab(read_file(with_bom))
    assert loaded["[PAD]"] == 0 and "\ufeff[PAD]" in reference  # BERT's keeps the mark in token 0
    assert {t: i for t, i in loaded.items() if i} == {t: i for t, i in reference.items() if i}
    assert loaded == load_vocab(data)
    plain = run("tokenize", "--vocab", vocab, corpus)
    marked = run("tokenize", "--vocab", with_bom, corpus)
    assert marked.exit_code == 0 and marked.stdout == plain.stdout
    JOB.check(ElectraConfig(vocab_file=str(with_bom)), read_file)


def test_the_tools_read_a_vocab_from_the_bucket_as_a_run_does(vocab, corpus, gcs_bucket, tmp_path):
    from fleet.core.store import open_store

    open_store(f"gs://{gcs_bucket}").write("vocab.txt", BOM + read_file(vocab))
    result = run("tokenize", "--vocab", f"gs://{gcs_bucket}/vocab.txt", corpus)
    assert result.exit_code == 0 and result.stdout == run("tokenize", "--vocab", vocab, corpus).stdout
    one_line_error(run("tokenize", "--vocab", f"gs://{gcs_bucket}/none.txt", corpus), "none.txt", "cannot read vocab")
    one_line_error(run("check", corpus, "--vocab", "s3://b/vocab.txt"), "s3://b/vocab.txt")
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = tmp_path / "out"
    records.mkdir()
    pq.write_table(
        pa.table({"input_ids": [[2, 5, 1, 3]], "input_mask": [[1] * 4], "segment_ids": [[0] * 4]}),
        str(records / "part-0.parquet"),
    )
    result = run("report", records, "--vocab", f"gs://{gcs_bucket}/vocab.txt")
    assert result.exit_code == 0 and "[UNK]: 50.000% of text tokens (1 of 2)" in result.stdout, result.output


def test_a_vocab_of_bare_cr_lines_says_so():
    with pytest.raises(VocabError, match="v.txt: not a BERT vocab, missing .* bare CR"):
        load_vocab(b"[PAD]\r[UNK]\r[CLS]\r[SEP]\r", "v.txt")


def test_a_tokenizer_json_with_a_bom_loads(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from fleet_jobs.causal_lm import JOB as CAUSAL, CausalLMConfig

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    path.write_bytes(BOM + tokenizer.to_str().encode())
    CAUSAL.check(CausalLMConfig(tokenizer_file=str(path)), read_file)


# -- item 1: a lone surrogate in a document ----------------------------------------------------


@pytest.fixture
def surrogate_jsonl(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = ['{"text": "a\\ud800b"}'] + [json.dumps({"text": d}, ensure_ascii=False) for d in DOCS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_vocab_skips_and_counts_a_document_with_a_lone_surrogate(surrogate_jsonl, tmp_path):
    out = tmp_path / "v.txt"
    result = run("vocab", surrogate_jsonl, "--size", 200, "--out", out)
    assert result.exit_code == 0, result.output
    assert re.search(r"bad records skipped: 1 \(first: .*s\.jsonl", result.stderr), result.stderr
    assert {"中", "文", "##o"} <= set(out.read_text(encoding="utf-8").splitlines())  # the other documents


def test_check_skips_and_counts_a_document_with_a_lone_surrogate(surrogate_jsonl, vocab):
    result = run("check", surrogate_jsonl, "--vocab", vocab)
    assert result.exit_code == 0, result.output
    assert "sample: 3 documents" in result.stdout
    assert re.search(r"bad records skipped: 1 \(first: .*s\.jsonl", result.stdout), result.stdout


# -- (e): the command lines --------------------------------------------------------------------

BAD_VOCABS = {
    "empty.txt": b"",
    "binary.txt": bytes(range(256)) * 4,
    "latin1.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncafé\n".encode("latin-1"),
    "repeated.txt": b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" * 2,
    "no_specials.txt": b"hello\nworld\n",
    "cr_only.txt": b"[PAD]\r[UNK]\r[CLS]\r[SEP]\r",
    "pad_not_first.txt": b"[UNK]\n[PAD]\n[CLS]\n[SEP]\n",
}


def bad_command_lines(tmp_path, corpus, vocab):
    """(argv, the file or option the one line must name)."""
    empty = tmp_path / "empty_folder"
    empty.mkdir(exist_ok=True)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    missing = tmp_path / "missing.txt"
    cases = []
    for name, data in BAD_VOCABS.items():
        (tmp_path / name).write_bytes(data)
        cases += [
            (["tokenize", "--vocab", tmp_path / name, corpus], name),
            (["check", corpus, "--vocab", tmp_path / name], name),
            (["report", tmp_path, "--vocab", tmp_path / name], name),
        ]
    for size in ("0", "-1", "inf", "nan", "1e400", "99999999999999", "x"):
        cases.append((["vocab", corpus, "--size", size, "--out", tmp_path / "v.txt"], "--size"))
    for option in ("--limit-alphabet", "--min-frequency"):
        cases.append((["vocab", corpus, option, "-1", "--out", tmp_path / "v.txt"], option))
    for mb in ("0", "-1", "inf", "nan"):
        cases.append((["check", corpus, "--vocab", vocab, "--mb", mb], "--mb"))
    cases += [
        (["vocab", missing, "--out", tmp_path / "v.txt"], "missing.txt"),
        (["vocab", empty, "--out", tmp_path / "v.txt"], "empty_folder"),
        (["vocab", blank, "--out", tmp_path / "v.txt"], "blank.txt"),
        (["vocab", corpus, "--out", tmp_path], str(tmp_path)),
        (["vocab"], "INPUT"),
        (["tokenize", "--vocab", missing, corpus], "missing.txt"),
        (["tokenize", "--vocab", empty, corpus], "empty_folder"),
        (["tokenize", "--vocab", vocab, empty], "empty_folder"),
        (["tokenize", corpus], "--vocab"),
        (["check", missing, "--vocab", vocab], "missing.txt"),
        (["check", empty, "--vocab", vocab], "empty_folder"),
        (["check", blank, "--vocab", vocab], "blank.txt"),
        (["check", corpus, "--vocab", vocab, "--max-seq-length", "inf"], "--max-seq-length"),
        (["check", corpus, "--vocab", vocab, "--seconds", "inf"], "--seconds"),
        (["check", corpus], "--vocab"),
        (["report", missing], "missing.txt"),
        (["report", empty], "empty_folder"),
        (["report", tmp_path, "--max-records", "0"], "--max-records"),
        (["no-such-command"], "no-such-command"),
        (["vocab", corpus, "--no-such-option"], "--no-such-option"),
    ]
    return cases


def test_every_malformed_command_line_is_one_line_and_exit_2(tmp_path, corpus, vocab):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [[2, 5, 3]]}), str(tmp_path / "part-0.parquet"))  # report gets past its files
    for argv, needle in bad_command_lines(tmp_path, corpus, vocab):
        one_line_error(run(*argv), needle)


# -- (e): any vocab file loads or is one line naming it ----------------------------------------

_TOKEN_CHARS = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc", "Cf", "Mn"))
_TOKENS = st.one_of(
    st.sampled_from(SPECIAL_TOKENS),
    st.text(_TOKEN_CHARS, max_size=6),
    st.text(_TOKEN_CHARS, min_size=1, max_size=4).map(lambda t: "##" + t),
    st.sampled_from("中文a#"),
)


@st.composite
def vocab_files(draw) -> bytes:
    """Vocab files as people have them: maybe all the specials first, then tokens with repeats,
    CRLF or CR endings, a BOM, a damaged byte; or any bytes at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    specials = list(SPECIAL_TOKENS) if draw(st.booleans()) else draw(st.lists(st.sampled_from(SPECIAL_TOKENS)))
    tokens = specials + draw(st.lists(_TOKENS, max_size=30))
    if draw(st.booleans()):  # a repeat of an earlier line
        tokens.append(draw(st.sampled_from(tokens)) if tokens else "")
    data = draw(st.sampled_from(["\n", "\r\n", "\r"])).join(tokens) + draw(st.sampled_from(["", "\n", "\r\n"]))
    raw = (BOM if draw(st.booleans()) else b"") + data.encode("utf-8")
    if raw and draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw


def _usable(data: bytes) -> bool:
    """What the job can use, by BERT's reading: UTF-8, [PAD] [UNK] [CLS] [SEP] present, [PAD] id 0 (the
    padding), no special token on two lines."""
    try:
        vocab = bert_load_vocab(data)
    except UnicodeDecodeError:
        return False
    tokens = [line.strip() for line in data.decode("utf-8").split("\n")]
    return (
        all(t in vocab for t in SPECIAL_TOKENS[:4])
        and vocab["[PAD]"] == 0
        and all(tokens.count(t) <= 1 for t in SPECIAL_TOKENS)
    )


def _ids_both_ways(tokenizer: BertTokenizer, lines: list[str]) -> list[list[int]]:
    before = os.environ.get("FLEET_NATIVE")
    try:
        os.environ["FLEET_NATIVE"] = "0"
        python = tokenizer.tokenize_lines(lines)
        os.environ.pop("FLEET_NATIVE")
        native = tokenizer.tokenize_lines(lines)
    finally:
        os.environ.pop("FLEET_NATIVE", None)
        if before is not None:
            os.environ["FLEET_NATIVE"] = before
    assert native == python
    return python


@settings(max_examples=150, deadline=None)
@given(data=vocab_files(), words=st.lists(_TOKENS, max_size=8))
def test_any_vocab_file_loads_as_bert_reads_it_or_is_one_line_naming_it(data, words):
    try:
        tokenizer = BertTokenizer.from_bytes(data, "gen/vocab.txt")
    except VocabError as e:
        assert str(e).startswith("gen/vocab.txt: ") and "\n" not in str(e)
        assert not _usable(data.removeprefix(BOM)), str(e)
        return
    reference = bert_load_vocab(data.removeprefix(BOM))
    assert tokenizer.vocab == reference and tokenizer.vocab["[PAD]"] == 0
    assert {t: i for t, i in tokenizer.vocab.items() if i} == {
        t: i for t, i in bert_load_vocab(data).items() if i
    }  # with the BOM kept, as BERT reads it: token 0 aside
    lines = [" ".join(words), "".join(words), " ".join(tokenizer.vocab)]
    for ids in _ids_both_ways(tokenizer, lines):
        assert all(i in tokenizer.inv_vocab for i in ids)


@settings(max_examples=40, deadline=None)
@given(data=vocab_files())
def test_the_tools_take_any_vocab_file_or_say_why_in_one_line(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "vocab.txt")
        with open(path, "wb") as f:
            f.write(data)
        text = os.path.join(d, "in.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("Hello 中文 world\n")
        result = run("tokenize", "--vocab", path, text)
        if result.exit_code:
            one_line_error(result, path)
        else:
            assert len(result.stdout.splitlines()) == 1


# -- item 1 as an invariant: whatever the documents hold, the tools count or say, never crash ----

_ANY_TEXT = st.text(st.characters(codec=None, categories=("L", "N", "P", "Zs", "Cc", "Cs", "Co", "Cn")), max_size=20)
_HALF = st.integers(0xD800, 0xDFFF).map(chr)
_DOCUMENT = st.one_of(_ANY_TEXT, st.tuples(_ANY_TEXT, _HALF, _ANY_TEXT).map("".join))  # (rare in text() alone)


@settings(max_examples=25, deadline=None)
@given(texts=st.lists(_DOCUMENT, min_size=1, max_size=6))
@example(texts=["\ud800\udc00", "a\udc00"])  # a pair JSON joins (good), and a lone one (bad)
def test_vocab_and_check_count_documents_with_lone_surrogates_whatever_else_they_hold(vocab, texts):
    # What the file says once read: JSON joins an escaped high and low surrogate into one character
    # ("\ud800\udc00" is U+10000, a good document); only what stays lone is bad.
    bad = sum(any("\ud800" <= c <= "\udfff" for c in json.loads(json.dumps(t))) for t in texts)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "docs.jsonl")
        with open(path, "w", encoding="ascii") as f:  # json's escapes: "\ud800" is valid JSON
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        vocab_out = os.path.join(d, "v.txt")
        results = {"vocab": run("vocab", path, "--size", 500, "--min-frequency", 1, "--out", vocab_out)}
        results["check"] = run("check", path, "--vocab", vocab_out if os.path.exists(vocab_out) else vocab)
        for name, result in results.items():
            if result.exit_code:
                one_line_error(result, "docs.jsonl")
                continue
            said = re.search(r"bad records skipped: (\d+) \(first: [^\n]*docs\.jsonl", result.output)
            assert (int(said.group(1)) if said else 0) == bad, (name, result.output)


# -- (e) as an invariant: any command line built from the commands' own options --------------------

_NUMBERS = st.sampled_from(
    ["0", "-1", "1", "5", "128", "inf", "-inf", "nan", "1e400", "0.5", "", "x", "99999999999999999999"]
)
_OPTIONS = {
    "vocab": ["--size", "--limit-alphabet", "--min-frequency", "--out"],
    "tokenize": ["--vocab"],
    "check": ["--vocab", "--max-seq-length", "--mb", "--seconds", "--text-column"],
    "report": ["--vocab", "--max-records", "--png"],
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_command_line_exits_0_or_says_why_in_one_line(tmp_path_factory, corpus, vocab, data):
    d = tmp_path_factory.mktemp("argv")
    (d / "empty.txt").write_bytes(b"")
    (d / "binary.bin").write_bytes(bytes(range(256)))
    (d / "folder").mkdir()
    paths = [
        str(corpus),
        str(vocab),
        str(d / "empty.txt"),
        str(d / "binary.bin"),
        str(d / "folder"),
        str(d / "missing.txt"),
        str(d / "folder" / "out.txt"),
        str(d / "no" / "out.txt"),
        "",
    ]
    command = data.draw(st.sampled_from(sorted(_OPTIONS)))
    argv = [command, *data.draw(st.lists(st.sampled_from(paths), max_size=2))]
    for option in data.draw(st.lists(st.sampled_from(_OPTIONS[command]), max_size=3, unique=True)):
        argv += [option, data.draw(st.one_of(_NUMBERS, st.sampled_from(paths)))]
    here = os.getcwd()
    os.chdir(d)  # (a number given as --out or --png is a file name here)
    try:
        result = run(*argv)
    finally:
        os.chdir(here)
    assert result.exit_code in (0, 2), (argv, result.output)
    assert "Traceback" not in result.output, (argv, result.output)
    if result.exit_code == 2:
        one_line_error(result)

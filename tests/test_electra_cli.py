"""python -m fleet_jobs.text (the text tools, once electra_zh_en's): vocab and tokenize, and their one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fleet_jobs.text.tools.cli import app
from fleet_jobs.text.tokenizers.tokenization import SPECIAL_TOKENS, BertTokenizer
from tests.helpers.cli import one_line_job_error as one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_A = "Hello world, this is English text.\nIt has two lines.\n\n第二个文档。中文和 English 混合。\n"
TEXT_B = "Another file; more words, more words.\n\n\n最后一个文档\n"


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(TEXT_A, encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(TEXT_B, encoding="utf-8")
    (folder / ".hidden.txt").write_bytes(b"\xff not utf-8, and skipped\n")
    (folder / "c.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": "压缩的文档\nzipped"}).encode() + b"\n"))
    return folder


@pytest.fixture
def vocab(tmp_path, corpus):
    out = tmp_path / "vocab.txt"
    result = run("vocab", corpus, "--size", 300, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_vocab_from_a_folder(vocab):
    tokens = vocab.read_text(encoding="utf-8").split("\n")
    assert tokens[:5] == list(SPECIAL_TOKENS) and tokens[-1] == ""
    assert {"中", "文", "h", "##o", "压"} <= set(tokens)


def test_vocab_errors(tmp_path, corpus):
    one_line_error(run("vocab", tmp_path / "missing.txt", "--out", tmp_path / "v.txt"), "missing.txt")
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\n\xfe\n")  # most lines bad: not text at all
    one_line_error(run("vocab", tmp_path / "bad.txt", "--out", tmp_path / "v.txt"), "bad.txt")
    (tmp_path / "one_bad.txt").write_bytes(b"fine\n\xff\n")  # one bad line costs itself, counted
    result = run("vocab", tmp_path / "one_bad.txt", "--out", tmp_path / "v.txt")
    assert result.exit_code == 0 and "bad records skipped: 1" in result.output and "one_bad.txt" in result.output
    one_line_error(run("vocab", corpus, "--out", tmp_path / "no" / "v.txt"), "v.txt")


def test_tokenize_prints_ids_per_non_blank_line(tmp_path, vocab):
    text = "Hello world!\n\n   \n中文 English\n\x01\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    result = run("tokenize", "--vocab", vocab, tmp_path / "in.txt")
    assert result.exit_code == 0, result.output
    tokenizer = BertTokenizer.from_file(str(vocab))
    expected = [tokenizer.tokenize_ids(line) for line in text.split("\n") if line.strip()]
    assert [json.loads(line) for line in result.stdout.splitlines()] == expected
    assert expected[2] == [] and all(expected[:2])


def test_tokenize_errors(tmp_path, vocab):
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    one_line_error(run("tokenize", "--vocab", tmp_path / "nov.txt", tmp_path / "in.txt"), "nov.txt")
    (tmp_path / "bad_vocab.txt").write_text("hello\nworld\n", encoding="utf-8")
    one_line_error(run("tokenize", "--vocab", tmp_path / "bad_vocab.txt", tmp_path / "in.txt"), "bad_vocab.txt")
    one_line_error(run("tokenize", "--vocab", vocab, tmp_path / "none.txt"), "none.txt")
    (tmp_path / "latin1.txt").write_bytes("ok\ncafé\n".encode("latin-1"))
    one_line_error(run("tokenize", "--vocab", vocab, tmp_path / "latin1.txt"), "latin1.txt", "line 2")


def test_module_entry_point(tmp_path, vocab):
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text", "tokenize", "--vocab", str(vocab), str(tmp_path / "in.txt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout) == BertTokenizer.from_file(str(vocab)).tokenize_ids("hello")
    bad = subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text", "tokenize", "--vocab", "nope.txt", str(tmp_path / "in.txt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: nope.txt: cannot read vocab (No such file or directory)"
    ]


def test_the_tools_former_place_forwards(tmp_path, vocab):
    """``python -m fleet_jobs.electra_zh_en`` (the tools' place before issue 31) still runs them, for
    scripts written then: the same ids as ``python -m fleet_jobs.text``."""
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=ROOT)
    old = subprocess.run(
        [sys.executable, "-m", "fleet_jobs.electra_zh_en", "tokenize", "--vocab", str(vocab), str(tmp_path / "in.txt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert old.returncode == 0 and json.loads(old.stdout) == BertTokenizer.from_file(str(vocab)).tokenize_ids("hello")

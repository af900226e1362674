"""causal_lm's SentencePiece and tiktoken tokenizers: each document's ids are the library's own
``encode`` of its text (held-out documents, through ``fleet local``, read back from TFRecord and
Parquet), followed by the end-of-document id; the file is pinned in run.json; bad files are one
line at plan time (exit 2)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.job import ConfigError
from fleet_jobs.causal_lm import JOB, CausalLMConfig
from fleet_jobs.text.tokenizers.tiktoken_file import KNOWN, parse_ranks
from fleet_jobs.text.tokenizers.tokenizer_cache import tokenizer_kind
from tests.helpers.records import folder_examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[list[str]]]:
    """Training documents, and held-out ones (cut into short documents, so many boundaries)."""
    en, zh = read_documents("sample_en.txt"), read_documents("sample_zh.txt")
    held = [lines[i : i + 2] for d in en[60:66] + zh[60:66] for lines in [d] for i in range(0, min(len(lines), 40), 2)]
    return {"train": en[:40] + zh[:40], "held_out": held}


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory, corpus) -> str:
    """A SentencePiece unigram model of 2000 pieces trained on the sample (a few seconds)."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for d in corpus["train"] for line in d]),
        model_writer=out,
        vocab_size=2000,
        minloglevel=2,
        num_threads=1,
    )
    path = tmp_path_factory.mktemp("sp") / "spm.model"
    path.write_bytes(out.getvalue())
    return str(path)


def byte_level_ranks(documents) -> dict[bytes, int]:
    """tiktoken ranks from a byte-level BPE that ``tokenizers`` trains: the 256 bytes, then each
    merge's token in merge order (tiktoken merges by the rank of the result)."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(("\n".join(d) for d in documents), vocab_size=1500, show_progress=False)
    char_byte = gpt2_byte_of_char()
    ranks = {bytes([b]): b for b in range(256)}
    for merge in json.loads(tokenizer.to_str())["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(char_byte[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    return ranks


def gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: the character a byte-level BPE writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def write_ranks(path, ranks: dict[bytes, int]) -> str:
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda x: x[1])))
    return str(path)


@pytest.fixture(scope="module")
def ranks_path(tmp_path_factory, corpus) -> str:
    return write_ranks(tmp_path_factory.mktemp("tiktoken") / "tiny.tiktoken", byte_level_ranks(corpus["train"]))


def fleet_local(inputs, out, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", "local", *inputs, str(out), "--job", "causal_lm", "--workers", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def documents_file(tmp_path, documents) -> str:
    path = tmp_path / "in" / "docs.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return str(path)


def real_ids(rows) -> list[int]:
    return [i for r in rows for i, m in zip(r["input_ids"], r["attention_mask"]) if m]


def test_sentencepiece_ids_are_sp_encode_of_each_document_then_its_eos(tmp_path, sp_model, corpus):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=sp_model)
    held = corpus["held_out"]
    proc = fleet_local(
        [documents_file(tmp_path, held)],
        tmp_path / "out",
        "--set",
        f"tokenizer_file={sp_model}",
        "--set",
        "max_seq_length=48",
    )
    assert proc.returncode == 0, proc.stderr
    expected = [i for d in held for i in (*sp.encode("\n".join(d)), sp.eos_id())]
    assert real_ids(folder_examples(str(tmp_path / "out"))) == expected
    with open(tmp_path / "out" / ".fleet" / "runs" / "local" / "run.json") as f:
        run = json.load(f)
    with open(sp_model, "rb") as f:
        assert run["files"] == {"tokenizer_file": "sha256:" + hashlib.sha256(f.read()).hexdigest()}


def test_tiktoken_ids_are_encode_of_each_document_then_the_eod_token(tmp_path, ranks_path, corpus):
    import tiktoken

    from fleet_jobs.text.tokenizers.tiktoken_file import CL100K_PATTERN

    with open(ranks_path, "rb") as f:
        ranks = parse_ranks(f.read(), ranks_path)
    eod = len(ranks)
    enc = tiktoken.Encoding("t", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eod})
    held = corpus["held_out"] + [["a page that quotes <|endoftext|> as text"]]
    proc = fleet_local(
        [documents_file(tmp_path, held)],
        tmp_path / "out",
        "--set",
        f"tokenizer_file={ranks_path}",
        "--set",
        f"tiktoken_special_tokens=<|endoftext|>={eod}",
        "--set",
        "max_seq_length=48",
        "--set",
        "output=parquet",
    )
    assert proc.returncode == 0, proc.stderr
    got = real_ids(folder_examples(str(tmp_path / "out")))
    # The text's own "<|endoftext|>" is text: the only end-of-document ids are those the job put.
    expected = [i for d in held for i in (*enc.encode("\n".join(d), disallowed_special=()), eod)]
    assert got == expected and got.count(eod) == len(held)
    assert enc.decode(got[: got.index(eod)]) == "\n".join(held[0])


def test_the_kind_comes_from_the_name_then_the_content_then_the_option(tmp_path, sp_model, ranks_path):
    with open(ranks_path, "rb") as f:
        ranks = f.read()
    with open(sp_model, "rb") as f:
        model = f.read()
    assert tokenizer_kind("a/tokenizer.model", ranks) == "tiktoken"  # as Llama 3 names its tiktoken file
    assert tokenizer_kind("gs://b/spm.model", model) == "sentencepiece"
    assert tokenizer_kind("gs://b/spm", model) == "sentencepiece"
    assert tokenizer_kind("x/tokenizer.json", b"{}") == tokenizer_kind("x/tok", b' {"model": 1}') == "json"
    assert tokenizer_kind("x/tok.bin", ranks, "sentencepiece") == "sentencepiece"

    # Read through the job's opener: a gs:// URL works as a path does.
    objects = {"gs://b/llama/tokenizer.model": ranks, "gs://b/spm.model": model}
    config = CausalLMConfig(
        tokenizer_file="gs://b/llama/tokenizer.model", tiktoken_special_tokens="<|end_of_text|>=9999"
    )
    assert JOB.document_converter(config, objects.__getitem__).tokenizer.eod_id == 9999
    assert JOB.document_converter(CausalLMConfig(tokenizer_file="gs://b/spm.model"), objects.__getitem__)


def test_bad_tokenizer_files_are_one_line_naming_the_file_or_option(tmp_path, sp_model, ranks_path):
    import sentencepiece as spm

    (tmp_path / "bad.model").write_bytes(b"\x00\x01 not a model")
    lines = open(ranks_path, "rb").read().splitlines(keepends=True)
    (tmp_path / "bad.tiktoken").write_bytes(b"".join(lines[:7]) + b"IQ== x\n" + b"".join(lines[7:]))
    (tmp_path / "dup.tiktoken").write_bytes(b"".join(lines) + lines[3])
    no_eos = tmp_path / "no_eos.model"
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["some words here", "and more words there"] * 50),
        model_writer=out,
        vocab_size=15,
        eos_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    no_eos.write_bytes(out.getvalue())
    tk = str(tmp_path / "ok.tiktoken")
    with open(tk, "wb") as f:
        f.write(b"".join(lines))
    cases = {
        "bad.model: not a SentencePiece model": CausalLMConfig(tokenizer_file=str(tmp_path / "bad.model")),
        "bad.tiktoken: line 8 is not 'base64-token rank'": CausalLMConfig(
            tokenizer_file=str(tmp_path / "bad.tiktoken")
        ),
        "dup.tiktoken: line": CausalLMConfig(tokenizer_file=str(tmp_path / "dup.tiktoken")),
        "ok.tiktoken: no end-of-document token": CausalLMConfig(tokenizer_file=tk),
        "no_eos.model: no end-of-document token": CausalLMConfig(tokenizer_file=str(no_eos)),
        "option eod_token: '<eot>' is not in": CausalLMConfig(tokenizer_file=sp_model, eod_token="<eot>"),
        "option tiktoken_special_tokens: 'eot' is not TOKEN=ID": CausalLMConfig(
            tokenizer_file=tk, tiktoken_special_tokens="eot"
        ),
        "has the id of a token of": CausalLMConfig(tokenizer_file=tk, tiktoken_special_tokens="<|endoftext|>=5"),
        "option tiktoken_pattern: tiktoken refuses": CausalLMConfig(
            tokenizer_file=tk, tiktoken_pattern="(", tiktoken_special_tokens="<|endoftext|>=99999"
        ),
        "apply to a .tiktoken file": CausalLMConfig(tokenizer_file=sp_model, tiktoken_pattern=r"\w+"),
        "option tokenizer_type: 'bpe'": CausalLMConfig(tokenizer_file=sp_model, tokenizer_type="bpe"),
    }
    for message, config in cases.items():
        with pytest.raises(ConfigError, match=message) as e:
            JOB.check(config, lambda p: open(p, "rb").read())
        assert "\n" not in str(e.value)

    # Through the CLI: at plan time, exit 2, the one line.
    text = documents_file(tmp_path, [["hello"]])
    for bad in ("bad.model", "bad.tiktoken"):
        proc = fleet_local([text], tmp_path / f"out-{bad}", "--set", f"tokenizer_file={tmp_path / bad}")
        assert proc.returncode == 2 and bad in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / f"out-{bad}" / "summary.json").exists()


def test_the_known_encodings_are_tiktokens_own(monkeypatch):
    """The table of OpenAI's files (by sha256) holds what tiktoken's own constructors give them."""
    import tiktoken_ext.openai_public as public

    seen = {}
    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda url, expected_hash: seen.setdefault("hash", expected_hash))
    for name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        seen.clear()
        spec = public.ENCODING_CONSTRUCTORS[name]()
        known = KNOWN[seen["hash"]]
        assert (known.name, known.pattern, known.special_tokens) == (name, spec["pat_str"], spec["special_tokens"])


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=30, unique=True), bad=st.integers(0, 29)
)
def test_a_ranks_file_parses_back_to_its_ranks_and_a_bad_line_is_named(tokens, bad):
    ranks = {t: i for i, t in enumerate(tokens)}
    lines = [base64.b64encode(t) + b" %d" % r for t, r in ranks.items()]
    assert parse_ranks(b"\n".join(lines) + b"\n", "f.tiktoken") == ranks
    bad %= len(lines)
    lines[bad] = lines[bad].replace(b" ", b"\t")
    with pytest.raises(ConfigError, match=f"f.tiktoken: line {bad + 1} "):
        parse_ranks(b"\n".join(lines), "f.tiktoken")

"""causal_lm frames each document as its tokenizer frames a text (issue 33, item 1): a
``tokenizer.json``'s post-processor (Llama's ``<s>`` before; BERT's ``[CLS]``/``[SEP]`` around)
is in the ids, as ``tokenizer(text)`` gives them, and ``eod=auto|always|never`` says whether the
end-of-document id follows. Held against the ``tokenizers`` library on every document, through a
whole ``fleet local`` run read back by megatron-core's reader."""

from __future__ import annotations

import glob
import io
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from fleet.cli.local import run_local
from fleet.formats.token_files import INDEX_SUFFIXES, read_sequences
from fleet.job import ConfigError, StageOptions
from fleet_jobs.causal_lm import JOB
from fleet_jobs.causal_lm.blocks import BlockCutter, BlockOptions, framed
from fleet_jobs.causal_lm.provenance import BlockSources
from fleet_jobs.causal_lm.tokenizer import post_processor_frame

WORDS = [f"w{i}" for i in range(50)] + ["hello", "world", "a", "x", "y", "1", ".", "\n"]
SPECIALS = ["<unk>", "<s>", "</s>", "[CLS]", "[SEP]", "<|endoftext|>"]


def _tokenizer(template: str | None) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    for t in SPECIALS:
        tok.add_special_tokens([t])
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, vocab[t]) for t in SPECIALS if t in template]
        )
    return tok


TEMPLATES = {"plain": None, "llama": "<s> $A", "bert": "[CLS] $A [SEP]"}


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("framing")
    paths = {}
    for name, template in TEMPLATES.items():
        paths[name] = str(folder / f"{name}.json")
        _tokenizer(template).save(paths[name])
    return paths


DOCUMENTS = [
    ["hello world", "w1 w2 w3"],
    ["a"],
    ["w7 " * 40],
    ["x y", "1 ."],
]


def _expected(template: str | None, eod: str) -> list[list[int]]:
    """What the library gives for each document's text (lines joined by newlines), then the
    end-of-document id by the option's rule, the eod token being each template's default."""
    tok = _tokenizer(template)
    ends_itself = bool(template) and not template.rstrip().endswith("$A")
    eod_id = tok.token_to_id("<|endoftext|>")  # the first of EOD_CANDIDATES in this vocab
    out = []
    for lines in DOCUMENTS:
        ids = tok.encode("\n".join(lines)).ids
        if eod == "always" or (eod == "auto" and not ends_itself):
            ids = ids + [eod_id]
        out.append(ids)
    return out


def _run_sequences(tmp_path, path: str, eod: str) -> list[list[int]]:
    corpus = tmp_path / "in.txt"
    corpus.write_text("".join("\n".join(d) + "\n\n" for d in DOCUMENTS), encoding="utf-8")
    console = Console(file=io.StringIO(), width=200)
    out = tmp_path / f"out-{eod}"
    result = run_local(
        [str(corpus)],
        str(out),
        "causal_lm",
        1,
        {"tokenizer_file": path, "output": "tokens", "eod": eod},
        console=console,
        stage_options=StageOptions(),
        lease_ttl=20,
    )
    assert result.exit_code == 0, console.file.getvalue()
    got = []
    for prefix in sorted(p[:-4] for p in glob.glob(os.path.join(str(out), "part-*.bin"))):
        index = open(prefix + INDEX_SUFFIXES["tokens"], "rb").read()
        got += [s.tolist() for s in read_sequences(prefix + ".bin", index, "tokens", len(SPECIALS) + len(WORDS))]
    return got


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("eod", ["auto", "always", "never"])
def test_each_document_is_what_the_tokenizer_gives_for_it_then_eod_by_the_option(tmp_path, tokenizer_files, name, eod):
    assert _run_sequences(tmp_path, tokenizer_files[name], eod) == _expected(TEMPLATES[name], eod)


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class _Framer:
    """A tokenizer whose post-processor does ``frame(own ids)``: what post_processor_frame reads."""

    def __init__(self, frame):
        self.frame = frame

    def encode(self, text, add_special_tokens=True):
        own = [ord(c) for c in text]
        return _Encoding(self.frame(own) if add_special_tokens else own)


@pytest.mark.parametrize(
    "frame, message",
    [
        (lambda own: own[::-1], "its post-processor changes a text's own ids"),
        (lambda own: [1] * len(own) + own, "its post-processor frames texts differently"),
    ],
)
def test_a_post_processor_that_is_not_a_fixed_frame_is_refused_in_one_line(frame, message):
    with pytest.raises(ConfigError, match=message) as e:
        post_processor_frame(_Framer(frame), "t.json")
    assert str(e.value).startswith("t.json: ") and "\n" not in str(e.value)


def test_a_fixed_frame_is_read_off_the_probes():
    assert post_processor_frame(_Framer(lambda own: [1, 2] + own + [3]), "t.json") == ((1, 2), (3,))
    assert post_processor_frame(_Framer(lambda own: own), "t.json") == ((), ())


def test_eod_takes_auto_always_or_never(tokenizer_files):
    config = JOB.parse_config({"tokenizer_file": tokenizer_files["plain"], "eod": "sometimes"})
    with pytest.raises(ConfigError, match=r"^option eod: 'sometimes' is not supported \(known: auto, always, never\)$"):
        JOB.check(config, lambda p: open(p, "rb").read())


# -- the frame itself, any ids, any frame ------------------------------------------------------------

frames = st.lists(st.integers(1000, 1010), max_size=3)


@given(st.lists(st.lists(st.integers(0, 99), max_size=9), max_size=8), frames, frames)
@settings(max_examples=200)
def test_framed_puts_head_and_tail_around_every_document_with_ids(docs, head, tail):
    ids = np.array([i for d in docs for i in d], np.int32)
    stream, lengths = framed(ids, [len(d) for d in docs], head, tail)
    expected = [head + d + tail for d in docs if d]
    assert lengths.tolist() == [len(e) for e in expected]
    assert stream.tolist() == [i for e in expected for i in e]


@given(
    st.lists(st.lists(st.integers(0, 99), min_size=0, max_size=30), max_size=10),
    frames,
    frames,
    st.integers(2, 12),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=200)
def test_blocks_and_their_provenance_agree_whatever_the_frame(docs, head, tail, size, pack, pad):
    """BlockSources knows the blocks from the lengths alone: with a frame of any width too."""
    opts = BlockOptions(size, 1000, 999, "pad" if pad else "drop", pack, tuple(head), tuple(tail))
    cutter, sources = BlockCutter(opts), BlockSources(opts)
    blocks = cutter.add(docs)
    traced = sources.add([len(d) for d in docs], list(range(len(docs))))
    tail_blocks = cutter.finish()
    assert len(blocks) == len(traced)
    assert len(tail_blocks) == len(sources.finish())
    real = [i for row, n in zip(blocks.ids, blocks.lengths) for i in row[:n]] + [
        i for row, n in zip(tail_blocks.ids, tail_blocks.lengths) for i in row[:n]
    ]
    stream = [i for d in docs if d for i in head + d + tail]
    if pad:
        assert real == stream  # every id of every framed document, in order


@given(st.lists(st.sampled_from(WORDS[:-1] + ["zzz"]), max_size=12), st.sampled_from(sorted(TEMPLATES)))
@settings(max_examples=150)
def test_the_frame_read_off_the_probes_is_the_one_every_text_gets(words, name):
    """The invariant the Llama bug broke: a text's own ids inside the probed frame are
    ``tokenizer(text).ids``, for any text, not only the probes."""
    tok = _tokenizer(TEMPLATES[name])
    head, tail = post_processor_frame(tok, name)
    text = " ".join(words)
    assert list(head) + tok.encode(text, add_special_tokens=False).ids + list(tail) == tok.encode(text).ids

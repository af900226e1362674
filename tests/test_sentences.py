"""The sentence splitter behind the split_sentences option (issue 11): Chinese and English rules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_jobs.text.sentences import split_lines, split_sentences


@pytest.mark.parametrize(
    "line, expected",
    [
        # Chinese: 。！？ and their kin end a sentence whatever follows
        ("今天天气很好。我们去公园吧！你来吗？", ["今天天气很好。", "我们去公园吧！", "你来吗？"]),
        ("真的吗？！当然。", ["真的吗？！", "当然。"]),
        ("半角句号｡然后", ["半角句号｡", "然后"]),
        ("他说：“好。”然后走了。", ["他说：“好。”", "然后走了。"]),
        ("「走吧。」他说。", ["「走吧。」", "他说。"]),
        ("（这是括号里的话。）下一句。", ["（这是括号里的话。）", "下一句。"]),
        ("第一句。 第二句。", ["第一句。", "第二句。"]),
        ("中文里的半角问号?接着说", ["中文里的半角问号?", "接着说"]),
        ("中文里的半角句号.接着说", ["中文里的半角句号.", "接着说"]),
        ("他走了……我不知道。", ["他走了……我不知道。"]),  # …… is not an end
        ("前半句；后半句。", ["前半句；后半句。"]),  # ； is not an end
        ("等等……。然后呢？！", ["等等……。", "然后呢？！"]),  # …… then a full stop: the stop ends it
        ("你好!？我很好", ["你好!？", "我很好"]),
        ("Python 3.14 版本发布。它很快。", ["Python 3.14 版本发布。", "它很快。"]),
        ("这是中文。This is English. 又是中文。", ["这是中文。", "This is English.", "又是中文。"]),
        ("Hello!你好", ["Hello!", "你好"]),
        # English
        ("This is one. This is two! Is this three? Yes.", ["This is one.", "This is two!", "Is this three?", "Yes."]),
        ("Mr. Smith met Dr. Jones at St. Paul's.", ["Mr. Smith met Dr. Jones at St. Paul's."]),
        ("Mrs. Brown and Prof. White vs. Gen. Grant.", ["Mrs. Brown and Prof. White vs. Gen. Grant."]),
        ("Fruit, e.g. Apples and pears, i.e. Food.", ["Fruit, e.g. Apples and pears, i.e. Food."]),
        ("He lives in the U.S. He likes it.", ["He lives in the U.S. He likes it."]),  # dotted: kept (conservative)
        ("She has a Ph.D. From Harvard.", ["She has a Ph.D. From Harvard."]),
        ("Pi is 3.14 roughly. Then e is 2.718.", ["Pi is 3.14 roughly.", "Then e is 2.718."]),
        (
            "J. R. R. Tolkien wrote it. George W. Bush read it.",
            ["J. R. R. Tolkien wrote it.", "George W. Bush read it."],
        ),
        ("Wait... What was that?", ["Wait... What was that?"]),
        ("Wait… What was that?", ["Wait… What was that?"]),
        ("See Fig. 3 and No. 5 in vol. 2. The end.", ["See Fig. 3 and No. 5 in vol. 2.", "The end."]),
        ("1. Introduction to the topic", ["1. Introduction to the topic"]),
        ("It was built in 1990. The rest followed.", ["It was built in 1990.", "The rest followed."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ('"Stop!" he said. "Why?" she asked.', ['"Stop!" he said.', '"Why?" she asked.']),
        ("Really?! Yes. (Quite so.) Fine.", ["Really?!", "Yes.", "(Quite so.)", "Fine."]),
        (
            "Yahoo! is a company. Its site is example.com. It is old.",
            ["Yahoo! is a company.", "Its site is example.com.", "It is old."],
        ),
        ("It was 5 p.m. Then it was late.", ["It was 5 p.m. Then it was late."]),
        ("Apple Inc. Makes phones.", ["Apple Inc.", "Makes phones."]),
        ("lower case after a stop. does not split", ["lower case after a stop. does not split"]),
        ("Smith et al. Found it.", ["Smith et al. Found it."]),
        ("Why? 42 is the answer.", ["Why?", "42 is the answer."]),
        ("Size 3. 5 more.", ["Size 3. 5 more."]),  # a digit after a full stop does not start a sentence
        ("Élan. Über alles.", ["Élan.", "Über alles."]),
        # no end mark, blanks
        ("no end mark here", ["no end mark here"]),
        ("  padded line.  ", ["padded line."]),
        ("", []),
        ("   ", []),
        ("。", ["。"]),
        ("...", ["..."]),
    ],
)
def test_split(line, expected):
    assert split_sentences(line) == expected


def test_split_lines_keeps_the_document_together():
    assert split_lines(["一。二。", "Three. Four.", "", "five"]) == ["一。", "二。", "Three.", "Four.", "five"]


def _squeeze(s: str) -> str:
    return re.sub(r"\s+", "", s)


_ALPHABET = st.sampled_from(list("abcXYZ 12.!?。！？…“”\"'()「」（）中文字 \t") + ["Mr", "U.S.", "e.g.", "3.14"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_nothing_lost_nothing_empty_and_idempotent(line):
    pieces = split_sentences(line)
    assert _squeeze("".join(pieces)) == _squeeze(line)
    pos = 0  # the line is the pieces in order with only whitespace between them: nothing else goes
    for piece in pieces:
        while line[pos].isspace():
            pos += 1
        assert line.startswith(piece, pos)
        pos += len(piece)
    assert not line[pos:].strip()
    for piece in pieces:
        assert piece and piece == piece.strip()
        assert split_sentences(piece) == [piece]  # a sentence is not cut again


@pytest.mark.parametrize("name", ["electra_zh_en", "bert"])
def test_the_option_cuts_the_lines_where_documents_enter_the_job(tmp_path, name):
    from fleet.job import ItemContext, load_job
    from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
    from tests.helpers.sinks import MemorySink

    paragraphs = [
        ["今天天气很好。我们去公园吧！你来吗？" * 3, "Mr. Smith met Dr. Jones. They talked about 3.14 things. " * 4],
        ["第二个文件。它很短。", "Short one. Another one! Yes?"],
    ]
    vocab = str(tmp_path / "vocab.txt")
    write_vocab(train_vocab((line for doc in paragraphs for line in doc), 500), vocab)
    job = load_job(name)

    def convert(documents, **options):
        config = job.parse_config({"vocab_file": vocab, "max_seq_length": 32, **options})
        sink = MemorySink()
        stats = job.document_converter(config, lambda p: open(p, "rb").read()).convert(
            iter(documents), ItemContext("i", 7, "test"), sink
        )
        return stats, sink.files[".tfrecord"]

    stats, split = convert(paragraphs, split_sentences="true")
    stats_pre, presplit = convert([split_lines(doc) for doc in paragraphs])
    assert split == presplit and stats == stats_pre  # the same as giving the sentences as lines
    off_stats, off = convert(paragraphs)
    assert off != split and off_stats["lines"] == 4
    assert job.parse_config({"vocab_file": vocab}).split_sentences is False  # off by default: records as before

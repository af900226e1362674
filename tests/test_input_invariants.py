"""The input layer's invariants (issue 17), for every line format and compression:

(a) no good document is lost or duplicated, whatever the item size and wherever the bad bytes are;
(b) a bad record costs at most its own document and is counted, with its file and offset;
(c) no document's text contains another document's text or the format's markup;
(d) memory per document is bounded by a constant: documents are read as a stream, in parts.

First the cases issue 17 names (each failed on the code before it), then a fuzzer: hypothesis
renders arbitrary documents in each format, compresses and damages them, cuts them into items
with the real planner at random sizes, reads every item with the real reader and checks (a)-(c)
against the documents that went in. The default run is short; ``pytest -m fuzz`` runs it with
FLEET_FUZZ_EXAMPLES examples (default 5000) for a nightly-style search.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os

import pytest
import zstandard

from fleet.inputs import Tally, iter_documents, plan_ranges, read_all
from fleet.inputs import formats
from fleet.job import InputError
from fleet.store.local import LocalStore


def documents_of_ranges(store, name, data, fmt, target, tally=None):
    """Every document of a file read item by item, as workers would with the real planner."""
    out = []
    for start, end, _ in plan_ranges(store, name, len(data), fmt, target):
        out += iter_documents(io.BytesIO(data[start:end]), fmt, "none", name, start, tally)
    return out


def encodable(docs) -> bool:
    return all(line.encode("utf-8") is not None for doc in docs for line in doc)


# -- 1. a lone surrogate escape costs its record, not the item ---------------------------------------
@pytest.mark.parametrize("fmt,name", [("jsonl", "x.jsonl"), ("cirrus", "x-cirrussearch-content.json")])
def test_a_lone_surrogate_escape_is_a_bad_record_with_its_offset(fmt, name):
    records = [{"text": "good one"}, {"text": "a\ud800b\nsecond line"}, {"text": "good two"}]
    if fmt == "cirrus":
        records = [r for rec in records for r in ({"index": {"_id": "1"}}, rec)]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    tally = Tally()
    docs = read_all(data, name, fmt=fmt, tally=tally)
    assert docs == [["good one"], ["good two"]] and encodable(docs)
    at = data.index(b"\\ud800") - data[:data.index(b"\\ud800")][::-1].index(b"\n")
    assert tally.bad == 1 and tally.examples[0].startswith(f"{name}: byte {at}: record ")
    assert "lone surrogate" in tally.examples[0]


def test_a_surrogate_pair_is_one_character_not_damage():
    tally = Tally()
    assert read_all(b'{"text": "\\ud83d\\ude00 ok"}\n', "x.jsonl", tally=tally) == [["\U0001f600 ok"]]
    assert tally.bad == 0


# -- 2. one invalid byte costs its line, not the item ------------------------------------------------
def test_one_invalid_byte_in_a_document_without_blank_lines_costs_one_line():
    lines = [f"line {i} of one long document" for i in range(3000)]
    data = bytearray("\n".join(lines).encode() + b"\n")
    at = data.index(b"line 1500 ")
    data[at + 2:at + 3] = b"\xff"
    tally = Tally()
    docs = read_all(bytes(data), "one.txt", tally=tally)
    assert docs == [lines[:1500] + lines[1501:]]
    assert tally.bad == 1 and tally.examples == [f"one.txt: byte {at + 2}: invalid UTF-8"]


def test_the_bad_share_is_judged_over_lines_not_documents():
    good = b"".join(b"good line %d\n" % i for i in range(10))
    with pytest.raises(InputError, match=r"11 of 21 records are bad"):  # mostly bad: still not this format
        read_all(good[:len(good) // 2] + b"\xff\n" * 11 + good[len(good) // 2:], "x.txt")
    assert len(read_all(good + b"\xff\n" * 9, "x.txt")[0]) == 10


# -- 3. the cutter and the reader agree on where a <doc> starts ----------------------------------------
def wiki(articles) -> bytes:
    return "".join(f'<doc id="{i}" url="u{i}" title="T{i}">\nT{i}\n\n' + "\n".join(body) + "\n</doc>\n"
                   for i, body in enumerate(articles)).encode()


ARTICLES = [[f"article {i} line {j} " + "w" * (i % 37) for j in range(i % 6 + 1)] +
            (["<document>", "<doc>", "<doc of the week>"] if i % 7 == 3 else []) for i in range(400)]


@pytest.mark.parametrize("target", [300, 1000, 4096, 20_000])
def test_a_line_starting_with_doc_does_not_cut_a_wikiextractor_file(tmp_path, target):
    data = wiki(ARTICLES)
    (tmp_path / "wiki_00").write_bytes(data)
    tally = Tally()
    docs = documents_of_ranges(LocalStore(str(tmp_path)), "wiki_00", data, "wikiextractor", target, tally)
    assert docs == ARTICLES and tally.bad == 0


# -- 4. an unclosed or nested <doc> never merges two articles -----------------------------------------
def test_an_unclosed_doc_is_counted_and_not_merged_into_the_next():
    data = (b'<doc id="1" url="u" title="A">\nA\nfirst article\n'
            b'<doc id="2" url="u" title="B">\nB\nsecond article\n</doc>\n'
            b'<doc id="3" url="u" title="C">\nC\nthird article\n</doc>\n')
    tally = Tally()
    docs = read_all(data, "wiki_00", tally=tally)
    assert docs == [["second article"], ["third article"]]
    assert tally.bad == 1 and "wiki_00: byte 0: " in tally.examples[0] and "no </doc>" in tally.examples[0]


def test_a_nested_doc_costs_the_outer_article_and_no_markup_becomes_text():
    data = (b'<doc id="1" url="u" title="A">\nA\nouter start\n'
            b'<doc id="2" url="u" title="B">\nB\ninner\n</doc>\nouter end\n</doc>\n'
            b'<doc id="3" url="u" title="C">\nC\nnext\nand more\nlines\n</doc>\n')
    tally = Tally()
    docs = read_all(data, "wiki_00", tally=tally)
    assert docs == [["inner"], ["next", "and more", "lines"]]
    text = "\n".join(line for doc in docs for line in doc)
    assert "<doc" not in text and "</doc>" not in text and "outer" not in text
    assert tally.bad == 3  # the unclosed outer <doc>, then its tail outside any <doc>: counted, not read


# -- 5. documents stream: memory is bounded whatever their length --------------------------------------
@pytest.fixture
def small_limits(monkeypatch):
    """Parts of 10 kB, lines of 64 kB, blocks of 16 kB: the streaming paths at test sizes."""
    monkeypatch.setattr(formats, "MAX_DOCUMENT_CHARS", 10_000)
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 64 << 10)
    monkeypatch.setattr(formats, "_BLOCK", 16 << 10)


@pytest.fixture
def decompressed_bytes(monkeypatch):
    """How many bytes the reader has taken from the decompressor (the raw file's offset, when plain)."""
    taken = [0]
    real = formats.decompressed

    class Counted(io.RawIOBase):
        def __init__(self, stream):
            self.stream = stream

        def readable(self):
            return True

        def readinto(self, buffer):
            data = self.stream.read(len(buffer))
            buffer[:len(data)] = data
            taken[0] += len(data)
            return len(data)

    monkeypatch.setattr(formats, "decompressed", lambda f, compression: Counted(real(f, compression)))
    return taken


@pytest.mark.parametrize("compression", ["none", "zst"])
def test_a_long_document_is_handed_on_in_parts_before_it_is_read_whole(small_limits, decompressed_bytes,
                                                                       compression):
    lines = [f"line {i} " + "x" * 90 for i in range(20_000)]  # 2 MB, no blank line
    data = "\n".join(lines).encode() + b"\n"
    if compression == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    docs = iter_documents(io.BytesIO(data), "text", compression, "big.txt")
    first = next(docs)
    assert sum(map(len, first)) <= 10_000 and decompressed_bytes[0] < 100 << 10  # a block ahead, not the document
    rest = list(docs)
    assert [line for part in [first] + rest for line in part] == lines


def test_a_json_record_longer_than_a_line_is_read_as_a_stream(small_limits):
    paragraphs = [f"paragraph {i} \u6570\u636e \U0001f600 \"q\" \\ \t" + "y" * (i % 300) for i in range(3000)]
    text = "\n".join(paragraphs)
    record = json.dumps({"id": 1, "meta": {"a": ["x", {"text": "not this one"}]}, "text": text, "n": 2.5e3,
                         "tail": "after \\ \""})
    other = json.dumps({"text": "short one"})
    for ensure_ascii in (True, False):
        record = json.dumps(json.loads(record), ensure_ascii=ensure_ascii)
        data = (other + "\n" + record + "\n" + other + "\n").encode()
        assert len(record) > formats.MAX_LINE_BYTES
        tally = Tally()
        docs = list(iter_documents(io.BytesIO(data), "jsonl", "none", "big.jsonl", tally=tally))
        assert tally.bad == 0 and docs[0] == docs[-1] == ["short one"]
        assert [line for part in docs[1:-1] for line in part] == paragraphs
        assert all(sum(map(len, part)) <= 10_000 for part in docs)


@pytest.mark.parametrize("damage,why", [
    (lambda r: r.replace(b'"n": 2', b'"n": 2,,'), "not JSON"),
    (lambda r: r.replace(b"paragraph 2000 ", b"paragraph 2000 \\ud800"), "lone surrogate"),
    (lambda r: r.replace(b"paragraph 2000 ", b"paragraph 2000 \xff"), "invalid UTF-8"),
    (lambda r: r.replace(b'"text"', b'"body"'), "no string field 'text'"),
    (lambda r: r[:-10], "ends early"),
])
def test_a_damaged_long_json_record_is_one_bad_record(small_limits, damage, why):
    text = "\n".join(f"paragraph {i} " + "y" * 50 for i in range(3000))
    record = damage(json.dumps({"text": text, "n": 2}).encode())
    data = b'{"text": "before"}\n' + record + b'\n{"text": "after"}\n'
    tally = Tally()
    docs = read_all(data, "big.jsonl", tally=tally)
    assert docs[0] == ["before"] and docs[-1] == ["after"]
    kept = [line for part in docs[1:-1] for line in part]
    assert kept == text.split("\n")[:len(kept)]  # what was handed on before the damage, no more
    assert tally.bad == 1 and tally.examples[0].startswith("big.jsonl: byte 19: record 2") and why in tally.examples[0]

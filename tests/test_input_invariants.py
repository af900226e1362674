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
import codecs
import gzip
import io
import json
import lzma
import os
import re
import tempfile
from dataclasses import dataclass, field

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.job import InputError
from fleet.core.store.local import LocalStore
from fleet_jobs.text.inputs import ReadOptions, Tally, formats, iter_documents, plan_ranges, ranges, read_all


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
    at = data.index(b"\\ud800") - data[: data.index(b"\\ud800")][::-1].index(b"\n")
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
    data[at + 2 : at + 3] = b"\xff"
    tally = Tally()
    docs = read_all(bytes(data), "one.txt", tally=tally)
    assert docs == [lines[:1500] + lines[1501:]]
    assert tally.bad == 1 and tally.examples == [f"one.txt: byte {at + 2}: invalid UTF-8"]


def test_the_bad_share_is_judged_over_lines_not_documents():
    good = b"".join(b"good line %d\n" % i for i in range(10))
    with pytest.raises(InputError, match=r"11 of 21 records are bad"):  # mostly bad: still not this format
        read_all(good[: len(good) // 2] + b"\xff\n" * 11 + good[len(good) // 2 :], "x.txt")
    assert len(read_all(good + b"\xff\n" * 9, "x.txt")[0]) == 10


# -- 3. the cutter and the reader agree on where a <doc> starts ----------------------------------------
def wiki(articles) -> bytes:
    return "".join(
        f'<doc id="{i}" url="u{i}" title="T{i}">\nT{i}\n\n' + "\n".join(body) + "\n</doc>\n"
        for i, body in enumerate(articles)
    ).encode()


ARTICLES = [
    [f"article {i} line {j} " + "w" * (i % 37) for j in range(i % 6 + 1)]
    + (["<document>", "<doc>", "<doc of the week>"] if i % 7 == 3 else [])
    for i in range(400)
]


@pytest.mark.parametrize("target", [300, 1000, 4096, 20_000])
def test_a_line_starting_with_doc_does_not_cut_a_wikiextractor_file(tmp_path, target):
    data = wiki(ARTICLES)
    (tmp_path / "wiki_00").write_bytes(data)
    tally = Tally()
    docs = documents_of_ranges(LocalStore(str(tmp_path)), "wiki_00", data, "wikiextractor", target, tally)
    assert docs == ARTICLES and tally.bad == 0


# -- 4. an unclosed or nested <doc> never merges two articles -----------------------------------------
def test_an_unclosed_doc_is_counted_and_not_merged_into_the_next():
    data = (
        b'<doc id="1" url="u" title="A">\nA\nfirst article\n'
        b'<doc id="2" url="u" title="B">\nB\nsecond article\n</doc>\n'
        b'<doc id="3" url="u" title="C">\nC\nthird article\n</doc>\n'
    )
    tally = Tally()
    docs = read_all(data, "wiki_00", tally=tally)
    assert docs == [["second article"], ["third article"]]
    assert tally.bad == 1 and "wiki_00: byte 0: " in tally.examples[0] and "no </doc>" in tally.examples[0]


def test_a_nested_doc_costs_the_outer_article_and_no_markup_becomes_text():
    data = (
        b'<doc id="1" url="u" title="A">\nA\nouter start\n'
        b'<doc id="2" url="u" title="B">\nB\ninner\n</doc>\nouter end\n</doc>\n'
        b'<doc id="3" url="u" title="C">\nC\nnext\nand more\nlines\n</doc>\n'
    )
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
            buffer[: len(data)] = data
            taken[0] += len(data)
            return len(data)

    monkeypatch.setattr(formats, "decompressed", lambda f, compression: Counted(real(f, compression)))
    return taken


@pytest.mark.parametrize("compression", ["none", "zst"])
def test_a_long_document_is_handed_on_in_parts_before_it_is_read_whole(small_limits, decompressed_bytes, compression):
    lines = [f"line {i} " + "x" * 90 for i in range(20_000)]  # 2 MB, no blank line
    data = "\n".join(lines).encode() + b"\n"
    if compression == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    docs = iter_documents(io.BytesIO(data), "text", compression, "big.txt")
    first = next(docs)
    assert sum(map(len, first)) <= 10_000 and decompressed_bytes[0] < 100 << 10  # a block ahead, not the document
    rest = list(docs)
    assert [line for part in [first] + rest for line in part] == lines


def test_a_highly_compressed_zst_is_decoded_a_bounded_step_at_a_time():
    # 16 kB of a zstd stream of zeros used to decode to 200 MB at once: a worker's memory went
    # with the compression ratio, not with the read size.
    import tracemalloc

    data = zstandard.ZstdCompressor().compress(bytes(200 << 20))
    stream = formats.decompressed(io.BytesIO(data), "zst")
    tracemalloc.start()
    try:
        total = 0
        while block := stream.read(1 << 20):
            total += len(block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 200 << 20 and peak < 48 << 20


def test_a_json_record_longer_than_a_line_is_read_as_a_stream(small_limits):
    paragraphs = [f'paragraph {i} \u6570\u636e \U0001f600 "q" \\ \t' + "y" * (i % 300) for i in range(3000)]
    text = "\n".join(paragraphs)
    record = json.dumps(
        {"id": 1, "meta": {"a": ["x", {"text": "not this one"}]}, "text": text, "n": 2.5e3, "tail": 'after \\ "'}
    )
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


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda r: r.replace(b'"n": 2', b'"n": 2,,'), "not JSON"),
        (lambda r: r.replace(b"paragraph 2000 ", b"paragraph 2000 \\ud800"), "lone surrogate"),
        (lambda r: r.replace(b"paragraph 2000 ", b"paragraph 2000 \xff"), "invalid UTF-8"),
        (lambda r: r.replace(b'"text"', b'"body"'), "no string field 'text'"),
        (lambda r: r[:-10], "ends early"),
    ],
)
def test_a_damaged_long_json_record_is_one_bad_record(small_limits, damage, why):
    text = "\n".join(f"paragraph {i} " + "y" * 50 for i in range(3000))
    record = damage(json.dumps({"text": text, "n": 2}).encode())
    data = b'{"text": "before"}\n' + record + b'\n{"text": "after"}\n'
    tally = Tally()
    docs = read_all(data, "big.jsonl", tally=tally)
    assert docs[0] == ["before"] and docs[-1] == ["after"]
    kept = [line for part in docs[1:-1] for line in part]
    assert kept == text.split("\n")[: len(kept)]  # what was handed on before the damage, no more
    assert tally.bad == 1 and tally.examples[0].startswith("big.jsonl: byte 19: record 2") and why in tally.examples[0]


# -- 6. a record the JSON decoder cannot take costs that record only (issue 30) ----------------------
POISON = {
    "nested past the recursion limit": "[" * 100_000,
    "an object nested past the recursion limit": '{"text": "x", "n": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}",
    "an integer past int's max str digits": '{"text": "x", "n": ' + "9" * 10_000 + "}",
    "a float past the largest double": '{"text": "x", "n": 1e999999}',  # json reads inf: a good record
}


@pytest.mark.parametrize("compression", ["none", "gz"])
@pytest.mark.parametrize("what", list(POISON))
def test_a_record_the_json_decoder_cannot_take_is_one_bad_record(what, compression):
    """Whatever the decoder raises on a record (RecursionError, ValueError, OverflowError...),
    that record is one bad record with its reason, and every other record is read: before, a
    record nested deeper than the recursion limit failed its whole item (the whole file, when
    compressed)."""
    record = POISON[what]
    data = b'{"text": "before"}\n' + record.encode() + b'\n{"text": "after"}\n'
    name = "deep.jsonl" if compression == "none" else "deep.jsonl.gz"
    if compression == "gz":
        data = gzip.compress(data, mtime=0)
    tally = Tally()
    docs = read_all(data, name, tally=tally)
    if what.startswith("a float"):
        assert docs == [["before"], ["x"], ["after"]] and tally.bad == 0
        return
    assert docs == [["before"], ["after"]]
    assert tally.bad == 1 and tally.examples[0].startswith(
        f"{name}: {'decompressed ' * (compression != 'none')}byte 19: record 2 is not JSON ("
    )


@pytest.mark.parametrize(
    "error", [RecursionError("deep"), OverflowError("big"), ValueError("odd"), MemoryError(), KeyError("x")]
)
def test_any_exception_of_the_json_decoder_costs_its_record_only(monkeypatch, error):
    """The reader and the provenance reading (places.py) both pass over a record whatever the
    decoder raises on it, and agree on every other record."""
    from fleet_jobs.text.inputs import places

    real = json.loads

    def loads(s, *a, **k):
        if "poison" in s:
            raise error
        return real(s, *a, **k)

    monkeypatch.setattr(json, "loads", loads)
    data = b'{"text": "one"}\n{"text": "poison"}\n{"text": "two"}\n'
    tally = Tally()
    assert read_all(data, "p.jsonl", tally=tally) == [["one"], ["two"]]
    assert tally.bad == 1 and f"({error.__class__.__name__}" in tally.examples[0]
    records = places.line_records(io.BytesIO(data), "jsonl", "none", 0, ReadOptions())
    assert [doc for _, doc, _ in records] == [["one"], ["two"]]


def test_a_first_line_the_decoder_cannot_take_does_not_stop_the_format_sniffing():
    """Telling a file's format from its first bytes never raises, whatever its first line holds."""
    deep = b'{"text": ' + b"[" * 100_000
    assert formats.sniff(deep) == "jsonl"  # a record longer than the sample
    assert formats.sniff(deep + b'\n{"text": "x"}\n') is None  # not JSON: taken for text, as any other


# -- 7. what follows a complete compressed stream is counted, and costs no document (issue 30) ---------
def _xz(data: bytes) -> bytes:
    return lzma.compress(data)


MEMBER = {
    "gz": lambda d: gzip.compress(d, mtime=0),
    "bz2": bz2.compress,
    "xz": _xz,
    "zst": lambda d: zstandard.ZstdCompressor().compress(d),
}
MAGIC = {"gz": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00", "zst": b"\x28\xb5\x2f\xfd"}  # how a member starts


@pytest.mark.parametrize(
    "fmt,name,data",
    [
        (
            "text",
            "t.txt",
            b"".join(b"doc %d line one\ndoc %d line two\n\n" % (i, i) for i in range(150)) + b"last doc\n",
        ),
        ("jsonl", "t.jsonl", b"".join(b'{"text": "doc %d"}\n' % i for i in range(150)) + b'{"text": "last doc"}'),
    ],
)
@pytest.mark.parametrize("compression", list(MEMBER))
def test_junk_after_a_complete_stream_keeps_its_last_document_and_is_counted_in_bytes(fmt, name, data, compression):
    """Bytes after a complete member that start no member are trailing garbage: every document of
    the member is read (the last one too, that no blank line ends), and the garbage is counted in
    its bytes, with its offset in the file, not as a bad record. Before, gzip and zstd dropped the
    last document and counted one bad record; bzip2 said nothing."""
    junk = b"junk after the stream"
    packed = MEMBER[compression](data)
    tally = Tally()
    docs = read_all(packed + junk, f"{name}.{compression}", tally=tally)
    assert docs == read_all(data, name) and docs[-1] == ["last doc"]
    assert tally.bad == 0 and tally.trailing == len(junk)
    assert tally.examples == [
        f"{name}.{compression}: byte {len(packed)}: {len(junk)} bytes of trailing garbage "
        f"after a complete {formats.Trailing(0, 1, compression).why.split(' after a complete ')[1]}"
    ]
    assert tally.stats()["trailing_garbage_bytes"] == len(junk)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(
        st.lists(
            st.text(alphabet="ab \u4e2d\U0001f600.\x00", min_size=1, max_size=20).filter(lambda s: s.strip()),
            min_size=1,
            max_size=4,
        ),
        max_size=30,
    ),
    compression=st.sampled_from(list(MEMBER)),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=3),
    junk=st.binary(max_size=64),
    begun=st.booleans(),
    end_blank=st.booleans(),
    block=st.sampled_from([7, 64, 4 << 20]),
)
def test_any_members_then_any_junk_give_every_document_and_count_the_junk(
    docs, compression, cuts, junk, begun, end_blank, block
):
    """Any text in one or more members of any compression, followed by any bytes that start no
    member, reads as the same documents as the text itself, and the junk is counted to the byte.
    Junk that starts like a member is a damaged member: one bad record, the documents before it kept."""
    text = "\n\n".join("\n".join(doc) for doc in docs).encode() + b"\n\n" * end_blank
    points = sorted({c % (len(text) + 1) for c in cuts})
    members = b"".join(MEMBER[compression](text[a:b]) for a, b in zip([0] + points, points + [len(text)]))
    expected = read_all(text, "x.txt")
    magic = MAGIC[compression]
    if begun:
        junk = magic + junk
    old = formats._BLOCK
    formats._BLOCK = block
    try:
        tally = Tally()
        got = read_all(members + junk, f"x.txt.{compression}", tally=tally, options=ReadOptions(max_bad_share=1.0))
    finally:
        formats._BLOCK = old
    if junk.startswith(magic):  # a member begun: damaged or cut short
        assert got == expected[: len(got)] and tally.trailing == 0
        assert tally.bad == 1 and "corrupt or truncated" in tally.examples[0], tally.examples
        assert got == expected or not end_blank  # (the document in progress, when the break ends none)
        return
    assert got == expected and tally.bad == 0 and tally.trailing == len(junk)


def test_xz_is_read_and_taken_from_a_folder(tmp_path):
    """.xz is read wherever .gz is: in a folder, and named on its own."""
    from fleet_jobs.text.inputs import find_corpus, plan_slices

    data = b"one\n\ntwo\nlines\n"
    (tmp_path / "a.txt.xz").write_bytes(lzma.compress(data))
    (tmp_path / "b.jsonl.xz").write_bytes(lzma.compress(b'{"text": "three"}\n'))
    assert sorted(s.name for s in find_corpus([str(tmp_path)])) == ["a.txt.xz", "b.jsonl.xz"]
    slices = plan_slices([str(tmp_path)], 1 << 20)
    assert [(s.name, s.format, s.compression) for s in slices] == [
        ("a.txt.xz", "text", "xz"),
        ("b.jsonl.xz", "jsonl", "xz"),
    ]
    assert read_all(lzma.compress(data), "a.txt.xz") == [["one"], ["two", "lines"]]


def test_places_and_documents_agree_after_trailing_garbage():
    """Provenance reads the same lines as the reader when the stream is followed by junk."""
    from fleet_jobs.text.inputs import places

    data = gzip.compress(b'{"text": "one"}\n{"text": "two"}', mtime=0) + b"junk"
    records = places.line_records(io.BytesIO(data), "jsonl", "gz", 0, ReadOptions())
    assert [doc for _, doc, _ in records] == read_all(data, "x.jsonl.gz") == [["one"], ["two"]]


# -- 8. text in UTF-16 or UTF-32 with a byte-order mark reads as the same documents as UTF-8 (issue 30) --
ENCODINGS = {
    "utf-8": lambda t: t.encode("utf-8"),
    "utf-8-bom": lambda t: codecs.BOM_UTF8 + t.encode("utf-8"),
    "utf-16-le": lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"),
    "utf-16-be": lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    "utf-32-le": lambda t: codecs.BOM_UTF32_LE + t.encode("utf-32-le"),
    "utf-32-be": lambda t: codecs.BOM_UTF32_BE + t.encode("utf-32-be"),
}
MANY = "".join(f"document {i} \u6570\u636e\nits second line \U0001f600\n\n" for i in range(151))


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_utf16_or_utf32_file_with_its_mark_gives_its_documents(encoding):
    """Text with a UTF-16 or UTF-32 byte-order mark is decoded, not read as UTF-8 with NULs:
    151 documents are 151, not 1, and nothing is counted bad."""
    tally = Tally()
    docs = read_all(ENCODINGS[encoding](MANY), "many.txt", tally=tally)
    assert len(docs) == 151 and docs == read_all(MANY.encode(), "many.txt") and tally.bad == 0


@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if e.startswith("utf-16")])
def test_a_utf16_file_larger_than_an_item_is_one_item_that_gives_every_document(tmp_path, encoding):
    """A file in UTF-16 cannot be cut where UTF-8 has its boundaries: it is one item, as a
    compressed file is, and every document comes out once."""
    from fleet_jobs.text.inputs import plan_slices, read_slice

    (tmp_path / "many.txt").write_bytes(ENCODINGS[encoding](MANY))
    slices = plan_slices([str(tmp_path)], 1000)
    assert [(s.start, s.end) for s in slices] == [(0, (tmp_path / "many.txt").stat().st_size)]
    tally = Tally()
    docs = list(read_slice(slices[0], str(tmp_path), tally))
    assert docs == read_all(MANY.encode(), "many.txt") and tally.bad == 0


@pytest.mark.parametrize(
    "damage,where",
    [
        (
            lambda b: b.replace(
                "second line \U0001f600\n\nd".encode("utf-16-le"),
                "second line \ud800\n\nd".encode("utf-16-le", "surrogatepass"),
                1,
            ),
            "a lone surrogate",
        ),
        (lambda b: b + b"x", "an odd last byte"),
    ],
)
def test_what_is_not_text_in_utf16_costs_its_line(damage, where):
    """A code unit that is not text costs its line (counted, "invalid UTF-16"); its document goes on."""
    data = damage(codecs.BOM_UTF16_LE + MANY.encode("utf-16-le"))
    tally = Tally()
    docs = read_all(data, "many.txt", tally=tally)
    good = read_all(MANY.encode(), "many.txt")
    assert tally.bad == 1 and "invalid UTF-16" in tally.examples[0], where
    if where == "a lone surrogate":
        assert docs == [good[0][:1]] + good[1:]
    else:
        assert docs == good


@pytest.mark.parametrize(
    "name,data,fmt",
    [
        ("data", '{"text": "one"}\n{"text": "two"}\n', "jsonl"),
        ("wiki_00", '<doc id="1" url="u" title="T">\nT\nbody\n</doc>\n', "wikiextractor"),
    ],
)
def test_the_format_of_a_utf16_file_is_told_from_its_text(name, data, fmt):
    raw = ENCODINGS["utf-16-le"](data)
    assert formats.decide("text", name, raw) == fmt
    assert read_all(raw, name) == read_all(data.encode(), name)


text_docs = st.lists(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)
        .map(lambda s: s.replace("\n", " ").replace("\r", " "))
        .filter(lambda s: s.strip()),
        min_size=1,
        max_size=4,
    ),
    max_size=12,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=text_docs,
    encoding=st.sampled_from(list(ENCODINGS)),
    fmt=st.sampled_from(["text", "jsonl", "wikiextractor"]),
    compression=st.sampled_from(["none", "gz", "zst"]),
    block=st.sampled_from([7, 16, 64, 4 << 20]),
)
def test_any_text_in_any_unicode_encoding_with_its_mark_gives_the_same_documents(
    docs, encoding, fmt, compression, block
):
    """Any documents written as text, JSON Lines or WikiExtractor, encoded as UTF-8 (with or
    without its mark), UTF-16 or UTF-32 (LE or BE, with their mark), compressed or not, read as
    the same documents as their UTF-8, with nothing counted bad, however the blocks fall; and
    provenance (places.py) sees the same records."""
    from fleet_jobs.text.inputs import places

    if fmt == "text":
        text = "".join("\n".join(doc) + "\n\n" for doc in docs)
    elif fmt == "jsonl":
        text = "".join(json.dumps({"text": "\n".join(doc)}, ensure_ascii=False) + "\n" for doc in docs)
    else:
        text = "".join(
            f'<doc id="{i}" url="u" title="t">\nt\n' + "\n".join(doc) + "\n</doc>\n" for i, doc in enumerate(docs)
        )
    name = {"text": "x.txt", "jsonl": "x.jsonl", "wikiextractor": "wiki_00"}[fmt]
    expected = read_all(text.encode(), name, fmt=fmt)
    data = ENCODINGS[encoding](text)
    if compression != "none":
        data, name = COMPRESS[compression](data), f"{name}.{compression}"
    old = formats._BLOCK
    formats._BLOCK = block
    try:
        tally = Tally()
        assert read_all(data, name, fmt=fmt, tally=tally) == expected and tally.bad == 0, tally.examples
        records = places.line_records(io.BytesIO(data), fmt, compression, 0, ReadOptions())
        assert [doc for _, doc, _ in records] == [doc for doc in expected]
    finally:
        formats._BLOCK = old


# -- the fuzzer ----------------------------------------------------------------------------------
# Documents are rendered in a format, with lines that look like the format's markup, blank-ish
# lines, NULs, CRs, and lines made bad on purpose (invalid UTF-8; a lone surrogate escape in
# JSON; longer than MAX_LINE_BYTES). Every document holds a tag line (_head) and its plain
# lines end with its tag (_tag), so its text can be told apart wherever it lands; what a format
# adds around a document (titles, ids, urls) holds "\ue123<k>". The file is then damaged
# (bytes flipped, inserted, deleted, or cut off), maybe compressed (and maybe the compressed
# stream cut off), planned into items with the real planner at a random item size, and read.
TAG, MARK, HEAD, END = "\ue124", "\ue123", "\ue125", "\ue126"
ODD = (
    "aZ9 .,!?'#[]{}<>/\"\\:\t\r\x00\x01\x0b\x0c\x1c\x7f\x85\xa0\xad\u200b\u2028\u2029\u3000\ufffd\ufeff"
    "\u0301éß中文数据\U00020000\U0001f600"
)
SPECIAL = [
    "<doc",
    "</doc>",
    "</doc> \r",
    '<doc id="9" url="u" title="x">',
    "<doc id=1>",
    "<document>",
    "<doc>",
    '{"index": {"_id": "1"}}',
    '{"text": "x"}',
    "\u3000",
    "\r",
    " \t",
    "\x1c",
    "\x00",
    "\ufeff",
    "",
    "\x85",
    "\u2028",
    "a\rb",
    "\\",
    '"',
    "\\u",
    "\\ud800",
]
plain = st.one_of(st.text(alphabet=ODD, max_size=12), st.text(max_size=8)).map(
    lambda s: (
        s.replace("\n", " ")
        .replace(TAG, "")
        .replace(MARK, "")
        .replace(HEAD, "")
        .replace(END, "")
        .replace(POISON_MARK, "")
    )
)
lines = st.lists(
    st.tuples(st.one_of(plain, st.sampled_from(SPECIAL)), st.sampled_from(["ok"] * 12 + ["bad", "long"])), max_size=5
)
# Records no JSON reader takes, read whole (json.loads) or as a stream (longjson), whatever the
# limits; none holds a text field, so each is one bad record on either path. POISON_MARK: a short
# record that the fuzzer's stand-in decoder (check_case) fails with a drawn exception.
POISON_MARK = "\ue127"
POISONED = [
    lambda: b"[" * 5000,  # past the recursion limit of json.loads (a fixed size: hypothesis wants the same draws)
    lambda: b'{"n": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    lambda: b'{"n": ' + b"9" * 10_000 + b"}",  # past int's max str digits (4300)
    lambda: b'{"n": 1e999999}',
    lambda: json.dumps({"text": POISON_MARK}, ensure_ascii=False).encode(),
]
FORMATS_NAMES = {"text": "f.txt", "jsonl": "f.jsonl", "cirrus": "f-cirrussearch.json", "wikiextractor": "wiki_00"}
_CLOSE = re.compile(r"</doc>\s*$")


@dataclass
class Rendered:
    data: bytes
    owners: list[tuple[int, int, frozenset]]  # byte ranges and the documents they belong to
    expected: list[list[str]]  # each document's good lines
    bad: list[int]  # bad records each document costs when undamaged
    broken: set[int] = field(default_factory=set)  # documents damaged by their own text (markup inside)


def _line(text: str, kind: str, k: int, fmt: str, max_line: int) -> tuple[str, bytes | None]:
    """(the line's text, or its bytes when it is bad)."""
    if kind == "long":
        return "L" * (max_line + 3) + _tag(k), None
    if kind == "bad":
        if fmt in ("jsonl", "cirrus"):
            return text + "\ud800" + _tag(k), None
        raw = (text + _tag(k)).encode()
        return "", raw[: len(raw) // 2] + b"\xff" + raw[len(raw) // 2 :]
    if kind == "tag":
        return text, None
    return (text + _tag(k) if text.strip() and text not in SPECIAL else text), None


def render(fmt: str, docs, draw, max_line: int, titles: bool) -> Rendered:
    out = bytearray()
    owners: list[tuple[int, int, frozenset]] = []
    expected, bad, broken = [], [], set()

    def put(chunk: bytes, *who: int) -> None:
        owners.append((len(out), len(out) + len(chunk), frozenset(who)))
        out.extend(chunk)

    for k, body in enumerate(docs):
        at = draw(st.integers(0, len(body)))
        body = body[:at] + [(_head(k), "tag")] + body[at:]
        rendered = [_line(text, kind, k, fmt, max_line) + (kind if kind != "tag" else "ok",) for text, kind in body]
        good = [t for t, raw, kind in rendered if kind == "ok" and t.strip()]
        if fmt in ("text", "wikiextractor"):
            n_bad = sum(kind != "ok" for _, _, kind in rendered)
            if fmt == "text":
                rendered = [r for r in rendered if r[2] != "ok" or r[0].strip()]  # blank lines end documents
                if not out and rendered and rendered[0][0].startswith("\ufeff"):
                    broken.add(k)  # a byte-order mark at the start of the file is not text
            else:
                put(f'<doc id="{k}" url="{MARK}{_tag(k)}" title="t">\n'.encode(), k)
                title = f"T{_tag(k)}" if titles else f"{MARK}{_tag(k)}"  # text only if kept
                put(f"{title}\n".encode(), k)
                good = [title] * titles + good
                if any(
                    kind == "ok" and (re.match(r"<doc\s+id=.*>\s*$", t) or _CLOSE.match(t)) for t, _, kind in rendered
                ):
                    broken.add(k)
            for text, raw, _kind in rendered:
                put((raw if raw is not None else text.encode()) + b"\n", k)
            if fmt == "text":
                put(b"\n", k, k + 1)  # the blank line between documents
            else:
                put(b"</doc>\n", k)
            expected.append(good)
            bad.append(n_bad)
            continue
        text = "\n".join(t for t, _, _ in rendered)
        good = [t for t, _, _ in rendered if t.strip()]  # a long line is text in JSON
        fields = {"id": MARK + _tag(k), "text": text}
        if draw(st.booleans()):
            fields = {
                "meta": {"text": MARK + _tag(k), "a": [1, -2.5e3, None, True, 'x\\"{']},
                "text": text,
                "tail": MARK + _tag(k),
            }
        record = json.dumps(fields, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
        n_bad = 0
        if any(kind == "bad" for _, _, kind in rendered):
            broken.add(k)  # a lone surrogate: the record is bad (what a stream handed on before stays)
            n_bad = 1
        elif len(record) > max_line:  # read as a stream: a line of its text longer than a line is dropped
            n_bad = sum(len(t) > max_line for t in good)
            good = [t for t in good if len(t) <= max_line]
        for poison in draw(st.lists(st.sampled_from(range(len(POISONED))), max_size=2)):
            put(POISONED[poison]() + b"\n", k)  # records the decoder cannot take: one bad record each
            n_bad += 1
        if fmt == "cirrus":
            put(json.dumps({"index": {"_id": MARK + _tag(k)}}).encode() + b"\n", k)
        put(record + b"\n", k)
        expected.append(good)
        bad.append(n_bad)
    return Rendered(bytes(out), owners, expected, bad, broken)


def damage(r: Rendered, draw) -> tuple[bytes, set[int]]:
    """The file with a few random byte-level injuries, and the documents they touch."""
    data = bytearray(r.data)
    spans = []
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        p = draw(st.integers(0, len(r.data) - 1)) if r.data else 0
        spans.append((kind, p, draw(st.binary(min_size=1, max_size=3)), draw(st.integers(1, 4))))
    spans.sort(key=lambda s: -s[1])  # from the end: positions stay valid
    spans = [s for n, s in enumerate(spans) if not n or s[1] + s[3] + 2 < spans[n - 1][1]]  # apart
    for kind, p, new, n in spans:
        if kind == "flip":
            data[p : p + 1] = new[:1]
        elif kind == "insert":
            data[p:p] = new
        elif kind == "delete":
            del data[p : p + n]
        else:
            del data[p:]
    hit = [(p - 1, {"flip": p + 2, "insert": p + 1, "delete": p + n + 1}.get(kind, 1 << 60)) for kind, p, _, n in spans]
    return bytes(data), touched(r, hit)


def touched(r: Rendered, hit) -> set[int]:
    return {k for s, e, who in r.owners for lo, hi in hit if s < hi and lo < e for k in who}


COMPRESS = {
    "gz": lambda d: gzip.compress(d, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zst": lambda d: zstandard.ZstdCompressor().compress(d),
}
_STORE = tempfile.mkdtemp(prefix="fuzz-inputs-")


def read_items(data: bytes, fmt: str, compression: str, name: str, target: int | None, titles: bool = False):
    """(parts, tally) of the file read item by item (one item when compressed or target is None)."""
    tally = Tally()
    options = ReadOptions(keep_titles=titles, max_bad_share=1.0)  # never judge: all must be accounted for
    if compression != "none" or target is None:
        return list(iter_documents(io.BytesIO(data), fmt, compression, name, 0, tally, options)), tally
    with open(os.path.join(_STORE, name), "wb") as f:
        f.write(data)
    parts = []
    for start, end, _ in plan_ranges(LocalStore(_STORE), name, len(data), fmt, target):
        parts += iter_documents(io.BytesIO(data[start:end]), fmt, "none", name, start, tally, options)
    return parts, tally


def _tag(k: int) -> str:
    """Document k's tag: its number and a check, so that no few damaged bytes make another's."""
    return f"{TAG}{k}{END}{k * 2654435761 % (1 << 24):06x}{TAG}"


def _head(k: int) -> str:
    return HEAD + _tag(k)


def _tags(line: str) -> set[int]:
    return {
        int(k)
        for k, check in re.findall(f"{TAG}(\\d+){END}([0-9a-f]{{6}}){TAG}", line)
        if _tag(int(k)).endswith(f"{END}{check}{TAG}")
    }


def check_case(draw, fmt: str) -> None:
    max_doc = draw(st.sampled_from([4, 30, 4 << 20]))
    max_line = draw(st.sampled_from([64, 100, 300]))
    block = draw(st.sampled_from([7, 16, 64]))
    scan = draw(st.sampled_from([5, 64, 64 << 10]))
    patches = [
        (formats, "MAX_DOCUMENT_CHARS", max_doc),
        (formats, "MAX_LINE_BYTES", max_line),
        (formats, "_BLOCK", block),
        (ranges, "_SCAN", scan),
        (ranges, "_SHORT", draw(st.sampled_from([40, 64 << 10]))),
    ]
    error = draw(st.sampled_from([RecursionError, OverflowError, ValueError, MemoryError, KeyError]))
    real_loads = json.loads

    def loads(s, *args, **kwargs):  # any exception of the decoder costs its record only
        if POISON_MARK in s:
            raise error(POISON_MARK)
        return real_loads(s, *args, **kwargs)

    patches.append((json, "loads", loads))
    saved = [(m, a, getattr(m, a)) for m, a, _ in patches]
    for m, a, v in patches:
        setattr(m, a, v)
    try:
        _check(draw, fmt, max_doc, max_line)
    finally:
        for m, a, v in saved:
            setattr(m, a, v)


def _check(draw, fmt: str, max_doc: int, max_line: int) -> None:
    name = FORMATS_NAMES[fmt]
    docs = draw(st.lists(lines, max_size=7))
    titles = fmt == "wikiextractor" and draw(st.booleans())
    r = render(fmt, docs, draw, max_line, titles)
    data, hurt = damage(r, draw)
    clean = data = data if data != r.data else r.data
    if data != r.data:
        clean = None
    compression = draw(st.sampled_from(["none", "none", "gz", "bz2", "xz", "zst"]))
    chaos = False  # damage inside a compressed stream: garbage may come out, but no crash
    trailing = 0  # bytes of junk after a complete stream: counted, and no document's loss
    if compression != "none":
        name += "." + compression
        data = COMPRESS[compression](data)
        if clean is not None:
            clean = data
        if data and draw(st.booleans()):
            cut = draw(st.integers(0, len(data) - 1))
            if draw(st.booleans()):
                data = data[:cut] + bytes([data[cut] ^ draw(st.integers(1, 255))]) + data[cut + 1 :]
                chaos = True
            else:
                data = data[:cut]
                got = 0  # what the reader gets out of the cut stream: the documents after it are touched
                for block in formats._blocks(io.BytesIO(data), compression):
                    if block.__class__ is not bytes:
                        break
                    got += len(block)
                hurt |= touched(r, [(got - 16, 1 << 60)])  # (less what the damage inserted before it)
        elif data:
            junk = draw(st.binary(max_size=6))  # that starts no member (nor a zstd skippable frame)
            if junk and junk[0] != data[0] and not 0x50 <= junk[0] < 0x60:
                data += junk
                trailing = len(junk)
                if clean is not None:
                    clean = data
    target = draw(st.integers(1, max(1, len(data) + 10)))
    try:
        _check_read(fmt, name, data, compression, target, max_doc, r, hurt, clean, chaos, docs, titles, trailing)
    except AssertionError:
        if os.environ.get("FLEET_FUZZ_DUMP"):  # the failing case, to replay by hand
            with open(os.environ["FLEET_FUZZ_DUMP"], "a") as f:
                f.write(
                    json.dumps(
                        [
                            fmt,
                            compression,
                            target,
                            data.decode("latin-1"),
                            max_doc,
                            max_line,
                            formats._BLOCK,
                            ranges._SCAN,
                            ranges._SHORT,
                        ]
                    )
                    + "\n"
                )
        raise


def _check_read(fmt, name, data, compression, target, max_doc, r, hurt, clean, chaos, docs, titles, trailing=0) -> None:
    whole, whole_tally = read_items(data, fmt, compression, name, None, titles)
    parts, tally = read_items(data, fmt, compression, name, target, titles)
    if not chaos:
        assert tally.trailing == whole_tally.trailing == trailing
    case = (fmt, compression, target, data)
    # Every part is a bounded piece of one document.
    for part in parts:
        assert part and (sum(map(len, part)) <= max_doc or len(part) == 1), part
    # Cutting never changes what is read: the same lines, the same bad records.
    assert [x for p in parts for x in p] == [x for p in whole for x in p], case
    assert tally.bad == whole_tally.bad, case
    if fmt != "text":  # (plain text alone may cut a document longer than an item, between lines)
        assert parts == whole
    # (b) every bad record is counted with its place.
    assert all(re.match(re.escape(name) + r": (decompressed )?byte \d+: ", e) for e in tally.examples), tally.examples
    if chaos:
        return
    safe = [k for k in range(len(docs)) if k not in hurt and k not in r.broken]
    assert tally.bad >= sum(r.bad[k] for k in safe) + len(r.broken - hurt) * (fmt in ("jsonl", "cirrus"))
    if data == clean and not r.broken:
        assert tally.bad == sum(r.bad), tally.examples
    # (c) no markup, and nothing of another document, in a document's text.
    for part in parts:
        owners = set().union(*map(_tags, part))
        if len(owners) > 1:
            assert all(k in hurt for k in range(min(owners), max(owners) + 1)), (owners, hurt, part)
        for line in part:
            assert not (fmt == "wikiextractor" and (re.match(r"<doc\s+id=.*>\s*$", line) or _CLOSE.match(line)))
            for m in re.findall(MARK + r"(" + TAG + r"\d+" + END + r"[0-9a-f]{6}" + TAG + ")", line):
                assert _tags(m) <= hurt, (line, hurt)
    # (a) every document no damage touched comes out once, whole, in order, alone in its parts.
    where = {}
    for n, part in enumerate(parts):
        for j, line in enumerate(part):
            if line.startswith(HEAD) and len(_tags(line)) == 1 and line == _head(min(_tags(line))):
                k = min(_tags(line))
                assert k not in where, f"document {k} read twice"
                where[k] = (n, j)
    last = -1
    for k in safe:
        assert k in where, f"document {k} lost: {r.expected[k]}"
        n, j = where[k]
        doc = r.expected[k]
        t = doc.index(_head(k))
        first = n  # the parts before the tag's hold the document's lines before it
        need = t - j
        while need > 0:
            first -= 1
            need -= len(parts[first])
        end = n
        have = len(parts[n]) - j
        while have < len(doc) - t:
            end += 1
            have += len(parts[end])
        assert need == 0 and have == len(doc) - t and [x for p in parts[first : end + 1] for x in p] == doc, k
        assert first > last
        last = end


FUZZ_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("fmt", list(FORMATS_NAMES))
@settings(max_examples=60, **FUZZ_SETTINGS)
@given(data=st.data())
def test_invariants_hold_for_damaged_documents_in_every_format(fmt, data):
    check_case(data.draw, fmt)


@pytest.mark.fuzz
@pytest.mark.parametrize("fmt", list(FORMATS_NAMES))
@settings(max_examples=int(os.environ.get("FLEET_FUZZ_EXAMPLES", "5000")), **FUZZ_SETTINGS)
@given(data=st.data())
def test_fuzz_invariants_hold_for_damaged_documents_in_every_format(fmt, data):
    check_case(data.draw, fmt)

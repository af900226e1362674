"""Inputs: formats, compression, and cutting files at document boundaries."""

from __future__ import annotations

import bz2
import gzip
import json
import os

import pytest
import zstandard

from fleet.job import InputError
from fleet.core.run import make_items
from fleet.core.store.local import LocalStore
from fleet_jobs.text.inputs import (
    describe,
    find_corpus,
    iter_documents,
    iter_path_documents,
    plan_ranges,
    plan_slices,
    read_all,
)
from tests.helpers.linejob import JOB as LINEJOB, LineConfig
from tests.test_properties import assert_pieces_are_the_documents

CORPUS = os.path.join(os.path.dirname(__file__), "..", "corpus")


def docs_of(path: str) -> list[list[str]]:
    with open(path, "rb") as f:
        return list(iter_documents(f, "text", "none", path))


def test_describe_formats_and_compression():
    assert describe("a.txt") == ("text", "none")
    assert describe("a.jsonl.gz") == ("jsonl", "gz")
    assert describe("wiki_00") == ("text", "none")
    assert describe("x.TXT.ZST") == ("text", "zst")
    assert describe("b.json.bz2") == ("jsonl", "bz2")


def test_text_documents_split_on_blank_lines():
    data = b"a1\na2\n\n  \nb1\n\n\nc1\nc2 no newline"
    assert read_all(data, "x.txt") == [["a1", "a2"], ["b1"], ["c1", "c2 no newline"]]


def test_empty_file_has_no_documents():
    assert read_all(b"", "x.txt") == []
    assert read_all(b"\n\n\n", "x.txt") == []


@pytest.mark.parametrize(
    "suffix,compress", [(".gz", gzip.compress), (".bz2", bz2.compress), (".zst", zstandard.ZstdCompressor().compress)]
)
def test_compressed_inputs_read_like_plain(suffix, compress):
    data = "第一行\nline two\n\ndoc two\n".encode()
    assert read_all(compress(data), "c.txt" + suffix) == [["第一行", "line two"], ["doc two"]]


def test_jsonl_text_field_is_a_document():
    data = b'{"text": "l1\\nl2"}\n\n{"text": "only", "id": 3}\n'
    assert read_all(data, "d.jsonl") == [["l1", "l2"], ["only"]]


def test_jsonl_bad_records_are_skipped_and_named_until_most_are_bad():
    from fleet_jobs.text.inputs import Tally

    tally = Tally()
    data = b'{"text": "ok"}\n{not json\n{"text": "fine"}\n{"body": "x"}\n{"text": "also"}\n'
    assert read_all(data, "d.jsonl", tally=tally) == [["ok"], ["fine"], ["also"]]
    assert tally.bad == 2 and tally.documents == 3
    assert tally.examples[0].startswith("d.jsonl: byte 15: record 2 is not JSON")
    assert tally.examples[1] == "d.jsonl: byte 42: record 4 has no string field 'text'"
    with pytest.raises(InputError, match=r"d.jsonl: 2 of 3 records are bad, more than the 50% allowed"):
        read_all(b'{"body": "x"}\n{"text": "ok"}\n[1]\n', "d.jsonl")


def test_invalid_utf8_skips_its_line_naming_the_byte_offset():
    # A bad line costs itself, not its document (issue 17): the document goes on around it.
    from fleet_jobs.text.inputs import Tally

    tally = Tally()
    assert read_all(b"good\n\nhello\n\xff\xfe\nmore\n\nfine\nend\n", "bad.txt", tally=tally) == [
        ["good"],
        ["hello", "more"],
        ["fine", "end"],
    ]
    assert tally.examples == ["bad.txt: byte 12: invalid UTF-8"]
    with pytest.raises(InputError, match=r"bad.txt: 2 of 3 records are bad.*\(first: bad.txt: byte 6: invalid UTF-8\)"):
        read_all(b"hello\n\xff\xfe\n\xff\n", "bad.txt")


def test_nul_and_control_characters_are_text():
    assert read_all(b"a\x00b\x01c\n\nd\x7f\n", "c.txt") == [["a\x00b\x01c"], ["d\x7f"]]


def test_a_truncated_gzip_keeps_the_documents_before_the_damage():
    from fleet_jobs.text.inputs import Tally

    data = gzip.compress(b"".join(b"doc %d line\nsecond line\n\n" % i for i in range(3000)))
    tally = Tally()
    docs = read_all(data[: len(data) // 2], "t.txt.gz", tally=tally)
    assert 100 < len(docs) < 3000 and docs == [[f"doc {i} line", "second line"] for i in range(len(docs))]
    assert tally.bad == 1 and "t.txt.gz: decompressed byte" in tally.examples[0]
    assert (
        "corrupt or truncated gz data" in tally.examples[0] and "the documents before it are kept" in tally.examples[0]
    )
    with pytest.raises(InputError, match=r"t.txt.gz: 1 of 1 records are bad.*corrupt or truncated gz"):
        read_all(gzip.compress(b"some text\n" * 1000)[:-20], "t.txt.gz")


def test_folder_inputs_skip_readmes_code_and_hidden(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "wiki_00").write_text("y\n")
    (tmp_path / "README.md").write_text("z\n")
    (tmp_path / "make.py").write_text("print(1)\n")
    (tmp_path / ".hidden.txt").write_text("h\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "t"}\n'))
    names = [f.name for f in find_corpus([str(tmp_path)])]
    assert names == ["a.txt", "sub/b.jsonl.gz", "wiki_00"]


def test_missing_input_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="no such file or folder"):
        find_corpus([str(tmp_path / "nope")])


@pytest.mark.parametrize("target", [1000, 7919, 50_000, 300_000])
def test_cut_ranges_split_only_documents_longer_than_an_item_and_lose_no_line(target):
    path = os.path.abspath(os.path.join(CORPUS, "sample_en.txt"))
    size = os.path.getsize(path)
    store = LocalStore(os.path.dirname(path))
    ranges = plan_ranges(store, "sample_en.txt", size, "text", target)
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    if target < size // 2:
        assert len(ranges) > 1
    if target >= 300_000:  # longer than any man page of the sample (160 kB at most): no document is cut
        assert not any(cuts for _, _, cuts in ranges)
        pieces = []
        for start, end, _ in ranges:
            pieces += read_all(store.read("sample_en.txt", start, end), "sample_en.txt")
        assert pieces == docs_of(path)
    with open(path, "rb") as f:
        assert_pieces_are_the_documents(f.read(), "sample_en.txt", ranges, target)


def test_cut_ranges_jsonl_cuts_at_line_ends(tmp_path):
    lines = [json.dumps({"text": f"doc {i} " + "w" * (i % 50)}) for i in range(500)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    store = LocalStore(str(tmp_path))
    size = os.path.getsize(tmp_path / "c.jsonl")
    ranges = [(s, e) for s, e, _ in plan_ranges(store, "c.jsonl", size, "jsonl", 997)]
    got = [d for s, e in ranges for d in read_all(store.read("c.jsonl", s, e), "c.jsonl")]
    assert len(ranges) > 5
    assert got == [[json.loads(line)["text"]] for line in lines]


def test_a_document_longer_than_an_item_is_cut_between_lines(tmp_path):
    # It used to be one item whatever the item size: a 30 MB file with no blank line took
    # one worker 447 MB, and a 1 GB one would have taken it down.
    (tmp_path / "one.txt").write_text("line\n" * 10000)
    store = LocalStore(str(tmp_path))
    ranges = plan_ranges(store, "one.txt", 50000, "text", 1000)
    assert len(ranges) >= 40 and all(cuts for _, _, cuts in ranges[:-1]) and not ranges[-1][2]
    assert all(end % 5 == 0 and end - start <= 2000 for start, end, _ in ranges)  # at line ends
    assert_pieces_are_the_documents((tmp_path / "one.txt").read_bytes(), "one.txt", ranges, 1000)


def test_the_end_of_the_file_is_a_boundary_when_no_blank_line_comes_first(tmp_path):
    # Found by test_properties' search in a fresh clone: the planner looked for a blank line past
    # an item's end, reached the end of the file instead, and cut the last (short) document at its
    # first line end, although the end of the file ends it: its examples then hung on --item-mb.
    data = (
        b"\n0\xc2\x80\xc2\x80\xf0\x90\x80\x80\xf0\x90\x80\x80\n0000\xc2\x80\xc2\x80\xc2\x80\xc2\x80"
        b"\xf0\x90\x80\x80\n\n\n\n0\n0000000"
    )
    (tmp_path / "c.txt").write_bytes(data)
    ranges = plan_ranges(LocalStore(str(tmp_path)), "c.txt", len(data), "text", 35)
    assert ranges == [(0, len(data), False)]
    assert_pieces_are_the_documents(data, "c.txt", ranges, 35)


def test_items_cover_every_input(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"x\n\ny\n"))
    found = find_corpus([CORPUS, str(tmp_path)])
    slices = plan_slices([CORPUS, str(tmp_path)], 100_000)
    assert sum(s.size for s in slices) == sum(f.size for f in found)
    gz = [s for s in slices if s.compression == "gz"]
    assert len(gz) == 1 and gz[0].start == 0
    # A run's items are the text job's slices, numbered in order, each pinned to its file's version.
    items = make_items(LINEJOB, LineConfig(), found, 100_000)
    assert [i.id for i in items] == [f"{n:05d}" for n in range(len(items))]
    assert [(i.name, i.start, i.end, i.size, i.version) for i in items] == [
        (s.name, s.start, s.end, s.size, s.version) for s in slices
    ]
    assert [i.meta["compression"] for i in items] == [s.compression for s in slices]


def test_iter_path_documents_reads_folders(tmp_path):
    (tmp_path / "a.txt").write_text("a\n\nb\n")
    (tmp_path / "b.jsonl").write_text('{"text": "c"}\n')
    assert list(iter_path_documents([str(tmp_path)])) == [["a"], ["b"], ["c"]]


def test_an_item_planned_before_the_item_api_reads_as_the_slice_it_was(tmp_path):
    # Runs planned by 83e8d26 wrote the text layer's slice fields at the top of each item line.
    from fleet.core.run import Item
    from fleet_jobs.text.job import item_slice

    (tmp_path / "c.txt").write_bytes(b"a\n\nb\nc\n\nd\n")
    for s in plan_slices([str(tmp_path)], 4):
        old = {
            "url": s.url,
            "name": s.name,
            "start": s.start,
            "end": s.end,
            "format": s.format,
            "compression": s.compression,
            "version": s.version,
            "cuts_document": s.cuts_document,
            "text_bytes": 0,
            "id": "00000",
        }
        item = Item.from_dict(old)
        assert item.size == s.size and item_slice(item.input()) == s

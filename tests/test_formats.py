"""The corpora people have (issue 11): WikiExtractor shards and their --json form,
CirrusSearch dumps, recognised by content where the name does not say; a bad record
skipped and named, an item failed only when most of it is bad.

Every file is made here in exactly its format, with its broken forms.
"""

from __future__ import annotations

import bz2
import gzip
import json

import pytest

from fleet.job import InputError
from fleet.core.store.local import LocalStore
from fleet_jobs.text.inputs import ReadOptions, Tally, file_format, plan_ranges, read_all
from tests.helpers.cli import fleet, one_line_error

ARTICLES = [
    (
        "12",
        "Anarchism",
        [
            "Anarchism is a political philosophy.",
            "",
            "It is sceptical of authority.",
            "Etymology",
            "The word comes from Greek.",
        ],
    ),
    ("25", "自闭症", ["自闭症是一种神经发育障碍。", "", "其特征为社交障碍。"]),
    ("39", "Albedo", ["Albedo is the fraction of sunlight that is reflected."]),
]
EXPECTED = [[line for line in body if line] for _, _, body in ARTICLES]


def wikiextractor(articles=ARTICLES) -> bytes:
    """WikiExtractor's default output: <doc> tags, the title line, blank lines between paragraphs."""
    out = []
    for doc_id, title, body in articles:
        url = f"https://en.wikipedia.org/wiki?curid={doc_id}"
        out.append(f'<doc id="{doc_id}" url="{url}" title="{title}">\n{title}\n\n' + "\n".join(body) + "\n</doc>\n")
    return "".join(out).encode()


def wikiextractor_json(articles=ARTICLES) -> bytes:
    """WikiExtractor --json: one object per line; its text keeps paragraphs as lines."""
    return "".join(
        json.dumps({"id": d, "revid": "1", "url": f"u{d}", "title": t, "text": "\n".join(b)}, ensure_ascii=False) + "\n"
        for d, t, b in articles
    ).encode()


def cirrus(articles=ARTICLES) -> bytes:
    """A CirrusSearch content dump: bulk index lines alternating with content lines."""
    out = []
    for doc_id, title, body in articles:
        out.append(json.dumps({"index": {"_type": "page", "_id": doc_id}}))
        out.append(
            json.dumps(
                {
                    "namespace": 0,
                    "title": title,
                    "text": "\n".join(line for line in body if line),
                    "timestamp": "2024-01-01T00:00:00Z",
                    "wiki": "enwiki",
                },
                ensure_ascii=False,
            )
        )
    return ("\n".join(out) + "\n").encode()


def test_wikiextractor_documents_are_docs_not_paragraphs_and_titles_are_dropped():
    assert read_all(wikiextractor(), "wiki_00") == EXPECTED
    titled = read_all(wikiextractor(), "wiki_00", options=ReadOptions(keep_titles=True))
    assert titled == [[title] + doc for (_, title, _), doc in zip(ARTICLES, EXPECTED)]
    assert read_all(bz2.compress(wikiextractor()), "wiki_01.bz2") == EXPECTED


def test_wikiextractor_json_shards_are_json_not_text():
    # An extension-less --json shard used to be read as plain text: its JSON syntax became training data.
    assert read_all(wikiextractor_json(), "wiki_00") == EXPECTED


def test_cirrussearch_dump_documents_are_the_content_lines():
    assert read_all(gzip.compress(cirrus()), "enwiki-20240101-cirrussearch-content.json.gz") == EXPECTED


@pytest.mark.parametrize(
    "name,data,fmt",
    [
        ("wiki_00", wikiextractor(), "wikiextractor"),
        ("wiki_01", wikiextractor_json(), "jsonl"),
        ("x-cirrussearch-content.json.gz", gzip.compress(cirrus(), mtime=0), "cirrus"),
        ("wiki_02.bz2", bz2.compress(wikiextractor()), "wikiextractor"),
        ("a.txt", b"plain\ntext\n", "text"),
        ("shard_7", b"plain\ntext\n", "text"),
        ("b.jsonl", b'{"text": "x"}\n', "jsonl"),
        ("notes.txt", b'{"text": "looks like JSON"}\n', "text"),  # a name that says text is text...
        ("c.txt", wikiextractor(), "wikiextractor"),  # ...unless it is WikiExtractor's
    ],
)
def test_the_format_is_told_by_content_where_the_name_does_not_say(tmp_path, name, data, fmt):
    (tmp_path / name).write_bytes(data)
    assert file_format(LocalStore(str(tmp_path)), name, len(data)) == fmt


def test_the_same_articles_in_every_format_give_the_same_documents():
    plain = "\n\n".join("\n".join(doc) for doc in EXPECTED).encode() + b"\n"
    forms = {
        "a.txt": plain,
        "wiki_00": wikiextractor(),
        "wiki_01": wikiextractor_json(),
        "x-cirrussearch-content.json.gz": gzip.compress(cirrus()),
        "a.jsonl.gz": gzip.compress(wikiextractor_json()),
    }
    for name, data in forms.items():
        assert read_all(data, name) == EXPECTED, name


def test_wikiextractor_shards_are_cut_only_between_docs(tmp_path):
    many = [(str(i), f"T{i}", [f"line {i}.{j} " + "w" * (i % 40) for j in range(i % 5 + 1)]) for i in range(300)]
    data = wikiextractor(many)
    (tmp_path / "wiki_00").write_bytes(data)
    ranges = plan_ranges(LocalStore(str(tmp_path)), "wiki_00", len(data), "wikiextractor", 997)
    assert len(ranges) > 10 and not any(cut for _, _, cut in ranges)
    pieces = []
    for start, end, _ in ranges:
        assert data[start:].startswith(b"<doc ")
        pieces += read_all(data[start:end], "wiki_00", fmt="wikiextractor")
    assert pieces == [[line for line in body] for _, _, body in many]


def test_cirrus_files_are_cut_only_before_an_index_line(tmp_path):
    many = [(str(i), f"T{i}", [f"text of {i} " + "w" * (i % 30)]) for i in range(300)]
    data = cirrus(many)
    (tmp_path / "c.json").write_bytes(data)
    ranges = plan_ranges(LocalStore(str(tmp_path)), "c.json", len(data), "cirrus", 500)
    assert len(ranges) > 10
    pieces = []
    for start, end, _ in ranges:
        assert data[start:].startswith(b'{"index"')
        pieces += read_all(data[start:end], "c.json", fmt="cirrus")
    assert pieces == [body for _, _, body in many]


# -- broken forms ----------------------------------------------------------------------------------
def test_a_truncated_wikiextractor_shard_keeps_its_whole_docs():
    data = wikiextractor()
    tally = Tally()
    docs = read_all(data[: data.index(b"reflected")], "wiki_00", tally=tally)
    assert docs == EXPECTED[:2] and tally.bad == 1 and "has no </doc>" in tally.examples[0]


def test_text_outside_docs_is_bad_and_a_file_of_it_fails():
    tally = Tally()
    docs = read_all(
        wikiextractor() + b"stray line\n" + wikiextractor(ARTICLES[:1]), "wiki_00", fmt="wikiextractor", tally=tally
    )
    assert docs == EXPECTED + EXPECTED[:1] and tally.bad == 1 and "outside any <doc>" in tally.examples[0]
    with pytest.raises(InputError, match=r"wiki_00: 3 of 3 records are bad.*outside any <doc>"):
        read_all(b"a\nb\nc\n", "wiki_00", fmt="wikiextractor")


def test_a_wrong_text_column_fails_naming_it():
    with pytest.raises(InputError, match=r"wiki_00: 3 of 3 records are bad.*has no string field 'body'"):
        read_all(wikiextractor_json(), "wiki_00", options=ReadOptions(text_column="body"))
    assert read_all(b'{"body": "a\\nb"}\n', "x.jsonl", options=ReadOptions(text_column="body")) == [["a", "b"]]


def test_the_bad_share_option_sets_when_an_item_fails():
    data = b'{"text": "ok"}\n{"text": 1}\n{"text": "ok"}\n{"text": "ok"}\n'
    assert len(read_all(data, "x.jsonl", options=ReadOptions(max_bad_share=0.25))) == 3
    with pytest.raises(InputError, match=r"1 of 4 records are bad, more than the 20% allowed"):
        read_all(data, "x.jsonl", options=ReadOptions(max_bad_share=0.2))


def test_a_binary_file_fails_fast_without_reading_it_all():
    tally = Tally()
    junk = b"\x80\x81 binary \xff\xfe\n\n" * 200_000  # 2.8 MB of bad "documents" (FF FE first: UTF-16's mark)
    with pytest.raises(InputError, match=r"100 of 100 records are bad"):
        read_all(junk, "x.txt", tally=tally)


def test_formats_run_end_to_end_with_their_options(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "wiki_00").write_bytes(wikiextractor())
    (folder / "wiki_01").write_bytes(wikiextractor_json())
    (folder / "enwiki-cirrussearch-content.json.gz").write_bytes(gzip.compress(cirrus()))
    out = tmp_path / "out"
    proc = fleet(
        "local", folder, out, "--job", "tests.helpers.linejob:JOB", "--workers", "1", "--keep-titles", tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents"] == 9 and summary["lines"] == 3 * 7 + 3  # titles kept in the WikiExtractor shard
    one_line_error(
        fleet("local", folder, out, "--job", "tests.helpers.linejob:JOB", tmp=tmp_path),
        "keep titles is False, was True",
    )
    one_line_error(
        fleet("local", folder, tmp_path / "o2", "--job", "tests.helpers.linejob:JOB", "--max-bad-share", "2"),
        "--max-bad-share 2: give 0 to 1 (a share of the records)",
    )


# -- Parquet ---------------------------------------------------------------------------------------
def write_parquet(path, texts, column="text", row_group_size=50, **extra) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(texts))), column: texts, **extra})
    pq.write_table(table, str(path), row_group_size=row_group_size, compression="zstd")


ROWS = [f"row {i} first line.\n\nrow {i} second line 数据" if i % 7 else f"row {i} only" for i in range(400)]


def test_parquet_rows_are_documents_and_items_are_row_group_ranges(tmp_path):
    from fleet_jobs.text.inputs import plan_slices, read_slice

    write_parquet(tmp_path / "train-00000.parquet", ROWS)
    items = plan_slices([str(tmp_path)], 3000)
    assert len(items) > 2 and all(i.format == "parquet" for i in items)
    assert items[0].start == 0 and items[-1].end == 8 and all(a.end == b.start for a, b in zip(items, items[1:]))
    docs = []
    for item in items:
        docs += list(read_slice(item, str(tmp_path)))
    assert docs == [[line for line in row.split("\n") if line.strip()] for row in ROWS]
    assert sum(i.size for i in items) > sum(map(len, ROWS))  # sizes are text bytes, for progress and balance


def test_parquet_on_gcs_is_read_by_ranges_of_the_planned_generation(tmp_path, gcs_bucket):
    from fleet.core.store import open_store
    from fleet_jobs.text.inputs import plan_slices, read_slice

    write_parquet(tmp_path / "a.parquet", ROWS)
    store = open_store(f"gs://{gcs_bucket}")
    store.write("hub/a.parquet", (tmp_path / "a.parquet").read_bytes())
    items = plan_slices([f"gs://{gcs_bucket}/hub"], 3000)
    docs = [doc for item in items for doc in read_slice(item, str(tmp_path))]
    assert len(docs) == 400
    write_parquet(tmp_path / "b.parquet", ROWS[::-1])
    store.write("hub/a.parquet", (tmp_path / "b.parquet").read_bytes())
    with pytest.raises(InputError, match="changed since it was planned"):
        list(read_slice(items[0], str(tmp_path)))


def test_parquet_text_column_option_and_bad_rows(tmp_path):
    texts = ROWS[:100]
    texts[5] = None
    write_parquet(tmp_path / "a.parquet", ROWS[:100], column="body")
    write_parquet(tmp_path / "b.parquet", texts)
    docs = read_parquet_file(tmp_path / "a.parquet", ReadOptions(text_column="body"))
    assert len(docs) == 100
    tally = Tally()
    assert len(read_parquet_file(tmp_path / "b.parquet", tally=tally)) == 99
    assert tally.bad == 1 and tally.examples == [f"{tmp_path}/b.parquet: row 6 has no text in column 'text'"]


def read_parquet_file(path, options=ReadOptions(), tally=None):
    from fleet_jobs.text.inputs.parquet import parquet_documents, row_groups

    store = LocalStore(str(path.parent))
    size = path.stat().st_size
    groups = row_groups(store, path.name, size, None, options.text_column, str(path))
    return list(parquet_documents(store, path.name, size, None, 0, len(groups), str(path), tally or Tally(), options))


def test_broken_parquet_files_are_one_line_errors_naming_them(tmp_path):
    write_parquet(tmp_path / "good.parquet", ROWS[:10])
    data = (tmp_path / "good.parquet").read_bytes()
    cases = {
        "truncated.parquet": (data[: len(data) // 2], "not a readable Parquet file"),
        "not.parquet": (b"this is text, not parquet\n" * 20, "not a readable Parquet file"),
        "good.parquet": (data, "no column 'body' (columns: id, text); name the text column with --text-column"),
    }
    for name, (content, message) in cases.items():
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_bytes(content)
        proc = fleet(
            "plan",
            "--bucket",
            tmp_path / f"b-{name}",
            "--run",
            "r",
            "--job",
            "tests.helpers.linejob:JOB",
            "--input",
            folder / name,
            "--output",
            tmp_path / "o",
            "--text-column",
            "body",
        )
        one_line_error(proc, f"{folder / name}: {message}")
    write_parquet(tmp_path / "ints.parquet", ROWS[:10], extra_col=list(range(10)))
    one_line_error(
        fleet(
            "plan",
            "--bucket",
            tmp_path / "b3",
            "--run",
            "r",
            "--job",
            "tests.helpers.linejob:JOB",
            "--input",
            tmp_path / "ints.parquet",
            "--output",
            tmp_path / "o",
            "--text-column",
            "id",
        ),
        "column 'id' holds int64, not text",
    )


def test_the_same_articles_as_parquet_give_the_same_documents(tmp_path):
    write_parquet(tmp_path / "w.parquet", ["\n\n".join(body) for _, _, body in ARTICLES], row_group_size=2)
    assert read_parquet_file(tmp_path / "w.parquet") == EXPECTED


def test_parquet_end_to_end(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_parquet(folder / "train-00000-of-00002.parquet", ROWS)
    write_parquet(folder / "train-00001-of-00002.parquet", ROWS[:100])
    out = tmp_path / "out"
    proc = fleet(
        "local", folder, out, "--job", "tests.helpers.linejob:JOB", "--workers", "2", "--item-mb", "0.003", tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents"] == 500 and summary["items"] > 4

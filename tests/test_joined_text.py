"""``--text-column title,text`` (issue 33 item 3): several text fields joined into one document.

The truth is a plain definition (``joined``: json.loads, then the named fields' strings joined by a
blank line); the reader (formats.py, a record read whole or streamed by longjson when it is longer
than a line; parquet.py, a value read whole or a window at a time) and the second reading that
places documents (places.py) must give exactly its documents, for any records. Then real ``fleet
local`` runs over JSON Lines and Parquet with title and text, some records missing one, whose
output sequences are traced by the provenance sidecar to their records and re-tokenized from the
joined text; and the option's refusals, one line at plan time.
"""

from __future__ import annotations

import glob
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.core.store.local import LocalStore
from fleet.formats.token_files import read_sequences
from fleet.job import ConfigError
from fleet_jobs.text.inputs import ReadOptions, Tally, formats, parquet, places, read_all
from fleet_jobs.text.inputs.formats import text_fields
from fleet_jobs.text.job import check_read_options
from tests.helpers.cli import fleet, fleet_in_process, one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def joined(record: object, names: tuple[str, ...]) -> list[str] | None:
    """The document of one JSON record by the definition: the named fields' strings, in order,
    joined by a blank line (a missing or null field gives none), split into its non-blank lines;
    None (a bad record) when it is no object, when no field holds a string, or when one holds
    anything but a string or null."""
    if not isinstance(record, dict):
        return None
    values = [record.get(name) for name in names]
    if any(v is not None and not isinstance(v, str) for v in values):
        return None
    strings = [v for v in values if isinstance(v, str)]
    if not strings:
        return None
    text = "\n\n".join(s for s in strings if s)
    return [line for line in text.split("\n") if line.strip()]


def expected(records: list, names: tuple[str, ...]) -> tuple[list[list[str]], int]:
    """(documents, bad records) by the definition."""
    docs, bad = [], 0
    for record in records:
        doc = joined(record, names)
        if doc is None:
            bad += 1
        elif doc:
            docs.append(doc)
    return docs, bad


# Short lines (a streamed record's lines stay under the lowered MAX_LINE_BYTES, as a record read
# whole has no such limit), blank ones, whitespace, non-ASCII, JSON escapes.
_LINE = st.text(st.sampled_from('ab zé漢\t"\\/\x01😀'), max_size=12)
_TEXT = st.lists(_LINE, max_size=6).map("\n".join)
_VALUE = st.one_of(
    _TEXT, _TEXT, _TEXT, st.none(), st.integers(-5, 5), st.booleans(), st.lists(st.integers(), max_size=2)
)
NAMES = [("text",), ("title", "text"), ("text", "title"), ("title", "text", "id")]


@st.composite
def records(draw):
    keys = draw(st.permutations(["title", "text", "id", "other"]))
    return {k: draw(_VALUE) for k in keys if draw(st.integers(0, 3))}  # each key missing a quarter of the time


@settings(max_examples=300, **SETTINGS)
@given(
    recs=st.lists(records(), max_size=8),
    names=st.sampled_from(NAMES),
    line=st.sampled_from([formats.MAX_LINE_BYTES, 64, 24]),
    held=st.sampled_from([formats._HELD, 5]),
    ascii_=st.booleans(),
)
def test_joined_reading_is_the_definition_for_any_records(recs, names, line, held, ascii_):
    """Short and (with a lowered MAX_LINE_BYTES) streamed records, fields in any order in the
    record (a streamed field named first that comes last is held, spilled to disk when ``held`` is
    small): the reader's documents and bad count, and the places reading's documents, are the
    definition's, one for one."""
    data = "".join(json.dumps(r, ensure_ascii=ascii_) + "\n" for r in recs).encode()
    want, bad = expected(recs, names)
    column = ",".join(names)
    saved = formats.MAX_LINE_BYTES, formats._BLOCK, formats._HELD
    formats.MAX_LINE_BYTES, formats._BLOCK, formats._HELD = line, min(line, formats._BLOCK), held
    try:
        tally = Tally()
        got = read_all(data, "x.jsonl", tally=tally, options=ReadOptions(text_column=column, max_bad_share=1.0))
        found = [
            doc for _, doc, _ in places._json_records(places._lines(io.BytesIO(data), "none", 0, True), column, False)
        ]
    finally:
        formats.MAX_LINE_BYTES, formats._BLOCK, formats._HELD = saved
    assert got == want
    assert tally.bad == bad
    assert found == want  # the second reading (provenance) finds the same documents


@settings(max_examples=100, **SETTINGS)
@given(
    rows=st.lists(st.tuples(st.one_of(st.none(), _TEXT), st.one_of(st.none(), _TEXT)), max_size=10),
    names=st.sampled_from([("title", "text"), ("text", "title"), ("text",)]),
    long=st.sampled_from([parquet.MAX_DOCUMENT_CHARS, 8]),
    window=st.sampled_from([parquet._WINDOW, 4]),
    group=st.integers(1, 4),
)
def test_joined_parquet_rows_are_the_definition(tmp_path_factory, rows, names, long, window, group):
    """Parquet: a row's document is its named columns joined, a null one giving nothing; null in all
    is a bad row. Values over ``long`` bytes are streamed a window at a time (parquet._long_row)."""
    folder = tmp_path_factory.mktemp("pq")
    table = pa.table({"title": [r[0] for r in rows], "text": [r[1] for r in rows]}, schema=_SCHEMA)
    pq.write_table(table, folder / "a.parquet", row_group_size=group)
    want, bad = expected([{"title": t, "text": x} for t, x in rows], names)
    column = ",".join(names)
    size = (folder / "a.parquet").stat().st_size
    store = LocalStore(str(folder))
    groups = parquet.row_groups(store, "a.parquet", size, None, column, "a.parquet")
    saved = parquet.MAX_DOCUMENT_CHARS, parquet._WINDOW
    parquet.MAX_DOCUMENT_CHARS, parquet._WINDOW = long, window
    try:
        tally = Tally()
        options = ReadOptions(text_column=column, max_bad_share=1.0)
        got = list(parquet.parquet_documents(store, "a.parquet", size, None, 0, len(groups), "a", tally, options))
        pf = parquet._open(store, "a.parquet", size, None, "a")
        found = [doc for _, doc, _ in places.parquet_records(pf, 0, len(groups), column)]
    finally:
        parquet.MAX_DOCUMENT_CHARS, parquet._WINDOW = saved
    assert got == want
    assert tally.bad == bad
    assert found == want


_SCHEMA = pa.schema([("title", pa.string()), ("text", pa.string())])


def test_a_single_text_column_reads_as_before():
    """One name is taken as it is (spaces and all); only a comma makes several."""
    assert text_fields("text") == ("text",) and text_fields(" body ") == (" body ",)
    assert text_fields("title, text") == ("title", "text")
    data = b'{"title": "T", "text": "body"}\n{"text": 5}\n'
    tally = Tally()
    assert read_all(data, "x.jsonl", tally=tally, options=ReadOptions(max_bad_share=1.0)) == [["body"]]
    assert tally.examples == ["x.jsonl: byte 31: record 2 has no string field 'text'"]


def test_bad_joined_records_are_counted_and_say_why():
    data = b'{"title": "T", "text": "a"}\n{"title": 7, "text": "b"}\n{"id": 1}\n{"title": null}\n{"text": ""}\n'
    tally = Tally()
    got = read_all(data, "x.jsonl", tally=tally, options=ReadOptions(text_column="title,text", max_bad_share=1.0))
    assert got == [["T", "a"]]
    assert tally.bad == 3
    assert [e.split(": ", 2)[2] for e in tally.examples] == [
        "record 2: field 'title' holds a number, not text",
        "record 3 has no string in any of the fields 'title', 'text'",
        "record 4 has no string in any of the fields 'title', 'text'",
    ]


def test_a_long_record_with_a_non_string_field_is_one_bad_record():
    """Streamed (longer than MAX_LINE_BYTES), a record whose named field holds a list is bad, as
    read whole; its text, held or not, is not handed on."""
    record = json.dumps({"text": "x" * 50, "title": [1, 2]}).encode()
    saved = formats.MAX_LINE_BYTES, formats._BLOCK
    formats.MAX_LINE_BYTES, formats._BLOCK = 32, 16
    try:
        tally = Tally()
        got = read_all(record + b'\n{"text": "ok"}\n', "x.jsonl", tally=tally, options=_OPTIONS)
    finally:
        formats.MAX_LINE_BYTES, formats._BLOCK = saved
    assert got == [["ok"]] and tally.bad == 1
    assert tally.examples[0].endswith("read as a stream): field 'title' holds a list, not text")


_OPTIONS = ReadOptions(text_column="title,text", max_bad_share=1.0)


@pytest.mark.parametrize(
    "value, why",
    [
        (",", "an empty name"),
        ("title,,text", "an empty name"),
        ("text,", "an empty name"),
        ("text,text", "names a field twice"),
        ("title, title", "names a field twice"),
    ],
)
def test_bad_text_columns_are_refused_naming_the_option(value, why):
    with pytest.raises(ConfigError, match=why) as e:
        check_read_options({"text_column": value})
    assert str(e.value).startswith(f"--text-column {value!r}: ") and "\n" not in str(e.value)


def test_a_bad_text_column_is_one_line_at_plan_time(tmp_path):
    """A bad option; a Parquet file without one of the columns (its schema says so for every row:
    a misspelt name, not a missing value); a JSON file none of whose first records has any."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x"]) + "\n")
    common = ["--set", f"vocab_file={vocab}", "--text-column"]
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    proc = fleet_in_process("local", tmp_path / "a.jsonl", tmp_path / "out", *common, "text,,title")
    one_line_error(proc, "--text-column 'text,,title'", "an empty name")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "b.parquet")
    proc = fleet_in_process("local", tmp_path / "b.parquet", tmp_path / "out2", *common, "title,text")
    one_line_error(proc, "b.parquet", "no column 'title'")
    (tmp_path / "c.jsonl").write_text('{"body": "x"}\n' * 3)
    proc = fleet_in_process("local", tmp_path / "c.jsonl", tmp_path / "out3", *common, "title,text")
    one_line_error(proc, "c.jsonl", "any of the fields 'title', 'text'", "give --text-column body")


def test_the_check_tool_reads_joined_fields_and_refuses_a_bad_option(tmp_path):
    from typer.testing import CliRunner

    from fleet_jobs.text.tools.cli import app
    from tests.helpers.cli import one_line_job_error

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "title", "body"]) + "\n")
    (tmp_path / "a.jsonl").write_text('{"title": "title", "text": "body"}\n{"text": "body"}\n')
    common = ["check", str(tmp_path / "a.jsonl"), "--vocab", str(vocab), "--text-column"]
    one_line_job_error(CliRunner().invoke(app, [*common, "title,title"]), "--text-column 'title,title'", "twice")
    done = CliRunner().invoke(app, [*common, "title,text"])
    assert done.exit_code == 0 and "bad records" not in done.output, done.output


# -- real runs: the documents the output holds are the joined texts ------------------------------


def corpus_records() -> list[dict]:
    """Records with a title and a text, some without a title (missing or null), some without a text,
    a few with neither (bad records)."""
    blocks = []
    for lang in ("en", "zh"):
        with open(os.path.join(ROOT, "corpus", f"sample_{lang}.txt"), encoding="utf-8") as f:
            blocks += ["\n".join(b.split("\n")[:4]) for b in f.read().split("\n\n") if b.strip()]
    out = []
    for i, text in enumerate(blocks[:80]):
        record: dict = {"id": i, "title": f"Title {i} {text.split()[0]}", "text": text}
        if i % 5 == 1:
            del record["title"]
        elif i % 5 == 2:
            record["title"] = None
        elif i % 7 == 3:
            del record["text"]
        elif i % 11 == 4:
            record = {"id": i}
        out.append(record)
    return out


def test_fleet_local_writes_the_joined_texts_of_jsonl_and_parquet(tmp_path):
    from tokenizers import ByteLevelBPETokenizer, Tokenizer

    recs = corpus_records()
    inputs = tmp_path / "in"
    inputs.mkdir()
    with open(inputs / "a.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs[:40])
    rows = recs[40:]
    pq.write_table(
        pa.table(
            {
                "id": [r["id"] for r in rows],
                "title": [r.get("title") for r in rows],
                "text": [r.get("text") for r in rows],
            }
        ),
        inputs / "b.parquet",
        row_group_size=7,
    )
    names = ("title", "text")
    truth = {("a.jsonl", k): joined(r, names) for k, r in enumerate(recs[:40])}
    truth.update({("b.parquet", k): joined(r, names) for k, r in enumerate(rows)})
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator((r.get("text") or "" for r in recs), vocab_size=800, special_tokens=["<|endoftext|>"])
    bpe.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    out = tmp_path / "out"
    proc = fleet(
        "local", inputs, out, "--workers", "2", "--item-mb", "0.004", "--text-column", "title,text",
        "--job", "causal_lm", "--set", f"tokenizer_file={tmp_path / 'tokenizer.json'}",
        "--set", "output=megatron", "--set", "provenance=true", "--set", "fields=title,id",
        tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    offsets = [0]  # where each JSON record starts
    for r in recs[:40]:
        offsets.append(offsets[-1] + len((json.dumps(r, ensure_ascii=False) + "\n").encode()))
    seen = []
    for bin_path in sorted(glob.glob(str(out / "part-*.bin"))):
        prefix = bin_path[:-4]
        with open(prefix + ".idx", "rb") as f:
            sequences = read_sequences(bin_path, f.read(), "megatron", 800)
        with open(prefix + ".provenance.jsonl") as f:
            lines = [json.loads(line) for line in f]
        assert len(lines) == len(sequences)
        for place, sequence in zip(lines, sequences):
            name = os.path.basename(place["file"])
            k = offsets.index(place["offset"]) if "offset" in place else place["row"]
            doc = truth[(name, k)]
            assert doc, place  # a document only of a record that has text
            assert sequence.tolist() == [*tok.encode("\n".join(doc), add_special_tokens=False).ids, eod], place
            record = recs[k] if name == "a.jsonl" else rows[k]
            assert place["fields"] == {"title": record.get("title"), "id": str(record["id"])}  # a text field carried
            seen.append((name, k))
    assert sorted(seen) == sorted(key for key, doc in truth.items() if doc)  # every record with text, once
    assert any(r.get("title") and r.get("text") for r in recs) and any(d and len(d) == 1 for d in truth.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bad_records"] == sum(d is None for d in truth.values()) > 0, summary

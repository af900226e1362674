"""python -m fleet_jobs.text check: a bounded look at the inputs before the spend (issue 11)."""

from __future__ import annotations

import bz2
import gzip
import json
import re

import pytest
from typer.testing import CliRunner

from fleet_jobs.text.tools.cli import app
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.cli import one_line_job_error as one_line_error

DOCS = [
    ["今天天气很好。我们去公园吧！你来吗？", "第二段只有一句。"],
    ["Mr. Smith met Dr. Jones at 3.14 p.m. in the U.S. They talked. It was fine!", "A second paragraph."],
    ["混合 English 和中文。Another sentence here."],
]


def run(*args):
    return CliRunner().invoke(app, ["check", *map(str, args)])


def figures(output: str) -> str:
    """The report without its first line (which names the formats and the time taken)."""
    return output.split("\n", 1)[1]


@pytest.fixture
def vocab(tmp_path) -> str:
    path = str(tmp_path / "vocab.txt")
    write_vocab(train_vocab((line for doc in DOCS for line in doc), 400), path)
    return str(path)


def write_formats(folder) -> dict[str, str]:
    """The same documents in every format fleet reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    paths = {}
    paths["text"] = folder / "docs.txt"
    paths["text"].write_text("\n\n".join("\n".join(d) for d in DOCS) + "\n", encoding="utf-8")
    paths["jsonl"] = folder / "docs.jsonl"
    paths["jsonl"].write_text(
        "".join(json.dumps({"text": "\n".join(d)}, ensure_ascii=False) + "\n" for d in DOCS), encoding="utf-8"
    )
    paths["wikiextractor"] = folder / "wiki_00.bz2"
    paths["wikiextractor"].write_bytes(
        bz2.compress(
            "".join(
                f'<doc id="{i}" url="u" title="T{i}">\nT{i}\n\n' + "\n\n".join(d) + "\n</doc>\n"
                for i, d in enumerate(DOCS)
            ).encode()
        )
    )
    paths["cirrus"] = folder / "cirrussearch-content.json"
    paths["cirrus"].write_text(
        "".join(
            json.dumps({"index": {"_id": i}}) + "\n" + json.dumps({"text": "\n".join(d)}, ensure_ascii=False) + "\n"
            for i, d in enumerate(DOCS)
        ),
        encoding="utf-8",
    )
    paths["parquet"] = folder / "train.parquet"
    pq.write_table(pa.table({"text": ["\n".join(d) for d in DOCS]}), str(paths["parquet"]))
    return {k: str(v) for k, v in paths.items()}


def test_the_figures_of_a_sample(tmp_path, vocab):
    paths = write_formats(tmp_path / "in")
    result = run(paths["text"], "--vocab", vocab, "--max-seq-length", 16)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "read 1 of 1 files (1 text)" in out
    assert "sample: 3 documents, 5 lines" in out
    assert re.search(r"per MB of text: [\d,]+ documents, [\d,]+ lines", out)
    assert re.search(r"tokens per line: p50 \d+, p90 \d+, p99 \d+, max \d+, mean [\d.]+", out)
    assert "[UNK]: 0.00% of" in out
    chinese, latin = map(float, re.search(r"Chinese ([\d.]+)%, Latin letters ([\d.]+)%", out).groups())
    text = "".join("".join(d) for d in DOCS).replace(" ", "")
    assert chinese == round(100 * len(re.findall(r"[\u4e00-\u9fff]", text)) / len(text), 1)
    assert latin == round(100 * len(re.findall(r"[A-Za-z]", text)) / len(text), 1)
    assert re.search(r"lines over 14 tokens \(max_seq_length 16 less \[CLS\] \[SEP\]\): [1-9]", out)
    assert "with split_sentences=true: 9 lines (1.80x)" in out
    # a vocab that misses the Chinese characters shows as [UNK]
    english = tmp_path / "english.txt"
    write_vocab(train_vocab(["Mr Smith met Dr Jones English sentence paragraph"], 100), str(english))
    unk = float(re.search(r"\[UNK\]: ([\d.]+)%", run(paths["text"], "--vocab", english).output).group(1))
    assert unk > 20


def test_every_format_gives_the_same_figures(tmp_path, vocab):
    paths = write_formats(tmp_path / "in")
    results = {fmt: run(path, "--vocab", vocab) for fmt, path in paths.items()}
    for fmt, result in results.items():
        assert result.exit_code == 0, (fmt, result.output)
        assert f"(1 {fmt})" in result.output.splitlines()[0]
    assert len({figures(r.output) for r in results.values()}) == 1, {f: figures(r.output) for f, r in results.items()}
    both = run(tmp_path / "in", "--vocab", vocab)  # a folder: every file sampled
    assert "read 5 of 5 files" in both.output and "sample: 15 documents" in both.output


def test_the_sample_is_bounded(tmp_path, vocab):
    big = tmp_path / "big.txt"
    doc = "\n".join(DOCS[1]) + "\n\n"
    big.write_text(doc * 20000, encoding="utf-8")  # about 2 MB
    other = tmp_path / "other.txt"
    other.write_text(doc * 10, encoding="utf-8")
    result = run(big, other, "--vocab", vocab, "--mb", 0.3)
    assert result.exit_code == 0, result.output
    documents = int(re.search(r"sample: ([\d,]+) documents", result.output).group(1).replace(",", ""))
    assert 2000 < documents < 5000  # the first file's share (256 KiB at least), then the second file whole
    assert "read 2 of 2 files" in result.output
    result = run(big, other, "--vocab", vocab, "--seconds", 0.000001)
    assert "time limit reached" in result.output and "read 1 of 2 files" in result.output


def test_bad_input_is_one_line_naming_the_file(tmp_path, vocab):
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_bytes(b"PAR1 this is not parquet at all")
    one_line_error(run(not_parquet, "--vocab", vocab), "x.parquet", "not a readable Parquet file")
    garbage = tmp_path / "g.jsonl"
    garbage.write_text("not json\n" * 20)
    one_line_error(run(garbage, "--vocab", vocab), "g.jsonl", "are bad")
    truncated = tmp_path / "wiki_01.gz"
    truncated.write_bytes(gzip.compress(b'<doc id="1" url="u" title="t">\nt\n\nsome text.\n</doc>\n' * 50)[:-20])
    result = run(truncated, "--vocab", vocab)  # the documents before the damage are read, the damage counted
    assert result.exit_code == 0 and "bad records skipped: 1" in result.output and "wiki_01.gz" in result.output
    one_line_error(run(tmp_path / "missing.txt", "--vocab", vocab), "missing.txt", "no such file")
    wrong_column = tmp_path / "y.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["a"]}), str(wrong_column))
    one_line_error(run(wrong_column, "--vocab", vocab), "y.parquet", "no column 'text'")
    good = write_formats(tmp_path / "in")["text"]
    one_line_error(run(good, "--vocab", tmp_path / "nope.txt"), "nope.txt", "cannot read vocab")
    one_line_error(run(good, "--vocab", vocab, "--max-seq-length", 2), "--max-seq-length")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    one_line_error(run(empty, "--vocab", vocab), "empty.txt", "no documents")


def test_gcs_inputs_are_sampled_by_ranged_reads(tmp_path, vocab, gcs_bucket):
    from fleet.core.store import open_store

    paths = write_formats(tmp_path / "in")
    store = open_store(f"gs://{gcs_bucket}")
    for fmt in ("text", "parquet", "wikiextractor"):
        with open(paths[fmt], "rb") as f:
            store.write(f"corpus/{paths[fmt].rsplit('/', 1)[1]}", f.read())
    result = run(f"gs://{gcs_bucket}/corpus", "--vocab", vocab)
    assert result.exit_code == 0, result.output
    assert "read 3 of 3 files" in result.output and "sample: 9 documents" in result.output


def test_a_store_error_is_one_line(tmp_path, vocab, fake_gcs):
    one_line_error(run("gs://no-such-bucket-here/corpus", "--vocab", vocab), "no-such-bucket-here")
    one_line_error(run("s3://b/corpus", "--vocab", vocab), "s3://b/corpus")


def test_bad_lines_are_judged_as_lines_as_a_run_judges_them(tmp_path, vocab):
    """`check` judges the bad share over the records a run judges it over (lines of text): two bad
    lines inside one long document are two skipped lines, not a file "not in this format"."""
    doc = b"\n".join([b"good line %d." % i for i in range(20)] + [b"bad \xff one", b"bad \xfe two"])
    path = tmp_path / "one_doc.txt"
    path.write_bytes(doc + b"\n")
    result = run(path, "--vocab", vocab)
    assert result.exit_code == 0, result.output
    assert "bad records skipped: 2" in result.output and "one_doc.txt" in result.output

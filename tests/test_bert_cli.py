"""`python -m fleet_jobs.text report` and `fleet local --job bert` (or `--set format=bert`) end to end."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fleet.job import ItemContext, Sink
from fleet.core.discovery import load_configured
from fleet.formats import tfrecord
from fleet_jobs.text.tools.cli import app
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus")


class FolderSink(Sink):
    def __init__(self, folder, name):
        self.folder, self.name = folder, name

    def open(self, suffix):
        return open(os.path.join(self.folder, self.name + suffix), "wb")


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


@pytest.fixture(scope="module")
def documents():
    return read_documents("sample_zh.txt")[:25] + read_documents("sample_en.txt")[:15]


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory, documents):
    folder = tmp_path_factory.mktemp("vocab")
    lines = [line for doc in documents for line in doc]
    paths = {"good": str(folder / "good.txt"), "poor": str(folder / "poor.txt")}
    write_vocab(train_vocab(lines, 21128), paths["good"])
    write_vocab(train_vocab(lines, 600, limit_alphabet=150), paths["poor"])  # misses most Chinese characters
    return paths


def write_run(folder, vocab, documents, **options) -> dict:
    os.makedirs(folder, exist_ok=True)
    job, config = load_configured("electra_zh_en", {"vocab_file": vocab, **options})  # format=bert: the bert job
    converter = job.document_converter(config, lambda p: open(p, "rb").read())
    totals: dict = {}
    for part in range(2):
        stats = converter.convert(
            documents[part::2], ItemContext(f"{part}", part, "t"), FolderSink(str(folder), f"part-{part:05d}")
        )
        for k, v in stats.items():
            totals[k] = totals.get(k, 0) + v
    return totals


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    for needle in needles:
        assert str(needle) in lines[0]


def test_report_on_bert_records_with_a_png(tmp_path, vocabs, documents):
    out = tmp_path / "bert"
    totals = write_run(out, vocabs["good"], documents, format="bert", compression="GZIP")
    result = run("report", out, "--vocab", vocabs["good"], "--png", tmp_path / "report.png")
    assert result.exit_code == 0, result.output
    text = result.stdout
    fill = totals["tokens"] / totals["positions"]
    assert f"records: {totals['examples']:,} in 2 files (bert, max_seq_length 128)" in text
    assert f"fill ratio {fill:.3f}" in text
    assert f"{totals['masked_lm_predictions'] / totals['tokens']:.1%} of real tokens" in text
    assert f"1 (random next) {totals['random_next'] / totals['examples']:.1%}" in text
    share = float(re.search(r"\[MASK\] ([0-9.]+)%, random ([0-9.]+)%, unchanged ([0-9.]+)%", text).group(1))
    assert 75 < share < 85 and "segments per example: two 100.0%" in text
    assert "[UNK]: 0.0" in text and "high" not in text
    assert len([line for line in text.splitlines() if line.startswith("  ") and "%" in line]) == 8  # histogram
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000


def test_report_catches_a_vocab_that_misses_characters(tmp_path, vocabs, documents):
    out = tmp_path / "poor"
    write_run(out, vocabs["poor"], documents)
    result = run("report", out, "--vocab", vocabs["poor"])
    assert result.exit_code == 0, result.output
    line = [x for x in result.stdout.splitlines() if x.startswith("[UNK]")][0]
    assert float(line.split()[1].rstrip("%")) > 5 and "high: does the vocab cover the text?" in line
    assert "(electra, max_seq_length 128)" in result.stdout and "masked per example" not in result.stdout
    no_vocab = run("report", out)
    assert no_vocab.exit_code == 0 and "[UNK]: unknown (no vocab: pass --vocab)" in no_vocab.stdout


def test_report_reads_parquet_outputs_as_it_reads_tfrecords(tmp_path, vocabs, documents):
    texts = {}
    for output in ("tfrecord", "parquet"):
        write_run(tmp_path / output, vocabs["good"], documents, format="bert", output=output)
        result = run("report", tmp_path / output, "--vocab", vocabs["good"])
        assert result.exit_code == 0, result.output
        texts[output] = result.stdout
    assert texts["parquet"] == texts["tfrecord"].replace(str(tmp_path / "tfrecord"), str(tmp_path / "parquet"))
    assert "(bert, max_seq_length 128)" in texts["parquet"]
    (tmp_path / "parquet" / "part-00001.parquet").write_bytes(b"PAR1 not really")
    one_line_error(run("report", tmp_path / "parquet"), "part-00001.parquet: cannot read as Parquet")


def test_report_on_causal_lm_blocks(tmp_path, vocabs, documents):
    from fleet_jobs.causal_lm import JOB as LM

    out = tmp_path / "lm"
    out.mkdir()
    config = LM.parse_config({"vocab_file": vocabs["good"], "max_seq_length": "64", "output": "parquet"})
    stats = LM.document_converter(config, lambda p: open(p, "rb").read()).convert(
        documents, ItemContext("0", 0, "t"), FolderSink(str(out), "part-00000")
    )
    text = LM.report(str(out), config)
    assert f"records: {stats['examples']:,} in 1 files (causal_lm, max_seq_length 64)" in text
    assert f"fill ratio {stats['real_tokens'] / stats['positions']:.3f}" in text
    assert "segments" not in text and "[UNK]: 0.0" in text


def test_report_errors(tmp_path, vocabs, documents):
    one_line_error(run("report", tmp_path / "none"), "none: not a folder")
    (tmp_path / "empty").mkdir()
    one_line_error(run("report", tmp_path / "empty"), "empty: no .tfrecord, .tfrecord.gz or .parquet files")
    out = tmp_path / "run"
    write_run(out, vocabs["good"], documents[:6], format="bert")
    one_line_error(run("report", out, "--vocab", tmp_path / "missing.txt"), "missing.txt")
    one_line_error(run("report", out, "--png", tmp_path / "no" / "x.png"), "x.png: cannot write")
    path = out / "part-00001.tfrecord"
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))
    one_line_error(run("report", out), "part-00001.tfrecord", "checksum")


def test_parse_example_reads_what_tensorflow_writes():
    tf = pytest.importorskip("tensorflow")
    ex = tf.train.Example()
    ex.features.feature["a"].int64_list.value.extend([1, 300, -5, 2**40])
    ex.features.feature["f"].float_list.value.extend([0.5, 1.0])
    ex.features.feature["b"].bytes_list.value.extend([b"x", b""])
    parsed = tfrecord.parse_example(ex.SerializeToString())
    assert parsed["a"].tolist() == [1, 300, -5, 2**40] and parsed["f"].dtype == np.float32
    assert parsed["f"].tolist() == [0.5, 1.0] and parsed["b"] == [b"x", b""]


@pytest.mark.parametrize("job", [["--job", "bert"], ["--set", "format=bert"]])
def test_fleet_local_with_the_bert_job(tmp_path, vocabs, job):
    """``--job bert``, and ``--set format=bert`` (its former name), end to end: summary, report, records."""
    tf = pytest.importorskip("tensorflow")
    out = str(tmp_path / "out")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "local",
            CORPUS,
            out,
            "--workers",
            "2",
            "--item-mb",
            "0.3",
            "--set",
            f"vocab_file={vocabs['good']}",
            *job,
            "--set",
            "v2_feature_names=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["done"] == summary["items"] > 2 and summary["failed"] == 0
    assert 0.14 < summary["masked_share"] < 0.152 and 0.45 < summary["random_next_share"] < 0.62
    # The job's report is printed at the end, with the vocab found in the run's config.
    # (at most REPORT_RECORDS records, drawn at random from the run's: a bounded parse at the end of every run)
    from fleet_jobs.bert.job import REPORT_RECORDS

    n = min(summary["examples"], REPORT_RECORDS)
    where = (
        re.escape(f"in {summary['items']} files (")
        if n == summary["examples"]
        else rf"sampled at random from {summary['examples']:,} in {summary['items']} files \(a share within ±[\d.]+% at 95%; "
    )
    assert re.search(rf"records: {n:,} {where}bert \(v2 feature names\)", proc.stderr), proc.stderr
    assert "masked per example" in proc.stderr and "[UNK]: " in proc.stderr and "unknown" not in proc.stderr
    files = sorted(glob.glob(os.path.join(out, "*.tfrecord")))
    spec = {
        "input_word_ids": tf.io.FixedLenFeature([128], tf.int64),
        "input_type_ids": tf.io.FixedLenFeature([128], tf.int64),
        "input_mask": tf.io.FixedLenFeature([128], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([20], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([20], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([20], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    n = tokens = 0
    for batch in tf.data.TFRecordDataset(files).batch(1024):
        parsed = tf.io.parse_example(batch, spec)
        n += int(parsed["input_mask"].shape[0])
        tokens += int(parsed["input_mask"].numpy().sum())
    assert n == summary["examples"] and tokens == summary["tokens"]


def test_report_parses_only_the_records_it_draws(tmp_path, vocabs, documents, monkeypatch):
    """A report over more than max_records records counts them all by their frames (a GZIP output
    decompressed, nothing decoded) and parses only the sample it shows."""
    from fleet_jobs.text.tools import report

    out = tmp_path / "run"
    write_run(out, vocabs["good"], documents, compression="GZIP")
    whole = report.read_report(str(out), max_records=10**9)
    assert whole.records > 5
    parsed = []
    real = tfrecord.parse_example
    monkeypatch.setattr(report.tfrecord, "parse_example", lambda raw: parsed.append(raw) or real(raw))
    part = report.read_report(str(out), max_records=5)
    assert len(parsed) == part.records == 5 and part.total == whole.records

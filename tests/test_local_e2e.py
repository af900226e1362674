"""The README's demo, as a user runs it: vocab, `fleet local`, `fleet status`, records TensorFlow reads."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus")
FLEET = [sys.executable, "-m", "fleet.cli"]


def run(cmd, **kw):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    proc = run([sys.executable, "-m", "fleet_jobs.text", "vocab", CORPUS, "--size", "21128", "--out", path])
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory, vocab):
    out = str(tmp_path_factory.mktemp("demo") / "out")
    proc = run(FLEET + ["local", CORPUS, out, "--workers", "2", "--item-mb", "0.2", "--set", f"vocab_file={vocab}"])
    assert proc.returncode == 0, proc.stderr
    return out, proc


def digests(out):
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    import hashlib

    return summary, {
        os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
        for p in sorted(glob.glob(os.path.join(out, "*.tfrecord")))
    }


def test_fleet_local_writes_records_tensorflow_reads_with_the_electra_spec(demo):
    import tensorflow as tf

    out, proc = demo
    summary, files = digests(out)
    assert summary["done"] == summary["items"] > 2 and summary["failed"] == 0
    assert sorted(files) == sorted(summary["outputs"])
    spec = {name: tf.io.FixedLenFeature([128], tf.int64) for name in ("input_ids", "input_mask", "segment_ids")}
    n = tokens = 0
    for raw in tf.data.TFRecordDataset(sorted(glob.glob(os.path.join(out, "*.tfrecord")))):
        ex = tf.io.parse_single_example(raw, spec)
        ids, mask, seg = ex["input_ids"].numpy(), ex["input_mask"].numpy(), ex["segment_ids"].numpy()
        length = int(mask.sum())
        assert ids[0] == 2  # [CLS]
        assert ids[length - 1] == 3  # [SEP]
        assert (ids[length:] == 0).all() and (seg[length:] == 0).all() and (mask[:length] == 1).all()
        n += 1
        tokens += length
    assert n == summary["examples"] > 1000
    assert tokens == summary["tokens"]
    assert 0.5 < summary["fill_ratio"] <= 1.0
    assert "fleet local" in proc.stderr and "fill_ratio" in proc.stderr


def test_fleet_status_reports_the_finished_run(demo):
    out, _ = demo
    proc = run(FLEET + ["status", out, "--json"])
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["done"] == st["items"] and st["pending"] == st["leased"] == st["failed"] == 0
    proc = run(FLEET + ["status", out])
    assert "done" in proc.stdout and "failed" in proc.stdout


def test_same_input_and_config_give_byte_identical_output_with_other_worker_counts(demo, vocab, tmp_path):
    out, _ = demo
    other = str(tmp_path / "again")
    proc = run(FLEET + ["local", CORPUS, other, "--workers", "1", "--item-mb", "0.2", "--set", f"vocab_file={vocab}"])
    assert proc.returncode == 0, proc.stderr
    assert digests(other)[1] == digests(out)[1]
    # The default item size too: it used to be chosen from the worker count, so --workers 1
    # and --workers 2 cut the corpus differently and wrote other records.
    runs = []
    for workers in ("1", "2"):
        folder = str(tmp_path / f"default-{workers}")
        proc = run(FLEET + ["local", CORPUS, folder, "--workers", workers, "--set", f"vocab_file={vocab}"])
        assert proc.returncode == 0, proc.stderr
        runs.append(digests(folder)[1])
    assert runs[0] == runs[1] and len(runs[0]) > 2


def test_rerun_on_the_same_out_dir_resumes(demo, vocab):
    out, _ = demo
    before = digests(out)[1]
    proc = run(FLEET + ["local", CORPUS, out, "--workers", "2", "--item-mb", "0.2", "--set", f"vocab_file={vocab}"])
    assert proc.returncode == 0 and "resuming" in proc.stderr
    assert digests(out)[1] == before


def test_rerun_with_other_options_is_refused_in_one_line(demo, vocab):
    out, _ = demo
    proc = run(FLEET + ["local", CORPUS, out, "--item-mb", "0.2", "--set", f"vocab_file={vocab}", "--set", "seed=1"])
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "planned differently: option seed is 1, was 12345" in line and "another OUT_DIR" in line


def test_missing_vocab_option_is_one_clear_line(tmp_path):
    proc = run(FLEET + ["local", CORPUS, str(tmp_path / "o")])
    assert proc.returncode == 2 and "vocab_file is required" in proc.stderr


def test_unknown_job_is_one_clear_line(tmp_path):
    proc = run(FLEET + ["local", CORPUS, str(tmp_path / "o"), "--job", "nope"])
    assert proc.returncode == 2 and "unknown job 'nope'" in proc.stderr and "electra_zh_en" in proc.stderr


@pytest.mark.parametrize("command", ["module", "script"])
def test_a_worker_started_by_the_fleet_command_does_not_import_the_cli(tmp_path, command):
    """Spawn re-runs the parent's main script in each worker; for `fleet` that was the whole CLI
    (typer, rich, pydantic), a tenth of a second of every worker's start for nothing. (A worker
    started as a fresh interpreter: the command's process has a second thread, so it does not fork
    them, tests/test_start_cost.py; a forked worker has the CLI loaded already, and imports nothing.)"""
    script = os.path.join(os.path.dirname(sys.executable), "fleet")
    if command == "script" and not os.path.exists(script):
        pytest.skip("no fleet console script beside this python")
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n")
    out = tmp_path / "out"
    thread = "import runpy, threading, time; threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
    if command == "module":
        cmd = [sys.executable, "-c", thread + "runpy.run_module('fleet.cli', run_name='__main__')"]
    else:
        cmd = [sys.executable, "-c", thread + f"runpy.run_path({script!r}, run_name='__main__')"]
    proc = run(
        cmd + ["local", str(corpus), str(out), "--workers", "1", "--job", "tests.helpers.modulesjob:JOB"],
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    (part,) = glob.glob(str(out / "part-*.txt"))
    assert open(part).read() == "-"

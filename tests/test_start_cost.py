"""What `fleet local` no longer pays for at start-up stays unpaid (bench/bench_startup.py has the
figures): multiprocessing's spawn machinery and its resource tracker process in the parent and
the workers, importlib.metadata's read of every installed distribution in a worker, and in the
parent what only some runs or other commands need (the live bar, a resumed run's repair, the
tokenizer's regexes). And the cheap look that spares importlib.metadata still finds a
``fleet.jobs`` entry point. Counted (which modules are loaded), never timed."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# fleet local, as the fleet command runs it, then which of PARENT_WATCH the parent process has loaded.
PARENT = """
import os, sys
from fleet.cli import main
try:
    main()
except SystemExit as e:
    assert e.code == 0, e.code
print(" ".join(m for m in os.environ["PARENT_WATCH"].split(",") if m in sys.modules) or "-")
"""


# Put before PARENT: a second thread in the command's process, as a notebook's kernel has, so that
# `fleet local` starts its workers as fresh interpreters, not forks of itself (processes.can_fork).
THREADED = "import threading, time; threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"


def run(cmd, env=None, **kw):
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        **kw,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_fleet_local_and_a_fresh_worker_load_no_multiprocessing_and_the_worker_no_distribution_metadata(tmp_path):
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n")
    out = tmp_path / "out"
    proc = run(
        [
            sys.executable,
            "-c",
            THREADED + PARENT,
            "local",
            str(corpus),
            str(out),
            "--workers",
            "1",
            "--job",
            "tests.helpers.loadedjob:JOB",
        ],
        env={"PARENT_WATCH": "multiprocessing", "LOADED_WATCH": "multiprocessing,importlib.metadata"},
    )
    assert proc.stdout.split()[-1] == "-"  # no multiprocessing (its spawn starts a resource tracker process)
    (part,) = glob.glob(str(out / "part-*.txt"))
    assert open(part).read() == "-"


def test_fleet_local_and_its_fresh_workers_start_no_blas_thread_pool_unless_the_user_asks(tmp_path):
    """numpy's OpenBLAS starts a spinning thread per core on import, 0.1-0.15 s of CPU a process,
    for BLAS calls fleet never makes: the fleet command and its workers run with one. (Workers as
    fresh interpreters: a forked one starts with no pool at all, the forking thread alone.)"""
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n")
    blas_of_parent = "\nprint(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    workers = {}
    for user, blas in ((None, "1"), ("2", "2")):
        out = tmp_path / f"out-{user}"
        env = {"PARENT_WATCH": "-", "LOADED_THREADS": "1"}
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")} | env
        if user:
            env["OPENBLAS_NUM_THREADS"] = user
        cmd = [sys.executable, "-c", THREADED + PARENT + blas_of_parent, "local", str(corpus), str(out)]
        cmd += ["--workers", "1"]
        proc = subprocess.run(
            [*cmd, "--job", "tests.helpers.loadedjob:JOB"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "PYTHONPATH": ROOT},
        )
        assert proc.returncode == 0, proc.stderr
        parent_blas = proc.stdout.split()[-1]
        (part,) = glob.glob(str(out / "part-*.txt"))
        worker = dict(cell.split("=") for cell in open(part).read().split()[1:])
        assert parent_blas == worker["blas"] == blas
        workers[user] = int(worker["threads"])
    # The worker's own threads are the same in both runs: numpy's pool is the difference, none of its own.
    assert workers[None] == workers["2"] - 1, workers


def test_fleet_local_forks_its_workers_with_what_it_loaded_unless_another_thread_runs(tmp_path):
    """A fresh interpreter per worker imports again what the command has loaded (the job, numpy, a
    tokenizer library, fleet): 0.3-0.5 s of CPU each. `fleet local` forks them instead, the
    worker's own code loaded once before; from a process with another thread, which a fork would
    not copy (a lock it holds stays held), they are fresh interpreters as before."""
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n" * 200)  # 3.6 kB: four items of 1 kB, for two workers
    watch = "fleet.cli.commands,fleet.core.spawner"
    loaded = {}
    # "blas": a native thread, not Python's: numpy's pool, of two threads as the user asks
    cases = (("one", PARENT, "1"), ("two", THREADED + PARENT, "1"), ("blas", "import numpy\n" + PARENT, "2"))
    for threads, code, blas in cases:
        out = tmp_path / f"out-{threads}"
        cmd = [sys.executable, "-c", code, "local", str(corpus), str(out), "--workers", "2"]
        proc = run(
            [*cmd, "--item-mb", "0.001", "--job", "tests.helpers.loadedjob:JOB"],
            env={"PARENT_WATCH": watch, "LOADED_WATCH": watch, "OPENBLAS_NUM_THREADS": blas},
        )
        parts = sorted(glob.glob(str(out / "part-*.txt")))
        assert len(parts) == 4
        loaded[threads] = (proc.stdout.split("\n")[-2], {open(p).read() for p in parts})
    # forked: the command's modules are the worker's, and its code was loaded in the command
    assert loaded["one"] == ("fleet.cli.commands fleet.core.spawner", {"fleet.cli.commands fleet.core.spawner"})
    # fresh: the worker imported its own code only, and the command none of it
    assert loaded["two"] == loaded["blas"] == ("fleet.cli.commands", {"fleet.core.spawner"})


# What a first `fleet local` run (its output a file, not a terminal) leaves unloaded in the process that
# plans and watches: the live bar (a terminal's only), the repair of a resumed run, other commands'
# libraries (Compute Engine, the bucket's client, Arrow for Parquet output), the outage retries of a worker,
# and pydantic (typer 0.29 coerces every option through it: pinned below, pyproject.toml).
NOT_FOR_A_FIRST_RUN = (
    "pydantic",
    "rich.progress",
    "fleet.core.repair",
    "fleet.core.verify",
    "fleet.gce.compute",
    "fleet.gce.compute_requests",
    "google.cloud",
    "pyarrow",
    "tenacity",
)
# ... and after it, how many of the tokenizer's regex sets (tokenization._patterns) it compiled: its
# plan makes a tokenizer to check the vocab and never tokenizes.
PATTERNS = "\nfrom fleet_jobs.text.tokenizers.tokenization import _patterns\nprint(_patterns.cache_info().currsize)\n"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "one", "line", "another"]


def test_a_first_fleet_local_run_loads_only_what_it_needs_and_a_resumed_one_its_repair(tmp_path):
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    cmd = [sys.executable, "-c", PARENT + PATTERNS, "local", str(corpus), str(tmp_path / "out")]
    cmd += ["--workers", "1", "--set", f"vocab_file={vocab}"]
    env = {"PARENT_WATCH": ",".join(NOT_FOR_A_FIRST_RUN)}
    first = run(cmd, env=env).stdout.splitlines()
    assert first[-2:] == ["-", "0"]
    again = run(cmd, env=env).stdout.splitlines()  # resumed: the repair is loaded, so the watch sees it
    assert again[-2].split() == ["fleet.core.repair", "fleet.core.verify"]


def test_a_byte_level_bpe_is_checked_in_the_parent_without_its_word_cache(tmp_path):
    """The parent's plan loads a tokenizer.json to check it and never tokenizes: the word cache
    (``regex`` and the model's JSON read again) is made by the worker's first batch only."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["one line", "another line"] * 20, vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(bpe.to_str(), encoding="utf-8")
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n")
    cmd = [sys.executable, "-c", PARENT, "local", str(corpus), str(tmp_path / "out"), "--workers", "1"]
    cmd += ["--job", "causal_lm", "--set", f"tokenizer_file={tokenizer}"]
    watch = ("regex", *NOT_FOR_A_FIRST_RUN)
    assert run(cmd, env={"PARENT_WATCH": ",".join(watch)}).stdout.splitlines()[-1] == "-"


def test_fleet_local_help_loads_no_job_and_no_record_library():
    watch = ("numpy", "fleet_jobs", "fleet.job", "fleet.formats", *NOT_FOR_A_FIRST_RUN)
    proc = run([sys.executable, "-c", PARENT, "local", "--help"], env={"PARENT_WATCH": ",".join(watch)})
    assert "OUT_DIR" in proc.stdout and proc.stdout.splitlines()[-1] == "-"


def test_loading_a_job_reads_no_distribution_metadata_when_none_declares_a_job():
    code = (
        "import sys; from fleet.core.discovery import _may_declare_entry_points, load_job; "
        "assert not _may_declare_entry_points('fleet.jobs'); load_job('causal_lm'); "
        "print('importlib.metadata' in sys.modules)"
    )
    assert run([sys.executable, "-c", code]).stdout.strip() == "False"


def test_a_fleet_jobs_entry_point_is_found_and_comes_before_a_job_of_the_same_name(tmp_path):
    info = tmp_path / "site" / "somejobs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: somejobs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[fleet.jobs]\nlines = tests.helpers.linejob:JOB\ncausal_lm = tests.helpers.linejob:JOB\n"
    )
    code = (
        "from fleet.job import load_job; from tests.helpers.linejob import JOB; "
        "assert load_job('lines') is JOB and load_job('causal_lm') is JOB; print('ok')"
    )
    proc = run([sys.executable, "-c", code], env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'site'}"})
    assert proc.stdout.strip() == "ok"


def test_a_worker_that_crashes_is_named_and_fleet_local_goes_on_to_its_summary(tmp_path):
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "local",
            str(corpus),
            str(tmp_path / "out"),
            "--workers",
            "1",
            "--job",
            "tests.helpers.crashjob:JOB",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 1, proc.stderr
    _, _, rest = proc.stderr.partition("Process local-w0:\nTraceback")
    assert "RuntimeError: simulated crash as the worker starts" in rest
    assert "0/1 items done" in rest and "workers stopped with 1 items unfinished" in rest

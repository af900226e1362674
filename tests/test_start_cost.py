"""What `fleet local` no longer pays for at start-up stays unpaid (bench/bench_startup.py has the
figures): multiprocessing's spawn machinery and its resource tracker process in the parent and
the workers, and importlib.metadata's read of every installed distribution in a worker. And the
cheap look that spares importlib.metadata still finds a ``fleet.jobs`` entry point."""

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


def test_fleet_local_and_its_worker_load_no_multiprocessing_and_the_worker_no_distribution_metadata(tmp_path):
    corpus = tmp_path / "in.txt"
    corpus.write_text("one line\n\nanother\n")
    out = tmp_path / "out"
    # The parent's pydantic (through typer) imports importlib.metadata itself: only the worker is held to it.
    proc = run(
        [
            sys.executable,
            "-c",
            PARENT,
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

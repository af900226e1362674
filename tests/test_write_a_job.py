"""docs/write-a-job.md's example job, run as a reader of the page would run it: its first Python
block saved as the package it names, then `fleet local` over the sample corpora with `--job`.
A change to the job API that the page does not follow fails here, not in a user's first job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "write-a-job.md"
SAMPLES = [ROOT / "corpus" / "sample_en.txt", ROOT / "corpus" / "sample_zh.txt"]


def test_the_pages_example_job_runs_and_counts_every_line(tmp_path):
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    first = block.splitlines()[0]
    package = re.match(r"# fleet_jobs/(\w+)/__init__\.py", first)
    assert package, f"the example's first line names its file: {first!r}"
    name = package.group(1)
    (tmp_path / "jobs" / name).mkdir(parents=True)
    (tmp_path / "jobs" / name / "__init__.py").write_text(block)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "jobs")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "local",
            *map(str, SAMPLES),
            str(out),
            "--job",
            f"{name}:JOB",
            "--workers",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("\t") for p in sorted(out.rglob("part-*.txt")) for line in p.read_text().splitlines()]
    # One item per file (the example keeps Job.cut's default), each counted whole.
    assert sorted((n, int(c)) for n, c in rows) == [(p.name, p.read_bytes().count(b"\n")) for p in SAMPLES]

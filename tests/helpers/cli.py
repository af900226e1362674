"""The `fleet` command in a subprocess, as a user runs it: never a traceback, errors in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.procs import ROOT

FLEET = [sys.executable, "-m", "fleet.cli"]


def fleet(
    *args, env: dict | None = None, timeout: float = 180, tmp: Path | str | None = None
) -> subprocess.CompletedProcess:
    """Run `fleet ARGS`; ``tmp`` is the TMPDIR of its workers (their scratch stays out of /tmp)."""
    environ = dict(os.environ, **(env or {}))
    if tmp is not None:
        environ["TMPDIR"] = str(tmp)
    proc = subprocess.run(
        FLEET + [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environ
    )
    for stream in (proc.stderr, proc.stdout):
        assert "Traceback" not in stream and "Logging error" not in stream, stream
    return proc


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def one_line_job_error(result, *needles) -> str:
    """A job's own command (``python -m fleet_jobs.NAME``, run in process by typer's CliRunner) that refused
    its input: exit 2 and one line on stderr, ``error: ...``, naming what is wrong."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert str(needle) in lines[0], lines[0]
    return lines[0]

"""The `fleet` command in a subprocess, as a user runs it, or in this process where only its answer matters:
never a traceback, errors in one line."""

from __future__ import annotations

import logging
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


class _LastResort(logging.Handler):
    """What ``logging.lastResort`` does in a `fleet` process, where nothing sets logging up (the workers
    do, in their own processes): WARNING and above, the bare message, on the stderr of the moment. Under
    pytest the root logger has handlers of its own, so lastResort would be skipped."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def fleet_in_process(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`fleet ARGS` in this process (typer's CliRunner), as ``fleet`` returns it, for a command that
    only answers (plan, status, a run refused before its workers start): no interpreter to start, no
    imports again (1-2 s a call). Anything raised past the CLI fails here, as its traceback would in a
    process. Not for what starts workers: their signals, logging and gc are a process's own."""
    from typer.testing import CliRunner

    from fleet.cli.commands import app

    handler = _LastResort()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    finally:
        root.removeHandler(handler)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for stream in (result.stderr, result.stdout):
        assert "Traceback" not in stream and "Logging error" not in stream, stream
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


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

"""Worker processes for tests that kill, stop or starve them: each logs to its own file.

Shared by the chaos, fault and bad-input tests. A worker is the real
``fleet.core.processes.work_one`` in a fresh interpreter; its log file tells the test
where it is (see ``FLEET_TEST_PAUSE`` in fleet/core/attempt.py).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fleet.core.lease import DONE
from fleet.core.run import PlanRequest, plan
from fleet.core.status import StatusReader
from fleet.core.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINEJOB = "tests.helpers.linejob:JOB"
_PAUSE = re.compile(r"^(\S+ \S+) .*test pause at (\w+), item (\S+)$")


def write_corpus(path: str, docs: int, lines_per_doc: int = 5, seed: int = 0) -> str:
    """A small deterministic text corpus: `docs` documents separated by blank lines."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "数据", "模型", "训练", "zeta", "eta"]
    with open(path, "w", encoding="utf-8") as f:
        for d in range(docs):
            for i in range(lines_per_doc):
                f.write(f"doc {d} line {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n")
            f.write("\n")
    return path


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: str
    stderr: str
    env: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_lines(self) -> list[str]:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def at(self) -> tuple[str, str] | None:
        """(point, item) when the last thing this worker logged is a test pause marker."""
        paused = self.paused()
        return paused[:2] if paused else None

    def paused(self) -> tuple[str, str, float] | None:
        """(point, item, seconds since the worker got there) when its last log line is a
        pause marker. The age lets a test kill only inside the pause, not after it."""
        lines = self.log_lines()
        m = _PAUSE.search(lines[-1]) if lines else None
        if not m:
            return None
        when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return m.group(2), m.group(3), time.time() - when

    def stderr_text(self) -> str:
        with open(self.stderr, encoding="utf-8", errors="replace") as f:
            return f.read()


def start_worker(bucket: str, run: str, name: str, log_dir: str, env: dict | None = None) -> Proc:
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, f"{name}.log")
    err = os.path.join(log_dir, f"{name}.stderr")
    full_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    code = (
        f"from fleet.core.processes import work_one; raise SystemExit(work_one({bucket!r}, {run!r}, {name!r}, {log!r}))"
    )
    with open(err, "wb") as stderr:
        popen = subprocess.Popen(
            [sys.executable, "-c", code], env=full_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr
        )
    return Proc(name, popen, log, err, env or {})


def wait_exit(procs, timeout: float) -> None:
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.popen.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.alive():
                    q.popen.kill()
            raise AssertionError(
                f"worker {p.name} still running after {timeout} s; log tail: {p.log_lines()[-5:]}"
            ) from None


def plan_lines(
    bucket: str,
    run: str,
    corpus: str,
    item_bytes: int,
    ttl: float,
    attempts: int = 10,
    output: str | None = None,
    **settings,
) -> list:
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run=run,
            job=LINEJOB,
            inputs=[corpus],
            output=output or f"{bucket}/out-{run}",
            code_version="test",
            settings={k: str(v) for k, v in settings.items()},
            lease_ttl=ttl,
            max_attempts=attempts,
            item_bytes=item_bytes,
        ),
    )
    return items


def committed(bucket: str, run: str) -> dict[str, str]:
    """Output name -> sha256 over the run's leases; every lease must be done."""
    reader = StatusReader(open_store(bucket), run)
    out = {}
    for item, lease in sorted(reader.leases().items()):
        assert lease.state == DONE, (run, item, lease)
        for o in lease.outputs:
            out[o["name"]] = o["sha256"]
    return out


def listed_outputs(output_url: str) -> dict[str, str]:
    """Every output under an output prefix, name -> sha256 of its bytes: every object but the
    manifest a finished run writes beside them (fleet.core.manifest), a file of the run, no item's."""
    from fleet.core.manifest import MANIFEST

    store = open_store(output_url)
    return {b.name: hashlib.sha256(store.read(b.name)).hexdigest() for b in store.list("") if b.name != MANIFEST}


def clean_run(bucket: str, run: str, corpus: str, item_bytes: int, log_dir: str, **settings) -> dict[str, str]:
    """One worker, no faults, no delays: the digests every other run must reproduce.

    The worker loop runs in this process (fleet.core.spawner.Worker, as ``work_one`` runs it):
    what is under test is the other runs, whose workers are processes; this one only says what
    their bytes must be, and a fresh interpreter for it cost a second or more per test."""
    from fleet.core.spawner import Worker

    plan_lines(bucket, run, corpus, item_bytes, ttl=30, **settings)
    os.makedirs(log_dir, exist_ok=True)
    worker = Worker(bucket, run, name=f"{run}-solo", poll=0.05)
    try:
        worker.run_until_drained()
    finally:
        worker.close()
    digests = committed(bucket, run)
    assert listed_outputs(f"{bucket}/out-{run}") == digests
    return digests


def kill_at_pauses(
    bucket: str,
    run: str,
    workers: int,
    log_dir: str,
    env: dict,
    targets: list,
    where: Callable[[str], Any],
    young: Callable[[str], float],
    timeout: float = 240,
) -> list:
    """Runs ``workers`` worker processes on ``run`` (``env``: their pauses, FLEET_TEST_PAUSE), and
    SIGKILLs one each time it is young in a pause at a target: (point, ``where(item)``), e.g. the
    item's step or stage; a fresh worker replaces it. Returns once every target had its kill and the
    workers drained (asserting both, and that no worker printed a traceback): the kills, in order.
    ``young(point)``: how long into a pause a kill may still land (the pause must not end first)."""
    live = [start_worker(bucket, run, f"w{i}", log_dir, env) for i in range(workers)]
    everyone, serial, killed = list(live), workers, []
    targets = list(targets)
    deadline = time.time() + timeout
    while targets and any(w.alive() for w in live):
        assert time.time() < deadline, f"kills left: {targets}; done: {killed}"
        for w in [w for w in live if w.alive()]:
            at = w.paused()
            if at and (at[0], where(at[1])) in targets and at[2] < young(at[0]):
                w.popen.send_signal(signal.SIGKILL)
                w.popen.wait()
                targets.remove((at[0], where(at[1])))
                killed.append((at[0], where(at[1]), at[1]))
                live.remove(w)
                fresh = start_worker(bucket, run, f"w{serial}", log_dir, env)
                serial += 1
                live.append(fresh)
                everyone.append(fresh)
                break
        time.sleep(0.02)
    wait_exit([w for w in live if w.alive()], 180)
    assert not targets, f"no kill landed at {targets} (killed: {killed})"
    for w in everyone:
        assert "Traceback" not in w.stderr_text(), w.stderr_text()
    return killed

"""Following a run from the trainer (issue 11): each committed output once, as items finish."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from fleet.core.follow import follow
from fleet.core.store import open_store
from tests.helpers.cli import FLEET, fleet
from tests.helpers.procs import LINEJOB, ROOT, write_corpus


def plan(tmp_path, bucket: str, output: str, docs: int = 120, **options) -> None:
    corpus = write_corpus(str(tmp_path / "c.txt"), docs)
    sets = [a for k, v in options.items() for a in ("--set", f"{k}={v}")]
    proc = fleet(
        "plan",
        "--bucket",
        bucket,
        "--run",
        "r",
        "--job",
        LINEJOB,
        "--input",
        corpus,
        "--output",
        output,
        "--item-mb",
        "0.004",
        *sets,
    )
    assert proc.returncode == 0, proc.stderr


def read_url(url: str) -> bytes:
    if url.startswith("gs://"):
        bucket, _, name = url[len("gs://") :].partition("/")
        return open_store(f"gs://{bucket}").read(name)
    with open(url, "rb") as f:
        return f.read()


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_a_consumer_started_before_the_workers_reads_every_record_once_and_ends(tmp_path, kind, request):
    bucket = str(tmp_path / "bucket") if kind == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}"
    output = str(tmp_path / "out") if kind == "local" else f"{bucket}/out"
    plan(tmp_path, bucket, output, delay=0.02)  # about 12 items of 0.2 s
    consumer = subprocess.Popen(
        FLEET + ["follow", "--bucket", bucket, "--run", "r", "--poll", "0.2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # the consumer is waiting before any worker starts
    workers = subprocess.Popen(
        FLEET + ["work", "--bucket", bucket, "--run", "r", "--procs", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    records = []
    urls = []
    try:
        for line in consumer.stdout:  # read each output as it is announced, as a trainer would
            urls.append(line.strip())
            records += read_url(urls[-1]).decode().splitlines()
        assert consumer.wait(timeout=120) == 0, consumer.stderr.read()
    finally:
        for p in (consumer, workers):
            if p.poll() is None:
                p.kill()
        workers.wait()
    status = json.loads(fleet("status", "--bucket", bucket, "--run", "r", "--json").stdout)
    assert status["done"] == status["items"] > 5
    assert sorted(urls) == sorted(f"{output}/{name}" for name in status["outputs"])  # each once
    assert len(records) == 120 and len(set(records)) == 120  # every record of the run, once


def test_a_consumer_started_mid_run_catches_up_with_from_start(tmp_path, gcs_bucket):
    bucket = f"gs://{gcs_bucket}"
    plan(tmp_path, bucket, f"{bucket}/out", delay=0.02)
    workers = subprocess.Popen(
        FLEET + ["work", "--bucket", bucket, "--run", "r", "--procs", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        store = open_store(bucket)
        deadline = time.time() + 90
        while len(list(store.list("runs/r/final/"))) < 3:
            assert time.time() < deadline, "no item finished"
            time.sleep(0.1)
        follower = follow(bucket, "r", from_start=True, poll=0.2)
        outs = list(follower)
    finally:
        workers.wait(timeout=120)
    assert len(outs) == len({o.url for o in outs}) == len(list(store.list("out/part-")))  # (beside them: manifest.json)
    assert [o.committed for o in outs] == sorted(o.committed for o in outs)  # in commit order
    assert sum(len(read_url(o.url).decode().splitlines()) for o in outs) == 120
    assert follower.failed == []


def test_only_new_outputs_without_from_start_and_failures_listed(tmp_path):
    bucket = str(tmp_path / "bucket")
    plan(tmp_path, bucket, str(tmp_path / "out"), poison="doc 3 line")  # one item fails
    assert fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path).returncode == 0
    proc = fleet("follow", "--bucket", bucket, "--run", "r", "--poll", "0.1")
    assert proc.returncode == 1 and proc.stdout == "", proc  # all committed before it started
    assert "failed item 00000" in proc.stderr and "poisoned document" in proc.stderr
    proc = fleet("follow", "--bucket", bucket, "--run", "r", "--from-start")
    assert proc.returncode == 1 and len(proc.stdout.splitlines()) == len(list((tmp_path / "out").iterdir()))


# -- issue 30: a run whose workers are all dead ------------------------------------------------


class FakeTime:
    """The follower's clock and sleep: a sleep moves the clock on, and ``at`` runs what a
    worker would do at that second. After ``until`` seconds it stops the follower."""

    def __init__(self, until: float, at: dict | None = None):
        self.now, self.until, self.at = 1_000_000.0, until, dict(at or {})
        self.start = self.now

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for second in sorted(self.at):
            if self.now - self.start >= second:
                self.at.pop(second)()
        if self.now - self.start >= self.until:
            raise TimeoutError("still following")

    @property
    def elapsed(self) -> float:
        return self.now - self.start


def beat(bucket: str, worker: str, updated: float, host: str = "elsewhere", pid: int = 0, state: str = "running"):
    from fleet.core.layout import worker_prefix

    body = {"worker": worker, "host": host, "pid": pid, "state": state, "updated": updated}
    open_store(bucket).write(worker_prefix("r") + worker, json.dumps(body).encode())


def stopped_run(tmp_path) -> str:
    bucket = str(tmp_path / "bucket")
    plan(tmp_path, bucket, str(tmp_path / "out"))
    return bucket


def test_a_run_no_worker_ever_started_is_reported_stopped_after_dead_after(tmp_path):
    """Issue 30: `fleet follow` on a run whose workers are all dead waited forever. With
    ``dead_after``, a run that shows no life (no item finishing, no heartbeat alive or changing)
    for that long on the follower's own clock raises RunStopped naming the run, how long and
    how many items are left; never before: a run's start has ``dead_after`` to show life."""
    from fleet.core.follow import Follower, RunStopped

    bucket = stopped_run(tmp_path)
    t = FakeTime(until=10_000)
    with pytest.raises(
        RunStopped,
        match=r"^run r: no worker has been alive for \d+ s and \d+ item\(s\) are "
        r"unfinished: the run is stopped; start its workers again",
    ):
        list(Follower(bucket, "r", poll=2.0, dead_after=60.0, clock=t.clock, sleep=t.sleep))
    assert 60 <= t.elapsed <= 60 + 20


def test_a_worker_that_beats_is_alive_however_long_its_items_take(tmp_path):
    """No false alarm during a run's start or between items: a worker whose first heartbeat
    comes 50 s in (before ``dead_after``) and beats every 100 s (TTL/3 on a long item) keeps the
    follower waiting, without an item finishing, for as long as it beats."""
    from fleet.core.follow import Follower

    bucket = stopped_run(tmp_path)
    t = FakeTime(until=1_500)
    t.at = {s: (lambda: beat(bucket, "w1", t.now)) for s in range(50, 1_500, 100)}
    with pytest.raises(TimeoutError):
        list(Follower(bucket, "r", poll=5.0, dead_after=60.0, clock=t.clock, sleep=t.sleep))


def test_a_worker_that_stopped_beating_is_dead_after_its_ttl(tmp_path):
    """A heartbeat counts as alive for a lease TTL (+5 s) after it was written (liveness.worker_alive:
    a VM deleted writes no final beat); the run is stopped ``dead_after`` seconds later."""
    from fleet.core.follow import Follower, RunStopped

    bucket = stopped_run(tmp_path)
    t = FakeTime(until=10_000)
    t.at = {30: lambda: beat(bucket, "w1", t.now)}  # beats once at 30 s, then its VM is gone
    with pytest.raises(RunStopped):
        list(Follower(bucket, "r", poll=2.0, dead_after=60.0, clock=t.clock, sleep=t.sleep))
    # The run's lease TTL is 300 s; the last look that saw the beat alive was at most a look (6 s) before it expired.
    assert 30 + 300 + 5 - 6 + 60 <= t.elapsed <= 30 + 300 + 5 + 60 + 20


def test_a_local_worker_whose_process_is_gone_is_dead_at_once(tmp_path):
    """On the machine it ran on, a heartbeat's pid says at once that its worker is gone (a
    `fleet local` killed with SIGKILL leaves a beat that looks fresh)."""
    import socket

    from fleet.core.follow import Follower, RunStopped

    bucket = stopped_run(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    t = FakeTime(until=10_000)
    beat(bucket, "w1", t.now + 3_600, host=socket.gethostname(), pid=gone.pid)  # fresh by its time stamp
    with pytest.raises(RunStopped):
        list(Follower(bucket, "r", poll=2.0, dead_after=60.0, clock=t.clock, sleep=t.sleep))
    assert t.elapsed <= 60 + 20


def test_fleet_follow_on_a_stopped_run_says_so_in_one_line_and_exits_3(tmp_path):
    bucket = stopped_run(tmp_path)
    proc = fleet("follow", "--bucket", bucket, "--run", "r", "--poll", "0.05", "--dead-after", "1", timeout=120)
    assert proc.returncode == 3, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no worker has been alive for" in lines[0] and "the run is stopped" in lines[0]
    assert f"fleet work --bucket {bucket} --run r" in lines[0] and "Traceback" not in proc.stderr


def test_fleet_follow_on_a_fleet_local_killed_with_sigkill_says_it_is_stopped(tmp_path):
    """The case of the issue end to end: `fleet local` killed with SIGKILL mid-run leaves heartbeats
    that look fresh, but their pids are gone, so `fleet follow` says the run is stopped (exit 3)
    after --dead-after, and names `fleet local` to resume it."""
    import signal

    corpus = write_corpus(str(tmp_path / "c.txt"), 120)
    out = tmp_path / "out"
    local = subprocess.Popen(
        FLEET
        + ["local", corpus, str(out), "--job", LINEJOB, "--workers", "2", "--item-mb", "0.004", "--set", "delay=0.2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        deadline = time.time() + 120
        while not (out / ".fleet" / "runs" / "local" / "workers").is_dir() or not any(
            (out / ".fleet" / "runs" / "local" / "workers").iterdir()
        ):
            assert time.time() < deadline and local.poll() is None, "no worker started"
            time.sleep(0.1)
    finally:
        os.killpg(local.pid, signal.SIGKILL)
        local.wait()
    proc = fleet("follow", "--bucket", out, "--poll", "0.1", "--dead-after", "2", timeout=120)
    assert proc.returncode == 3, proc
    assert "the run is stopped; resume it with `fleet local`" in proc.stderr and len(proc.stderr.splitlines()) == 1

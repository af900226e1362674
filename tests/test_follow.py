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
    proc = fleet("plan", "--bucket", bucket, "--run", "r", "--job", LINEJOB, "--input", corpus, "--output", output,
                 "--item-mb", "0.004", *sets)
    assert proc.returncode == 0, proc.stderr


def read_url(url: str) -> bytes:
    if url.startswith("gs://"):
        bucket, _, name = url[len("gs://"):].partition("/")
        return open_store(f"gs://{bucket}").read(name)
    with open(url, "rb") as f:
        return f.read()


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_a_consumer_started_before_the_workers_reads_every_record_once_and_ends(tmp_path, kind, request):
    bucket = str(tmp_path / "bucket") if kind == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}"
    output = str(tmp_path / "out") if kind == "local" else f"{bucket}/out"
    plan(tmp_path, bucket, output, delay=0.02)  # about 12 items of 0.2 s
    consumer = subprocess.Popen(FLEET + ["follow", "--bucket", bucket, "--run", "r", "--poll", "0.2"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the consumer is waiting before any worker starts
    workers = subprocess.Popen(FLEET + ["work", "--bucket", bucket, "--run", "r", "--procs", "2"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, TMPDIR=str(tmp_path)))
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
    workers = subprocess.Popen(FLEET + ["work", "--bucket", bucket, "--run", "r", "--procs", "1"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, TMPDIR=str(tmp_path)))
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

"""Workers as real processes: no double commits, SIGKILL mid-item, same digests as a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fleet.core.lease import DONE, Lease
from fleet.core.layout import lease_prefix, worker_prefix
from fleet.core.run import PlanRequest, plan
from fleet.core.status import StatusReader
from fleet.core.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_EN = os.path.join(ROOT, "corpus", "sample_en.txt")
JOB = "tests.helpers.linejob:JOB"


def start_worker(bucket: str, run: str, name: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    code = f"from fleet.core.processes import work_one; raise SystemExit(work_one({bucket!r}, {run!r}, {name!r}))"
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def plan_run(bucket: str, run: str, delay: float, ttl: float, corpus: str = CORPUS_EN, **extra) -> list:
    settings = {"delay": str(delay), **extra}
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run=run,
            job=JOB,
            inputs=[corpus],
            output=f"{bucket}/out-{run}",
            code_version="test",
            settings=settings,
            lease_ttl=ttl,
            max_attempts=4,
            item_bytes=60_000,
        ),
    )
    return items


def digests(bucket: str, run: str) -> dict[str, str]:
    store = open_store(bucket)
    reader = StatusReader(store, run)
    out = {}
    for item, lease in reader.leases().items():
        assert lease.state == DONE, (item, lease)
        for o in lease.outputs:
            out[o["name"]] = o["sha256"]
    return out


@pytest.fixture
def head_en(tmp_path) -> str:
    """The sample's first 12 documents (96 kB: 2 items of 60 kB), for the tests that kill or stop a
    worker mid-item: what they check needs a few items, not the sample's 46 documents at a delay each."""
    docs = open(CORPUS_EN, encoding="utf-8").read().split("\n\n")[:12]
    path = tmp_path / "head_en.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return str(path)


def wait_all(procs, timeout=120):
    deadline = time.time() + timeout
    for p in procs:
        p.wait(max(1, deadline - time.time()))


def test_two_workers_never_both_commit_an_item(store_url):
    items = plan_run(store_url, "two", delay=0.01, ttl=30)
    procs = [start_worker(store_url, "two", f"w{i}") for i in range(2)]
    wait_all(procs)
    assert all(p.returncode == 0 for p in procs), [p.stderr.read() for p in procs]
    store = open_store(store_url)
    done_by = {}
    for blob in store.list(worker_prefix("two")):
        beat = json.loads(store.read(blob.name))
        done_by[beat["worker"]] = beat["items_done"]
    assert sum(done_by.values()) == len(items)  # each item committed exactly once in all
    leases = StatusReader(store, "two").leases()
    assert sorted(leases) == [i.id for i in items]
    assert all(lease.state == DONE and lease.attempt == 1 for lease in leases.values())


def _holder_of_a_leased_item(store, run, names) -> tuple[str, str] | None:
    prefix = lease_prefix(run)
    for blob in store.list(prefix):
        lease = Lease.from_json(store.read(blob.name))
        if lease.state == "leased" and lease.worker in names and lease.expires > time.time():
            return blob.name[len(prefix) :], lease.worker
    return None


def test_sigkilled_worker_item_is_taken_over_and_output_matches_a_clean_run(store_url, head_en):
    clean_items = plan_run(store_url, "clean", delay=0.0, ttl=30, corpus=head_en)
    clean = start_worker(store_url, "clean", "solo")
    wait_all([clean])
    assert clean.returncode == 0
    expected = digests(store_url, "clean")
    assert len(expected) == len(clean_items)

    plan_run(store_url, "chaos", delay=0.15, ttl=2.0, corpus=head_en)
    store = open_store(store_url)
    procs = {f"v{i}": start_worker(store_url, "chaos", f"v{i}") for i in range(2)}
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline:
        victim = _holder_of_a_leased_item(store, "chaos", set(procs))
        time.sleep(0.05)
    assert victim, "no item was ever leased"
    item, worker = victim
    procs[worker].send_signal(signal.SIGKILL)
    procs[worker].wait()
    replacement = start_worker(store_url, "chaos", "replacement")
    survivors = [p for n, p in procs.items() if n != worker] + [replacement]
    wait_all(survivors)
    assert all(p.returncode == 0 for p in survivors)
    taken_over, _ = StatusReader(store, "chaos").leases()[item], None
    assert taken_over.state == DONE and taken_over.attempt == 2 and taken_over.worker != worker
    got = digests(store_url, "chaos")
    # Same bytes, whoever did each item, however often.
    assert {k.replace("chaos", ""): v for k, v in got.items()} == {
        k.replace("clean", ""): v for k, v in expected.items()
    }
    out = open_store(f"{store_url}/out-chaos")
    for name, sha in got.items():
        import hashlib

        assert hashlib.sha256(out.read(name)).hexdigest() == sha


def test_bad_items_fail_with_reason_and_the_rest_complete(store_url):
    items = plan_run(store_url, "bad", delay=0.0, ttl=30, poison="character set description file")
    worker = start_worker(store_url, "bad", "w")
    wait_all([worker])
    assert worker.returncode == 0
    st = StatusReader(open_store(store_url), "bad").collect()
    assert st.failed >= 1 and st.done == len(items) - st.failed
    assert all("poisoned document" in f["error"] and "sample_en.txt" in f["error"] for f in st.failures)


def test_retryable_errors_are_retried_then_failed(store_url):
    items = plan_run(store_url, "crash", delay=0.0, ttl=30, crash="character set description file")
    worker = start_worker(store_url, "crash", "w")
    wait_all([worker])
    st = StatusReader(open_store(store_url), "crash").collect()
    leases = StatusReader(open_store(store_url), "crash").leases()
    failed = [leases[f["item"]] for f in st.failures]
    assert failed and all(lease.attempt == 4 and "RuntimeError: simulated crash" in lease.error for lease in failed)
    assert st.done == len(items) - len(failed)


def test_sigterm_gives_the_item_back_at_once(store_url, head_en):
    plan_run(store_url, "term", delay=0.3, ttl=300, corpus=head_en)
    store = open_store(store_url)
    w = start_worker(store_url, "term", "t1")
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline:
        victim = _holder_of_a_leased_item(store, "term", {"t1"})
        time.sleep(0.05)
    assert victim
    w.send_signal(signal.SIGTERM)
    w.wait(30)
    lease = Lease.from_json(store.read(lease_prefix("term") + victim[0]))
    assert lease.state == "leased" and lease.expires == 0.0  # released, not left for 300 s
    # A new worker finishes the run without waiting for the ttl.
    t0 = time.time()
    w2 = start_worker(store_url, "term", "t2")
    wait_all([w2])
    assert w2.returncode == 0 and time.time() - t0 < 120
    assert StatusReader(store, "term").collect().done == StatusReader(store, "term").collect().items


def test_fleet_work_lets_its_idle_processes_go_when_one_drains_the_run_without_listing_it_again(tmp_path, monkeypatch):
    """`fleet work --procs N` listed every lease and marker itself whenever one of its processes
    left (spares too: 2 x items / 1,000 calls each time, per VM) and SIGTERMed the others, one
    perhaps writing the run's files. Now the process that found the run drained says so by its
    exit code, and its siblings asleep between idle sweeps leave on a SIGUSR1: no listing here,
    every item done once, the run's files written, and a success."""
    from fleet.core import processes
    from fleet.core.manifest import MANIFEST

    bucket = str(tmp_path / "bucket")
    items = plan_run(bucket, "procs", delay=0.2, ttl=30)  # a 5 s poll: idle siblings sleep
    assert len(items) >= 4
    listed = []
    original = open_store(bucket).__class__.list

    def listing(self, prefix="", *args, **kwargs):  # this process's own listings: the parent's, none
        listed.append(prefix)
        return original(self, prefix, *args, **kwargs)

    monkeypatch.setattr(open_store(bucket).__class__, "list", listing)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    report = tmp_path / "drained"  # what startup.sh reads to know the run finished, instead of listing it
    code = processes.work(
        bucket, "procs", procs=3, log_dir=str(tmp_path / "logs"), prefix="vm", drained_file=str(report)
    )
    assert code == 0, [open(tmp_path / "logs" / f).read()[-2000:] for f in os.listdir(tmp_path / "logs")]
    assert listed == [] and report.exists()
    digests(bucket, "procs")  # every item done
    assert open_store(f"{bucket}/out-procs").stat(MANIFEST) is not None
    store = open_store(bucket)
    beats = [json.loads(store.read(b.name)) for b in store.list(worker_prefix("procs"))]
    assert len(beats) == 3 and {b["state"] for b in beats} <= {"exited", "stopped"}
    # One process, and a run already drained: it finds so and says so too.
    report.unlink()
    assert processes.work(bucket, "procs", procs=1, prefix="late", drained_file=str(report)) == 0
    assert report.exists()

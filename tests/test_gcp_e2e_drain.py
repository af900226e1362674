"""Draining with standbys (what VMs run): a bounded idle tail, and no item stranded.

Workers here run `work_one(..., standby=N)` as processes, as `fleet work --standby N`
does on each VM; leaving the MIG afterwards is tests/test_gcp_e2e.py's part.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from fleet.core.lease import DONE, Lease
from fleet.core.layout import lease_prefix, worker_prefix
from fleet.core.run import PlanRequest, plan
from fleet.core.status import StatusReader
from fleet.core.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_EN = os.path.join(ROOT, "corpus", "sample_en.txt")
JOB = "tests.helpers.linejob:JOB"


def start(bucket: str, run: str, name: str, standby: int) -> subprocess.Popen:
    code = (
        f"from fleet.core.processes import work_one; "
        f"raise SystemExit(work_one({bucket!r}, {run!r}, {name!r}, standby={standby}))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def beats(store, run: str) -> dict[str, dict]:
    prefix = worker_prefix(run)
    return {b.name[len(prefix) :]: json.loads(store.read(b.name)) for b in store.list(prefix)}


def test_idle_workers_leave_except_the_standbys(store_url):
    _, items, _ = plan(
        store_url,
        PlanRequest(
            run="tail",
            job=JOB,
            inputs=[CORPUS_EN],
            output=f"{store_url}/out-tail",
            code_version="test",
            settings={"delay": "0.2"},
            lease_ttl=3,
            item_bytes=200_000,
        ),
    )
    assert len(items) == 3  # of 12 to 21 documents: 2.4 s or more each
    procs = [start(store_url, "tail", f"w{i}", standby=1) for i in range(5)]
    for p in procs:
        p.wait(120)
    assert [p.returncode for p in procs] == [0] * 5, [p.stderr.read() for p in procs]
    store = open_store(store_url)
    leases = StatusReader(store, "tail").leases()
    assert all(lease.state == DONE for lease in leases.values())
    last_done = max(lease.finished for lease in leases.values())
    seen = beats(store, "tail")
    assert len(seen) == 5 and all(b["state"] == "exited" for b in seen.values())
    # When the last item finished, only its worker and the one standby were still there: every
    # other worker left as soon as it found nothing to claim. (Under load a worker may start only
    # as the run ends: one that began less than a first pass, 3 s, before then is not counted.)
    alive_at_end = {name for name, b in seen.items() if b["updated"] >= last_done and b["started"] < last_done - 3}
    assert len(alive_at_end) <= 2, (seen, last_done)


def test_a_standby_takes_over_when_the_last_busy_worker_dies(store_url):
    plan(
        store_url,
        PlanRequest(
            run="strand",
            job=JOB,
            inputs=[CORPUS_EN],
            output=f"{store_url}/out-strand",
            code_version="test",
            settings={"delay": "0.06"},
            lease_ttl=2.0,
            max_attempts=3,
            item_bytes=10_000_000,
        ),
    )
    store = open_store(store_url)
    procs = {name: start(store_url, "strand", name, standby=1) for name in ("a", "b")}
    holder, deadline = None, time.time() + 60
    while holder is None and time.time() < deadline:
        for blob in store.list(lease_prefix("strand")):
            lease = Lease.from_json(store.read(blob.name))
            if lease.state == "leased":
                holder = lease.worker
        time.sleep(0.05)
    assert holder in procs
    time.sleep(0.5)  # the other one has gone idle by now, and must not have left
    other = next(n for n in procs if n != holder)
    assert procs[other].poll() is None, "the only other worker left while an item was in flight"
    procs[holder].send_signal(signal.SIGKILL)
    procs[holder].wait()
    assert procs[other].wait(120) == 0
    (lease,) = StatusReader(store, "strand").leases().values()
    assert lease.state == DONE and lease.worker == other and lease.attempt == 2


def test_sigterm_right_after_a_claim_still_gives_the_item_back(store_url):
    """A VM stopped between a claim and the conversion's start must not keep the item for a whole TTL."""
    plan(
        store_url,
        PlanRequest(
            run="justclaimed",
            job=JOB,
            inputs=[CORPUS_EN],
            output=f"{store_url}/out-jc",
            code_version="test",
            lease_ttl=300,
            item_bytes=10_000_000,
        ),
    )
    code = f"from fleet.core.processes import work_one; raise SystemExit(work_one({store_url!r}, 'justclaimed', 'w', standby=1))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=ROOT, FLEET_TEST_PAUSE="claimed=30"),
    )
    store = open_store(store_url)
    deadline = time.time() + 60
    while not list(store.list(lease_prefix("justclaimed"))):
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.3)  # inside the pause: claimed, conversion not started
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    (lease,) = StatusReader(store, "justclaimed").leases().values()
    assert lease.state == "leased" and lease.expires == 0.0 and lease.attempt == 0  # released, attempt not spent

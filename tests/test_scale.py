"""The scale simulation (bench/scale_sim.py), small: 30 worker threads running the real
Worker loop on 200 items on fake-gcs-server. No timings asserted, only the protocol's
promises: no item committed twice, none stranded, every output as the job wrote it."""

from __future__ import annotations

import importlib.util
import os
import sys

from fleet.core.lease import DONE
from fleet.core.status import StatusReader
from fleet.core.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_scale_sim():
    spec = importlib.util.spec_from_file_location("scale_sim", os.path.join(ROOT, "bench", "scale_sim.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_thirty_workers_two_hundred_items_no_double_commit_none_stranded(fake_gcs, gcs_bucket):
    sim = load_scale_sim()
    # A generous ttl: this process is saturated by 30 threads, and lost leases are not the question here.
    fig = sim.simulate(gcs_bucket, workers=30, items=200, seconds=0.3, ttl=20, standby=2, run="scale")
    assert fig.errors == []
    assert fig.double_commits == 0
    assert fig.stranded == 0 and fig.not_done == 0
    assert fig.processed >= 200 and sum(fig.requests.values()) > 200 * 5  # it did run, through the store
    store = open_store(f"gs://{gcs_bucket}")
    leases = StatusReader(store, "scale").leases()
    assert len(leases) == 200 and all(lease.state == DONE for lease in leases.values())
    out = open_store(f"gs://{gcs_bucket}/out/scale")
    listed = {b.name for b in out.list("")}
    # Every item's output, and the manifest of the finished run (written once, by a drained worker).
    assert listed == {o["name"] for lease in leases.values() for o in lease.outputs} | {"manifest.json"}
    for item, lease in leases.items():
        [o] = lease.outputs
        assert out.read(o["name"]).startswith(f"{item} 1 ".encode())  # one document per item, its own
    # The drain logic let workers leave without waiting for the last item.
    assert len(fig.tail_idle) == 30
    # Coordination does not grow with the crowd: live leases are never read, so a worker's
    # requests per item stay a handful (a loop that reads the leases it passes makes
    # O(workers) requests per item: ~30 here).
    assert fig.requests.get("lease read", 0) / 200 < 2, fig.requests
    assert fig.coordination_requests / 200 < 15, fig.requests

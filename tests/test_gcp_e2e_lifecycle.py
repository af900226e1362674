"""A fleet's life on the Compute stand-in as GCE really runs it (issue 29): a deadline no VM outlives,
a fleet that goes away when the run is done, zones that run out.

Each test launches a small fleet of VMs running the real startup/startup.sh (tests/test_gcp_e2e.py's
`cloud`) against one behaviour of tests/standins/compute.py that a kinder stand-in would hide.
"""

from __future__ import annotations

import json
import time

from fleet.gce import compute_requests
from fleet.gce.boots import boot_records, load_stop
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.test_gcp_e2e import Cloud, cloud_fixture, init, ship_test_jobs  # noqa: F401 (the `cloud` fixture)


def _set(cloud: Cloud, key: str, value: str) -> None:
    config = cloud.tmp / "fleet.toml"
    lines = [line for line in config.read_text().splitlines() if not line.startswith(f"{key} =")]
    config.write_text("\n".join(lines + [f"{key} = {value}"]) + "\n")


def test_a_hung_worker_cannot_keep_the_run_past_its_deadline(cloud, capsys):
    """Workers that never finish their item: at the deadline every VM is stopped, none is ever
    created again, the boots it ended count as failed and the run stops itself (MIG and
    template deleted). Before, maxRunDuration bounded each VM, and the MIG recreated it with a
    fresh clock, round after round."""
    init(cloud)
    _set(cloud, "boot_minutes", "0.1")  # a deadline must leave room for a boot: 6 s here
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet("plan", "--run", "hung", "--job", "tests.helpers.linejob:JOB", "--input",
                f"{cloud.bucket}/corpus/sample_en.txt", "--output", f"{cloud.bucket}/out-hung/",
                "--set", "delay=3600", "--item-mb", "0.3", "--lease-ttl", "20")  # 2 items, an hour a document
    deadline = int(time.time()) + 40
    out = cloud.fleet("launch", "--run", "hung", "--workers", "2", "--template", "fleet-t-hung",
                      "--deadline", compute_requests.rfc3339(deadline))
    assert f"deadline: {compute_requests.rfc3339(deadline)}, " in out
    status = cloud.fleet("status", "--run", "hung")
    assert "deadline " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(deadline)) + " (in " in status
    st = cloud.standin
    while time.time() < deadline + 60:
        with st.lock:
            left = bool(st.running() or st.migs or st.templates)
        if not left:
            break
        time.sleep(0.2)
    gone = time.time() - deadline
    with capsys.disabled():
        print(f"\nhung workers, deadline 40 s after launch: zero VMs, no MIG, no template {gone:.1f}s after it")
    assert not left, f"still there {gone:.0f}s after the deadline: {st.events[-20:]}\n{cloud.vms.console()}"
    ended = [t for t, k, _, _ in st.events if k == "termination-time"]
    assert len(ended) == 2 and min(ended) >= deadline  # GCE's stop, at the deadline, never before
    assert not [t for t, k, _, _ in st.events if k in ("create", "recreate") and t >= deadline]  # none after it
    store = open_store(cloud.bucket)
    records = boot_records(store, "hung")
    assert len(records) == 2 and {r.outcome for r in records} == {"failed"}
    assert all("the run's deadline" in r.reason and "ended this boot" in r.reason for r in records)
    stop = load_stop(store, "hung")
    assert stop is not None and stop.deadline == deadline and stop.items_finished == 0
    assert StatusReader(store, "hung").collect().leased == 0  # the hung items were given back
    view = json.loads(cloud.fleet("status", "--run", "hung", "--json"))["fleet"]
    assert view["mig"] is None and view["launch"]["deadline"] == deadline and "reached its deadline" in view["stopped"]
    text = cloud.fleet("status", "--run", "hung")
    assert "VM boots: 2 failed" in text and "ago): the run's VMs are gone" in text


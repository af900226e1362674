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
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture)
from tests.test_gcp_e2e import ACCOUNT, PROJECT, Cloud, check_clean_exit, init, ship_test_jobs


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
    cloud.fleet(
        "plan",
        "--run",
        "hung",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-hung/",
        "--set",
        "delay=3600",
        "--item-mb",
        "0.3",
        "--lease-ttl",
        "20",
    )  # 2 items, an hour a document
    deadline = int(time.time()) + 40
    out = cloud.fleet(
        "launch",
        "--run",
        "hung",
        "--workers",
        "2",
        "--template",
        "fleet-t-hung",
        "--deadline",
        compute_requests.rfc3339(deadline),
    )
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


def test_a_late_delete_instances_still_leaves_no_fleet_behind(cloud):
    """deleteInstances is DONE when the deletion is scheduled; here the VMs start DELETING, and the
    size drops, 5 s later. The last VM out used to read targetSize right after its own
    deleteInstances, found itself still counted and left the MIG and its template behind. Now
    the VM that finds every item finished deletes them, whatever the size says."""
    cloud.standin.delete_lag = 5.0
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "late",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-late/",
        "--item-mb",
        "0.2",
        "--lease-ttl",
        "20",
    )
    cloud.fleet("launch", "--run", "late", "--workers", "3", "--template", "fleet-t-late")
    cloud.wait_until_gone("fleet-late", "fleet-t-late", timeout=120)
    st = StatusReader(open_store(cloud.bucket), "late").collect()
    assert st.done == st.items and not st.failed
    check_clean_exit(cloud, "late")  # every VM left through deleteInstances, MIG and template deleted
    logs = "".join(cloud.fleet("logs", "--run", "late", vm) for vm in set(cloud.standin.events_of("create")))
    assert "the run is finished: deleting fleet-late" in logs


def test_a_zone_out_of_capacity_holds_up_neither_the_run_nor_the_fleets_end(cloud, capsys):
    """A regional launch where two zones have no Spot capacity and the others room for two VMs
    in all: the third VM can be created nowhere and waits in CREATING. The work finishes on the
    other two, `fleet status` says which zones are short, and the VM that finds the run finished
    deletes the MIG (the waiting VM with it) and the template. Before, the last VM out read the
    target size, which counts the waiting VM, and left the MIG and the template behind."""
    cloud.fleet(
        "init",
        "--project",
        PROJECT,
        "--region",
        "us-central1",
        "--bucket",
        cloud.bucket,
        "--service-account",
        ACCOUNT,
        "--workers-per-vm",
        "1",
        "--standby",
        "1",
        "--max-run-hours",
        "1",
    )
    for zone, room in (("us-central1-a", 0), ("us-central1-b", 0), ("us-central1-c", 1), ("us-central1-f", 1)):
        cloud.standin.set_capacity(zone, room)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "zones",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-zones/",
        "--set",
        "delay=0.3",
        "--item-mb",
        "0.2",
        "--lease-ttl",
        "20",
    )
    cloud.fleet("launch", "--run", "zones", "--workers", "3", "--template", "fleet-t-zones")
    st = cloud.standin
    mig = st.migs[("regions/us-central1", "fleet-zones")]
    assert mig.body["instanceLifecyclePolicy"] == {"onRepair": {"allowChangingZone": "YES"}}
    deadline = time.time() + 60
    while len(st.events_of("create")) < 2 or len(st.events_of("create-failed")) < 2:
        assert time.time() < deadline, st.events
        time.sleep(0.2)
    view = json.loads(cloud.fleet("status", "--run", "zones", "--json"))["fleet"]
    short = view["mig"]["short_zones"]
    assert short and set(short) <= {"us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"}, short
    assert "zones short:" in cloud.fleet("status", "--run", "zones")
    cloud.wait_until_gone("fleet-zones", "fleet-t-zones", timeout=150)
    status = StatusReader(open_store(cloud.bucket), "zones").collect()
    assert status.done == status.items and not status.failed
    created = set(st.events_of("create"))
    assert len(created) == 2  # the third never found room
    waiting = {w for w in st.events_of("create-failed")} - created
    assert waiting and waiting <= set(st.events_of("deleteInstances"))  # removed, never holding the MIG up
    gone_via = {w: d for _, k, w, d in st.events if k == "gone"}
    assert set(gone_via.values()) == {"deleteInstances"}, gone_via
    assert st.events_of("mig-gone") == ["fleet-zones"] and st.events_of("template-deleted") == ["fleet-t-zones"]
    ran = {r.zone for r in boot_records(open_store(cloud.bucket), "zones")}  # where the VMs ran
    assert ran == {"us-central1-c", "us-central1-f"}, ran

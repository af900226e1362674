"""A bucket outage in the middle of a run, on the stand-in VMs: no VM leaves because of it.

Before, a worker stopped once the storage client's retries (120 s) were spent; startup.sh then
recorded a failed boot and removed the VM from its MIG for good, so an outage of a few minutes
shrank the fleet for the rest of the run. Scaled here: the VMs' storage client gives up after
1 s (FLEET_STORE_RETRY_SECONDS) and the outage lasts 10 s, ten times that (on GCS: 120 s, and an
outage of minutes). The workers' backoff (up to a minute, doubling from a second) then waits at
most 16 s after the outage; at 3 s and 30 s (as before) it waited up to a minute, for the same check.
Every request of the VMs to the bucket is refused (503) meanwhile.
"""

from __future__ import annotations

import io
import time

from rich.console import Console

from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.gce.boots import boot_records
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture)
from tests.test_gcp_e2e import CORPUS, check_clean_exit, init, local_digests, output_digests, ship_test_jobs

OUTAGE = 10.0
RETRY = 1  # the VMs' storage client's retry deadline (s): a tenth of the outage


def test_a_bucket_outage_mid_run_takes_no_vm_away(cloud, tmp_path, capsys):
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.vms.env.update(FLEET_STORE_RETRY_SECONDS=str(RETRY))
    job = "tests.helpers.linejob:JOB"
    cloud.fleet(
        "plan",
        "--run",
        "out",
        "--job",
        job,
        "--input",
        f"{cloud.bucket}/corpus/",
        "--output",
        f"{cloud.bucket}/out-out/",
        "--set",
        "delay=0.1",
        "--item-mb",
        "0.1",
        "--lease-ttl",
        "20",
    )
    cloud.fleet("launch", "--run", "out", "--workers", "3", "--template", "fleet-t-out")
    reader = StatusReader(open_store(cloud.bucket), "out")
    deadline = time.time() + 120
    while not ((st := reader.collect()).done >= 1 and st.leased >= 2):
        assert time.time() < deadline, cloud.vms.console()
        time.sleep(0.1)
    cloud.storage.script = [[lambda method, path: True, "503", 10**9]]  # the VMs reach nothing in the bucket
    began = time.time()
    time.sleep(OUTAGE)
    refused = cloud.storage.counts["503"]
    cloud.storage.script = []
    ended = time.time()
    assert not cloud.standin.events_of("deleteInstances"), "a VM left during the outage"
    cloud.wait_until_gone("fleet-out", "fleet-t-out", timeout=240)

    st = cloud.standin
    assert len(st.events_of("create")) == 3 and not st.events_of("recreate")
    left = [t for t, kind, _, _ in st.events if kind == "deleteInstances"]
    assert len(left) == 3 and min(left) > ended  # each left after the outage, because the run was done
    records = boot_records(open_store(cloud.bucket), "out")
    # No boot failed. The first VM to find the run finished deletes every VM: one whose worker was still idle,
    # waiting for the drain, is stopped by that deletion (and its boot counts for nothing), never failed.
    outcomes = [r.outcome for r in records]
    assert len(records) == 3 and "done" in outcomes and set(outcomes) <= {"done", "stopped"}, (
        [(r.instance, r.outcome, r.reason) for r in records],
        cloud.standin.events,
        cloud.vms.console(),
    )
    status = reader.collect()
    assert status.done == status.items and not status.failed
    check_clean_exit(cloud, "out")
    logs = "".join(cloud.fleet("logs", "--run", "out", r.instance) for r in records)
    assert "the bucket is unreachable" in logs and "waiting for it" in logs

    from fleet.cli.local import run_local

    out = tmp_path / "local-out"
    result = run_local(
        [str(CORPUS)], str(out), job, 2, {"delay": "0"}, item_bytes=int(0.1e6), console=Console(file=io.StringIO())
    )
    assert result.exit_code == 0
    assert output_digests(f"{cloud.bucket}/out-out") == local_digests(out)
    with capsys.disabled():
        print(
            f"\nbucket outage of {OUTAGE:.0f} s (client retries {RETRY} s) mid-run: {refused} VM requests refused, no VM "
            f"left; the run ended {max(left) - began:.0f} s after the outage began, {status.items} items"
        )

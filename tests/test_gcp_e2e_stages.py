"""A run with stages on the Compute Engine stand-in: the VMs' workers do the map, wait for
it to drain instead of leaving as standbys would, move on to the shards stage without a new
launch, and the VM that finds the final stage done deletes the MIG. The shards
are the bytes `fleet local` writes on this machine."""

from __future__ import annotations

import io

from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.run import load_items
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.job import StageOptions
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture)
from tests.test_gcp_e2e import CORPUS, check_clean_exit, init, local_digests, output_digests, ship_test_jobs

JOB = "tests.helpers.stagejob:JOB"


def test_vms_move_from_the_map_to_the_shards_stage_and_leave_after_the_last(cloud, tmp_path):
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "st",
        "--job",
        JOB,
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-st/",
        "--set",
        "delay=0.02",
        "--item-mb",
        "0.1",
        "--lease-ttl",
        "20",
        "--shards",
        "3",
    )
    cloud.fleet("launch", "--run", "st", "--workers", "3", "--template", "fleet-t-st")
    cloud.wait_until_gone("fleet-st", "fleet-t-st")
    store = open_store(cloud.bucket)
    reader = StatusReader(store, "st")
    st = reader.collect()
    assert st.done == st.items and not st.failed and not st.blocked, st
    assert [(s["name"], s["done"]) for s in st.stages] == [("map", st.items - 4), ("shards", 3)]
    check_clean_exit(cloud, "st")
    # The VMs that did the map went on to the shards: no VM was launched for the second stage.
    leases = reader.leases()
    steps = {i.id: i.step for i in load_items(store, "st")}
    map_workers = {lease.worker.rsplit("-w", 1)[0] for item, lease in leases.items() if steps[item] == 0}
    shard_workers = {lease.worker.rsplit("-w", 1)[0] for item, lease in leases.items() if steps[item] == 2}
    assert map_workers & shard_workers, (map_workers, shard_workers)

    out = tmp_path / "local"
    result = run_local(
        [str(CORPUS / "sample_en.txt")],
        str(out),
        JOB,
        2,
        {"delay": "0.02"},
        item_bytes=int(0.1e6),
        console=Console(file=io.StringIO()),
        stage_options=StageOptions(3),
    )
    assert result.exit_code == 0
    on_vms = output_digests(f"{cloud.bucket}/out-st")
    assert on_vms == local_digests(out)
    assert sorted(on_vms) == [f"part-0000{i}-of-00003.txt" for i in range(3)]

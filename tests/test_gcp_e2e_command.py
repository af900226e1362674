"""The `command` job on the Compute Engine stand-in: VMs run the real startup.sh, which runs
`fleet work`, which runs a script of ours (tests/helpers/upper.py, shipped in the code snapshot
through code_paths) per item; the outputs are the bytes `fleet local` writes on this machine."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture)
from tests.test_gcp_e2e import CORPUS, ROOT, init, local_digests, output_digests, ship_test_jobs
from tests.test_gcp_e2e_failures import check_stopped, until_nothing_left

COMMAND = "python3 tests/helpers/upper.py {input} {output} {seed}"


def test_an_existing_script_runs_on_vms_and_writes_what_fleet_local_writes(cloud, tmp_path, monkeypatch):
    init(cloud)
    ship_test_jobs()  # code_paths += tests/helpers: the script travels in the snapshot
    cloud.fleet("sync")
    options = {"command": COMMAND, "split": "lines", "seed": "11"}
    cloud.fleet(
        "plan",
        "--run",
        "cmd",
        "--job",
        "command",
        "--input",
        f"{cloud.bucket}/corpus/",
        "--output",
        f"{cloud.bucket}/out-cmd/",
        *(a for k, v in options.items() for a in ("--set", f"{k}={v}")),
        "--item-mb",
        "0.15",
        "--lease-ttl",
        "20",
    )
    cloud.fleet("launch", "--run", "cmd", "--workers", "2", "--template", "fleet-t-cmd")
    cloud.wait_until_gone("fleet-cmd", "fleet-t-cmd")
    st = StatusReader(open_store(cloud.bucket), "cmd").collect()
    assert st.done == st.items >= 4 and not st.failed, st
    assert st.totals["output_files"] == 2 * st.items and st.totals["items_without_outputs"] == 0
    status = json.loads(cloud.fleet("status", "--run", "cmd", "--json"))
    assert status["done"] == st.items and status["failures"] == []

    monkeypatch.chdir(ROOT)  # where the command's relative script path is found, as on the VMs
    out = tmp_path / "local"
    result = run_local(
        [str(CORPUS / "sample_en.txt"), str(CORPUS / "sample_zh.txt")],
        str(out),
        "command",
        2,
        options,
        item_bytes=int(0.15e6),
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0
    on_vms = output_digests(f"{cloud.bucket}/out-cmd")
    assert on_vms == local_digests(out) and len(on_vms) == 2 * st.items
    assert sorted(on_vms)[:2] == ["part-00000-stats.json", "part-00000-upper.txt"]


def test_a_program_missing_on_the_vms_stops_the_run_in_one_line(cloud, capsys):
    """`fleet plan` cannot see the VMs' PATH: each worker looks before its first item, fails its
    boot with the one line, and the run stops itself after three such boots."""
    init(cloud)
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "nocmd",
        "--job",
        "command",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-nocmd/",
        "--set",
        "command=tool-not-on-the-image {input} {output}",
    )
    started = time.time()
    cloud.fleet("launch", "--run", "nocmd", "--workers", "3", "--template", "fleet-t-nocmd")
    until_nothing_left(cloud, "nocmd", started, "a program missing on the VMs", capsys)
    check_stopped(cloud, "nocmd", "tool-not-on-the-image: no such program on PATH")

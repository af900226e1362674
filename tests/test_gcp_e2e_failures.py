"""No path leaves a VM billing: runs whose VMs fail at boot end with zero VMs, no MIG, no template.

Each test launches 3 VMs on the local stand-ins (tests/test_gcp_e2e.py's `cloud`) with one
thing broken, and waits until nothing is left. Every boot fails; startup.sh records it in the
bucket and leaves the MIG with curl alone, and the boot that makes 3 failures with no item
finished in between deletes the MIG and the template: the run stopped itself, and
`fleet status` says why in one line. Each test prints how long that took and how many VM
boots it cost.
"""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from fleet.gce import gcp
from fleet.cli.commands import app
from fleet.gce.boots import boot_records, load_stop
from fleet.core.codesync import parse_manifest
from fleet.core.layout import code_manifest_name as manifest_name, code_object_name
from fleet.gce.config import load
from fleet.core.store import open_store
from tests.test_gcp_e2e import Cloud, cloud_fixture, init, ship_test_jobs  # noqa: F401 (the `cloud` fixture)

LIMIT = 240.0  # seconds to zero VMs; each takes well under a minute here


def launch(cloud: Cloud, run: str, job: str = "tests.helpers.linejob:JOB") -> float:
    cloud.fleet(
        "plan",
        "--run",
        run,
        "--job",
        job,
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-{run}/",
        "--item-mb",
        "0.3",
    )
    started = time.time()
    cloud.fleet("launch", "--run", run, "--workers", "3", "--template", f"fleet-t-{run}")
    return started


def until_nothing_left(cloud: Cloud, run: str, started: float, what: str, capsys) -> None:
    """Wait for zero VMs, no MIG and no template; print the time and the VM boots it cost."""
    st = cloud.standin
    while True:
        with st.lock:
            vms = st.running()
            left = bool(vms or st.migs or st.templates)
        if not left:
            break
        assert time.time() - started < LIMIT, (
            f"{what}: still {len(vms)} VM(s), MIGs {list(st.migs)}, templates "
            f"{list(st.templates)} after {LIMIT:.0f}s\n{cloud.vms.console()}"
        )
        time.sleep(0.2)
    boots = len(st.events_of("create")) + len(st.events_of("recreate"))
    with capsys.disabled():  # in the test log, passed or not
        print(f"\n{what}: zero VMs, no MIG, no template {time.time() - started:.1f}s after launch; {boots} VM boots")
    assert boots == 3  # each VM booted once: nothing was recreated, nothing booted after the stop
    assert not st.events_of("power-off")  # every VM's stop ended with its shutdown script


def check_stopped(cloud: Cloud, run: str, reason: str, run_spec_sound: bool = True) -> None:
    """The run says why it stopped, in one line; every boot is recorded, each under its own name."""
    store = open_store(cloud.bucket)
    stop = load_stop(store, run)
    assert stop is not None and stop.failed_boots >= 3 and reason in stop.reason, stop
    records = boot_records(store, run)
    assert len(records) == 3 and {r.outcome for r in records} == {"failed"}, records
    assert all(reason in r.reason for r in records), [r.reason for r in records]
    if run_spec_sound:
        status = cloud.fleet("status", "--run", run)
        assert "VM boots: 3 failed" in status
        view = json.loads(cloud.fleet("status", "--run", run, "--json"))["fleet"]
        assert view["mig"] is None and reason in view["stopped"]
    else:  # status cannot count items, and says so in one line after why the run stopped
        result = CliRunner().invoke(app, ["status", "--run", run])
        assert result.exit_code == 2 and "run.json" in result.output.splitlines()[-1], result.output
        status = result.output
    lines = [line for line in status.splitlines() if "the run stopped itself" in line]
    assert len(lines) == 1 and reason in lines[0] and "fleet launch" in lines[0], status


def test_code_that_fails_its_hash_check(cloud, capsys):
    init(cloud)
    version = cloud.fleet("sync").strip().splitlines()[-1]
    store = open_store(cloud.bucket)
    sha = dict((p, s) for s, p in parse_manifest(store.read(manifest_name(version))))["fleet/core/spawner.py"]
    store.write(code_object_name(sha), b"raise SystemExit('not the real spawner')\n")
    started = launch(cloud, "hash")
    until_nothing_left(cloud, "hash", started, "code that fails its hash check", capsys)
    check_stopped(cloud, "hash", "the downloaded code does not match its manifest")


def test_a_dependency_that_cannot_install(cloud, tmp_path, capsys):
    init(cloud)
    cloud.fleet("sync")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    # A real install into a fresh venv on each VM's own disk (one venv shared by VMs booting at
    # once raced), from an index that has nothing (as when PyPI is unreachable).
    cloud.vms.env.update(
        FLEET_SKIP_INSTALL="0",
        FLEET_PYTHON="{disk}/venv/bin/python",
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(empty),
        PIP_RETRIES="0",
    )
    started = launch(cloud, "deps")
    until_nothing_left(cloud, "deps", started, "a dependency that cannot install", capsys)
    check_stopped(cloud, "deps", "pip could not install")


def test_a_worker_that_crashes_at_start(cloud, capsys):
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    started = launch(cloud, "crash", job="tests.helpers.crashjob:JOB")
    until_nothing_left(cloud, "crash", started, "a worker that crashes at start", capsys)
    check_stopped(cloud, "crash", "fleet work exited 1")
    assert "simulated crash as the worker starts" in cloud.fleet(
        "logs", "--run", "crash", boot_records(open_store(cloud.bucket), "crash")[0].instance
    )


def test_a_corrupt_run_spec(cloud, capsys):
    init(cloud)
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "spec",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-spec/",
    )
    cfg = load()
    plan = gcp.plan_launch(cfg, "spec", 3, "fleet-t-spec")  # checked while run.json was sound...
    open_store(cloud.bucket).write(
        "runs/spec/run.json", b'{"job": "tests.helpers.linejob:JOB", "conf'
    )  # ...then damaged
    started = time.time()
    gcp.launch(cfg, plan, echo=lambda m: None)
    until_nothing_left(cloud, "spec", started, "a corrupt run spec", capsys)
    check_stopped(cloud, "spec", "run.json", run_spec_sound=False)


def test_a_bucket_that_refuses_the_vms(cloud, capsys):
    """A 403 to every request of the VMs (a wrong bucket name, a missing grant): no boot record and no
    log can reach the bucket, so what each boot said must reach the VM's journal and serial console."""
    init(cloud)
    cloud.fleet("sync")
    cloud.storage.forbid = lambda method, path: True
    started = launch(cloud, "refused")
    until_nothing_left(cloud, "refused", started, "a bucket that refuses the VMs", capsys)
    assert boot_records(open_store(cloud.bucket), "refused") == []  # nothing reached the bucket
    assert len(cloud.vms.boots) == 3
    for folder in cloud.vms.boots:
        log = (folder / "disk" / "logs" / "startup.log").read_text().splitlines()
        console = [
            line for line in (folder / "console.log").read_text().splitlines() if line.startswith("startup-script: ")
        ]
        journal = (folder / "journal").read_text().splitlines()
        # Every line of startup.sh, in order, until the VM's stop (its deleteInstances) kills the runner, as
        # on GCE; the rest reaches the file and the bucket only, and shutdown.sh's lines, added to the
        # file then, go through the shutdown script's own runner.
        ours = [f"startup-script: {line}" for line in log if " shutdown: " not in line]
        assert console == ours[: len(console)] and len(console) >= 10
        assert journal == [f"google_metadata_script_runner: {line}" for line in console]
        text = "\n".join(console)
        assert "bucket request failed: HTTP 403" in text and "this boot failed: code " in text
        assert "refused this VM (HTTP 403): the VMs' service account needs to read it" in text
        assert "removed from fleet-refused through deleteInstances" in text

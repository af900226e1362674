"""The whole GCP path on local stand-ins: sync, plan, launch; VMs run the real startup.sh.

fake-gcs-server is the bucket, tests/standins/compute.py the Compute API (its MIG
starts each VM as a local process running the template's startup script), and a
metadata server per VM tells it who it is. Nothing reaches Google.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fleet.gce import compute_requests
from fleet.gce.boots import boot_records
from fleet.cli.commands import app
from fleet.core.lease import DONE, Lease
from fleet.core.layout import lease_prefix
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.standins.catalog import Catalog
from tests.standins.compute import ComputeStandin
from tests.standins.faultproxy import FaultProxy
from tests.standins.iam import IamStandin, Policy
from tests.standins.vm import LocalVMs

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
PROJECT, ZONE = "fleet-test-1", "us-central1-a"
ACCOUNT = f"fleet-worker@{PROJECT}.iam.gserviceaccount.com"


@dataclass
class Cloud:
    bucket: str  # gs://NAME
    standin: ComputeStandin
    vms: LocalVMs
    tmp: Path
    policy: Policy
    catalog: Catalog
    storage: FaultProxy  # the VMs' way to the bucket (guarded by the policy)
    network: FaultProxy  # the operator's way to Compute: it resets connections now and then

    def fleet(self, *args: str) -> str:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, (
            f"fleet {' '.join(args)} -> {result.exit_code}\n{result.output}\n{result.exception!r}"
        )
        return result.output

    def wait_until_gone(self, run_mig: str, template: str, timeout: float = 150) -> None:
        """Until the MIG and the template are gone and every VM has stopped."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.standin.lock:
                done = not self.standin.migs and template not in self.standin.templates and not self.standin.orphans
            if done:
                return
            time.sleep(0.2)
        raise AssertionError(
            f"fleet {run_mig} did not finish within {timeout}s; events "
            f"{[(k, w) for _, k, w, _ in self.standin.events]}\n{self.vms.console()}"
        )


@pytest.fixture(name="cloud")
def cloud_fixture(fake_gcs, gcs_bucket, tmp_path, monkeypatch):
    vm_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "FLEET_CONFIG"))}
    vm_env.pop("PYTHONPATH", None)
    # Workers run as this user here: a test must not add system users to the machine (tests/test_debian.py does, in a chroot).
    # Logs go up every 5 s (30 on GCE), and at each boot's end whatever the interval: every test reads them after
    # that. At 1 s the three VMs' shippers ran three processes and two requests a second each, for nothing.
    vm_env.update(FLEET_PYTHON=sys.executable, FLEET_SKIP_INSTALL="1", FLEET_LOG_INTERVAL="5", FLEET_RUN_AS="")
    vms = LocalVMs(tmp_path / "vms", vm_env)
    standin = ComputeStandin(PROJECT, launcher=vms, on_gone=vms.gone).start()  # GCE's stop windows: 30 s, 90 s
    catalog = Catalog(PROJECT).install(standin)  # regions.get (quotas) and machineTypes.get for `fleet launch`
    # The VMs' account holds exactly fleet/gce/iam.py's roles: the stand-ins refuse (403) any VM call outside them.
    policy = Policy.for_fleet(PROJECT, gcs_bucket, vms.tokens, upstream=fake_gcs.url, account=ACCOUNT)
    standin.guard = policy.compute_guard
    storage = FaultProxy(fake_gcs.url, guard=policy.storage_guard).start()  # the VMs' way to the bucket
    iam_api = IamStandin([ACCOUNT]).start()
    # The operator's Compute calls (fleet launch, status, down) meet what the network does now and then:
    # connection resets, and answers lost after the request was applied (retried with their requestId).
    network = FaultProxy(standin.url, rate=0.05, faults=("drop", "lost"), seed=29).start()
    vm_env["FLEET_COMPUTE_ENDPOINT"] = standin.url  # the VMs' `fleet leave` talks to the stand-in too
    vm_env["STORAGE_EMULATOR_HOST"] = storage.url
    monkeypatch.setenv("FLEET_COMPUTE_ENDPOINT", network.url)
    monkeypatch.setenv("FLEET_IAM_ENDPOINT", iam_api.url)
    monkeypatch.setenv("FLEET_CONFIG", str(tmp_path / "fleet.toml"))
    store = open_store(f"gs://{gcs_bucket}")
    for f in ("sample_en.txt", "sample_zh.txt"):
        store.upload_file(f"corpus/{f}", str(CORPUS / f))
    try:
        yield Cloud(f"gs://{gcs_bucket}", standin, vms, tmp_path, policy, catalog, storage, network)
    finally:
        standin.stop()
        storage.stop()
        network.stop()
        iam_api.stop()
    # Every request of the product (fleet launch/status/down, startup.sh on the VMs) was one the
    # published API accepts: the stand-in checks each against the discovery document.
    assert standin.violations == []


def init(cloud: Cloud, *extra: str) -> None:
    cloud.fleet(
        "init",
        "--project",
        PROJECT,
        "--zone",
        ZONE,
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
        *extra,
    )


def ship_test_jobs() -> None:
    """Add the slow test jobs (tests/helpers) to what `fleet sync` uploads: they travel in the snapshot like any job."""
    config = Path(os.environ["FLEET_CONFIG"])
    default_paths = 'code_paths = ["fleet", "fleet_jobs", "startup", "pyproject.toml", "requirements.lock"]'
    assert default_paths in config.read_text()
    config.write_text(
        config.read_text().replace(default_paths, default_paths[:-1] + ', "tests/__init__.py", "tests/helpers"]')
    )


def output_digests(url: str) -> dict[str, str]:
    store = open_store(url)
    return {
        b.name: hashlib.sha256(store.read(b.name)).hexdigest() for b in store.list("") if b.name.startswith("part-")
    }


def local_digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.name.startswith("part-")}


def check_clean_exit(cloud: Cloud, run: str) -> None:
    """Every VM that ever booted left through deleteInstances; the last one deleted MIG and template."""
    st = cloud.standin
    created = set(st.events_of("create"))
    assert len(created) >= 3
    assert set(st.events_of("deleteInstances")) == created
    assert sorted(st.events_of("gone")) == sorted(created)
    gone_via = {w: d for _, k, w, d in st.events if k == "gone"}
    assert set(gone_via.values()) == {"deleteInstances"}, gone_via
    assert st.events_of("mig-gone") == [f"fleet-{run}"] and st.events_of("template-deleted") == [f"fleet-t-{run}"]
    # Each VM removed itself with the token its own metadata server gave it, never anonymously.
    removals = [c for c in st.calls if c.path.endswith("/deleteInstances")]
    assert removals and all(c.auth and c.auth.split()[-1] in cloud.vms.tokens for c in removals)
    assert not [c for c in st.calls if "/instances/" in c.path and c.method == "DELETE"]  # never instances.delete
    assert cloud.vms.world_writable() == []


def test_launch_runs_the_job_on_vms_and_they_delete_themselves(cloud, tmp_path):
    vocab = tmp_path / "vocab.txt"
    subprocess.run(
        [sys.executable, "-m", "fleet_jobs.text", "vocab", str(CORPUS), "--size", "8000", "--out", str(vocab)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    open_store(cloud.bucket).upload_file("vocab.txt", str(vocab))
    init(cloud)
    synced = cloud.fleet("sync")
    version = synced.strip().splitlines()[-1]
    assert "files" in synced and len(version) == 16
    again = cloud.fleet("sync")
    assert " 0 new" in again and "already synced" in again  # content-addressed: nothing re-uploaded
    cloud.fleet(
        "plan",
        "--run",
        "e2e",
        "--job",
        "electra_zh_en",
        "--input",
        f"{cloud.bucket}/corpus/",
        "--output",
        f"{cloud.bucket}/out/",
        "--set",
        f"vocab_file={cloud.bucket}/vocab.txt",
        "--item-mb",
        "0.15",
        "--lease-ttl",
        "20",
    )
    # The deadline fixed once (a whole minute, an hour away), so that the dry run shows exactly what the launch sends.
    deadline = compute_requests.rfc3339((time.time() // 60 + 60) * 60)
    dry = cloud.fleet(
        "launch", "--run", "e2e", "--workers", "3", "--template", "fleet-t-e2e", "--dry-run", "--deadline", deadline
    )
    assert f"POST {os.environ['FLEET_COMPUTE_ENDPOINT']}/compute/v1/projects/{PROJECT}/global/instanceTemplates" in dry
    assert {c.method for c in cloud.standin.calls} == {"GET"}  # a dry run only reads (quotas, machine type)
    # GCE may report "template in use" as the error of the delete's operation: the last VM out must retry that too.
    cloud.standin.in_use_error = "operation"
    # Certainly once: the MIG's insert is applied, its answer lost; the retry, same requestId, gets its operation.
    cloud.network.script = [
        [lambda method, path: method == "POST" and path.split("?")[0].endswith("/instanceGroupManagers"), "lost", 1]
    ]
    cloud.fleet("launch", "--run", "e2e", "--workers", "3", "--template", "fleet-t-e2e", "--deadline", deadline)
    assert cloud.network.counts["lost"] >= 1 and len(cloud.standin.events_of("request-id-seen")) >= 1
    assert cloud.standin.events_of("mig-created") == ["fleet-e2e"]
    # What the dry run printed is exactly what was sent (a retry after a reset sends it again, with the same requestId).
    sent = [
        c
        for c in cloud.standin.calls
        if c.method == "POST" and c.path.endswith(("instanceTemplates", "instanceGroupManagers"))
    ]
    assert [c.body for c in {c.query["requestId"][0]: c for c in sent}.values()] == _bodies(dry)

    cloud.wait_until_gone("fleet-e2e", "fleet-t-e2e")
    st = StatusReader(open_store(cloud.bucket), "e2e").collect(with_workers=True)
    assert st.done == st.items and st.items >= 6 and not st.failed
    check_clean_exit(cloud, "e2e")
    assert cloud.standin.events_of("template-in-use")  # startup.sh met the in-use error (in the operation), retried

    # The same outputs, byte for byte, as `fleet local` on this machine.
    from fleet.cli.local import run_local

    out = tmp_path / "local-out"
    result = run_local(
        [str(CORPUS)],
        str(out),
        "electra_zh_en",
        2,
        {"vocab_file": str(vocab)},
        item_bytes=int(0.15e6),
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0
    assert output_digests(f"{cloud.bucket}/out") == local_digests(out) and len(local_digests(out)) == st.items

    # Logs were streamed; the VMs ran the downloaded, verified snapshot, not this tree.
    listing = cloud.fleet("logs", "--run", "e2e")
    assert len(listing.strip().splitlines()) == 3
    vm = listing.split()[0]
    text = cloud.fleet("logs", "--run", "e2e", vm + "-w0")
    assert f"code {version}: " in text and "downloaded and verified" in text
    # It left through deleteInstances: its own, or that of a VM which found the run finished first and
    # deleted the fleet (each VM that drains together may; check_clean_exit counts every VM's removal).
    assert (
        f"{vm}: removed from fleet-e2e through deleteInstances" in text
        or f"{vm}: fleet-e2e is already deleted, and this VM with it" in text
    ), text
    records = boot_records(open_store(cloud.bucket), "e2e")
    assert sorted(r.instance for r in records) == sorted(cloud.standin.events_of("create"))
    assert {r.outcome for r in records} == {"done"} and all(r.code_version == version for r in records)

    status = json.loads(cloud.fleet("status", "--run", "e2e", "--json"))
    assert status["fleet"]["mig"] is None and status["fleet"]["vms_seen"] == 3 and status["fleet"]["vm_hours"] > 0

    # Nothing secret reached the bucket (logs, heartbeats, leases, run spec) or the template's metadata.
    tokens = [t.encode() for t in cloud.vms.tokens]
    assert tokens
    store = open_store(cloud.bucket)
    for blob in store.list("runs/"):
        data = store.read(blob.name)
        assert not any(t in data for t in tokens), blob.name
    assert not any(t in json.dumps([c.body for c in sent]).encode() for t in tokens)

    # A second job on the same fleet path: causal_lm with a byte-level BPE read from the bucket,
    # written as Parquet; the same bytes as `fleet local`.
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train([str(CORPUS / "sample_en.txt")], vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save(str(tmp_path / "tokenizer.json"))
    store.upload_file("tokenizer.json", str(tmp_path / "tokenizer.json"))
    lm_options = {"tokenizer_file": f"{cloud.bucket}/tokenizer.json", "max_seq_length": "256", "output": "parquet"}
    cloud.fleet(
        "plan",
        "--run",
        "lm",
        "--job",
        "causal_lm",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/lm/",
        *(a for k, v in lm_options.items() for a in ("--set", f"{k}={v}")),
        "--item-mb",
        "0.2",
        "--lease-ttl",
        "20",
    )
    cloud.fleet("launch", "--run", "lm", "--workers", "2", "--template", "fleet-t-lm")
    cloud.wait_until_gone("fleet-lm", "fleet-t-lm")
    st = StatusReader(open_store(cloud.bucket), "lm").collect()
    assert st.done == st.items >= 2 and not st.failed
    lm_local = tmp_path / "lm-local"
    result = run_local(
        [str(CORPUS / "sample_en.txt")],
        str(lm_local),
        "causal_lm",
        2,
        {**lm_options, "tokenizer_file": str(tmp_path / "tokenizer.json")},
        item_bytes=int(0.2e6),
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0
    lm_outputs = output_digests(f"{cloud.bucket}/lm")
    assert lm_outputs == local_digests(lm_local) and all(name.endswith(".parquet") for name in lm_outputs)


def _bodies(dry: str) -> list[dict]:
    """The JSON bodies in `fleet launch --dry-run` output, in order."""
    bodies, decoder, i = [], json.JSONDecoder(), 0
    while (i := dry.find("\n{", i)) != -1:
        body, end = decoder.raw_decode(dry, i + 1)
        bodies.append(body)
        i = end
    return bodies


def _victim(store, run: str, vm_names: set[str]) -> tuple[str, str] | None:
    """An item leased right now by a worker on one of these VMs: (item, VM)."""
    prefix = lease_prefix(run)
    for blob in store.list(prefix):
        lease = Lease.from_json(store.read(blob.name))
        vm = lease.worker.rsplit("-w", 1)[0]
        # Claimed under a second ago, so seconds of work remain: the kill cannot land after its commit.
        if lease.state == "leased" and vm in vm_names and time.time() - lease.started < 1.0:
            return blob.name[len(prefix) :], vm
    return None


def test_a_preempted_vm_gives_its_item_back_at_once_and_is_recreated(cloud, tmp_path, capsys):
    """Spot preemption as GCE does it: only the startup script's runner is signalled, the template's
    shutdown-script runs, power-off follows within 30 s. The shutdown script must reach the workers:
    the item comes back within a second, announced in released/, and is taken again within a
    poll of a worker (10 s here), long before its lease (90 s) would have run out. A worker
    killed with its item would hold it until the lease expires, 90 s after its last renewal."""
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    job = "tests.helpers.linejob:JOB"
    ttl = 90.0
    cloud.fleet(
        "plan",
        "--run",
        "pre",
        "--job",
        job,
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-pre/",
        "--set",
        "delay=0.4",
        "--item-mb",
        "0.3",
        "--lease-ttl",
        str(ttl),
    )  # 2 items of about 24 documents: 10 s of work each; 3 VMs, one idle
    cloud.fleet("launch", "--run", "pre", "--workers", "3", "--template", "fleet-t-pre")
    store = open_store(cloud.bucket)
    found, deadline = None, time.time() + 90
    while found is None and time.time() < deadline:
        names = {vm.name for vm in cloud.standin.running() if vm.action == "NONE"}
        found = _victim(store, "pre", names)
        time.sleep(0.1)
    assert found, f"no item was ever leased\n{cloud.vms.console()}"
    item, vm = found
    t0 = time.time()
    cloud.standin.preempt(vm)
    released = taken = None
    while taken is None and time.time() < t0 + 60:
        lease = Lease.from_json(store.read(f"{lease_prefix('pre')}{item}"))
        if released is None and (lease.expires == 0.0 or lease.state == DONE or lease.started > t0):
            released = time.time() - t0
        if lease.state == DONE or lease.started > t0:
            taken = time.time() - t0
        time.sleep(0.1)
    with capsys.disabled():
        print(
            f"\npreempted {vm} holding item {item}: given back after {released and round(released, 1)}s, "
            f"taken again after {taken and round(taken, 1)}s (lease TTL {ttl:.0f}s)"
        )
    assert released is not None and released < 10, f"the item was not given back\n{cloud.vms.console()}"
    assert taken is not None and taken < 30, f"taken after {taken}s\n{cloud.vms.console()}"

    cloud.wait_until_gone("fleet-pre", "fleet-t-pre")
    assert cloud.standin.events_of("recreate") == [vm]
    assert not cloud.standin.events_of("power-off")  # every stop ended with its shutdown script, inside the window
    leases = StatusReader(store, "pre").leases()
    assert all(lease.state == DONE for lease in leases.values())
    check_clean_exit(cloud, "pre")

    # Same bytes as an undisturbed local run of the same plan.
    from fleet.cli.local import run_local

    out = tmp_path / "local-pre"
    result = run_local(
        [str(CORPUS / "sample_en.txt")],
        str(out),
        job,
        2,
        {"delay": "0"},
        item_bytes=int(0.3e6),
        console=Console(file=io.StringIO()),
    )
    assert result.exit_code == 0
    assert output_digests(f"{cloud.bucket}/out-pre") == local_digests(out)


def test_fleet_down_mid_run_stops_the_vms_and_they_give_their_items_back(cloud):
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "dn",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/",
        "--output",
        f"{cloud.bucket}/out-dn/",
        "--set",
        "delay=0.2",
        "--item-mb",
        "0.1",
        "--lease-ttl",
        "300",
    )
    cloud.fleet("launch", "--run", "dn", "--workers", "2", "--template", "fleet-t-dn")
    store = open_store(cloud.bucket)
    deadline = time.time() + 90
    while StatusReader(store, "dn").collect().leased < 2:
        assert time.time() < deadline, cloud.vms.console()
        time.sleep(0.1)
    out = cloud.fleet("down", "--run", "dn")
    assert "fleet-dn: deleted" in out and "fleet-t-dn: deleted" in out
    st = cloud.standin
    assert not st.migs and "fleet-t-dn" not in st.templates
    assert st.events_of("deleteInstances") == []  # stopped by the platform: they do not leave on their own
    assert {d for _, k, _, d in st.events if k == "gone"} == {"mig-delete"}
    status = StatusReader(store, "dn").collect()
    assert (
        status.leased == 0 and status.done < status.items
    )  # in-flight items were given back at once, not left for 300 s
    logs = cloud.fleet("logs", "--run", "dn")
    assert len(logs.strip().splitlines()) == 2
    text = cloud.fleet("logs", "--run", "dn", logs.split()[0])
    assert (
        "shutdown: the VM is stopping" in text and "SIGTERM: the VM is stopping" in text and "left to the MIG" in text
    )

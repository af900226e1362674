"""The whole install path on a real Debian 12: startup/startup.sh in a debootstrapped root file system.

Nothing is skipped: no FLEET_SKIP_INSTALL, no FLEET_PYTHON. In a minimal Debian 12
(`debootstrap --variant=minbase --include=curl,ca-certificates bookworm`: no Python), run
under chroot against fake-gcs-server, a metadata server and the Compute stand-in on this
machine's loopback, startup.sh installs Python with apt, the locked dependencies with
`pip --require-hashes`, fetches and verifies the code, creates the workers' system user,
converts every item of a small run as that user, and leaves its MIG; being the last one
out, it deletes the MIG and the template. It needs root, chroot, debootstrap and the Debian
and PyPI registries (.ci/run installs debootstrap); it takes a minute or two.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fleet.gce import compute, compute_requests
from fleet.gce.boots import boot_records
from fleet.core.codesync import sync
from fleet.gce.config import DEFAULT_CODE_PATHS
from fleet.core.layout import vm_paths_text
from fleet.core.run import PlanRequest, plan
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.standins.compute import ComputeStandin
from tests.standins.metadata import Instance, MetadataServer

ROOT = Path(__file__).resolve().parent.parent
PROJECT, ZONE = "fleet-test-1", "us-central1-a"
PIP_CONFIG_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "/etc/xdg/pip/constraints.txt")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("debootstrap") or not shutil.which("chroot"),
    reason="needs root, chroot and debootstrap (.ci/run installs debootstrap)",
)


def host_pip_settings(rootfs: Path) -> dict[str, str]:
    """The host's package-index settings, carried into the chroot: pip's config files, PIP_*
    variables and the CA bundle they trust (a proxy's CA, say); the variables are returned."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    files = list(PIP_CONFIG_FILES) + [
        os.path.expanduser("~/.config/pip/pip.conf"),
        os.path.expanduser("~/.pip/pip.conf"),
    ]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    for f in files:
        if os.path.isfile(f):
            target = rootfs / f.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    bundle = next(
        (
            b
            for b in (
                os.environ.get("PIP_CERT"),
                os.environ.get("REQUESTS_CA_BUNDLE"),
                os.environ.get("SSL_CERT_FILE"),
                "/etc/ssl/certs/ca-certificates.crt",
            )
            if b and os.path.isfile(b)
        ),
        None,
    )
    if bundle:
        shutil.copy2(bundle, rootfs / "usr/local/share/host-ca-bundle.crt")
        env.update(PIP_CERT="/usr/local/share/host-ca-bundle.crt")
    for var in ("PIP_FIND_LINKS",):  # local wheel folders of the host are not in the chroot
        env.pop(var, None)
    return env


def mount(rootfs: Path) -> list[Path]:
    points = []
    for src, dst, args in (("proc", "proc", ["-t", "proc"]), ("/dev", "dev", ["--bind"])):
        target = rootfs / dst
        subprocess.run(["mount", *args, src, str(target)], check=True)
        points.append(target)
    return points


def unmount(points: list[Path]) -> bool:
    ok = True
    for target in reversed(points):
        subprocess.run(["umount", "-l", str(target)], check=False)
        ok = ok and not os.path.ismount(target)
    return ok


def test_startup_sh_installs_and_works_on_a_bare_debian_12(fake_gcs, gcs_bucket, tmp_path, monkeypatch, capsys):
    t0 = time.time()
    rootfs = tmp_path / "debian12"
    no_proxy = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}  # conftest's dead proxy
    made = subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=curl,ca-certificates", "bookworm", str(rootfs)],
        capture_output=True,
        text=True,
        timeout=900,
        env=no_proxy,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    t_rootfs = time.time() - t0
    assert not (rootfs / "usr/bin/python3").exists()  # no Python: startup.sh must install it
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    pip_env = host_pip_settings(rootfs)

    # The bucket: code (with the small test job), a run of a few items.
    bucket = f"gs://{gcs_bucket}"
    store = open_store(bucket)
    store.upload_file("corpus/sample_en.txt", str(ROOT / "corpus" / "sample_en.txt"))
    version = sync(bucket, paths=list(DEFAULT_CODE_PATHS) + ["tests/__init__.py", "tests/helpers"]).version
    plan(
        bucket,
        PlanRequest(
            run="deb",
            job="tests.helpers.linejob:JOB",
            inputs=[f"{bucket}/corpus/sample_en.txt"],
            output=f"{bucket}/out-deb",
            code_version=version,
            item_bytes=200_000,
        ),
    )

    # Compute: a template and a MIG of one VM, which this chroot is.
    standin = ComputeStandin(PROJECT).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, standin.url)
    servers = []
    points: list[Path] = []
    try:
        spec = compute_requests.FleetSpec(
            run="deb",
            bucket=bucket,
            code_version=version,
            template="t-deb",
            machine_type="e2-standard-2",
            image="projects/debian-cloud/global/images/family/debian-12",
            service_account=f"fleet-worker@{PROJECT}.iam.gserviceaccount.com",
            startup_script=(ROOT / "startup" / "startup.sh").read_text(),
            workers_per_vm=1,
            standby=0,
        )
        place = compute_requests.Place(PROJECT, zone=ZONE)
        comp = compute.Compute(place)
        comp.ensure_template(compute_requests.template_resource(spec))
        comp.create_mig(compute_requests.mig_resource(spec, place, "fleet-deb", 1))
        deadline = time.time() + 30
        while not standin.running():
            assert time.time() < deadline
            time.sleep(0.1)
        (vm,) = standin.running()
        attributes = {
            "fleet-bucket": bucket,
            "fleet-run": "deb",
            "fleet-code-version": version,
            "fleet-workers-per-vm": "1",
            "fleet-standby": "0",
            "fleet-paths": vm_paths_text("deb"),
            "created-by": f"projects/123456789012/zones/{ZONE}/instanceGroupManagers/fleet-deb",
            "instance-template": "projects/123456789012/global/instanceTemplates/t-deb",
        }
        server = MetadataServer(Instance(vm.name, PROJECT, ZONE, attributes)).start()
        servers.append(server)

        shutil.copy2(ROOT / "startup" / "startup.sh", rootfs / "startup-script")
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "GCE_METADATA_HOST": server.host,
            "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
            compute_requests.ENDPOINT_ENV: standin.url,
            "FLEET_LOG_INTERVAL": "5",
            **pip_env,
        }
        points = mount(rootfs)
        t1 = time.time()
        ran = subprocess.run(
            [
                "chroot",
                str(rootfs),
                "/usr/bin/env",
                "-i",
                *[f"{k}={v}" for k, v in env.items()],
                "bash",
                "/startup-script",
            ],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        t_boot = time.time() - t1
        log = (rootfs / "var/lib/fleet/logs/startup.log").read_text(errors="replace")
        assert ran.returncode == 0, f"{ran.stdout[-2000:]}{ran.stderr[-2000:]}\n{log[-6000:]}"

        # Its stdout (what GCE's runner sends to the journal and the serial console) has every line of
        # the log: tail and wc from a minimal Debian's coreutils follow it.
        assert ran.stdout.splitlines() == log.splitlines()
        assert "installing python3 and python3-venv" in log
        assert "installing the locked dependencies" in log and f"code {version}: " in log
        # No compiler on a bare Debian, and none installed: the tokenizer's C core came with the code
        # (built by this checkout's pip install -e .) and loads there.
        assert (
            "gcc" not in log
            and f"tokenizer C core: /var/lib/fleet/code/{version}/fleet_jobs/text/tokenizers/_ccore." in log
        )
        users = (rootfs / "etc/passwd").read_text()
        fleet_user = next(line.split(":") for line in users.splitlines() if line.startswith("fleet:"))
        assert 0 < int(fleet_user[2]) < 1000 and f"workers run as fleet (uid {fleet_user[2]})" in log
        status = StatusReader(store, "deb").collect()
        assert status.done == status.items >= 3 and not status.failed
        (record,) = boot_records(store, "deb")
        assert record.outcome == "done" and record.instance == vm.name
        assert standin.events_of("deleteInstances") == [vm.name]
        assert not standin.migs and not standin.templates  # the last one out deleted both
        assert standin.violations == []  # every REST call startup.sh made is one the published API accepts
        frozen = subprocess.run(
            ["chroot", str(rootfs), "/opt/fleet/venv/bin/python", "-m", "pip", "freeze", "--all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

        def norm(pin: str) -> str:
            return re.sub(r"[-_.]+", "-", pin.lower())

        locked = {
            norm(line.split(" ")[0])
            for line in (ROOT / "requirements.lock").read_text().splitlines()
            if "==" in line and not line.startswith(" ")
        }
        assert locked <= {norm(line) for line in frozen.splitlines()}  # exactly the locked versions
        with capsys.disabled():
            print(
                f"\nDebian 12 root file system {t_rootfs:.0f}s; startup.sh from bare system to left the MIG "
                f"{t_boot:.0f}s ({status.items} items)"
            )
    finally:
        unmounted = unmount(points)
        standin.stop()
        for s in servers:
            s.stop()
        if unmounted:  # never delete through a mount of the host's /dev
            shutil.rmtree(rootfs, ignore_errors=True)

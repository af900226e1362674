"""The stand-in's VMs stop as GCE guests do, so a product that relies on kinder behaviour fails.

GCE's guest agent runs the startup script as a oneshot unit with KillMode=process: at a stop
only the script's runner gets SIGTERM, the template's shutdown-script runs, and the power-off
kills the rest, however detached. A VM at its maxRunDuration is deleted and (the worst case)
recreated by its MIG.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fleet.gce import compute, compute_requests
from tests.standins.compute import ComputeStandin
from tests.standins.vm import LocalVMs

PROJECT, ZONE = "fleet-test-1", "us-central1-a"

STARTUP = """
mark=${FLEET_WORK_DIR%/disk}
trap 'echo got SIGTERM > "$mark/startup-term"' TERM
setsid sleep 1000 &
echo $! > "$mark/detached"
while :; do sleep 0.1; done
"""
SHUTDOWN = """
echo ran > "${FLEET_WORK_DIR%/disk}/shutdown-ran"
"""


@pytest.fixture
def fleet_of(tmp_path, monkeypatch):
    standins = []

    def make(max_run_seconds: float = 0, scale: float = 1.0) -> tuple[ComputeStandin, LocalVMs]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        vms = LocalVMs(tmp_path / "vms", env)
        standin = ComputeStandin(PROJECT, launcher=vms, on_gone=vms.gone, run_duration_scale=scale).start()
        standins.append(standin)
        monkeypatch.setenv(compute_requests.ENDPOINT_ENV, standin.url)
        spec = compute_requests.FleetSpec(
            run="g",
            bucket="gs://b",
            code_version="0" * 16,
            template="t-g",
            machine_type="e2-standard-2",
            image="projects/debian-cloud/global/images/family/debian-12",
            service_account=f"w@{PROJECT}.iam.gserviceaccount.com",
            startup_script=STARTUP,
            shutdown_script=SHUTDOWN,
            max_run_hours=max_run_seconds / 3600,
        )
        place = compute_requests.Place(PROJECT, zone=ZONE)
        comp = compute.Compute(place)
        comp.ensure_template(compute_requests.template_resource(spec))
        comp.create_mig(compute_requests.mig_resource(spec, place, "fleet-g", 1))
        return standin, vms

    yield make
    for s in standins:
        s.stop()


def until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_a_stop_signals_only_the_runner_then_runs_the_shutdown_script_then_powers_off(fleet_of):
    standin, vms = fleet_of()
    until(lambda: vms.boots and (vms.boots[0] / "detached").exists(), "the VM never started its script")
    first = vms.boots[0]
    detached = int((first / "detached").read_text())
    assert pid_alive(detached)
    (vm,) = standin.running()
    standin.preempt(vm.name)
    until(lambda: standin.events_of("recreate"), "the preempted VM was not recreated")
    assert (first / "shutdown-ran").exists()  # the template's shutdown-script ran at the stop
    assert not (first / "startup-term").exists()  # the startup script itself got no SIGTERM
    assert not pid_alive(detached)  # the power-off reached a process that had left the session
    assert vms.boots[1].name == f"{vm.name}-boot2"
    assert not standin.events_of("power-off")  # it powered off when the shutdown script ended, inside the window


def test_a_vm_at_its_max_run_duration_is_deleted_and_recreated(fleet_of):
    standin, vms = fleet_of(max_run_seconds=60, scale=0.05)  # 3 s here
    until(lambda: len(standin.events_of("recreate")) >= 2, "no VM reached its maxRunDuration twice", timeout=90)
    (name,) = set(standin.events_of("max-run-duration"))
    assert [b.name for b in vms.boots[:3]] == [f"{name}-boot{i}" for i in (1, 2, 3)]
    assert all((b / "shutdown-ran").exists() for b in vms.boots[:2])


def test_guest_is_a_plain_script(tmp_path):
    """The guest runs with no PYTHONPATH: standard library only."""
    text = (Path(__file__).parent / "standins" / "guest.py").read_text()
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert all(
        line.split()[1].split(".")[0] in {"__future__", "ctypes", "os", "signal", "sys", "time", "pathlib"}
        for line in imports
    ), imports

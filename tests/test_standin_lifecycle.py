"""The Compute stand-in's VM lifecycle is GCE's where a kinder one would hide a bill (issue 29, part 7).

VMs here are placeholders (no process): what is checked is what the MIG does with them, as a
client sees it. tests/test_gcp_e2e_lifecycle.py runs the product against these behaviours.

- ``terminationTime`` ends every VM at one time, and no VM can be created from the template
  after it; it is one of the two kinds of time limit, never beside ``maxRunDuration``.
- ``deleteInstances``: the operation is DONE at once, the size drops a moment later.
- Zones run out: a regional ANY-shape MIG creates VMs where there is room, and repairs a VM
  in its own zone unless ``onRepair.allowChangingZone`` is YES.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from google.cloud import compute_v1

from fleet.gce import compute, compute_requests
from tests.helpers.gce import PROJECT, spec
from tests.standins.compute import ComputeStandin

ZONAL, REGIONAL = (
    compute_requests.Place(PROJECT, zone="us-central1-a"),
    compute_requests.Place(PROJECT, region="us-central1"),
)


@pytest.fixture
def standin(monkeypatch):
    s = ComputeStandin(PROJECT, op_delay=0.05, delete_lag=1.0).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, s.url)
    yield s
    s.stop()


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def template(**scheduling) -> compute_v1.InstanceTemplate:
    tpl = compute_requests.template_resource(spec())
    tpl.properties.scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT", automatic_restart=False, on_host_maintenance="TERMINATE", **scheduling
    )
    return tpl


def until(condition, what: str, timeout: float = 15) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize(
    "scheduling, message",
    [
        ({"termination_time": "tomorrow", "instance_termination_action": "DELETE"}, "Expected an RFC3339 timestamp"),
        ({"termination_time": "2030-01-01T00:00:00"}, "Expected an RFC3339 timestamp"),  # no time zone
        ({"termination_time": "2030-01-01T00:00:00Z"}, "must be set when terminationTime is set"),
        (
            {
                "termination_time": "2030-01-01T00:00:00Z",
                "instance_termination_action": "DELETE",
                "max_run_duration": compute_v1.Duration(seconds=3600),
            },
            "either maxRunDuration or terminationTime",
        ),
    ],
)
def test_a_termination_time_is_checked_as_gce_does(standin, scheduling, message):
    with pytest.raises(compute_requests.ComputeError, match=message):
        compute.Compute(ZONAL).ensure_template(template(**scheduling))


def test_at_the_termination_time_every_vm_goes_and_none_can_be_created(standin):
    comp = compute.Compute(ZONAL)
    end = time.time() + 2.5
    comp.ensure_template(template(termination_time=rfc3339(end), instance_termination_action="DELETE"))
    comp.create_mig(compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 2))
    until(lambda: len(standin.events_of("create")) == 2, "the VMs were never created")
    until(lambda: len(standin.events_of("termination-time")) == 2, "the VMs outlived their termination time")
    assert min(t for t, k, _, _ in standin.events if k == "termination-time") >= int(end)
    # The MIG tries to recreate them (the target size is unchanged) and cannot: the time has passed.
    until(lambda: len(standin.events_of("create-failed")) >= 4, "the MIG did not retry")
    state = comp.state("fleet-r1")
    assert state.target_size == 2 and all(i["status"] != "RUNNING" for i in state.instances)
    assert {e["code"] for e in state.errors} == {"INVALID_FIELD_VALUE"}
    assert not standin.events_of("recreate")


def test_delete_instances_is_done_before_the_size_drops(standin):
    comp = compute.Compute(ZONAL)
    comp.ensure_template(compute_requests.template_resource(spec()))
    comp.create_mig(compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 2))
    until(lambda: len(standin.events_of("create")) == 2, "the VMs were never created")
    vm = comp.state("fleet-r1").instances[0]
    comp.delete_instances("fleet-r1", [f"zones/{vm['zone']}/instances/{vm['name']}"])  # waited to DONE
    state = comp.state("fleet-r1")
    assert state.target_size == 2 and {i["action"] for i in state.instances} == {"NONE"}
    until(lambda: comp.get_mig("fleet-r1").target_size == 1, "the deletion never happened")


def _regional(standin, allow_changing_zone: bool, size: int = 2) -> compute.Compute:
    comp = compute.Compute(REGIONAL)
    comp.ensure_template(compute_requests.template_resource(spec()))
    mig = compute_requests.mig_resource(spec(), REGIONAL, "fleet-r1", size)
    if allow_changing_zone:
        mig.instance_lifecycle_policy = compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            on_repair=compute_v1.InstanceGroupManagerInstanceLifecyclePolicyOnRepair(allow_changing_zone="YES")
        )
    else:
        mig._pb.ClearField("instance_lifecycle_policy")
    comp.create_mig(mig)
    return comp


def test_an_any_shape_mig_creates_its_vms_where_there_is_room(standin):
    for zone in ("us-central1-a", "us-central1-b", "us-central1-c"):
        standin.set_capacity(zone, 0)
    comp = _regional(standin, allow_changing_zone=False, size=3)
    until(lambda: len(standin.events_of("create")) == 3, "the VMs were never created")
    state = comp.state("fleet-r1")
    assert {i["zone"] for i in state.instances} == {"us-central1-f"}
    # Each attempt in a full zone failed first, and says where.
    assert state.errors and {e["code"] for e in state.errors} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
    assert {e["zone"] for e in state.errors} <= {"us-central1-a", "us-central1-b", "us-central1-c"}
    assert set(state.short_zones) == {e["zone"] for e in state.errors}


@pytest.mark.parametrize("allow", [False, True], ids=["pinned", "allowChangingZone"])
def test_a_repair_stays_in_its_zone_unless_the_mig_allows_changing_it(standin, allow):
    comp = _regional(standin, allow_changing_zone=allow, size=1)
    until(lambda: standin.events_of("create"), "the VM was never created")
    (vm,) = standin.running()
    zone = vm.zone
    standin.set_capacity(zone, 0)  # the zone runs out of Spot capacity as it preempts the VM
    standin.preempt(vm.name)
    if allow:
        until(lambda: standin.events_of("recreate"), "the VM was not repaired in another zone")
        assert vm.zone != zone
    else:
        until(lambda: len(standin.events_of("create-failed")) >= 3, "the repair did not keep failing")
        assert vm.zone == zone and not standin.events_of("recreate")
        errors = comp.state("fleet-r1").errors
        assert errors and {e["code"] for e in errors} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}

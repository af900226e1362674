"""fleet.gce.compute through the real google-cloud-compute client against the local Compute stand-in.

VMs here are placeholders (no process); tests/test_gcp_e2e.py runs real ones.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies
from google.cloud import compute_v1
from typer.testing import CliRunner

from fleet.gce import compute, compute_requests, iam
from fleet.cli.commands import app
from fleet.core.codesync import sync
from fleet.gce.config import DEFAULT_CODE_PATHS
from fleet.core.run import PlanRequest, plan
from fleet.core.store import open_store
from tests.helpers.gce import PROJECT, spec
from tests.standins.catalog import Catalog
from tests.standins.compute import ComputeStandin
from tests.standins.faultproxy import FaultProxy
from tests.standins.iam import IamStandin

ROOT = Path(__file__).resolve().parent.parent
ZONAL, REGIONAL = (
    compute_requests.Place(PROJECT, zone="us-central1-a"),
    compute_requests.Place(PROJECT, region="us-central1"),
)


@pytest.fixture
def standin(monkeypatch):
    s = ComputeStandin(PROJECT).start()
    Catalog(PROJECT).install(s)  # regions.get and machineTypes.get, which `fleet launch` reads first
    accounts = IamStandin([f"w@{PROJECT}.iam.gserviceaccount.com"]).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, s.url)
    monkeypatch.setenv(iam.ENDPOINT_ENV, accounts.url)
    yield s
    s.stop()
    accounts.stop()


def test_template_request_has_only_the_scopes_workers_need_and_a_safety_net():
    body = compute_requests.to_dict(compute_requests.template_resource(spec(max_run_hours=6)))
    props = body["properties"]
    assert props["serviceAccounts"] == [
        {
            "email": f"w@{PROJECT}.iam.gserviceaccount.com",
            "scopes": [
                "https://www.googleapis.com/auth/devstorage.read_write",
                "https://www.googleapis.com/auth/compute",
            ],
        }
    ]
    assert props["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
        "maxRunDuration": {"seconds": "21600"},
    }  # int64 as a JSON string
    items = {i["key"]: i["value"] for i in props["metadata"]["items"]}
    assert set(items) == {
        "startup-script",
        "fleet-bucket",
        "fleet-run",
        "fleet-code-version",
        "fleet-workers-per-vm",
        "fleet-standby",
        "fleet-paths",
    }  # nothing secret
    standard = compute_requests.to_dict(compute_requests.template_resource(spec(spot=False, max_run_hours=0)))[
        "properties"
    ]
    assert standard["scheduling"] == {"provisioningModel": "STANDARD"}


@pytest.mark.parametrize("run, mig", [("wiki-zh-en", "fleet-wiki-zh-en"), ("Wiki_ZH.v2", None), ("x" * 80, None)])
def test_mig_names_are_valid_gce_names(run, mig):
    name = compute_requests.mig_name(run)
    compute_requests.check_name("managed instance group", name)
    assert mig is None or name == mig
    assert compute_requests.mig_name(run) == name and compute_requests.mig_name(run + "x") != name


def test_bad_names_are_refused_before_any_request():
    with pytest.raises(compute_requests.ComputeError, match=r"instance template name 'T_1': use 1-63 lowercase"):
        spec(template="T_1")


@pytest.mark.parametrize("place", [ZONAL, REGIONAL], ids=["zonal", "regional"])
def test_template_and_mig_lifecycle(standin, place):
    comp = compute.Compute(place)
    tpl = compute_requests.template_resource(spec())
    assert comp.ensure_template(tpl) == "created"
    assert comp.ensure_template(tpl) == "reused"  # identical: kept, whatever defaults the API filled in
    with pytest.raises(compute_requests.ComputeError, match="exists with other settings"):
        comp.ensure_template(compute_requests.template_resource(spec(machine_type="n2d-standard-8")))
    mig = compute_requests.mig_resource(spec(), place, "fleet-r1", 3)
    assert comp.create_mig(mig) == "created" and comp.create_mig(mig) == "exists"
    # Creating operations came back RUNNING and were waited on through the operations clients.
    waits = [c.path for c in standin.calls if c.path.endswith("/wait")]
    assert any("/global/operations/" in p for p in waits)
    assert any(f"/{place.scope}/operations/" in p for p in waits)
    deadline = time.time() + 10
    while (st := comp.state("fleet-r1")) and sum(i["action"] == "NONE" for i in st.instances) < 3:
        assert time.time() < deadline
        time.sleep(0.05)
    assert st.target_size == 3 and st.template == "t-r1"
    victim = st.instances[0]
    comp.delete_instances("fleet-r1", [f"zones/{victim['zone']}/instances/{victim['name']}"])
    # Its operation is DONE when the deletion is scheduled (as on GCE): the size may drop a moment later.
    deadline = time.time() + 10
    while comp.get_mig("fleet-r1").target_size != 2:  # the MIG will not replace it
        assert time.time() < deadline
        time.sleep(0.05)
    with pytest.raises(compute_requests.ComputeError, match="already being used by"):
        comp.delete_template("t-r1")
    assert comp.delete_mig("fleet-r1") is True and comp.get_mig("fleet-r1") is None
    assert comp.delete_template("t-r1") is True
    assert comp.delete_mig("fleet-r1") is False and comp.delete_template("t-r1") is False


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: setattr(t.properties.scheduling, "automatic_restart", True), "Spot VMs cannot restart"),
        (lambda t: setattr(t.properties.scheduling, "on_host_maintenance", "MIGRATE"), "must TERMINATE"),
        (
            lambda t: setattr(
                t.properties,
                "scheduling",
                compute_v1.Scheduling(
                    provisioning_model="STANDARD", max_run_duration=compute_v1.Duration(seconds=3600)
                ),
            ),
            "must be set when maxRunDuration",
        ),
        (
            lambda t: setattr(t.properties, "machine_type", "zones/us-central1-a/machineTypes/e2-small"),
            "machine type name",
        ),
        (lambda t: t.properties.metadata.items.append(compute_v1.Items(key="fleet-run", value="x")), "Duplicate keys"),
        (
            lambda t: setattr(t, "name", "a" * 64),
            r"instanceTemplate.*Must be a match of regex",
        ),  # the get, before the insert
    ],
)
def test_the_standin_validates_templates_as_gce_does(standin, mutate, message):
    tpl = compute_requests.template_resource(spec())
    mutate(tpl)
    with pytest.raises(compute_requests.ComputeError, match=message):
        compute.Compute(ZONAL).ensure_template(tpl)


def test_a_regional_any_shape_mig_needs_redistribution_off(standin):
    comp = compute.Compute(REGIONAL)
    comp.ensure_template(compute_requests.template_resource(spec()))
    mig = compute_requests.mig_resource(spec(), REGIONAL, "fleet-r1", 1)
    mig.update_policy.instance_redistribution_type = "PROACTIVE"
    with pytest.raises(compute_requests.ComputeError, match="instanceRedistributionType.*must be NONE"):
        comp.create_mig(mig)
    zonal = compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 1)
    zonal.distribution_policy = compute_v1.DistributionPolicy(target_shape="ANY")
    with pytest.raises(compute_requests.ComputeError, match="only regional"):
        compute.Compute(ZONAL).create_mig(zonal)


@pytest.fixture
def launched(fake_gcs, gcs_bucket, standin, tmp_path, monkeypatch):
    """A planned, synced run and a fleet.toml for it."""
    bucket = f"gs://{gcs_bucket}"
    monkeypatch.setenv("FLEET_CONFIG", str(tmp_path / "fleet.toml"))
    (tmp_path / "fleet.toml").write_text(
        f'project = "{PROJECT}"\nbucket = "{bucket}"\nzone = "us-central1-a"\n'
        f'service_account = "w@{PROJECT}.iam.gserviceaccount.com"\n'
    )
    store = open_store(bucket)
    store.upload_file("corpus/sample_en.txt", str(ROOT / "corpus" / "sample_en.txt"))
    version = sync(bucket, paths=DEFAULT_CODE_PATHS).version
    plan(
        bucket,
        PlanRequest(
            run="r1",
            job="tests.helpers.linejob:JOB",
            inputs=[f"{bucket}/corpus/"],
            output=f"{bucket}/out/",
            code_version=version,
            item_bytes=200_000,
        ),
    )
    return bucket, standin


def fleet(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


def test_status_shows_the_migs_instances_and_its_stock_out_errors(launched):
    bucket, standin = launched
    standin.fail_creations(2)
    fleet("launch", "--run", "r1", "--workers", "2")
    deadline = time.time() + 10
    while len(standin.events_of("create")) < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    view = json.loads(fleet("status", "--run", "r1", "--json"))["fleet"]
    assert view["launch"]["mig"] == "fleet-r1" and view["mig"]["target_size"] == 2
    assert len(view["mig"]["errors"]) == 2 and {e["code"] for e in view["mig"]["errors"]} == {
        "ZONE_RESOURCE_POOL_EXHAUSTED"
    }
    text = fleet("status", "--run", "r1")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in text and "fleet-r1" in text and "VM-hours" in text
    fleet("down", "--run", "r1")
    assert not standin.migs and not standin.templates
    assert "not there (already deleted)" in fleet("down", "--run", "r1")
    assert json.loads(fleet("status", "--run", "r1", "--json"))["fleet"]["mig"] is None


def test_launch_refuses_what_vms_cannot_run(launched, tmp_path):
    bucket, standin = launched
    plan(
        bucket,
        PlanRequest(
            run="localout",
            job="tests.helpers.linejob:JOB",
            inputs=[f"{bucket}/corpus/"],
            output=str(tmp_path / "out"),
            code_version="0123456789abcdef",
        ),
    )
    out = fleet("launch", "--run", "localout", "--workers", "2", code=2)
    assert "is a local path; VMs can read and write only gs:// URLs" in out
    plan(
        bucket,
        PlanRequest(
            run="unsynced",
            job="tests.helpers.linejob:JOB",
            inputs=[f"{bucket}/corpus/"],
            output=f"{bucket}/o2/",
            code_version="0123456789abcdef",
        ),
    )
    assert "code version 0123456789abcdef (pinned by run 'unsynced') is not in" in fleet(
        "launch", "--run", "unsynced", "--workers", "2", code=2
    )
    assert "--workers 0: give 1 to 1000 (the limit of a zonal" in fleet(
        "launch", "--run", "r1", "--workers", "0", code=2
    )
    # GCE's documented limit: 1000 VMs in a zonal MIG (2000 in a regional one); refused before any call.
    out = fleet("launch", "--run", "r1", "--workers", "1500", code=2)
    assert (
        out.count("\n") == 1
        and "--workers 1500: a zonal managed instance group holds at most 1000 VMs; "
        'set region = "us-central1" in fleet.toml instead of zone (a regional one holds 2000)'
        in out
    )
    assert "no run 'nope'" in fleet("launch", "--run", "nope", "--workers", "1", code=2)
    assert not standin.calls


def test_dry_run_prints_the_requests_and_only_reads(launched):
    bucket, standin = launched
    deadline = compute_requests.rfc3339((time.time() // 60 + 120) * 60)  # a whole minute: kept as given
    out = fleet("launch", "--run", "r1", "--workers", "5", "--no-spot", "--deadline", deadline, "--dry-run")
    assert f"POST {standin.url}/compute/v1/projects/{PROJECT}/global/instanceTemplates\n" in out
    assert f"POST {standin.url}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instanceGroupManagers\n" in out
    assert '"provisioningModel": "STANDARD"' in out and f'"terminationTime": "{deadline}"' in out
    assert '"instanceTerminationAction": "DELETE"' in out and '"targetSize": 5' in out and "maxRunDuration" not in out
    assert (
        f"deadline: {deadline}, 2.0 h after launch (set by --deadline); every VM, recreated ones included, "
        "is gone by then" in out
    )
    assert {c.method for c in standin.calls} == {"GET"} and open_store(bucket).stat("runs/r1/launch.json") is None


def test_launch_json_is_written_even_when_the_first_upload_fails(launched, fake_gcs, monkeypatch):
    """An unconditional write the client would not retry on its own: `status` and `down` need it."""
    bucket, standin = launched

    def is_launch_record(method: str, path: str) -> bool:  # launch's one unconditional upload (the name is in the body)
        return method == "POST" and "/upload/" in path and "ifGenerationMatch" not in path

    with FaultProxy(fake_gcs.url, script=[(is_launch_record, "503", 1), (is_launch_record, "drop", 1)]) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        fleet("launch", "--run", "r1", "--workers", "1")
    assert proxy.counts["503"] == 1 and proxy.counts["drop"] == 1
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
    assert json.loads(open_store(bucket).read("runs/r1/launch.json"))["mig"] == "fleet-r1"
    fleet("down", "--run", "r1")
    assert not standin.migs and not standin.templates


# -- what the network does now and then: resets, and answers lost after the request was applied ---------


class _Planned(FaultProxy):
    """A fault proxy whose n-th request gets ``plan[n]`` (None: forwarded as is)."""

    def __init__(self, upstream: str, plan: list[str | None]):
        super().__init__(upstream)
        self.plan = list(plan)

    def _decide(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            fault = self.plan.pop(0) if self.plan else None
            if fault:
                self.counts[fault] += 1
            return fault


@pytest.fixture
def through(standin, monkeypatch):
    """Compute calls through a fault proxy in front of the stand-in; the test sets its plan."""
    proxy = _Planned(standin.url, []).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, proxy.url)
    yield proxy
    proxy.stop()


def _mutations(standin) -> list:
    return [
        c
        for c in standin.calls
        if c.method in ("POST", "DELETE") and not c.path.endswith(("/wait", "/listManagedInstances"))
    ]


def test_a_connection_reset_on_a_compute_call_is_retried(standin, through):
    """requests' ConnectionError is not Python's: before, a reset failed `fleet launch` at once."""
    comp = compute.Compute(ZONAL)
    through.plan = ["drop"]  # the get before the insert
    assert comp.get_template("t-r1") is None
    through.plan = [None, "drop", None, "drop"]  # get, insert (never reached the server), insert, wait
    assert comp.ensure_template(compute_requests.template_resource(spec())) == "created"
    assert through.counts["drop"] == 3 and standin.events_of("template-created") == ["t-r1"]


@pytest.mark.parametrize("place", [ZONAL, REGIONAL], ids=["zonal", "regional"])
def test_a_retried_insert_or_delete_with_its_request_id_is_applied_once(standin, through, place):
    """The answer is lost after the request was applied: the retry carries the same requestId, and
    the stand-in, as Compute Engine, answers with the first request's operation."""
    comp = compute.Compute(place)
    through.plan = [None, "lost"]  # get, then the insert is applied but its answer lost
    assert comp.ensure_template(compute_requests.template_resource(spec())) == "created"
    through.plan = [None, "lost"]
    assert comp.create_mig(compute_requests.mig_resource(spec(), place, "fleet-r1", 0)) == "created"
    through.plan = ["lost"]
    assert comp.delete_mig("fleet-r1") is True  # not "already gone": the retry saw its own operation
    assert comp.get_mig("fleet-r1") is None
    through.plan = ["lost"]
    assert comp.delete_template("t-r1") is True
    assert through.counts["lost"] == 4
    assert standin.events_of("template-created") == ["t-r1"] and standin.events_of("mig-created") == ["fleet-r1"]
    ids = [c.query["requestId"][0] for c in _mutations(standin)]
    assert len(ids) == 8 and len(set(ids)) == 4  # each mutation twice, each time with its own one id
    assert len(standin.events_of("request-id-seen")) == 4


def test_every_mutation_carries_a_fresh_request_id(standin):
    comp = compute.Compute(ZONAL)
    comp.ensure_template(compute_requests.template_resource(spec()))
    comp.create_mig(compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 1))
    deadline = time.time() + 10
    while not (st := comp.state("fleet-r1")).instances:
        assert time.time() < deadline
        time.sleep(0.05)
    comp.delete_instances("fleet-r1", [f"zones/{st.instances[0]['zone']}/instances/{st.instances[0]['name']}"])
    comp.delete_mig("fleet-r1")
    comp.delete_template("t-r1")
    calls = _mutations(standin)
    assert [c.path.rsplit("/", 1)[-1] if c.method == "POST" else "DELETE" for c in calls] == [
        "instanceTemplates",
        "instanceGroupManagers",
        "deleteInstances",
        "DELETE",
        "DELETE",
    ]
    ids = [c.query.get("requestId", [""])[0] for c in calls]
    assert all(uuid.UUID(i).int for i in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize("bad", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_the_standin_refuses_a_request_id_google_refuses(standin, bad):
    import urllib.error
    import urllib.request

    url = f"{standin.url}/compute/v1/projects/{PROJECT}/global/instanceTemplates/t?requestId={bad}"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10)
    assert e.value.code == 400 and "valid UUID" in json.loads(e.value.read())["error"]["message"]


@pytest.fixture
def no_retry_waits(monkeypatch):
    """fleet.gce.compute's retries as they are (what they retry, how many times), without the backoff
    between them: what a test of many faults checks is what the retries do, not when (each fault waited
    0.5 s, 1 s, 2 s... before). The tests above retry with the real waits."""
    from tenacity import wait_none

    retrying = compute._retrying
    monkeypatch.setattr(compute, "_retrying", lambda fn: retrying(fn).retry_with(wait=wait_none()))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=strategies.lists(strategies.sampled_from([None, None, None, "drop", "lost", "503"]), max_size=14).filter(
        lambda p: not any(p[i] and p[i + 1] and p[i + 2] for i in range(len(p) - 2))
    )
)  # retries: a few at a time
def test_any_faults_on_the_way_leave_one_template_and_one_mig_then_none(standin, through, no_retry_waits, plan):
    """Whatever requests of a launch and a teardown are reset, refused or lose their answers, each
    resource is created once and deleted once, and each call says what really happened."""
    comp = compute.Compute(REGIONAL)
    standin.events.clear()
    through.plan = list(plan)
    assert comp.ensure_template(compute_requests.template_resource(spec())) == "created"
    assert comp.create_mig(compute_requests.mig_resource(spec(), REGIONAL, "fleet-r1", 0)) == "created"
    assert comp.delete_mig("fleet-r1") is True and comp.delete_template("t-r1") is True
    assert standin.events_of("template-created") == ["t-r1"] and standin.events_of("mig-created") == ["fleet-r1"]
    assert standin.events_of("template-deleted") == ["t-r1"] and standin.events_of("mig-delete") == ["fleet-r1"]
    assert not standin.templates and not standin.migs


def test_launch_refuses_a_run_without_a_sound_deadline_in_one_line(launched, tmp_path):
    """No launch leaves a run without a time limit, or with one that has passed or ends before a VM boots."""
    bucket, standin = launched
    soon = compute_requests.rfc3339(time.time() + 60)  # within one boot (boot_minutes = 3)
    cases = [
        (
            ["--max-run-hours", "0"],
            "--max-run-hours 0: a run without a time limit is refused (a hung worker would "
            "bill until `fleet down`); give the hours the run may last with --max-run-hours, "
            "a time with --deadline, or neither to derive one from the plan",
        ),
        (["--deadline", "2020-01-01T00:00:00Z"], "--deadline 2020-01-01T00:00:00Z: that time has passed (it is "),
        (["--deadline", soon], f"--deadline {soon}: "),
        (
            ["--max-run-hours", "0.01"],
            "--max-run-hours 0.01: 36 s from now is shorter than one VM boot (3 min, "
            "boot_minutes in fleet.toml); give a later deadline",
        ),
        (
            ["--deadline", "2030-01-01T00:00:00"],
            "--deadline 2030-01-01T00:00:00: give its time zone, e.g. 2030-01-01T00:00:00Z for UTC",
        ),
        (["--deadline", "friday"], "--deadline friday: not a time; give one like 2025-06-01T18:00:00Z (RFC 3339)"),
        (["--deadline", "2030-01-01T00:00:00Z", "--max-run-hours", "2"], "give one of the two"),
    ]
    for args, message in cases:
        for dry in ([], ["--dry-run"]):
            out = fleet("launch", "--run", "r1", "--workers", "2", *args, *dry, code=2)
            assert out.count("\n") == 1 and out.startswith("fleet: error: ") and message in out, (args, out)
    assert "shorter than one VM boot" in fleet("launch", "--run", "r1", "--workers", "2", "--deadline", soon, code=2)
    # fleet.toml's max_run_hours = 0 (no limit, which fleet once allowed) still loads, and is refused by name.
    config = tmp_path / "fleet.toml"
    config.write_text(config.read_text() + "max_run_hours = 0\n")
    out = fleet("launch", "--run", "r1", "--workers", "2", code=2)
    assert out.count("\n") == 1 and "fleet.toml: max_run_hours = 0: a run without a time limit is refused" in out
    assert not standin.calls  # refused before any request

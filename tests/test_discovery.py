"""The Compute stand-in answers as the published API does.

Every request is checked against Compute Engine's v1 discovery document
(tests/standins/discovery.py); what the document does not say (limits, real zones,
where an error arrives) the stand-in models from Google's documentation. Each test
here sends what GCE would refuse and expects GCE's answer; the product's own requests
(built by fleet.gce.compute, sent by the real client and by startup/startup.sh in the
end-to-end tests) must pass.
"""

from __future__ import annotations

import copy
import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

from fleet.gce import compute, compute_requests
from tests.helpers import gce
from fleet.gce.config import ConfigError, FleetConfig
from tests.standins import discovery
from tests.standins.compute import ComputeStandin

PROJECT = "fleet-test-1"
ZONAL, REGIONAL = (
    compute_requests.Place(PROJECT, zone="us-central1-a"),
    compute_requests.Place(PROJECT, region="us-central1"),
)
BASE = f"/compute/v1/projects/{PROJECT}"


def spec(**changes) -> compute_requests.FleetSpec:
    return gce.spec(**{"shutdown_script": "#!/bin/bash\ntrue\n", **changes})


@pytest.fixture
def standin(monkeypatch):
    s = ComputeStandin(PROJECT, op_delay=0.05).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, s.url)
    yield s
    s.stop()


def send(standin: ComputeStandin, method: str, path: str, body=None) -> tuple[int, dict]:
    """A raw request, as curl in startup.sh sends one: no client library in between."""
    conn = http.client.HTTPConnection(urlsplit(standin.url).netloc, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}")
    conn.close()
    return out


def refused(standin, method, path, body=None, status=400, reason="invalid") -> str:
    """The request gets Google's error JSON: code, message, and errors[] with a reason."""
    code, answer = send(standin, method, path, body)
    assert code == status, answer
    err = answer["error"]
    assert err["code"] == status and err["errors"][0]["reason"] == reason and err["message"]
    return err["message"]


def template_body(**changes) -> dict:
    return compute_requests.to_dict(compute_requests.template_resource(spec(**changes)))


def mig_body(place=ZONAL, size=2, name="fleet-r1") -> dict:
    return compute_requests.to_dict(compute_requests.mig_resource(spec(), place, name, size))


def test_the_document_is_the_pinned_one_and_says_its_revision():
    doc = discovery.document()
    print(f"compute v1 discovery document revision {doc['revision']}")
    assert doc["name"] == "compute" and doc["version"] == "v1" and doc["revision"].isdigit()
    ids = {m.id for m in discovery.methods()}
    assert {
        "compute.instanceTemplates.insert",
        "compute.regionInstanceGroupManagers.deleteInstances",
        "compute.globalOperations.wait",
        "compute.instanceGroupManagers.listManagedInstances",
    } <= ids


# -- the document's rules ---------------------------------------------------------------------------
def _set(path: str, value):
    def mutate(body: dict) -> dict:
        *parents, leaf = path.split(".")
        node = body
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[leaf] = value
        return body

    return mutate


@pytest.mark.parametrize(
    "mutate, reason, message",
    [
        (
            _set("properties.scheduling.schedulng", {}),
            "invalid",
            "Unknown name \"schedulng\" at 'resource.properties.scheduling': Cannot find field.",
        ),
        (_set("properties.schedulng", {}), "invalid", "Unknown name \"schedulng\" at 'resource.properties'"),
        (_set("properties.scheduling.provisioningModel", "SPOTTY"), "invalid", '(enum), "SPOTTY"'),
        (_set("properties.scheduling.instanceTerminationAction", "delete"), "invalid", '(enum), "delete"'),
        (_set("id", "123"), "invalid", "'resource.id': it is output only"),
        (_set("selfLink", "x"), "invalid", "'resource.selfLink': it is output only"),
        (
            _set("properties.networkInterfaces.0.kind", "compute#networkInterface"),
            "invalid",
            "'resource.properties.networkInterfaces[0].kind': it is output only",
        ),
        (
            lambda b: {k: v for k, v in b.items() if k != "name"},
            "required",
            "Required field 'resource.name' not specified",
        ),
        (
            lambda b: {**b, "properties": {k: v for k, v in b["properties"].items() if k != "machineType"}},
            "required",
            "Required field 'resource.properties.machineType' not specified",
        ),
        (_set("name", "T_r1"), "invalid", "Must be a match of regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'"),
        (_set("properties.metadata.items.0.key", "bad key"), "invalid", "[a-zA-Z0-9-_]{1,128}"),
        (
            _set("properties.disks.0.initializeParams.diskSizeGb", 20),
            "invalid",
            "(TYPE_STRING, format int64), 20: expected a JSON string",
        ),  # int64 travels as a JSON string
        (_set("properties.scheduling.maxRunDuration.seconds", "6h"), "invalid", '(TYPE_INT64), "6h"'),
        (_set("properties.scheduling.automaticRestart", "false"), "invalid", "(TYPE_BOOL)"),
        (_set("properties.labels", {"fleet-run": 7}), "invalid", "resource.properties.labels[fleet-run]"),
    ],
    ids=[
        "typo-nested",
        "typo",
        "enum",
        "enum-case",
        "output-only",
        "output-only-link",
        "output-only-nested",
        "required-name",
        "required-machine-type",
        "name-pattern",
        "key-pattern",
        "int64-as-number",
        "int64-garbage",
        "bool-as-string",
        "map-value-type",
    ],
)
def test_a_template_the_document_refuses_is_a_400(standin, mutate, reason, message):
    body = mutate(copy.deepcopy(template_body()))
    assert message in refused(standin, "POST", f"{BASE}/global/instanceTemplates", body, reason=reason)
    assert not standin.templates and standin.violations


def test_methods_paths_and_query_parameters_are_the_documents(standin):
    assert send(standin, "POST", f"{BASE}/global/instanceTemplates", template_body())[0] == 200
    assert send(standin, "GET", f"{BASE}/global/instanceTemplates/t-r1?alt=json&prettyPrint=false")[0] == 200
    assert send(standin, "GET", f"{BASE}/global/instanceTemplates/t-r1?%24alt=json%3Benum-encoding%3Dint")[0] == 200
    assert 'Unknown name "pageSize"' in refused(standin, "GET", f"{BASE}/global/instanceTemplates/t-r1?pageSize=3")
    assert "Expected a boolean" in refused(standin, "GET", f"{BASE}/global/instanceTemplates/t-r1?prettyPrint=yes")
    send(standin, "POST", f"{BASE}/zones/us-central1-a/instanceGroupManagers", mig_body())
    mig = f"{BASE}/zones/us-central1-a/instanceGroupManagers/fleet-r1"
    assert send(standin, "POST", f"{mig}/listManagedInstances?maxResults=500&pageToken=")[0] == 200
    assert "Expected an integer" in refused(standin, "POST", f"{mig}/listManagedInstances?maxResults=many")
    # listManagedInstances is a POST; a GET is not a method of the API (nor is an instances.delete we never make).
    refused(standin, "GET", f"{mig}/listManagedInstances", status=404, reason="notFound")
    refused(standin, "POST", f"{mig}/deleteAllInstances", {}, status=404, reason="notFound")
    assert "path parameter 'project'" in refused(
        standin, "GET", "/compute/v1/projects/Fleet_1/global/instanceTemplates/t"
    )
    assert "path parameter 'instanceTemplate'" in refused(standin, "GET", f"{BASE}/global/instanceTemplates/T_1")
    assert "takes no request body" in refused(standin, "DELETE", mig, {"force": True})
    assert "Required field 'resource' not specified" in refused(
        standin, "POST", f"{mig}/deleteInstances", reason="required"
    )
    ids = [c.method_id for c in standin.calls]
    assert ids[:3] == [
        "compute.instanceTemplates.insert",
        "compute.instanceTemplates.get",
        "compute.instanceTemplates.get",
    ]


def test_the_products_requests_pass_the_document():
    """Everything fleet.gce.compute builds, in every shape it can take, is a request GCE accepts."""
    for place in (ZONAL, REGIONAL):
        for changes in (
            {},
            {"spot": False, "max_run_hours": 0},
            {"disk_type": "hyperdisk-balanced", "machine_type": "c4-standard-8"},
            {"external_ip": False, "subnetwork": "regions/us-central1/subnetworks/s"},
        ):
            tpl = compute_requests.template_resource(spec(**changes))
            for req in compute_requests.launch_requests(
                tpl, compute_requests.mig_resource(spec(), place, "fleet-r1", 7), place
            ):
                method_id, _ = discovery.check(req.method, req.path, {}, req.body)
                assert method_id.endswith(".insert")


# -- the documented limits --------------------------------------------------------------------------
def test_mig_size_limits_zonal_1000_regional_2000(standin):
    send(standin, "POST", f"{BASE}/global/instanceTemplates", template_body())
    zonal = f"{BASE}/zones/us-central1-a/instanceGroupManagers"
    assert "A zonal managed instance group can have at most 1000 instances" in refused(
        standin, "POST", zonal, mig_body(size=1001)
    )
    regional = f"{BASE}/regions/us-central1/instanceGroupManagers"
    assert "at most 2000" in refused(standin, "POST", regional, mig_body(REGIONAL, size=2001))
    assert send(standin, "POST", regional, mig_body(REGIONAL, size=0))[0] == 200


def test_metadata_sizes_run_duration_and_base_name(standin):
    path = f"{BASE}/global/instanceTemplates"
    assert "a value may have at most 262144 bytes" in refused(
        standin, "POST", path, template_body(startup_script="x" * (256 * 1024 + 1))
    )
    assert send(standin, "POST", path, template_body(startup_script="x" * (256 * 1024)))[0] == 200
    # Two values of 256 KiB each are allowed alone, but keys and values together must stay under 512 KiB.
    assert "must be less than 512 KiB" in refused(
        standin,
        "POST",
        path,
        template_body(template="t-2", startup_script="x" * (256 * 1024), shutdown_script="y" * (256 * 1024 - 100)),
    )
    for seconds, ok in (("29", False), ("30", True), (str(120 * 86400), True), (str(120 * 86400 + 1), False)):
        body = template_body(template=f"t-d{seconds}")
        body["properties"]["scheduling"]["maxRunDuration"]["seconds"] = seconds
        code, answer = send(standin, "POST", path, body)
        assert (code == 200) == ok, (seconds, answer)
    mig = mig_body(size=1)
    mig["baseInstanceName"] = "fleet-" + "x" * 53  # 59 characters: GCE adds "-xxxx" to at most 58
    assert "baseInstanceName" in refused(standin, "POST", f"{BASE}/zones/us-central1-a/instanceGroupManagers", mig)
    assert compute_requests.base_instance_name("fleet-" + "x" * 60) == "fleet-" + "x" * 52


def test_zones_are_real_ones_not_invented_letters(standin):
    send(standin, "POST", f"{BASE}/global/instanceTemplates", template_body())
    # europe-west1 has zones b, c and d: "-a" is the name a tool invents.
    assert "Unknown zone" in refused(standin, "POST", f"{BASE}/zones/europe-west1-a/instanceGroupManagers", mig_body())
    assert "Unknown zone" in refused(standin, "POST", f"{BASE}/zones/us-central1-d/instanceGroupManagers", mig_body())
    assert send(standin, "POST", f"{BASE}/zones/europe-west1-b/instanceGroupManagers", mig_body())[0] == 200
    assert "Unknown region" in refused(
        standin, "POST", f"{BASE}/regions/mars-north1/instanceGroupManagers", mig_body(REGIONAL)
    )
    body = mig_body(REGIONAL, size=40)
    body["distributionPolicy"]["zones"] = [{"zone": "zones/us-central1-e"}]
    assert "Not a zone of region us-central1" in refused(
        standin, "POST", f"{BASE}/regions/us-central1/instanceGroupManagers", body
    )
    assert (
        send(standin, "POST", f"{BASE}/regions/us-central1/instanceGroupManagers", mig_body(REGIONAL, size=40))[0]
        == 200
    )
    deadline = time.time() + 10
    while len(standin.events_of("create")) < 41:
        assert time.time() < deadline
        time.sleep(0.05)
    regional = standin.migs[("regions/us-central1", "fleet-r1")]
    assert {vm.zone for vm in regional.vms.values()} == {
        "us-central1-a",
        "us-central1-b",
        "us-central1-c",
        "us-central1-f",
    }


def test_delete_instances_takes_1000_urls_and_the_product_batches(standin):
    comp = compute.Compute(ZONAL)
    comp.ensure_template(compute_requests.template_resource(spec()))
    comp.create_mig(compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 2))
    path = f"{BASE}/zones/us-central1-a/instanceGroupManagers/fleet-r1/deleteInstances"
    urls = [f"zones/us-central1-a/instances/fleet-r1-{i:04x}" for i in range(1001)]
    assert "at most 1000 per request" in refused(
        standin, "POST", path, {"instances": urls, "skipInstancesOnValidationError": True}
    )
    comp.delete_instances("fleet-r1", urls)  # two requests, 1000 and 1
    sent = [len(c.body["instances"]) for c in standin.calls if c.path == path and c.body]
    assert sent[-2:] == [1000, 1]


# -- errors arrive where GCE puts them --------------------------------------------------------------
def _two_vms(comp: compute.Compute, standin) -> list[str]:
    comp.ensure_template(compute_requests.template_resource(spec()))
    comp.create_mig(compute_requests.mig_resource(spec(), ZONAL, "fleet-r1", 2))
    deadline = time.time() + 10
    while (st := comp.state("fleet-r1")) and sum(i["action"] == "NONE" for i in st.instances) < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    return [f"zones/{i['zone']}/instances/{i['name']}" for i in st.instances]


def test_a_delete_instances_validation_failure_is_in_the_operation(standin):
    comp = compute.Compute(ZONAL)
    vms = _two_vms(comp, standin)
    stranger = "zones/us-central1-a/instances/not-in-the-group"
    code, op = send(
        standin,
        "POST",
        f"{BASE}/zones/us-central1-a/instanceGroupManagers/fleet-r1/deleteInstances",
        {"instances": [vms[0], stranger]},
    )
    assert code == 200 and op["status"] == "DONE" and op["error"]["errors"][0]["code"] == "RESOURCE_NOT_FOUND"
    assert comp.get_mig("fleet-r1").target_size == 2  # nothing was deleted
    with pytest.raises(
        compute_requests.ComputeError,
        match="deleteInstances on fleet-r1: RESOURCE_NOT_FOUND: Instance "
        "'zones/us-central1-a/instances/not-in-the-group' is not a member",
    ):
        comp.delete_instances("fleet-r1", [vms[0], stranger], skip_invalid=False)
    comp.delete_instances("fleet-r1", [vms[0], stranger])  # skipped: the member goes, the stranger is ignored
    deadline = time.time() + 10
    while comp.get_mig("fleet-r1").target_size != 1:  # a moment after the operation said DONE, as on GCE
        assert time.time() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["sync", "operation"])
def test_a_template_in_use_is_refused_either_way_and_the_product_waits_out_both(monkeypatch, mode):
    standin = ComputeStandin(PROJECT, op_delay=0.05, in_use_error=mode).start()
    monkeypatch.setenv(compute_requests.ENDPOINT_ENV, standin.url)
    try:
        comp = compute.Compute(ZONAL)
        _two_vms(comp, standin)
        code, answer = send(standin, "DELETE", f"{BASE}/global/instanceTemplates/t-r1")
        if mode == "sync":
            assert code == 400 and answer["error"]["errors"][0]["reason"] == "resourceInUseByAnotherResource"
        else:
            assert code == 200 and answer["status"] == "RUNNING" and "error" not in answer
            _, done = send(standin, "POST", f"{BASE}/global/operations/{answer['name']}/wait")
            assert (
                done["status"] == "DONE" and done["error"]["errors"][0]["code"] == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"
            )
        assert "t-r1" in standin.templates
        with pytest.raises(compute_requests.ComputeError, match="already being used by"):
            comp.delete_template("t-r1")  # no patience: the error, in one line
        comp.delete_mig("fleet-r1", wait=False)
        assert comp.delete_template("t-r1", in_use_timeout=60) is True  # retried until the MIG is gone
        assert not standin.templates and standin.events_of("template-in-use")
    finally:
        standin.stop()
    assert standin.violations == []


# -- disk type ----------------------------------------------------------------------------------------
def test_the_disk_type_is_the_series_default_unless_configured(standin):
    init = template_body()["properties"]["disks"][0]["initializeParams"]
    assert "diskType" not in init  # GCE picks what the series boots from (pd-standard on E2, Hyperdisk on C4)
    chosen = template_body(disk_type="pd-balanced")["properties"]["disks"][0]["initializeParams"]
    assert chosen["diskType"] == "pd-balanced"
    cfg = dict(project=PROJECT, bucket="gs://bkt", zone="us-central1-a")
    assert FleetConfig(**cfg, disk_type="hyperdisk-balanced", machine_type="c4-standard-8").disk_type
    with pytest.raises(ConfigError, match=r"disk_type = 'pd-balanced': c4 machines boot only from Hyperdisk"):
        FleetConfig(**cfg, disk_type="pd-balanced", machine_type="c4-standard-8")
    with pytest.raises(ConfigError, match=r"disk_type = 'zones/us-central1-a/diskTypes/pd-ssd': give a disk type name"):
        FleetConfig(**cfg, disk_type="zones/us-central1-a/diskTypes/pd-ssd")


@pytest.mark.parametrize("disk_type, fails", [("", False), ("hyperdisk-balanced", False), ("pd-balanced", True)])
def test_a_c4_mig_boots_from_hyperdisk_and_not_from_pd(standin, disk_type, fails):
    comp = compute.Compute(ZONAL)
    s = spec(machine_type="c4-standard-8", disk_type=disk_type)
    comp.ensure_template(compute_requests.template_resource(s))
    comp.create_mig(compute_requests.mig_resource(s, ZONAL, "fleet-r1", 1))
    deadline = time.time() + 10
    while not (standin.events_of("create") or standin.events_of("create-failed")):
        assert time.time() < deadline
        time.sleep(0.05)
    if fails:  # as on GCE: the template is accepted, every creation fails and says why in listErrors
        errors = comp.state("fleet-r1").errors
        assert (
            errors
            and errors[0]["code"] == "UNSUPPORTED_OPERATION"
            and "[pd-balanced] disk type" in errors[0]["message"]
        )
    else:
        assert standin.events_of("create")

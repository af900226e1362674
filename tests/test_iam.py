"""Least privilege, checked: the workers' roles (fleet/gce/iam.py) are exactly what VMs use.

A fleet runs end to end on the stand-ins, which record every API method each caller
makes and refuse (403, Google's error shape) any VM call outside the roles; the
permissions the VMs used must equal the roles, none missing and none extra, and the
GCP guide (docs/gcp.md) must list exactly them.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleet.gce import iam
from fleet.cli.commands import app
from tests.standins.compute import ComputeStandin
from tests.standins.faultproxy import FaultProxy
from tests.standins.iam import Policy, compute_attributes, compute_method, decide, storage_method
from tests.test_gcp_e2e import PROJECT, ZONE, cloud_fixture, init, ship_test_jobs  # noqa: F401 (the `cloud` fixture)

ROOT = Path(__file__).resolve().parent.parent


def test_the_vms_use_exactly_the_workers_roles(cloud, capsys):
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "iam",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-iam/",
        "--item-mb",
        "0.2",
        "--lease-ttl",
        "6",
    )  # renewals every 2 s: leases are rewritten, which needs storage.objects.delete
    cloud.fleet("launch", "--run", "iam", "--workers", "2")
    cloud.wait_until_gone("fleet-iam", "fleet-iam")
    policy = cloud.policy
    denied = policy.denied()
    assert not denied, [(c.principal, c.method, c.resource) for c in denied]
    assert policy.undetermined == []  # the condition held on what Google documents, for every VM call
    vm_calls = sorted({(c.method, c.permissions) for c in policy.calls if c.principal == "vm"})
    with capsys.disabled():
        print("\nVM calls -> permissions:")
        for method, perms in vm_calls:
            print(f"  {method:50} {', '.join(perms)}")
        print("operator calls -> permissions:")
        for method, perms in sorted({(c.method, c.permissions) for c in policy.calls if c.principal == "operator"}):
            print(f"  {method:50} {', '.join(perms)}")
    used = policy.vm_permissions()
    assert used == iam.worker_permissions(), (
        f"missing from the roles: {sorted(used - iam.worker_permissions())}; "
        f"never used: {sorted(iam.worker_permissions() - used)}"
    )
    compute_used = {p for p in used if p.startswith("compute.")}
    assert compute_used == set(iam.COMPUTE_ROLE.names) and used - compute_used == set(iam.STORAGE_ROLE.names)
    # The VMs authenticated every call with their own token; `fleet launch` never used one.
    assert {c.principal for c in policy.calls} == {"vm", "operator"}
    assert all(
        c.principal == "operator" for c in policy.calls if c.method.endswith(".insert") and "compute" in c.method
    )


@pytest.fixture
def guarded():
    """A bare Compute stand-in under fleet's policy, and one VM token."""
    standin = ComputeStandin(PROJECT).start()
    policy = Policy.for_fleet(PROJECT, "bkt", {"ya29.vm"})
    standin.guard = policy.compute_guard
    try:
        yield standin, policy
    finally:
        standin.stop()


def _call(url: str, method: str, path: str, token: str | None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_vm_call_outside_the_role_is_a_403_in_googles_shape(guarded):
    standin, policy = guarded
    base = f"/compute/v1/projects/{PROJECT}"
    status, body = _call(standin.url, "POST", f"{base}/global/instanceTemplates", "ya29.vm", {"name": "fleet-x"})
    assert status == 403
    assert body["error"]["code"] == 403 and body["error"]["errors"][0]["reason"] == "forbidden"
    assert (
        body["error"]["message"]
        == f"Required 'compute.instanceTemplates.create' permission for 'projects/{PROJECT}/global'"
    )
    # In the role, but the condition allows only the templates fleet creates: one named otherwise is refused...
    status, body = _call(standin.url, "DELETE", f"{base}/global/instanceTemplates/web-prod", "ya29.vm")
    assert status == 403 and "compute.instanceTemplates.delete" in body["error"]["message"]
    # ...while fleet's own pass the guard (and get the stand-in's 404: it does not exist).
    status, _ = _call(standin.url, "DELETE", f"{base}/global/instanceTemplates/fleet-r", "ya29.vm")
    assert status == 404
    # MIGs: IAM Conditions give no attributes for them, so no condition can name them; a worker may delete
    # any MIG of the project, fleet's or not (docs/gcp.md says so, and advises a project of fleet's own).
    for name in ("web-prod", "fleet-r"):
        status, _ = _call(standin.url, "DELETE", f"{base}/regions/us-central1/instanceGroupManagers/{name}", "ya29.vm")
        assert status == 404
    # The operator (no VM token) is recorded, not held to the workers' role.
    status, _ = _call(standin.url, "GET", f"{base}/global/instanceTemplates/web-prod", None)
    assert status == 404
    assert [(c.principal, c.allowed) for c in policy.calls] == [
        ("vm", False),
        ("vm", False),
        ("vm", True),
        ("vm", True),
        ("vm", True),
        ("operator", True),
    ]
    assert policy.undetermined == []


def test_storage_calls_outside_the_role_or_the_bucket_are_refused(fake_gcs, gcs_bucket):
    from google.cloud import storage
    from google.api_core import exceptions as gexc
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2.credentials import Credentials

    policy = Policy(
        PROJECT,
        gcs_bucket,
        {"ya29.vm"},
        set(),
        {"storage.objects.get", "storage.objects.create"},
        upstream=fake_gcs.url,
    )
    with FaultProxy(fake_gcs.url, guard=policy.storage_guard) as proxy:

        def client(token):
            creds = Credentials(token) if token else AnonymousCredentials()
            return storage.Client(project="p", credentials=creds, client_options={"api_endpoint": proxy.url})

        bucket = client("ya29.vm").bucket(gcs_bucket)
        bucket.blob("a").upload_from_string(b"1", if_generation_match=0)  # create only: storage.objects.create
        assert bucket.blob("a").download_as_bytes() == b"1"
        with pytest.raises(gexc.Forbidden, match="storage.objects.delete"):
            bucket.blob("a").upload_from_string(b"2")  # replaces it: needs storage.objects.delete too
        with pytest.raises(gexc.Forbidden, match="storage.objects.list"):
            list(client("ya29.vm").list_blobs(gcs_bucket))
        status, body = _call(proxy.url, "GET", f"/storage/v1/b/{gcs_bucket}/o/a?alt=media", None)
        assert status == 401 and "Anonymous caller does not have storage.objects.get" in body["error"]["message"]
    assert [(c.method, c.allowed) for c in policy.calls] == [
        ("storage.objects.insert", True),
        ("storage.objects.get", True),
        ("storage.objects.insert", False),
        ("storage.objects.list", False),
        ("storage.objects.get", False),
    ]


def test_methods_map_to_googles_documented_permissions():
    p = f"/compute/v1/projects/{PROJECT}"
    assert compute_method("POST", f"{p}/zones/{ZONE}/instanceGroupManagers/m/deleteInstances") == (
        "compute.instanceGroupManagers.deleteInstances",
        "compute.instanceGroupManagers.update",
        f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/m",
    )
    assert compute_method("POST", f"{p}/regions/us-central1/instanceGroupManagers/m/listManagedInstances")[:2] == (
        "compute.regionInstanceGroupManagers.listManagedInstances",
        "compute.instanceGroupManagers.get",
    )
    assert compute_method("GET", f"{p}/global/operations/operation-1")[1] == "compute.globalOperations.get"
    assert compute_method("GET", f"{p}/regions/us-central1")[1] == "compute.regions.get"
    never = lambda b, o: False  # noqa: E731
    assert storage_method(
        "POST", "/upload/storage/v1/b/b/o?uploadType=multipart&ifGenerationMatch=7", b"", never
    ).permissions == ("storage.objects.create", "storage.objects.delete")
    assert storage_method("GET", "/download/storage/v1/b/b/o/x%2Fy?alt=media", b"", never).object == "x/y"


def test_the_condition_confines_templates_to_fleets_names():
    cel = iam.condition_expression()
    allowed = [
        f"projects/{PROJECT}/global/instanceTemplates/fleet-run",
        f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/fleet-run",
        f"projects/{PROJECT}/regions/us-central1/instanceGroupManagers/web",  # every MIG: see below
        f"projects/{PROJECT}/global/operations/operation-123",
    ]
    refused = [
        f"projects/{PROJECT}/global/instanceTemplates/web",
        f"projects/{PROJECT}/global/instanceTemplates/web-fleet-x",
    ]
    assert all(decide(cel, compute_attributes(name)) is True for name in allowed)
    assert all(decide(cel, compute_attributes(name)) is False for name in refused)


# What a worker's VMs touch in Compute (tests/standins/iam.py's COMPUTE_METHODS for the role's permissions).
TOUCHED = [
    f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{{}}",
    f"projects/{PROJECT}/regions/us-central1/instanceGroupManagers/{{}}",
    f"projects/{PROJECT}/global/instanceTemplates/{{}}",
    f"projects/{PROJECT}/global/operations/{{}}",
]


@pytest.mark.parametrize("name", ["fleet-run", "web", "fleet", ""])
def test_the_condition_rests_only_on_attributes_google_gives(name):
    """Google lists resource attributes for instance templates, none for MIGs or operations
    (conditions-resource-attributes). Before, the condition named MIGs by resource.name: whether it
    let a worker delete a MIG named `web` turned on a value Google does not document (and the
    stand-in, which read fleet's own table, said no). Now the outcome is documented for every
    resource a VM touches, whatever its name."""
    cel = iam.condition_expression()
    for pattern in TOUCHED:
        assert decide(cel, compute_attributes(pattern.format(name))) is not None, pattern.format(name)


def test_a_condition_on_a_migs_name_is_undetermined_on_the_stand_in():
    on_mig_names = 'resource.name.extract("/instanceGroupManagers/{name}").startsWith("fleet-")'
    mig = f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/fleet-x"
    assert decide(on_mig_names, compute_attributes(mig)) is None
    on_types = 'resource.type == "compute.googleapis.com/InstanceTemplate"'
    assert decide(on_types, compute_attributes(f"projects/{PROJECT}/global/instanceTemplates/web")) is True


def test_the_gcp_guide_lists_exactly_the_roles_and_the_condition():
    readme = (ROOT / "docs" / "gcp.md").read_text()
    block = re.search(r"<!-- worker-permissions -->(.*?)<!-- /worker-permissions -->", readme, re.S)
    assert block, "docs/gcp.md: the worker-permissions block is missing"
    listed = set(re.findall(r"`((?:compute|storage)\.[A-Za-z]+\.[A-Za-z]+)`", block.group(1)))
    assert listed == iam.worker_permissions()
    assert iam.condition_expression() in readme
    for role in iam.ROLES:
        assert f"roles/{role.id}" in readme


def test_fleet_iam_prints_gcloud_ready_role_files():
    runner = CliRunner()
    for role in iam.ROLES:
        out = runner.invoke(app, ["iam", "--role", role.id])
        assert out.exit_code == 0
        parsed = yaml.safe_load(out.output)
        assert parsed["includedPermissions"] == role.names and parsed["stage"] == "GA" and parsed["title"]
    out = runner.invoke(app, ["iam"])
    assert out.exit_code == 0 and "gcloud projects add-iam-policy-binding" in out.output
    assert iam.condition_expression() in out.output
    bad = runner.invoke(app, ["iam", "--role", "owner"])
    assert bad.exit_code == 2 and "no such role" in bad.output


def test_fleet_toml_no_longer_suggests_instance_admin():
    from fleet.gce.config import FleetConfig, dumps

    text = dumps(FleetConfig(project="proj-123", bucket="gs://b-1", zone=ZONE))
    assert "instanceAdmin" not in text and "fleet iam" in text

"""The workers' identity: exactly the permissions a VM uses, and the check that its account exists.

A VM makes few calls of its own (startup/startup.sh with curl, the workers through
google-cloud-storage), so its service account gets two custom roles instead of
predefined ones, each with only the permissions those calls need:

- ``fleetWorkerStorage`` on the bucket: read code and items, write outputs, leases,
  heartbeats and logs (an overwrite needs ``storage.objects.delete`` too).
- ``fleetWorkerCompute`` on the project: leave its own MIG (``deleteInstances``), and,
  when the run is done or stops itself, or no VM is left, delete the MIG and the template.
  Its IAM condition confines the template deletion to templates named ``fleet-*``
  (what `fleet launch` creates). It cannot confine the MIG permissions: IAM Conditions
  give resource attributes (``resource.type``, ``resource.name``) only for the resource
  types Google lists (https://cloud.google.com/iam/docs/conditions-resource-attributes),
  ``compute.googleapis.com/InstanceTemplate`` among them, MIGs (zonal or regional) and
  operations not; and MIGs have no IAM policy of their own to bind on
  (https://cloud.google.com/iam/help/conditions/resource-policies). A condition on a
  MIG's name would rest on a value Google does not give. So a worker can get, update
  and delete every MIG in the project: give fleet a project of its own (docs/gcp.md).

tests/test_iam.py derives the same sets from the calls VMs make on the stand-ins,
which refuse (403) any VM call outside them, and checks the GCP guide (docs/gcp.md) lists them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from urllib.parse import quote

NAME_PREFIX = "fleet-"  # every MIG and template `fleet launch` creates; the condition allows only these
ENDPOINT_ENV = "FLEET_IAM_ENDPOINT"  # like FLEET_COMPUTE_ENDPOINT: a local stand-in in tests
DEFAULT_ENDPOINT = "https://iam.googleapis.com"


@dataclass(frozen=True)
class Permission:
    name: str
    calls: str  # which calls of a VM need it, for docs/gcp.md and `fleet iam`


@dataclass(frozen=True)
class Role:
    id: str  # the custom role's id in the project
    title: str
    description: str
    permissions: tuple[Permission, ...]

    @property
    def names(self) -> list[str]:
        return sorted(p.name for p in self.permissions)


STORAGE_ROLE = Role(
    "fleetWorkerStorage",
    "fleet worker (bucket)",
    "What fleet's VMs do in the run's bucket: read code and items, write outputs, leases, logs.",
    (
        Permission("storage.objects.get", "objects.get: code snapshot, run spec, items, leases (startup.sh, workers)"),
        Permission("storage.objects.list", "objects.list: leases, released items, failed-boot markers"),
        Permission("storage.objects.create", "objects.insert: outputs, leases, heartbeats, logs, boot records"),
        Permission(
            "storage.objects.delete",
            "objects.insert over an existing object (lease renewals, logs), objects.delete of released-item markers",
        ),
    ),
)

COMPUTE_ROLE = Role(
    "fleetWorkerCompute",
    "fleet worker (own MIG)",
    "What a fleet VM does to its own MIG: leave it; when the run is done (or stops, or no VM is left), delete "
    "the MIG and its template.",
    (
        Permission(
            "compute.instanceGroupManagers.update", "instanceGroupManagers.deleteInstances: a VM leaves its MIG"
        ),
        Permission(
            "compute.instanceGroupManagers.get",
            "listManagedInstances: the VMs to remove, and whether any is left that is not being deleted",
        ),
        Permission("compute.instanceGroupManagers.delete", "instanceGroupManagers.delete: the run done or stopped"),
        Permission("compute.instanceTemplates.delete", "instanceTemplates.delete: the run done or stopped"),
        Permission("compute.globalOperations.get", "globalOperations.get: waiting for the template's deletion"),
    ),
)

ROLES = (STORAGE_ROLE, COMPUTE_ROLE)


def worker_permissions() -> set[str]:
    return {p.name for role in ROLES for p in role.permissions}


TEMPLATE_TYPE = "compute.googleapis.com/InstanceTemplate"  # a resource type IAM Conditions give attributes for


def condition_expression(prefix: str = NAME_PREFIX) -> str:
    """CEL for the compute binding: instance templates only when named prefix*; the rest of the role passes.

    The MIG and operation permissions pass whatever Google puts in resource.name and resource.type for
    them (it lists neither type among those with resource attributes): the condition rests only on
    attributes Google documents for instance templates."""
    return (
        f'resource.type != "{TEMPLATE_TYPE}" '
        f'|| resource.name.extract("/instanceTemplates/{{name}}").startsWith("{prefix}")'
    )


CONDITION_TITLE = "fleet-templates-only"


def role_yaml(role: Role) -> str:
    """The file `gcloud iam roles create ID --project=P --file=FILE` takes."""
    lines = [
        f"title: {json.dumps(role.title)}",
        f"description: {json.dumps(role.description)}",
        "stage: GA",
        "includedPermissions:",
    ]
    lines += [f"- {name}" for name in role.names]
    return "\n".join(lines) + "\n"


def setup_commands(project: str, bucket: str, service_account: str) -> str:
    """The gcloud commands that create the account, both roles and their bindings."""
    sa = service_account or f"fleet-worker@{project}.iam.gserviceaccount.com"
    account_id = sa.split("@", 1)[0]
    cond = condition_expression().replace("'", "'\\''")
    return (
        "\n".join(
            [
                f"gcloud iam service-accounts create {account_id} --project={project} --display-name='fleet workers'",
                *(
                    f"fleet iam --role {role.id} > {role.id}.yaml && "
                    f"gcloud iam roles create {role.id} --project={project} --file={role.id}.yaml"
                    for role in ROLES
                ),
                f"gcloud storage buckets add-iam-policy-binding {bucket} --member=serviceAccount:{sa} "
                f"--role=projects/{project}/roles/{STORAGE_ROLE.id}",
                f"gcloud projects add-iam-policy-binding {project} --member=serviceAccount:{sa} "
                f"--role=projects/{project}/roles/{COMPUTE_ROLE.id} "
                f"--condition='title={CONDITION_TITLE},expression={cond}'",
            ]
        )
        + "\n"
    )


# -- does the service account exist? -------------------------------------------------------
@dataclass(frozen=True)
class AccountCheck:
    exists: bool | None  # None: could not tell
    detail: str = ""


def api_endpoint() -> str | None:
    return os.environ.get(ENDPOINT_ENV) or None


def check_service_account(email: str, timeout: float = 30.0) -> AccountCheck:
    """IAM projects.serviceAccounts.get on the account (needs iam.serviceAccounts.get, which
    roles/iam.serviceAccountUser, needed to launch VMs as it, includes)."""
    import google.auth
    import google.auth.credentials
    import google.auth.exceptions
    from google.auth.transport.requests import AuthorizedSession
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential
    import requests

    endpoint = api_endpoint()
    credentials: google.auth.credentials.Credentials
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    else:
        try:
            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except google.auth.exceptions.DefaultCredentialsError:
            return AccountCheck(None, "no Google credentials on this machine: `gcloud auth application-default login`")
    session = AuthorizedSession(credentials)
    url = f"{(endpoint or DEFAULT_ENDPOINT).rstrip('/')}/v1/projects/-/serviceAccounts/{quote(email, safe='@.')}"

    @retry(
        retry=retry_if_exception_type((requests.ConnectionError, requests.Timeout, _Transient)),
        wait=wait_exponential(multiplier=0.5, max=8),
        stop=stop_after_attempt(5),
        reraise=True,
    )
    def get() -> requests.Response:
        response = session.get(url, timeout=timeout)
        if response.status_code in (429, 500, 502, 503, 504):
            raise _Transient(response.status_code)
        return response

    try:
        response = get()
    except (requests.RequestException, _Transient) as e:
        return AccountCheck(None, f"IAM API unreachable ({type(e).__name__})")
    if response.status_code == 200:
        return AccountCheck(True)
    message = _message(response)
    if response.status_code == 404:
        return AccountCheck(False, message)
    return AccountCheck(None, f"{response.status_code} {message}")


class _Transient(Exception):
    pass


def _message(response) -> str:
    try:
        text = response.json()["error"]["message"]
    except Exception:  # not Google's error shape
        text = response.text
    return re.sub(r"\s+", " ", str(text)).strip()[:200]

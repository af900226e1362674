"""Every Compute Engine call the fleet makes: instance templates and managed instance groups.

What a fleet is: one instance template (startup script, run, bucket and code
version in its metadata; a service account with only the Storage read/write
and Compute scopes) and one zonal or regional MIG of N VMs made from it.
Requests are built by pure functions, so `fleet launch --dry-run` prints the
very bodies that would be sent.

Operations are waited on with our own operations clients, built with the same
client options as the resource clients: the library's
``ExtendedOperation.result()`` always polls the real Google endpoint.
Set ``FLEET_COMPUTE_ENDPOINT`` (like ``STORAGE_EMULATOR_HOST``) to talk to a
local stand-in; calls are then anonymous unless credentials are given.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field

from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from fleet import layout

ENDPOINT_ENV = "FLEET_COMPUTE_ENDPOINT"
DEFAULT_ENDPOINT = "https://compute.googleapis.com"
# What a worker needs: read inputs/code and write outputs/leases/logs; remove its own VM from the MIG.
WORKER_SCOPES = (
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/compute",
)
_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
DELETE_INSTANCES_LIMIT = 1000  # instance URLs per deleteInstances request (documented)
MIG_LIMIT = {"zonal": 1000, "regional": 2000}  # VMs per managed instance group (documented)
_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, ConnectionError)

# Metadata keys startup.sh reads. MD_PATHS: the run's object names it writes (fleet.layout.vm_paths), so
# that the bucket layout has one owner; metadata, since the VM needs them before (and if) its code downloads.
MD_BUCKET, MD_RUN, MD_VERSION = "fleet-bucket", "fleet-run", "fleet-code-version"
MD_PROCS, MD_STANDBY, MD_PATHS = "fleet-workers-per-vm", "fleet-standby", "fleet-paths"


class ComputeError(Exception):
    """A Compute Engine request failed; the message says which and why in one line."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code  # an operation's error code (e.g. RESOURCE_IN_USE_BY_ANOTHER_RESOURCE), when it had one


NO_CREDENTIALS = ("no Google credentials found on this machine: log in with `gcloud auth application-default "
                  "login` (or set GOOGLE_APPLICATION_CREDENTIALS to a key file)")


class NoCredentials(ComputeError):
    """No Application Default Credentials: nothing can be asked of Compute Engine."""


def check_name(kind: str, name: str, max_len: int = 63) -> str:
    if len(name) > max_len or not _NAME.match(name):
        raise ComputeError(f"{kind} name {name!r}: use 1-{max_len} lowercase letters, digits and '-', "
                           "starting with a letter and not ending with '-'")
    return name


def mig_name(run: str) -> str:
    """The MIG of a run: 'fleet-<run>' when that is a valid name, else a readable form plus a hash."""
    plain = f"fleet-{run}"
    if len(plain) <= 63 and _NAME.match(plain):
        return plain
    slug = re.sub(r"[^a-z0-9]+", "-", run.lower()).strip("-")[:48].strip("-")
    return f"fleet-{slug}-{hashlib.sha256(run.encode()).hexdigest()[:6]}".replace("--", "-")


def base_instance_name(mig: str) -> str:
    return mig[:58].rstrip("-")  # GCE's limit: instances are named <base>-xxxx


def run_label(run: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", run.lower())[:63]


@dataclass(frozen=True)
class Place:
    project: str
    zone: str = ""
    region: str = ""

    @property
    def scope(self) -> str:
        return f"zones/{self.zone}" if self.zone else f"regions/{self.region}"

    @property
    def regional(self) -> bool:
        return not self.zone


@dataclass(frozen=True)
class FleetSpec:
    """Everything that decides what the VMs of one run look like."""

    run: str
    bucket: str  # gs://NAME
    code_version: str
    template: str
    machine_type: str
    image: str
    service_account: str
    startup_script: str
    shutdown_script: str = ""  # startup/shutdown.sh: has the workers give their items back when the VM stops
    spot: bool = True
    max_run_hours: float = 24.0
    disk_gb: int = 20
    disk_type: str = ""  # "" = the machine series' default (pd-standard on E2/N2, hyperdisk-balanced on C4/N4)
    workers_per_vm: int = 0
    standby: int = 2
    network: str = "global/networks/default"
    subnetwork: str = ""
    external_ip: bool = True

    def __post_init__(self) -> None:
        check_name("instance template", self.template)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # after the endpoint
    body: dict | None = None

    def render(self, endpoint: str | None = None) -> str:
        text = f"{self.method} {(endpoint or api_endpoint() or DEFAULT_ENDPOINT).rstrip('/')}{self.path}"
        return text + ("\n" + json.dumps(self.body, indent=2) if self.body is not None else "")


def api_endpoint() -> str | None:
    return os.environ.get(ENDPOINT_ENV) or None


def to_dict(message) -> dict:
    """A request body exactly as the REST transport sends it (camelCase, int64 as strings)."""
    return json.loads(type(message).to_json(message, use_integers_for_enums=False,
                                            always_print_fields_with_no_presence=False))


def template_resource(spec: FleetSpec) -> compute_v1.InstanceTemplate:
    items = {
        "startup-script": spec.startup_script,
        MD_BUCKET: spec.bucket,
        MD_RUN: spec.run,
        MD_VERSION: spec.code_version,
        MD_PROCS: str(spec.workers_per_vm),
        MD_STANDBY: str(spec.standby),
        MD_PATHS: layout.vm_paths_text(spec.run),
    }
    if spec.shutdown_script:
        items["shutdown-script"] = spec.shutdown_script
    scheduling = compute_v1.Scheduling(provisioning_model="SPOT" if spec.spot else "STANDARD")
    if spec.spot:
        # Spot VMs are deleted, not stopped, when preempted: the MIG then recreates them.
        scheduling.instance_termination_action = "DELETE"
        scheduling.automatic_restart = False
        scheduling.on_host_maintenance = "TERMINATE"
    if spec.max_run_hours:
        # The safety net: no VM bills for longer than this, whatever its script does.
        scheduling.max_run_duration = compute_v1.Duration(seconds=int(spec.max_run_hours * 3600))
        scheduling.instance_termination_action = "DELETE"
    nic = compute_v1.NetworkInterface(network=spec.network)
    if spec.subnetwork:
        nic.subnetwork = spec.subnetwork
    if spec.external_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    properties = compute_v1.InstanceProperties(
        machine_type=spec.machine_type,
        disks=[compute_v1.AttachedDisk(
            boot=True, auto_delete=True, type_="PERSISTENT",
            initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=spec.image, disk_size_gb=spec.disk_gb),
        )],
        network_interfaces=[nic],
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]),
        scheduling=scheduling,
        labels={"fleet-run": run_label(spec.run)},
    )
    if spec.service_account:
        properties.service_accounts = [compute_v1.ServiceAccount(email=spec.service_account, scopes=list(WORKER_SCOPES))]
    if spec.disk_type:  # unset, GCE picks the series' default, which every series can boot from
        properties.disks[0].initialize_params.disk_type = spec.disk_type
    template = compute_v1.InstanceTemplate(name=spec.template, properties=properties)
    # The description carries a digest of everything above: "identical" is then one comparison,
    # whatever defaults the API fills into the stored template.
    digest = hashlib.sha256(json.dumps(to_dict(template), sort_keys=True).encode()).hexdigest()[:32]
    template.description = f"fleet run {spec.run}; spec {digest}"
    return template


def mig_resource(spec: FleetSpec, place: Place, name: str, size: int) -> compute_v1.InstanceGroupManager:
    mig = compute_v1.InstanceGroupManager(
        name=check_name("managed instance group", name),
        base_instance_name=base_instance_name(name),
        instance_template=f"projects/{place.project}/global/instanceTemplates/{spec.template}",
        target_size=size,
        description=f"fleet run {spec.run}",
    )
    if place.regional:
        # ANY: take capacity in whichever zones have it (what Spot needs); it requires
        # proactive redistribution off, which would otherwise move VMs mid-item.
        mig.distribution_policy = compute_v1.DistributionPolicy(target_shape="ANY")
        mig.update_policy = compute_v1.InstanceGroupManagerUpdatePolicy(
            instance_redistribution_type="NONE", type_="OPPORTUNISTIC")
    return mig


def launch_requests(template: compute_v1.InstanceTemplate, mig: compute_v1.InstanceGroupManager,
                    place: Place) -> list[Request]:
    """The two creating requests `fleet launch` sends (after a get of each, to reuse what exists)."""
    base = f"/compute/v1/projects/{place.project}"
    return [
        Request("POST", f"{base}/global/instanceTemplates", to_dict(template)),
        Request("POST", f"{base}/{place.scope}/instanceGroupManagers", to_dict(mig)),
    ]


def _one_line(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    text = re.sub(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ", "", text.strip())  # the client prefixes the URL
    return (text.splitlines() or [""])[0][:300]


def _reasons(e: gexc.GoogleAPICallError) -> set[str]:
    return {d.get("reason", "") for d in (getattr(e, "errors", None) or []) if isinstance(d, dict)}


_retrying = retry(retry=retry_if_exception_type(_TRANSIENT), wait=wait_exponential(multiplier=0.5, max=10),
                  stop=stop_after_attempt(6), reraise=True)


@dataclass
class MigState:
    name: str
    target_size: int
    template: str  # the template's name
    instances: list[dict] = field(default_factory=list)  # name, status, action, errors
    errors: list[dict] = field(default_factory=list)  # from listErrors: time, instance, action, code, message


class Compute:
    """Clients for one project and one zone or region, sharing one set of client options."""

    def __init__(self, place: Place, credentials=None):
        self.place = place
        endpoint = api_endpoint()
        if credentials is None and endpoint:
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
        self._kwargs = {"credentials": credentials}
        if endpoint:
            self._kwargs["client_options"] = {"api_endpoint": endpoint}

    # -- clients, built on first use so that dry runs need no credentials --------
    def _client(self, cls):
        from google.auth.exceptions import DefaultCredentialsError

        try:
            return cls(**self._kwargs)
        except DefaultCredentialsError as e:
            given = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")  # a key file that is missing or bad
            raise NoCredentials(f"GOOGLE_APPLICATION_CREDENTIALS={given}: {str(e).splitlines()[0]}" if given
                                else NO_CREDENTIALS) from None

    @functools.cached_property
    def templates(self) -> compute_v1.InstanceTemplatesClient:
        return self._client(compute_v1.InstanceTemplatesClient)

    @functools.cached_property
    def migs(self):
        cls = compute_v1.RegionInstanceGroupManagersClient if self.place.regional else compute_v1.InstanceGroupManagersClient
        return self._client(cls)

    @functools.cached_property
    def zone_ops(self) -> compute_v1.ZoneOperationsClient:
        return self._client(compute_v1.ZoneOperationsClient)

    @functools.cached_property
    def region_ops(self) -> compute_v1.RegionOperationsClient:
        return self._client(compute_v1.RegionOperationsClient)

    @functools.cached_property
    def global_ops(self) -> compute_v1.GlobalOperationsClient:
        return self._client(compute_v1.GlobalOperationsClient)

    def _where(self) -> dict:
        p = self.place
        return {"project": p.project, "region": p.region} if p.regional else {"project": p.project, "zone": p.zone}

    # -- operations -----------------------------------------------------------------
    def wait(self, op: compute_v1.Operation, what: str, timeout: float = 900.0) -> None:
        """Until the operation is DONE (each `wait` call returns within about two minutes)."""
        deadline = time.monotonic() + timeout
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise ComputeError(f"{what}: operation {op.name} still {op.status.name} after {timeout:.0f}s")
            if op.zone:
                op = _retrying(self.zone_ops.wait)(project=self.place.project, zone=op.zone.rsplit("/", 1)[-1],
                                                   operation=op.name)
            elif op.region:
                op = _retrying(self.region_ops.wait)(project=self.place.project,
                                                     region=op.region.rsplit("/", 1)[-1], operation=op.name)
            else:
                op = _retrying(self.global_ops.wait)(project=self.place.project, operation=op.name)
        if op.error and op.error.errors:
            first = op.error.errors[0]
            raise ComputeError(f"{what}: {first.code}: {first.message}", code=first.code)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return _retrying(fn)(*args, **kwargs)
        except gexc.Forbidden as e:
            raise ComputeError(f"{what}: permission denied: {_one_line(e)}") from None
        except gexc.GoogleAPICallError as e:
            raise ComputeError(f"{what}: {e.code} {_one_line(e)}") from e

    # -- templates -------------------------------------------------------------------
    @staticmethod
    def _get_or_none(fn, what: str, **kwargs):
        """A get that says None for absent, and one line for anything else."""
        try:
            return _retrying(fn)(**kwargs)
        except gexc.NotFound:
            return None
        except gexc.GoogleAPICallError as e:
            raise ComputeError(f"get {what}: {e.code} {_one_line(e)}") from e

    def get_template(self, name: str) -> compute_v1.InstanceTemplate | None:
        return self._get_or_none(self.templates.get, f"instance template {name}",
                                 project=self.place.project, instance_template=name)

    def ensure_template(self, template: compute_v1.InstanceTemplate) -> str:
        """Create the template, or reuse an existing one made from the same spec; 'created' or 'reused'."""
        what = f"instance template {template.name}"
        existing = self.get_template(template.name)
        if existing is None:
            try:
                op = _retrying(self.templates.insert_unary)(project=self.place.project,
                                                            instance_template_resource=template)
            except gexc.Conflict:  # created meanwhile (or our retried insert landed)
                existing = self.get_template(template.name)
            except gexc.GoogleAPICallError as e:
                raise ComputeError(f"create {what}: {e.code} {_one_line(e)}") from e
            else:
                self.wait(op, f"create {what}")
                return "created"
        if existing is None or existing.description != template.description:
            raise ComputeError(f"{what} exists with other settings ({existing.description if existing else 'gone'!r}); "
                               "templates cannot change: pick another --template or delete it with `fleet down`")
        return "reused"

    def delete_template(self, name: str, in_use_timeout: float = 0.0) -> bool:
        """Delete; False if absent. While a MIG still uses it, retry for in_use_timeout seconds.

        GCE says "still in use" either at once (a 400 resourceInUseByAnotherResource) or as the
        error of the delete's operation (RESOURCE_IN_USE_BY_ANOTHER_RESOURCE): both are retried.
        """
        what = f"delete instance template {name}"
        deadline = time.monotonic() + in_use_timeout
        while True:
            try:
                op = _retrying(self.templates.delete_unary)(project=self.place.project, instance_template=name)
                self.wait(op, what)
                return True
            except gexc.NotFound:
                return False
            except gexc.BadRequest as e:
                if "resourceInUseByAnotherResource" not in _reasons(e) or time.monotonic() >= deadline:
                    raise ComputeError(f"{what}: {_one_line(e)}") from None
            except ComputeError as e:
                if e.code != "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" or time.monotonic() >= deadline:
                    raise
            except gexc.GoogleAPICallError as e:
                raise ComputeError(f"{what}: {e.code} {_one_line(e)}") from e
            time.sleep(2.0)

    # -- managed instance groups -------------------------------------------------------
    def get_mig(self, name: str) -> compute_v1.InstanceGroupManager | None:
        return self._get_or_none(self.migs.get, f"managed instance group {name}",
                                 instance_group_manager=name, **self._where())

    def create_mig(self, mig: compute_v1.InstanceGroupManager) -> str:
        """Create the MIG; 'exists' if it already does with the same template (a repeated launch)."""
        what = f"managed instance group {mig.name} in {self.place.scope}"
        existing = self.get_mig(mig.name)
        if existing is None:
            try:
                op = _retrying(self.migs.insert_unary)(instance_group_manager_resource=mig, **self._where())
            except gexc.Conflict:
                existing = self.get_mig(mig.name)
            except gexc.GoogleAPICallError as e:
                raise ComputeError(f"create {what}: {e.code} {_one_line(e)}") from e
            else:
                self.wait(op, f"create {what}")
                return "created"
        if existing is None or not existing.instance_template.endswith(mig.instance_template):
            raise ComputeError(f"{what} exists with template {existing.instance_template if existing else '?'}; "
                               "remove it with `fleet down` first")
        return "exists"

    def delete_mig(self, name: str, wait: bool = True) -> bool:
        """Delete the group and its VMs; False if absent."""
        try:
            op = _retrying(self.migs.delete_unary)(instance_group_manager=name, **self._where())
        except gexc.NotFound:
            return False
        except gexc.GoogleAPICallError as e:
            raise ComputeError(f"delete managed instance group {name}: {e.code} {_one_line(e)}") from e
        if wait:
            self.wait(op, f"delete managed instance group {name}")
        return True

    def delete_instances(self, name: str, instances: list[str], skip_invalid: bool = True) -> None:
        """Through the MIG, which lowers its target size: a plain instances.delete would be undone.

        At most DELETE_INSTANCES_LIMIT URLs go in one request. A URL that is not in the group is
        skipped unless skip_invalid is False; then GCE fails the operation (not the request).
        """
        for i in range(0, len(instances), DELETE_INSTANCES_LIMIT):
            batch = instances[i:i + DELETE_INSTANCES_LIMIT]
            if self.place.regional:
                body = {"region_instance_group_managers_delete_instances_request_resource":
                        compute_v1.RegionInstanceGroupManagersDeleteInstancesRequest(
                            instances=batch, skip_instances_on_validation_error=skip_invalid)}
            else:
                body = {"instance_group_managers_delete_instances_request_resource":
                        compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                            instances=batch, skip_instances_on_validation_error=skip_invalid)}
            op = self._call(f"deleteInstances on {name}", self.migs.delete_instances_unary,
                            instance_group_manager=name, **body, **self._where())
            self.wait(op, f"deleteInstances on {name}")

    def managed_instances(self, name: str) -> list[compute_v1.ManagedInstance]:
        pager = self._call(f"listManagedInstances of {name}", self.migs.list_managed_instances,
                           instance_group_manager=name, **self._where())
        return list(pager)

    def list_errors(self, name: str) -> list[compute_v1.InstanceManagedByIgmError]:
        pager = self._call(f"listErrors of {name}", self.migs.list_errors, instance_group_manager=name, **self._where())
        return list(pager)

    def state(self, name: str) -> MigState | None:
        """The MIG, its instances with their current actions, and its recent errors (quota, stock-out)."""
        mig = self.get_mig(name)
        if mig is None:
            return None
        st = MigState(name, mig.target_size, mig.instance_template.rsplit("/", 1)[-1])
        for mi in self.managed_instances(name):
            errs = [f"{e.code}: {e.message}" for e in mi.last_attempt.errors.errors] if mi.last_attempt else []
            st.instances.append({"name": mi.name or mi.instance.rsplit("/", 1)[-1],
                                 "zone": mi.instance.split("/zones/")[-1].split("/")[0], "status": mi.instance_status,
                                 "action": mi.current_action, "errors": errs})
        for e in self.list_errors(name):
            st.errors.append({"time": e.timestamp, "instance": e.instance_action_details.instance.rsplit("/", 1)[-1],
                              "action": e.instance_action_details.action, "code": e.error.code,
                              "message": e.error.message})
        return st

    # -- what `fleet launch` checks first: the region's quotas and the machine type --------------
    @property
    def region(self) -> str:
        return self.place.region or self.place.zone.rsplit("-", 1)[0]

    def region_info(self) -> tuple[list[str], dict[str, tuple[float, float]]]:
        """The region's zones and its quotas, metric -> (limit, usage)."""
        region = self._call(f"regions.get {self.region}", self._client(compute_v1.RegionsClient).get,
                            project=self.place.project, region=self.region)
        zones = [z.rsplit("/", 1)[-1] for z in region.zones]
        return zones, {q.metric: (q.limit, q.usage) for q in region.quotas}

    def machine_vcpus(self, zone: str, machine_type: str) -> int:
        mt = self._call(f"machineTypes.get {machine_type} in {zone}", self._client(compute_v1.MachineTypesClient).get,
                        project=self.place.project, zone=zone, machine_type=machine_type)
        return int(mt.guest_cpus)

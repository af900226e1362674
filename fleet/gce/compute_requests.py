"""What the fleet asks of Compute Engine, as data: names, the instance template, the MIG, and the
bodies of the calls fleet.gce.compute sends (and what their answers mean).

What a fleet is: one instance template (startup script, run, bucket and code
version in its metadata; a service account with only the Storage read/write
and Compute scopes) and one zonal or regional MIG of N VMs made from it.
Everything here is a pure function of its arguments, so `fleet launch --dry-run`
prints the very bodies that would be sent, and tests check them with no client.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from google.cloud import compute_v1

from fleet.core import layout

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

# Metadata keys startup.sh reads. MD_PATHS: the run's object names it writes (fleet.core.layout.vm_paths), so
# that the bucket layout has one owner; metadata, since the VM needs them before (and if) its code downloads.
MD_BUCKET, MD_RUN, MD_VERSION = "fleet-bucket", "fleet-run", "fleet-code-version"
MD_PROCS, MD_STANDBY, MD_PATHS = "fleet-workers-per-vm", "fleet-standby", "fleet-paths"
MD_DEADLINE = "fleet-deadline"  # the run's deadline in seconds since the epoch: startup.sh tells a boot it ended


def rfc3339(t: float) -> str:
    """A time as GCE's terminationTime takes it (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(int(t), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ComputeError(Exception):
    """A Compute Engine request failed; the message says which and why in one line."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code  # an operation's error code (e.g. RESOURCE_IN_USE_BY_ANOTHER_RESOURCE), when it had one


def check_name(kind: str, name: str, max_len: int = 63) -> str:
    if len(name) > max_len or not _NAME.match(name):
        raise ComputeError(
            f"{kind} name {name!r}: use 1-{max_len} lowercase letters, digits and '-', "
            "starting with a letter and not ending with '-'"
        )
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

    @property
    def region_name(self) -> str:
        return self.region or self.zone.rsplit("-", 1)[0]

    def where(self) -> dict:
        """The arguments that name this project and zone or region in a client call."""
        return (
            {"project": self.project, "region": self.region}
            if self.regional
            else {"project": self.project, "zone": self.zone}
        )


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
    max_run_hours: float = 24.0  # scheduling.maxRunDuration of each VM (0 = none); bounds a VM, not the run
    deadline: float = 0.0  # the run's end, seconds since the epoch: scheduling.terminationTime of every VM
    disk_gb: int = 20
    disk_type: str = ""  # "" = the machine series' default (pd-standard on E2/N2, hyperdisk-balanced on C4/N4)
    workers_per_vm: int = 0
    standby: int = 2
    network: str = "global/networks/default"
    subnetwork: str = ""
    external_ip: bool = True

    def __post_init__(self) -> None:
        check_name("instance template", self.template)
        if self.deadline and self.max_run_hours:  # Google's "Limit the run time of VMs in a MIG": one of the two
            raise ValueError("a template takes one time limit: a deadline or max_run_hours, not both")


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


def request_id() -> str:
    """A fresh ``requestId`` for one mutating call (insert, delete, deleteInstances), the same on each
    of its retries: Compute Engine ignores a request whose id it has already seen (for at least 60
    minutes after the first) and answers with the first one's operation, so a retried insert whose
    answer was lost is not a second resource. A UUID, not the zero one (Google's format)."""
    return str(uuid.uuid4())


def to_dict(message) -> dict:
    """A request body exactly as the REST transport sends it (camelCase, int64 as strings)."""
    return json.loads(
        type(message).to_json(message, use_integers_for_enums=False, always_print_fields_with_no_presence=False)
    )


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
    if spec.deadline:
        # The run's deadline: every VM, recreated ones included, is deleted at this time whatever it is
        # doing, and the MIG can create none after it (maxRunDuration would bound each VM, not the run).
        scheduling.termination_time = rfc3339(spec.deadline)
        scheduling.instance_termination_action = "DELETE"
        items[MD_DEADLINE] = str(int(spec.deadline))
    elif spec.max_run_hours:
        scheduling.max_run_duration = compute_v1.Duration(seconds=int(spec.max_run_hours * 3600))
        scheduling.instance_termination_action = "DELETE"
    nic = compute_v1.NetworkInterface(network=spec.network)
    if spec.subnetwork:
        nic.subnetwork = spec.subnetwork
    if spec.external_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    properties = compute_v1.InstanceProperties(
        machine_type=spec.machine_type,
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=spec.image, disk_size_gb=spec.disk_gb
                ),
            )
        ],
        network_interfaces=[nic],
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]),
        scheduling=scheduling,
        labels={"fleet-run": run_label(spec.run)},
    )
    if spec.service_account:
        properties.service_accounts = [
            compute_v1.ServiceAccount(email=spec.service_account, scopes=list(WORKER_SCOPES))
        ]
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
            instance_redistribution_type="NONE", type_="OPPORTUNISTIC"
        )
        # A preempted Spot VM is repaired in its old zone by default (allowChangingZone NO): the zone
        # that just ran out of capacity. YES lets the MIG recreate it wherever there is room.
        mig.instance_lifecycle_policy = compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            on_repair=compute_v1.InstanceGroupManagerInstanceLifecyclePolicyOnRepair(allow_changing_zone="YES")
        )
    return mig


def launch_requests(
    template: compute_v1.InstanceTemplate, mig: compute_v1.InstanceGroupManager, place: Place
) -> list[Request]:
    """The two creating requests `fleet launch` sends (after a get of each, to reuse what exists)."""
    base = f"/compute/v1/projects/{place.project}"
    return [
        Request("POST", f"{base}/global/instanceTemplates", to_dict(template)),
        Request("POST", f"{base}/{place.scope}/instanceGroupManagers", to_dict(mig)),
    ]


def delete_instances_body(place: Place, instances: list[str], skip_invalid: bool) -> dict:
    """The deleteInstances request of a zonal or regional MIG, as the client's keyword argument."""
    if place.regional:
        return {
            "region_instance_group_managers_delete_instances_request_resource": compute_v1.RegionInstanceGroupManagersDeleteInstancesRequest(
                instances=instances, skip_instances_on_validation_error=skip_invalid
            )
        }
    return {
        "instance_group_managers_delete_instances_request_resource": compute_v1.InstanceGroupManagersDeleteInstancesRequest(
            instances=instances, skip_instances_on_validation_error=skip_invalid
        )
    }


# What GCE says when a zone has no capacity for the VM (a Spot stock-out, most often).
STOCK_OUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")


@dataclass
class MigState:
    name: str
    target_size: int
    template: str  # the template's name
    instances: list[dict] = field(default_factory=list)  # name, status, action, errors
    errors: list[dict] = field(default_factory=list)  # from listErrors: time, instance, zone, action, code, message
    short_zones: dict[str, int] = field(default_factory=dict)  # zone -> stock-outs listErrors reports there


def mig_state(
    name: str,
    mig: compute_v1.InstanceGroupManager,
    managed: list[compute_v1.ManagedInstance],
    errors: list[compute_v1.InstanceManagedByIgmError],
) -> MigState:
    """The MIG, its instances with their current actions, and its recent errors (quota, stock-out)."""
    st = MigState(name, mig.target_size, mig.instance_template.rsplit("/", 1)[-1])
    for mi in managed:
        errs = [f"{e.code}: {e.message}" for e in mi.last_attempt.errors.errors] if mi.last_attempt else []
        st.instances.append(
            {
                "name": mi.name or mi.instance.rsplit("/", 1)[-1],
                "zone": mi.instance.split("/zones/")[-1].split("/")[0],
                "status": mi.instance_status,
                "action": mi.current_action,
                "errors": errs,
            }
        )
    for e in errors:
        url = e.instance_action_details.instance
        st.errors.append(
            {
                "time": e.timestamp,
                "instance": url.rsplit("/", 1)[-1],
                "zone": url.split("/zones/")[-1].split("/")[0] if "/zones/" in url else "",
                "action": e.instance_action_details.action,
                "code": e.error.code,
                "message": e.error.message,
            }
        )
    # A zone is short of capacity where GCE could not create a VM for want of it (listErrors: recent history).
    for error in st.errors:
        if error["code"] in STOCK_OUT_CODES and error["zone"]:
            st.short_zones[error["zone"]] = st.short_zones.get(error["zone"], 0) + 1
    return st

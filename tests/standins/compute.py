"""A local Compute Engine REST stand-in: instance templates, MIGs, their VMs, operations.

Only the endpoints the fleet calls, reached by the real `google-cloud-compute`
client through ``client_options={"api_endpoint": url}``. It validates names
(RFC 1035, at most 63 characters) and bodies as GCE does, answers int64 fields
as JSON strings, and returns creating operations as RUNNING so that callers
must poll them through an operations client.

A MIG here behaves as a real one for what the fleet relies on: it keeps
``targetSize`` VMs, each started by a *launcher* (in the end-to-end test a
local process running the template's startup script); ``deleteInstances``
lowers the target size, stops the VM and never replaces it; a preempted VM is
stopped and recreated under the same name, and so (the worst case, which GCE
does not rule out) is a VM that reaches its template's ``maxRunDuration``;
creation failures injected with :meth:`ComputeStandin.fail_creations` show up in
``listErrors``.

What costs money when a product assumes kinder behaviour (issue 29):

- ``deleteInstances`` answers with an operation that is already DONE, but the VMs
  start ``DELETING`` and ``targetSize`` drops only ``delete_lag`` seconds later: the
  operation says the deletion is scheduled, not done.
- A template's ``scheduling.terminationTime`` (RFC 3339; one of the two kinds of time
  limit Google's "Limit the run time of VMs in a MIG" names, so never beside
  ``maxRunDuration``) ends every VM at that time, whenever it was created; the MIG
  then tries to recreate it, and a VM made from the template after that time cannot
  be created (the attempt fails, in ``listErrors``, and is retried as GCE retries).
- Zones have capacity (:meth:`ComputeStandin.set_capacity`; 0 is a stock-out): a
  creation in a full zone fails with ``ZONE_RESOURCE_POOL_EXHAUSTED``. A regional MIG
  whose distribution shape is ``ANY`` then puts a new VM in a zone that has room; a
  *repair* (recreating a preempted VM, or one at its time limit) stays in the VM's
  zone unless ``instanceLifecyclePolicy.onRepair.allowChangingZone`` is ``YES``. The
  attempt in the full zone fails first (``listErrors`` has it), as GCE reports it.

A stop is what a GCE guest sees (tests/standins/guest.py models the inside): the
*machine* (what the launcher returns) is asked to stop, which signals only the
startup script's runner and runs the template's ``shutdown-script``; it powers off
when that ends, and the stand-in powers it off (SIGKILL of every process of the
VM) when the stop's window ends first: ``preempt_window`` (30 s on GCE) after a
preemption, ``stop_window`` (about 90 s) after any other stop.

Deleting a MIG completes once each of its VMs is gone or was already being
deleted through ``deleteInstances`` before; then the template is no longer in
use. (On GCE a group's last VM may not outlive the group's deletion; the
fleet's last-one-out step is best effort there and `fleet down` is the backstop.)
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Protocol
from urllib.parse import parse_qs, urlparse

from tests.standins import discovery

API = "https://www.googleapis.com/compute/v1"
NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
BASE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,57})$")
# Real zones of the regions tests use (Google's "Regions and zones" page): zone letters are not
# always a, b, c (europe-west1 has b, c, d), so a product that invents "<region>-a" is caught here.
ZONES = {
    "us-central1": ("a", "b", "c", "f"),
    "us-west1": ("a", "b", "c"),
    "us-east1": ("b", "c", "d"),
    "europe-west1": ("b", "c", "d"),
    "europe-west4": ("a", "b", "c"),
}
MIG_LIMIT = {"zonal": 1000, "regional": 2000}  # VMs per MIG, documented
DELETE_INSTANCES_LIMIT = 1000  # instance URLs per deleteInstances
METADATA_VALUE_LIMIT, METADATA_TOTAL_LIMIT = 256 * 1024, 512 * 1024  # a value at most; all keys and values below
# Machine series that take only Hyperdisk (no pd-*), per the machine series pages.
HYPERDISK_ONLY = ("c4", "c4a", "c4d", "n4", "n4a", "n4d")
METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
LABEL = re.compile(r"^[a-z0-9_-]{0,63}$")
SCOPE_PREFIX = "https://www.googleapis.com/auth/"


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _id() -> str:
    return str(uuid.uuid4().int % 10**19)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


def invalid(field_name: str, message: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field_name}': {message}")


def check_name(field_name: str, name) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(field_name, f"'{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'")


def int64(field_name: str, value) -> int:
    """GCE takes int64 fields as JSON strings (the client sends them so) or numbers."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).lstrip("-").isdigit():
        raise invalid(field_name, f"'{value}'. Expected an int64 (a JSON string of digits).")
    return int(value)


RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def rfc3339(field_name: str, value) -> float:
    """A time stamp in RFC 3339 text format (a date, a time and a zone), as seconds since the epoch."""
    if not isinstance(value, str) or not RFC3339.match(value):
        raise invalid(field_name, f"'{value}'. Expected an RFC3339 timestamp, e.g. 2025-01-01T12:00:00Z.")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def termination_time(template: dict) -> float | None:
    sch = template["properties"].get("scheduling") or {}
    return rfc3339("terminationTime", sch["terminationTime"]) if "terminationTime" in sch else None


STOCK_OUT = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "The zone does not have enough resources available to fulfill the request. Try a different zone, "
    "or try again later.",
)


def last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


# -- body validation ---------------------------------------------------------------
def validate_template(body: dict) -> None:
    check_name("resource.name", body.get("name"))
    props = body.get("properties")
    if not isinstance(props, dict):
        raise ApiError(400, "required", "Required field 'resource.properties' not specified")
    mt = props.get("machineType")
    if not mt:
        raise ApiError(400, "required", "Required field 'resource.properties.machineType' not specified")
    if "/" in mt or not NAME.match(mt):
        raise invalid("resource.properties.machineType", f"'{mt}'. Instance templates take a machine type name.")
    disks = props.get("disks") or []
    boots = [d for d in disks if d.get("boot")]
    if len(boots) != 1:
        raise invalid("resource.properties.disks", "exactly one boot disk is required")
    init = boots[0].get("initializeParams") or {}
    if not init.get("sourceImage"):
        raise ApiError(
            400, "required", "Required field 'resource.properties.disks[0].initializeParams.sourceImage' not specified"
        )
    if (
        "diskSizeGb" in init
        and int64("resource.properties.disks[0].initializeParams.diskSizeGb", init["diskSizeGb"]) < 10
    ):
        raise invalid("resource.properties.disks[0].initializeParams.diskSizeGb", "must be at least 10")
    nics = props.get("networkInterfaces") or []
    if not nics or not all(n.get("network") or n.get("subnetwork") for n in nics):
        raise invalid("resource.properties.networkInterfaces", "at least one interface with a network is required")
    accounts = props.get("serviceAccounts") or []
    if len(accounts) > 1:
        raise invalid("resource.properties.serviceAccounts", "at most one service account")
    for a in accounts:
        if "@" not in (a.get("email") or ""):
            raise invalid("resource.properties.serviceAccounts[0].email", f"'{a.get('email')}'")
        for s in a.get("scopes") or []:
            if not s.startswith(SCOPE_PREFIX):
                raise invalid("resource.properties.serviceAccounts[0].scopes", f"'{s}'")
    items = (props.get("metadata") or {}).get("items") or []
    keys = [i.get("key") for i in items]
    if len(set(keys)) != len(keys):
        raise invalid("resource.properties.metadata", "Duplicate keys.")
    total = 0
    for i in items:
        if not isinstance(i.get("key"), str) or not METADATA_KEY.match(i["key"]):
            raise invalid("resource.properties.metadata.items.key", f"'{i.get('key')}'")
        size = len((i.get("value") or "").encode())
        if size > METADATA_VALUE_LIMIT:
            raise invalid(
                f"resource.properties.metadata.items[{i['key']}].value",
                f"{size} bytes; a value may have at most {METADATA_VALUE_LIMIT} bytes (256 KiB)",
            )
        total += size + len(i["key"].encode())  # "the total size of all keys and values must be less than 512 KB"
    if total >= METADATA_TOTAL_LIMIT:
        raise invalid("resource.properties.metadata", f"keys and values total {total} bytes; must be less than 512 KiB")
    for k, v in (props.get("labels") or {}).items():
        if not LABEL.match(k) or not k or not LABEL.match(v):
            raise invalid("resource.properties.labels", f"'{k}': '{v}'")
    sch = props.get("scheduling") or {}
    model = sch.get("provisioningModel", "STANDARD")
    if model not in ("STANDARD", "SPOT"):
        raise invalid("resource.properties.scheduling.provisioningModel", f"'{model}'")
    action = sch.get("instanceTerminationAction")
    if action not in (None, "STOP", "DELETE"):
        raise invalid("resource.properties.scheduling.instanceTerminationAction", f"'{action}'")
    if model == "SPOT":
        if sch.get("automaticRestart", True):
            raise invalid("resource.properties.scheduling.automaticRestart", "Spot VMs cannot restart automatically.")
        if sch.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise invalid(
                "resource.properties.scheduling.onHostMaintenance", "Spot VMs must TERMINATE on host maintenance."
            )
    if "terminationTime" in sch:
        rfc3339("resource.properties.scheduling.terminationTime", sch["terminationTime"])
        if "maxRunDuration" in sch:  # "You can specify one of two types of time limits"
            raise invalid("resource.properties.scheduling", "give either maxRunDuration or terminationTime, not both")
        if action is None:
            raise invalid(
                "resource.properties.scheduling.instanceTerminationAction", "must be set when terminationTime is set"
            )
    if "maxRunDuration" in sch:
        seconds = int64("resource.properties.scheduling.maxRunDuration.seconds", sch["maxRunDuration"].get("seconds"))
        if not 30 <= seconds <= 120 * 86400:
            raise invalid("resource.properties.scheduling.maxRunDuration", "must be between 30 s and 120 days")
        if action is None:
            raise invalid(
                "resource.properties.scheduling.instanceTerminationAction", "must be set when maxRunDuration is set"
            )
    elif action is not None and model != "SPOT" and "terminationTime" not in sch:
        raise invalid(
            "resource.properties.scheduling.instanceTerminationAction",
            "only for Spot VMs or VMs with a run duration limit",
        )


def validate_mig(body: dict, regional: bool, templates: dict) -> str:
    check_name("resource.name", body.get("name"))
    base = body.get("baseInstanceName")
    if not isinstance(base, str) or not BASE_NAME.match(base):
        raise invalid("resource.baseInstanceName", f"'{base}'. Must be a match of regex '[a-z](?:[-a-z0-9]{{0,57}})'")
    tpl = body.get("instanceTemplate") or ""
    m = re.search(r"(?:^|/)projects/[^/]+/global/instanceTemplates/([^/]+)$", tpl) or re.match(
        r"^global/instanceTemplates/([^/]+)$", tpl
    )
    if not m:
        raise invalid("resource.instanceTemplate", f"'{tpl}'")
    if m.group(1) not in templates:
        raise ApiError(404, "notFound", f"The resource '{tpl}' was not found")
    size = body.get("targetSize", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise invalid("resource.targetSize", f"'{size}'")
    kind = "regional" if regional else "zonal"
    if size > MIG_LIMIT[kind]:
        raise invalid(
            "resource.targetSize",
            f"'{size}'. A {kind} managed instance group can have at most {MIG_LIMIT[kind]} instances.",
        )
    policy = body.get("distributionPolicy")
    if policy is not None and not regional:
        raise invalid("resource.distributionPolicy", "only regional managed instance groups have one")
    if policy:
        shape = policy.get("targetShape", "EVEN")
        if shape not in ("EVEN", "BALANCED", "ANY", "ANY_SINGLE_ZONE"):
            raise invalid("resource.distributionPolicy.targetShape", f"'{shape}'")
        redistribution = (body.get("updatePolicy") or {}).get("instanceRedistributionType", "PROACTIVE")
        if shape != "EVEN" and redistribution != "NONE":
            raise invalid(
                "resource.updatePolicy.instanceRedistributionType",
                f"must be NONE when the target distribution shape is {shape}",
            )
    return m.group(1)


# -- state -----------------------------------------------------------------------------
@dataclass
class VM:
    name: str
    zone: str
    mig: str
    id: str = field(default_factory=_id)
    status: str = "PROVISIONING"
    action: str = "CREATING"
    proc: "Machine | None" = None
    boot: int = 0
    errors: list[dict] = field(default_factory=list)
    deleted_via: str | None = None
    term_at: float | None = None
    kill_at: float | None = None
    termed: bool = False
    deadline: float | None = None  # maxRunDuration of this boot, as a time
    terminate_at: float | None = None  # the template's terminationTime
    repair: bool = False  # being recreated (zone-pinned unless onRepair.allowChangingZone is YES)
    next_try: float = 0.0
    extra: dict = field(default_factory=dict)  # for the launcher (metadata server, work dir)


@dataclass
class Mig:
    scope: str  # zones/<z> or regions/<r>
    name: str
    body: dict
    template: str
    target: int
    zones: list[str]
    id: str = field(default_factory=_id)
    created: str = field(default_factory=_now_iso)
    vms: dict[str, VM] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    deleting: bool = False
    gone_after: float = 0.0  # a MIG being deleted lasts at least until then (GCE takes its time)
    counter: int = 0


@dataclass
class Call:
    method: str
    path: str
    body: dict | None
    auth: str | None
    method_id: str = ""  # from the discovery document, e.g. compute.instanceGroupManagers.deleteInstances
    query: dict = field(default_factory=dict)


class Machine(Protocol):
    """A running VM as the launcher gives it (tests/standins/vm.py): the stand-in only stops it."""

    def alive(self) -> bool: ...

    def stop(self, preempted: bool) -> None: ...  # the platform's soft stop: runner SIGTERM, shutdown-script

    def power_off(self) -> None: ...  # SIGKILL of everything; returns once it is gone

    def script_exit(self) -> int | None: ...  # the startup script's status once it has ended


Launcher = Callable[["ComputeStandin", VM, Mig, dict], Machine]
Stopper = Callable[["ComputeStandin", VM], None]


_IN_USE_TURNS = itertools.cycle(("sync", "operation"))


class ComputeStandin:
    def __init__(
        self,
        project: str,
        launcher: Launcher | None = None,
        on_gone: Stopper | None = None,
        stop_delay: float = 0.3,
        stop_window: float = 90.0,
        preempt_window: float = 30.0,
        op_delay: float = 0.2,
        run_duration_scale: float = 1.0,
        in_use_error: str | None = None,
        mig_delete_time: float = 1.0,
        delete_lag: float = 1.0,
    ):
        self.project = project
        # deleteInstances: its operation is DONE at once, the VMs start DELETING (and targetSize drops) this much later.
        self.delete_lag = delete_lag
        self._pending_deletes: list[tuple[float, tuple[str, str], list[str]]] = []
        self.capacity: dict[str, int] = {}  # zone -> VMs it can hold (absent: no limit; 0: a stock-out)
        # A MIG's deletion takes a while even with no VM left, so its template is still in use meanwhile.
        self.mig_delete_time = mig_delete_time
        # Where GCE reports a template still used by a MIG: a synchronous 400 or an error in the delete's
        # operation. Both happen; unless a test chooses, stand-ins take turns so every suite sees both.
        self.in_use_error = in_use_error or next(_IN_USE_TURNS)
        assert self.in_use_error in ("sync", "operation"), in_use_error
        self.launcher, self.on_gone = launcher, on_gone
        self.stop_delay, self.stop_window, self.op_delay = stop_delay, stop_window, op_delay
        self.preempt_window = preempt_window
        self.run_duration_scale = run_duration_scale  # a test's maxRunDuration of 30 s can last 3
        self.templates: dict[str, dict] = {}
        self.migs: dict[tuple[str, str], Mig] = {}
        self.orphans: list[VM] = []  # VMs still shutting down after their MIG went away
        self.ops: dict[str, dict] = {}
        self.request_ids: dict[str, tuple[str, str]] = {}  # requestId -> (scope, name) of the operation it made
        self._ready: dict[str, Callable[[], bool]] = {}
        self._errors: dict[str, dict] = {}  # errors of RUNNING operations, shown once they are DONE
        self.calls: list[Call] = []
        self.violations: list[str] = []  # requests the discovery document refuses (answered 400 or 404)
        self.events: list[tuple[float, str, str, str]] = []  # (time, kind, vm or resource, detail)
        self._fail: list[tuple[str, str]] = []
        # Hooks for tests/standins/iam.py and catalog.py: a check of every request (raises ApiError)
        # and more routes (verb, pattern after /compute/v1/projects/{p}/, fn(*groups, body)).
        self.guard: Callable[[str, str, str | None], None] | None = None
        self.extra_routes: list[tuple[str, str, Callable]] = []
        self.lock = threading.RLock()
        self._stop = threading.Event()
        handler = type("Handler", (_Handler,), {"standin": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, daemon=True),
            threading.Thread(target=self._reconcile_forever, daemon=True),
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "ComputeStandin":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            vms = [vm for mig in self.migs.values() for vm in mig.vms.values()] + self.orphans
        for vm in vms:
            if vm.proc is not None:
                vm.proc.power_off()
            if self.on_gone:
                self.on_gone(self, vm)

    # -- test controls -----------------------------------------------------------------
    def event(self, kind: str, who: str, detail: str = "") -> None:
        with self.lock:
            self.events.append((time.time(), kind, who, detail))

    def events_of(self, kind: str) -> list[str]:
        with self.lock:
            return [who for _, k, who, _ in self.events if k == kind]

    def fail_creations(
        self,
        count: int,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
        message: str = "The zone does not have enough resources available to fulfill the request.",
    ) -> None:
        """The next `count` VM creations fail, as a stock-out or quota error would; the MIG retries."""
        with self.lock:
            self._fail += [(code, message)] * count

    def set_capacity(self, zone: str, vms: int | None) -> None:
        """At most ``vms`` VMs can run in ``zone`` (0: a Spot stock-out; None: no limit again)."""
        with self.lock:
            if vms is None:
                self.capacity.pop(zone, None)
            else:
                self.capacity[zone] = vms

    def preempt(self, name: str) -> VM:
        """Preempt a VM as Spot does: a stop with ``preempt_window`` to power-off, then recreate it."""
        with self.lock:
            vm = self.find(name)
            assert vm is not None and vm.deleted_via is None, f"no running VM {name}"
            self._recreate(vm, self.preempt_window, preempted=True)
        self.event("preempt", name)
        return vm

    def _recreate(self, vm: VM, window: float, preempted: bool = False) -> None:
        """Stop the VM (the MIG recreates it under the same name once it is off)."""
        now = time.time()
        vm.action, vm.status = "RECREATING", "STOPPING"
        vm.termed, vm.term_at, vm.kill_at = True, now, now + window
        if vm.proc is not None:
            vm.proc.stop(preempted)

    def find(self, name: str) -> VM | None:
        with self.lock:
            for mig in self.migs.values():
                if name in mig.vms:
                    return mig.vms[name]
        return None

    def running(self) -> list[VM]:
        with self.lock:
            return [vm for mig in self.migs.values() for vm in mig.vms.values()] + list(self.orphans)

    # -- the MIG's control loop -----------------------------------------------------------
    def _start(self, mig: Mig, vm: VM) -> None:
        vm.boot += 1
        vm.errors = []
        template = self.templates[mig.template]
        vm.termed, vm.term_at, vm.kill_at = False, None, None
        vm.extra.pop("exited", None)
        limit = ((template["properties"].get("scheduling") or {}).get("maxRunDuration") or {}).get("seconds")
        vm.deadline = time.time() + int(limit) * self.run_duration_scale if limit else None
        vm.terminate_at = termination_time(template)
        vm.repair = False
        vm.proc = self.launcher(self, vm, mig, template) if self.launcher else None
        vm.status, vm.action = "RUNNING", "NONE"

    def _used(self, zone: str) -> int:
        """VMs started in the zone and not yet gone (a stopping VM still holds its machine)."""
        return sum(
            1 for m in self.migs.values() for v in m.vms.values() if v.zone == zone and v.status != "PROVISIONING"
        ) + sum(1 for v in self.orphans if v.zone == zone)

    def _room(self, zone: str) -> bool:
        return zone not in self.capacity or self._used(zone) < self.capacity[zone]

    def _place(self, mig: Mig, vm: VM) -> None:
        """After an attempt failed for want of room, a regional ANY-shape MIG tries the VM where there
        is room; a repair stays in its zone unless the MIG allows changing it
        (instanceLifecyclePolicy.onRepair.allowChangingZone)."""
        if self._room(vm.zone) or not vm.errors or not mig.scope.startswith("regions/"):
            return
        if (mig.body.get("distributionPolicy") or {}).get("targetShape", "EVEN") != "ANY":
            return
        on_repair = (mig.body.get("instanceLifecyclePolicy") or {}).get("onRepair") or {}
        if vm.repair and on_repair.get("allowChangingZone", "NO") != "YES":
            return
        free = [z for z in mig.zones if self._room(z)]
        if free:
            vm.zone = free[0]

    def _create_error(self, mig: Mig, vm: VM, now: float) -> tuple[str, str] | None:
        """Why this attempt to create the VM fails, if it does."""
        refused = self._refused(mig)
        if refused:
            return refused
        end = termination_time(self.templates[mig.template])
        if end is not None and now >= end:
            return (
                "INVALID_FIELD_VALUE",
                "Invalid value for field 'resource.scheduling.terminationTime': "
                f"'{self.templates[mig.template]['properties']['scheduling']['terminationTime']}'. "
                "The termination time must be in the future.",
            )
        self._place(mig, vm)
        if not self._room(vm.zone):
            return STOCK_OUT
        if self._fail:
            return self._fail.pop(0)
        return None

    def _refused(self, mig: Mig) -> tuple[str, str] | None:
        """Why GCE cannot create a VM from this template at all (it keeps retrying and reporting it)."""
        props = self.templates[mig.template]["properties"]
        machine = props.get("machineType", "")
        disk = (props["disks"][0].get("initializeParams") or {}).get("diskType", "")
        if disk.startswith("pd-") and machine.split("-")[0] in HYPERDISK_ONLY:
            return "UNSUPPORTED_OPERATION", f"[{disk}] disk type cannot be used by [{machine}] machine type."
        return None

    def _reconcile_forever(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.reconcile()
            except Exception as e:  # keep the loop alive; a test sees the symptom
                self.event("standin-error", "", repr(e))

    def _shutdown_step(self, vm: VM, now: float) -> bool:
        """Drive a deleting VM toward gone; True once it is."""
        if vm.proc is None or not vm.proc.alive():
            return True
        if not vm.termed and now >= vm.term_at:
            vm.termed, vm.status = True, "STOPPING"
            vm.proc.stop(False)
        elif now >= vm.kill_at:
            self.event("power-off", vm.name, "the stop's window ended")
            vm.proc.power_off()
            return True
        return False

    def reconcile(self) -> None:
        now = time.time()
        gone: list[VM] = []
        with self.lock:
            due = [p for p in self._pending_deletes if now >= p[0]]
            self._pending_deletes = [p for p in self._pending_deletes if now < p[0]]
            for _, key, names in due:
                self._apply_delete(key, names, now)
            for vm in list(self.orphans):
                if self._shutdown_step(vm, now):
                    self.orphans.remove(vm)
                    gone.append(vm)
            for key, mig in list(self.migs.items()):
                for vm in list(mig.vms.values()):
                    if vm.action == "DELETING":
                        if self._shutdown_step(vm, now):
                            del mig.vms[vm.name]
                            gone.append(vm)
                    elif vm.action == "RECREATING":
                        if self._shutdown_step(vm, now):
                            if self.on_gone:
                                self.on_gone(self, vm)
                            vm.proc, vm.action, vm.status, vm.repair, vm.next_try = (
                                None,
                                "CREATING",
                                "PROVISIONING",
                                True,
                                0.0,
                            )
                    if vm.action == "CREATING" and now >= vm.next_try:
                        error = self._create_error(mig, vm, now)
                        if error:
                            code, message = error
                            err = {"code": code, "message": message}
                            vm.errors = [err]
                            vm.next_try = now + 0.5
                            mig.errors.append(
                                {
                                    "error": err,
                                    "timestamp": _now_iso(),
                                    "instanceActionDetails": {
                                        "action": "RECREATING" if vm.repair else "CREATING",
                                        "instance": self.instance_url(vm),
                                        "version": {"instanceTemplate": self.template_url(mig.template)},
                                    },
                                }
                            )
                            self.event("create-failed", vm.name, f"{code} {vm.zone}")
                        else:
                            repair = vm.repair
                            self._start(mig, vm)
                            self.event("recreate" if repair else "create", vm.name, str(vm.boot) if repair else vm.zone)
                    elif vm.action == "NONE" and vm.terminate_at is not None and now >= vm.terminate_at:
                        # terminationTime: GCE deletes the VM; the MIG tries to recreate it (and cannot, after that time).
                        self.event("termination-time", vm.name, str(vm.boot))
                        self._recreate(vm, self.stop_window)
                    elif vm.action == "NONE" and vm.deadline is not None and now >= vm.deadline:
                        # maxRunDuration: GCE deletes the VM; assume the worst, that the MIG recreates it.
                        self.event("max-run-duration", vm.name, str(vm.boot))
                        self._recreate(vm, self.stop_window)
                    elif (
                        vm.action == "NONE"
                        and vm.proc is not None
                        and "exited" not in vm.extra
                        and vm.proc.script_exit() is not None
                    ):
                        vm.extra["exited"] = vm.proc.script_exit()  # the script ended; the VM idles on
                        self.event("script-exited", vm.name, str(vm.extra["exited"]))
                if not mig.deleting:
                    alive = [vm for vm in mig.vms.values() if vm.action != "DELETING"]
                    for _ in range(mig.target - len(alive)):
                        mig.counter += 1
                        name = f"{mig.body['baseInstanceName']}-{uuid.uuid4().hex[:4]}"
                        zone = mig.zones[mig.counter % len(mig.zones)]
                        mig.vms[name] = VM(name, zone, mig.name)
                elif now >= mig.gone_after and all(vm.deleted_via == "deleteInstances" for vm in mig.vms.values()):
                    del self.migs[key]
                    self.orphans += list(mig.vms.values())
                    self.event("mig-gone", mig.name)
            for vm in gone:  # under the lock: whoever sees a VM gone from the MIG sees its event
                self.event("gone", vm.name, vm.deleted_via or "")
        for vm in gone:
            if self.on_gone:
                self.on_gone(self, vm)

    # -- URLs and resources -------------------------------------------------------------------
    def template_url(self, name: str) -> str:
        return f"{API}/projects/{self.project}/global/instanceTemplates/{name}"

    def instance_url(self, vm: VM) -> str:
        return f"{API}/projects/{self.project}/zones/{vm.zone}/instances/{vm.name}"

    def mig_url(self, mig: Mig) -> str:
        return f"{API}/projects/{self.project}/{mig.scope}/instanceGroupManagers/{mig.name}"

    def mig_json(self, mig: Mig) -> dict:
        actions = {
            a: 0
            for a in (
                "none",
                "creating",
                "deleting",
                "recreating",
                "abandoning",
                "refreshing",
                "restarting",
                "verifying",
                "creatingWithoutRetries",
            )
        }
        for vm in mig.vms.values():
            key = vm.action.lower()
            actions[key] = actions.get(key, 0) + 1
        body = dict(mig.body)
        body.update(
            {
                "kind": "compute#instanceGroupManager",
                "id": mig.id,
                "creationTimestamp": mig.created,
                "selfLink": self.mig_url(mig),
                "targetSize": mig.target,
                "currentActions": actions,
                "instanceTemplate": self.template_url(mig.template),
                "fingerprint": "standin=",
                "status": {"isStable": all(vm.action == "NONE" for vm in mig.vms.values())},
                "instanceGroup": self.mig_url(mig).replace("instanceGroupManagers", "instanceGroups"),
                (
                    "region" if mig.scope.startswith("regions/") else "zone"
                ): f"{API}/projects/{self.project}/{mig.scope}",
            }
        )
        return body

    def managed_instance_json(self, mig: Mig, vm: VM) -> dict:
        out = {
            "instance": self.instance_url(vm),
            "id": vm.id,
            "name": vm.name,
            "instanceStatus": vm.status,
            "currentAction": vm.action,
            "version": {"instanceTemplate": self.template_url(mig.template)},
        }
        if vm.errors:
            out["lastAttempt"] = {"errors": {"errors": vm.errors}}
        return out

    # -- operations ----------------------------------------------------------------------------
    def operation(
        self, scope: str, kind: str, target: str, ready: Callable[[], bool] | None = None, error: dict | None = None
    ) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        op = {
            "kind": "compute#operation",
            "id": _id(),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "RUNNING" if ready else "DONE",
            "progress": 0 if ready else 100,
            "insertTime": _now_iso(),
            "user": "standin",
        }
        if scope != "global":
            op["zone" if scope.startswith("zones/") else "region"] = f"{API}/projects/{self.project}/{scope}"
        op["selfLink"] = f"{API}/projects/{self.project}/{scope}/operations/{name}"
        with self.lock:
            self.ops[f"{scope}/{name}"] = op
            if ready:
                self._ready[f"{scope}/{name}"] = ready
            if error:  # an operation carries its error once it is DONE
                if ready:
                    self._errors[f"{scope}/{name}"] = {"errors": [error]}
                else:
                    op["error"] = {"errors": [error]}
        return dict(op)

    def poll_operation(self, scope: str, name: str, wait: float) -> dict:
        key = f"{scope}/{name}"
        deadline = time.time() + wait
        while True:
            with self.lock:
                op = self.ops.get(key)
                if op is None:
                    raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/{key}' was not found")
                ready = self._ready.get(key)
                if ready is not None and ready():
                    op.update(status="DONE", progress=100, endTime=_now_iso())
                    del self._ready[key]
                    if key in self._errors:
                        op["error"] = self._errors.pop(key)
                if op["status"] == "DONE" or time.time() >= deadline:
                    return dict(op)
            time.sleep(0.05)

    def _after(self, seconds: float) -> Callable[[], bool]:
        at = time.time() + seconds
        return lambda: time.time() >= at

    # -- request handling ----------------------------------------------------------------------
    def handle_once(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        """``requestId`` as Compute Engine documents it for every mutating method: "a unique request
        ID so that if you must retry your request, the server will know to ignore the request if it
        has already been completed" (at least 60 minutes after the first; this stand-in lives
        shorter), and "the request ID must be a valid UUID with the exception that zero UUID is
        not supported". A request whose id was seen is not applied again: the answer is the first
        request's operation, as it stands now. A request refused outright (a 4xx) made no
        operation, so its id is not kept."""
        given = query.get("requestId")
        if method == "GET" or not given:
            return self.handle(method, path, body)
        try:
            valid = uuid.UUID(given[0]).int != 0
        except ValueError:
            valid = False
        if not valid:
            raise invalid("requestId", f"'{given[0]}'. The request ID must be a valid UUID other than the zero UUID.")
        with self.lock:  # one at a time: two retries of one request racing must still apply it once
            seen = self.request_ids.get(given[0])
            if seen is not None:
                self.event("request-id-seen", given[0], f"{method} {path}")
                return 200, self.poll_operation(*seen, 0)
            status, answer = self.handle(method, path, body)
            if answer.get("kind") == "compute#operation":
                where = answer["selfLink"].split(f"/projects/{self.project}/", 1)[1].rsplit("/operations/", 1)[0]
                self.request_ids[given[0]] = (where, answer["name"])
            return status, answer

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        prefix = f"/compute/v1/projects/{self.project}/"
        if not path.startswith(prefix):
            m = re.match(r"^/compute/v1/projects/([^/]+)/", path)
            if m:
                raise ApiError(404, "notFound", f"The resource 'projects/{m.group(1)}' was not found")
            raise ApiError(404, "notFound", f"no such endpoint: {path}")
        rest = path[len(prefix) :]
        routes: list[tuple[str, str, Callable]] = [
            ("POST", r"global/instanceTemplates", self.insert_template),
            ("GET", r"global/instanceTemplates/([^/]+)", self.get_template),
            ("DELETE", r"global/instanceTemplates/([^/]+)", self.delete_template),
            ("GET", r"(global)/operations/([^/]+)", lambda s, n, b: self.poll_operation(s, n, 0)),
            ("POST", r"(global)/operations/([^/]+)/wait", lambda s, n, b: self.poll_operation(s, n, 30)),
            ("GET", r"((?:zones|regions)/[^/]+)/operations/([^/]+)", lambda s, n, b: self.poll_operation(s, n, 0)),
            (
                "POST",
                r"((?:zones|regions)/[^/]+)/operations/([^/]+)/wait",
                lambda s, n, b: self.poll_operation(s, n, 30),
            ),
            ("POST", r"((?:zones|regions)/[^/]+)/instanceGroupManagers", self.insert_mig),
            ("GET", r"((?:zones|regions)/[^/]+)/instanceGroupManagers/([^/]+)", self.get_mig),
            ("DELETE", r"((?:zones|regions)/[^/]+)/instanceGroupManagers/([^/]+)", self.delete_mig),
            (
                "POST",
                r"((?:zones|regions)/[^/]+)/instanceGroupManagers/([^/]+)/listManagedInstances",
                self.list_managed,
            ),
            ("POST", r"((?:zones|regions)/[^/]+)/instanceGroupManagers/([^/]+)/deleteInstances", self.delete_instances),
            ("GET", r"((?:zones|regions)/[^/]+)/instanceGroupManagers/([^/]+)/listErrors", self.list_errors),
        ] + self.extra_routes
        for verb, pattern, fn in routes:
            m = re.fullmatch(pattern, rest)
            if m and verb == method:
                args = m.groups()
                if args and args[0].startswith(("zones/", "regions/")):
                    self._check_scope(args[0])
                return 200, fn(*args, body)
        raise ApiError(404, "notFound", f"no such endpoint: {method} {path}")

    def _check_scope(self, scope: str) -> None:
        kind, where = scope.split("/")
        region, _, letter = where.rpartition("-") if kind == "zones" else (where, "", "")
        if region not in ZONES or (kind == "zones" and letter not in ZONES[region]):
            raise ApiError(400, "invalid", f"Invalid value for field '{kind[:-1]}': '{where}'. Unknown {kind[:-1]}.")

    def insert_template(self, body: dict | None) -> dict:
        body = body or {}
        validate_template(body)
        with self.lock:
            if body["name"] in self.templates:
                raise ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{self.project}/global/instanceTemplates/{body['name']}' already exists",
                )
            stored = json.loads(json.dumps(body))
            props = stored["properties"]
            for i, nic in enumerate(props.get("networkInterfaces", [])):  # what GCE fills in
                nic.setdefault("name", f"nic{i}")
            for i, d in enumerate(props.get("disks", [])):
                d.setdefault("deviceName", f"persistent-disk-{i}")
                d.setdefault("mode", "READ_WRITE")
                d.setdefault("index", i)
            props.setdefault("metadata", {})["fingerprint"] = "standin="
            stored.update(
                kind="compute#instanceTemplate",
                id=_id(),
                creationTimestamp=_now_iso(),
                selfLink=self.template_url(body["name"]),
            )
            self.templates[body["name"]] = stored
        self.event("template-created", body["name"])
        return self.operation("global", "insert", self.template_url(body["name"]), self._after(self.op_delay))

    def get_template(self, name: str, body) -> dict:
        with self.lock:
            if name not in self.templates:
                raise ApiError(
                    404,
                    "notFound",
                    f"The resource 'projects/{self.project}/global/instanceTemplates/{name}' was not found",
                )
            return self.templates[name]

    def delete_template(self, name: str, body) -> dict:
        with self.lock:
            if name not in self.templates:
                raise ApiError(
                    404,
                    "notFound",
                    f"The resource 'projects/{self.project}/global/instanceTemplates/{name}' was not found",
                )
            users = [m for m in self.migs.values() if m.template == name]
            if users:
                message = (
                    f"The instance_template resource 'projects/{self.project}/global/instanceTemplates/{name}' "
                    f"is already being used by '{self.mig_url(users[0])[len(API) + 1 :]}'"
                )
                self.event("template-in-use", name, self.in_use_error)
                if self.in_use_error == "sync":
                    raise ApiError(400, "resourceInUseByAnotherResource", message)
                return self.operation(
                    "global",
                    "delete",
                    self.template_url(name),
                    self._after(self.op_delay),
                    error={"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": message},
                )
            del self.templates[name]
        self.event("template-deleted", name)
        return self.operation("global", "delete", self.template_url(name), self._after(self.op_delay))

    def _mig(self, scope: str, name: str) -> Mig:
        mig = self.migs.get((scope, name))
        if mig is None:
            raise ApiError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/{scope}/instanceGroupManagers/{name}' was not found",
            )
        return mig

    def insert_mig(self, scope: str, body: dict | None) -> dict:
        body = body or {}
        regional = scope.startswith("regions/")
        with self.lock:
            template = validate_mig(body, regional, self.templates)
            if (scope, body["name"]) in self.migs:
                raise ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{self.project}/{scope}/instanceGroupManagers/{body['name']}' already exists",
                )
            where = scope.split("/")[1]
            if regional:
                real = [f"{where}-{z}" for z in ZONES[where]]
                zones = [
                    last(z.get("zone", "")) for z in (body.get("distributionPolicy") or {}).get("zones", [])
                ] or real
                for z in zones:
                    if z not in real:
                        raise invalid("resource.distributionPolicy.zones", f"'{z}'. Not a zone of region {where}.")
            else:
                zones = [where]
            mig = Mig(scope, body["name"], json.loads(json.dumps(body)), template, body.get("targetSize", 0), zones)
            self.migs[(scope, body["name"])] = mig
        self.event("mig-created", mig.name, str(mig.target))
        return self.operation(scope, "insert", self.mig_url(mig), self._after(self.op_delay))

    def get_mig(self, scope: str, name: str, body) -> dict:
        with self.lock:
            return self.mig_json(self._mig(scope, name))

    def delete_mig(self, scope: str, name: str, body) -> dict:
        with self.lock:
            mig = self._mig(scope, name)
            if not mig.deleting:
                mig.deleting, mig.target = True, 0
                now = time.time()
                mig.gone_after = now + self.mig_delete_time
                for vm in mig.vms.values():
                    if vm.action != "DELETING":
                        vm.action, vm.deleted_via = "DELETING", "mig-delete"
                        vm.term_at, vm.kill_at = now + self.stop_delay, now + self.stop_delay + self.stop_window
        self.event("mig-delete", name)
        key = (scope, name)
        return self.operation(scope, "delete", self.mig_url(mig), lambda: key not in self.migs)

    def list_managed(self, scope: str, name: str, body) -> dict:
        with self.lock:
            mig = self._mig(scope, name)
            return {"managedInstances": [self.managed_instance_json(mig, vm) for vm in mig.vms.values()]}

    def list_errors(self, scope: str, name: str, body) -> dict:
        with self.lock:
            return {"items": list(reversed(self._mig(scope, name).errors))}

    def delete_instances(self, scope: str, name: str, body: dict | None) -> dict:
        body = body or {}
        urls = body.get("instances") or []
        if not isinstance(urls, list) or not urls:
            raise ApiError(400, "required", "Required field 'instances' not specified")
        if len(urls) > DELETE_INSTANCES_LIMIT:
            raise invalid("resource.instances", f"{len(urls)} instances; at most {DELETE_INSTANCES_LIMIT} per request")
        skip = bool(body.get("skipInstancesOnValidationError"))
        now = time.time()
        with self.lock:
            mig = self._mig(scope, name)
            chosen, strangers = [], []
            for url in urls:
                m = re.search(r"(?:^|/)zones/([^/]+)/instances/([^/]+)$", url)
                vm = mig.vms.get(m.group(2)) if m else None
                if vm is None or vm.zone != m.group(1):
                    strangers.append(url)
                else:
                    chosen.append(vm)
            if strangers and not skip:
                # GCE accepts the request and reports the failed validation in the operation; nothing is deleted.
                return self.operation(
                    scope,
                    "deleteInstances",
                    self.mig_url(mig),
                    error={
                        "code": "RESOURCE_NOT_FOUND",
                        "message": f"Instance '{strangers[0]}' is not a member of "
                        f"the managed instance group '{mig.name}'.",
                    },
                )
            # DONE now; the VMs start DELETING, and the target size drops, delete_lag later (as on GCE).
            self._pending_deletes.append((now + self.delete_lag, (scope, name), [vm.name for vm in chosen]))
            if not self.delete_lag:
                self._pending_deletes.pop()
                self._apply_delete((scope, name), [vm.name for vm in chosen], now)
        return self.operation(scope, "deleteInstances", self.mig_url(mig))

    def _apply_delete(self, key: tuple[str, str], names: list[str], now: float) -> None:
        mig = self.migs.get(key)
        if mig is None or mig.deleting:
            return
        for name in names:
            vm = mig.vms.get(name)
            if vm is None or vm.action == "DELETING":
                continue
            vm.action, vm.deleted_via = "DELETING", "deleteInstances"
            vm.term_at, vm.kill_at = now + self.stop_delay, now + self.stop_delay + self.stop_window
            mig.target = max(0, mig.target - 1)
            self.event("deleteInstances", vm.name, mig.name)


class _Handler(BaseHTTPRequestHandler):
    standin: ComputeStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> dict | None:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return None
        return json.loads(self.rfile.read(n))

    def _dispatch(self) -> None:
        url = urlparse(self.path)
        try:
            body = self._body()
        except ValueError:
            status, payload = (
                400,
                ApiError(400, "parseError", "This API does not support parsing form-encoded input.").body(),
            )
        else:
            call = Call(
                self.command,
                url.path,
                body,
                self.headers.get("Authorization"),
                query=parse_qs(url.query, keep_blank_values=True),
            )
            with self.standin.lock:
                self.standin.calls.append(call)
            try:
                try:  # first as the published API would: method, path, query and body against the document
                    call.method_id, _ = discovery.check(self.command, url.path, call.query, body)
                except discovery.Violation as v:
                    with self.standin.lock:
                        self.standin.violations.append(f"{self.command} {self.path}: {v.message}")
                    raise ApiError(v.status, v.reason, v.message) from None
                if self.standin.guard is not None:
                    self.standin.guard(self.command, url.path, self.headers.get("Authorization"))
                status, payload = self.standin.handle_once(self.command, url.path, call.query, body)
            except ApiError as e:
                status, payload = e.status, e.body()
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _dispatch

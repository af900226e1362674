"""IAM on the stand-ins: who called which API method, and is it allowed.

Every request that reaches the Compute stand-in (through its ``guard`` hook) or a
guarded storage proxy (tests/standins/faultproxy.py's ``guard``) is mapped to its
API method id and the IAM permission Google documents for it, and recorded with
its caller: a *VM* when it carries a token a VM's metadata server handed out (the
VM's service account), else the *operator* (`fleet launch`/`down` on the user's
machine, anonymous here). A VM's call is allowed only if the permission is in the
role bound to the VM's account and, for the Compute role, the binding's condition
(CEL, evaluated here for the subset fleet uses) holds; otherwise it gets Google's 403.
The condition reads the resource attributes Google documents for the resource's type
(ATTRIBUTED_TYPES, with the pages they come from), not fleet's own table: where Google
gives none (MIGs, operations), a condition whose outcome would turn on them is
undetermined, refused and recorded. Storage grants hold on one bucket only.

Also an IAM API stand-in for ``projects.serviceAccounts.get`` (`fleet launch`
checks the workers' account exists), reached through ``FLEET_IAM_ENDPOINT``.

Permissions are the ones the Compute Engine and Cloud Storage API references name
for each method ("Authorization requires the following IAM permission"): for
example ``instanceGroupManagers.deleteInstances`` needs
``compute.instanceGroupManagers.update``, ``listManagedInstances`` needs ``...get``,
an object upload needs ``storage.objects.create`` and, when it replaces an
object, ``storage.objects.delete``.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

from tests.standins.compute import ApiError

# (HTTP method, path after /compute/v1/projects/{p}/, method id, permission, how many path parts name the resource)
_SCOPE = r"(?:zones|regions)/[^/]+"
COMPUTE_METHODS: list[tuple[str, str, str, str]] = [
    ("POST", r"global/instanceTemplates", "compute.instanceTemplates.insert", "compute.instanceTemplates.create"),
    ("GET", r"global/instanceTemplates/[^/]+", "compute.instanceTemplates.get", "compute.instanceTemplates.get"),
    (
        "DELETE",
        r"global/instanceTemplates/[^/]+",
        "compute.instanceTemplates.delete",
        "compute.instanceTemplates.delete",
    ),
    ("GET", r"global/operations/[^/]+", "compute.globalOperations.get", "compute.globalOperations.get"),
    ("POST", r"global/operations/[^/]+/wait", "compute.globalOperations.wait", "compute.globalOperations.get"),
    ("GET", r"zones/[^/]+/operations/[^/]+", "compute.zoneOperations.get", "compute.zoneOperations.get"),
    ("POST", r"zones/[^/]+/operations/[^/]+/wait", "compute.zoneOperations.wait", "compute.zoneOperations.get"),
    ("GET", r"regions/[^/]+/operations/[^/]+", "compute.regionOperations.get", "compute.regionOperations.get"),
    ("POST", r"regions/[^/]+/operations/[^/]+/wait", "compute.regionOperations.wait", "compute.regionOperations.get"),
    (
        "POST",
        rf"{_SCOPE}/instanceGroupManagers",
        "instanceGroupManagers.insert",
        "compute.instanceGroupManagers.create",
    ),
    ("GET", rf"{_SCOPE}/instanceGroupManagers/[^/]+", "instanceGroupManagers.get", "compute.instanceGroupManagers.get"),
    (
        "DELETE",
        rf"{_SCOPE}/instanceGroupManagers/[^/]+",
        "instanceGroupManagers.delete",
        "compute.instanceGroupManagers.delete",
    ),
    (
        "POST",
        rf"{_SCOPE}/instanceGroupManagers/[^/]+/listManagedInstances",
        "instanceGroupManagers.listManagedInstances",
        "compute.instanceGroupManagers.get",
    ),
    (
        "GET",
        rf"{_SCOPE}/instanceGroupManagers/[^/]+/listErrors",
        "instanceGroupManagers.listErrors",
        "compute.instanceGroupManagers.get",
    ),
    (
        "POST",
        rf"{_SCOPE}/instanceGroupManagers/[^/]+/deleteInstances",
        "instanceGroupManagers.deleteInstances",
        "compute.instanceGroupManagers.update",
    ),
    ("GET", r"regions/[^/]+", "compute.regions.get", "compute.regions.get"),
    ("GET", r"zones/[^/]+", "compute.zones.get", "compute.zones.get"),
    ("GET", r"zones/[^/]+/machineTypes/[^/]+", "compute.machineTypes.get", "compute.machineTypes.get"),
]
_VERBS = ("/wait", "/listManagedInstances", "/listErrors", "/deleteInstances")


@dataclass(frozen=True)
class Call:
    """One API method call as IAM sees it."""

    principal: str  # "vm" or "operator"
    method: str  # API method id, e.g. compute.instanceGroupManagers.deleteInstances
    permissions: tuple[str, ...]
    resource: str  # the resource name a condition sees, e.g. projects/p/zones/z/instanceGroupManagers/m
    allowed: bool


def compute_method(verb: str, path: str) -> tuple[str, str, str] | None:
    """(method id, permission, resource name) of a Compute request, None if fleet never calls it."""
    m = re.match(r"^/compute/v1/(projects/[^/]+)/(.*)$", path)
    if not m:
        return None
    project, rest = m.groups()
    for v, pattern, method, permission in COMPUTE_METHODS:
        if v == verb and re.fullmatch(pattern, rest):
            if method.startswith("instanceGroupManagers."):  # zonal and regional MIGs: same permissions
                kind = "regionInstanceGroupManagers" if rest.startswith("regions/") else "instanceGroupManagers"
                method = f"compute.{kind}.{method.split('.', 1)[1]}"
            resource = rest
            for suffix in _VERBS:
                resource = resource.removesuffix(suffix)
            if verb == "POST" and method.endswith(".insert"):
                resource = resource.rsplit("/", 1)[0] if "/" in resource else ""  # the collection's parent
            return method, permission, f"{project}/{resource}".rstrip("/")
    return None


@dataclass(frozen=True)
class StorageRequest:
    method: str
    permissions: tuple[str, ...]
    bucket: str
    object: str | None


def storage_method(verb: str, path: str, body: bytes, exists: Callable[[str, str], bool]) -> StorageRequest | None:
    """The JSON API method of a Cloud Storage request and the permissions it needs.

    ``exists(bucket, object)`` says whether an upload would replace an object (which
    needs storage.objects.delete besides storage.objects.create)."""
    split = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(split.query)
    p = split.path
    if m := re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", p):
        bucket = urllib.parse.unquote(m.group(1))
        if verb == "PUT" or "upload_id" in query:  # the rest of a resumable upload: authorised when it began
            return None
        name = (query.get("name") or [None])[0]
        if name is None:
            found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body[:65536])
            name = json.loads(b'"' + found.group(1) + b'"') if found else None
        match = (query.get("ifGenerationMatch") or [None])[0]
        replaces = match not in (None, "0") or (match is None and name is not None and exists(bucket, name))
        perms = ("storage.objects.create", "storage.objects.delete") if replaces else ("storage.objects.create",)
        return StorageRequest("storage.objects.insert", perms, bucket, name)
    if m := re.fullmatch(r"(?:/download)?/storage/v1/b/([^/]+)/o/(.+)", p):
        bucket, name = urllib.parse.unquote(m.group(1)), urllib.parse.unquote(m.group(2))
        if verb == "POST" and re.search(r"/(compose|copyTo|rewriteTo)/", "/" + name + "/"):
            kind = next(k for k in ("compose", "copyTo", "rewriteTo") if f"/{k}" in "/" + name)
            return StorageRequest(
                f"storage.objects.{kind}", ("storage.objects.create", "storage.objects.get"), bucket, name
            )
        method, perm = {
            "GET": ("get", "get"),
            "DELETE": ("delete", "delete"),
            "PATCH": ("patch", "update"),
            "PUT": ("update", "update"),
        }.get(verb, (None, None))
        if method is None:
            return None
        return StorageRequest(f"storage.objects.{method}", (f"storage.objects.{perm}",), bucket, name)
    if m := re.fullmatch(r"/storage/v1/b/([^/]+)/o", p):
        if verb == "GET":
            return StorageRequest(
                "storage.objects.list", ("storage.objects.list",), urllib.parse.unquote(m.group(1)), None
            )
        return None
    if m := re.fullmatch(r"/storage/v1/b/([^/]+)", p):
        if verb == "GET":
            return StorageRequest(
                "storage.buckets.get", ("storage.buckets.get",), urllib.parse.unquote(m.group(1)), None
            )
    return None


# -- what a condition sees: Google's resource attributes for Compute Engine ----------------------------
# https://cloud.google.com/iam/docs/conditions-attribute-reference ("Resource attributes"): Compute Engine
# recognizes resource.service, resource.type and resource.name in allow-policy role bindings.
# https://cloud.google.com/iam/docs/conditions-resource-attributes ("Resource type values"): resource
# attributes are available only for the resource types that page lists; "other services and resource
# types do not recognize resource attributes". Its Compute Engine types run BackendService, Disk, Firewall,
# ForwardingRule, GlobalForwardingRule, Image, Instance, InstanceTemplate, ...: no InstanceGroupManager
# (zonal or regional) and no operation. The same page gives the resource name format,
# projects/PROJECT/global/instanceTemplates/NAME (the relative name, without //compute.googleapis.com/).
# Below: the collections fleet's VMs touch, and the type value Google lists for each (None: not listed).
ATTRIBUTED_TYPES: dict[str, str | None] = {
    "instanceTemplates": "compute.googleapis.com/InstanceTemplate",
    "instances": "compute.googleapis.com/Instance",
    "instanceGroupManagers": None,
    "regionInstanceGroupManagers": None,
    "operations": None,
    "regions": None,
    "zones": None,
    "machineTypes": None,
}


# For a type Google does not list, the page does not say what a condition reads instead (empty, the
# resource's own name anyway, its project's, or an error): the stand-in tries each of these, and a
# condition whose outcome turns on which is undetermined (the call is refused and recorded), since fleet
# cannot count on any of them.
def _unknown(attribute: str, resource: str) -> tuple[str, ...]:
    if attribute == "name":
        return "", resource, "/".join(resource.split("/")[:2])
    if attribute == "type":
        return "", "compute.googleapis.com/InstanceGroupManager"
    return "", "compute.googleapis.com"


@dataclass(frozen=True)
class Attributes:
    """resource.service, resource.type and resource.name as a condition reads them (given: False when
    Google lists no attributes for the resource's type)."""

    resource: str  # the relative resource name, projects/P/...
    type: str
    given: bool


def compute_attributes(resource: str) -> Attributes:
    """The attributes of a Compute resource named projects/P/.../COLLECTION/NAME."""
    parts = resource.split("/")
    collection = parts[-2] if len(parts) >= 4 else ""
    if collection == "instanceGroupManagers" and parts[2] == "regions":
        collection = "regionInstanceGroupManagers"
    kind = ATTRIBUTED_TYPES.get(collection)
    return Attributes(resource, kind or "", kind is not None)


def decide(expression: str, attributes: Attributes) -> bool | None:
    """The condition's outcome, or None when it turns on an attribute Google does not give."""
    if attributes.given:
        return evaluate(expression, attributes.resource, attributes.type, "compute.googleapis.com")
    outcomes = {
        evaluate(expression, name, type_, service)
        for name in _unknown("name", attributes.resource)
        for type_ in _unknown("type", attributes.resource)
        for service in _unknown("service", attributes.resource)
    }
    return outcomes.pop() if len(outcomes) == 1 else None


# -- a small CEL evaluator: what fleet's condition uses ---------------------------------------------
_TOKEN = re.compile(r'\s*(\|\||&&|==|!=|!|\(|\)|\.|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z_0-9]*)')


def _tokens(text: str) -> list[str]:
    out, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            if text[i:].strip():
                raise ValueError(f"CEL: cannot read {text[i:]!r}")
            break
        out.append(m.group(1))
        i = m.end()
    return out


def _extract(value: str, template: str) -> str:
    head, _, tail = template.partition("{")
    tail = tail.partition("}")[2]
    at = value.find(head)
    if at < 0:
        return ""
    rest = value[at + len(head) :]
    return rest.split(tail, 1)[0] if tail else rest


def evaluate(expression: str, resource_name: str, resource_type: str = "", resource_service: str = "") -> bool:
    """Evaluate `!`, `&&`, `||`, parentheses, `resource.{name,type,service} ==/!= "..."` and
    resource.X.{contains,startsWith,endsWith,extract}(...)."""
    toks = _tokens(expression)
    pos = 0
    attrs = {"name": resource_name, "type": resource_type, "service": resource_service}

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(toks) or (expected is not None and toks[pos] != expected):
            raise ValueError(f"CEL: expected {expected!r} at token {pos} of {expression!r}")
        pos += 1
        return toks[pos - 1]

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def primary():
        if peek() == "(":
            take("(")
            value = disjunction()
            take(")")
            return value
        take("resource"), take(".")
        attr = take()
        if attr not in attrs:
            raise ValueError(f"CEL: unsupported attribute resource.{attr}")
        value: object = attrs[attr]
        while peek() == ".":
            take(".")
            fn = take()
            take("(")
            arg = json.loads(take())
            take(")")
            if fn == "extract":
                value = _extract(str(value), arg)
            elif fn in ("contains", "startsWith", "endsWith"):
                value = {"contains": str.__contains__, "startsWith": str.startswith, "endsWith": str.endswith}[fn](
                    str(value), arg
                )
            else:
                raise ValueError(f"CEL: unsupported function {fn}")
        if peek() in ("==", "!="):
            op = take()
            other = json.loads(take())
            value = (value == other) if op == "==" else (value != other)
        if not isinstance(value, bool):
            raise ValueError(f"CEL: {expression!r} does not give a boolean")
        return value

    def unary() -> bool:
        if peek() == "!":
            take("!")
            return not unary()
        return primary()

    def conjunction() -> bool:
        value = unary()
        while peek() == "&&":
            take("&&")
            value = unary() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while peek() == "||":
            take("||")
            value = conjunction() or value
        return value

    result = disjunction()
    if pos != len(toks):
        raise ValueError(f"CEL: trailing tokens in {expression!r}")
    return result


# -- the policy ----------------------------------------------------------------------------------
@dataclass
class Policy:
    """The VMs' service account's grants, enforced on every call that carries a VM's token."""

    project: str
    bucket: str  # the storage role is bound on this bucket only
    vm_tokens: Iterable[str]  # live view of the tokens VMs' metadata servers handed out
    compute_permissions: set[str]
    storage_permissions: set[str]
    condition: str | None = None  # CEL on the compute binding
    account: str = "fleet-worker@example.iam.gserviceaccount.com"
    calls: list[Call] = field(default_factory=list)
    upstream: str = ""  # fake-gcs-server, asked whether an upload replaces an object
    lock: threading.Lock = field(default_factory=threading.Lock)
    # VM calls whose condition outcome turned on an attribute Google does not give (refused here)
    undetermined: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def for_fleet(cls, project: str, bucket: str, vm_tokens: Iterable[str], **kw) -> "Policy":
        """The roles of fleet/gce/iam.py, with its condition."""
        from fleet.gce import iam

        return cls(
            project,
            bucket,
            vm_tokens,
            set(iam.COMPUTE_ROLE.names),
            set(iam.STORAGE_ROLE.names),
            iam.condition_expression(),
            **kw,
        )

    def principal(self, authorization: str | None) -> str | None:
        token = (authorization or "").split()[-1] if authorization else ""
        if token and token in set(self.vm_tokens):
            return "vm"
        return None if token else "anonymous"

    def _record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def vm_permissions(self, allowed_only: bool = True) -> set[str]:
        with self.lock:
            return {
                p for c in self.calls if c.principal == "vm" and (c.allowed or not allowed_only) for p in c.permissions
            }

    def denied(self) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if not c.allowed]

    # -- Compute: the stand-in's guard hook ------------------------------------------------------
    def compute_guard(self, verb: str, path: str, authorization: str | None) -> None:
        found = compute_method(verb, path)
        if found is None:
            return  # not a method fleet uses: the stand-in answers 404
        method, permission, resource = found
        who = self.principal(authorization)
        if who != "vm":
            self._record(Call("operator", method, (permission,), resource, True))
            return
        outcome = True if self.condition is None else decide(self.condition, compute_attributes(resource))
        if outcome is None:
            self.undetermined.append((method, resource))
        allowed = permission in self.compute_permissions and outcome is True
        self._record(Call("vm", method, (permission,), resource, allowed))
        if not allowed:
            raise ApiError(403, "forbidden", f"Required '{permission}' permission for '{resource}'")

    # -- Storage: a FaultProxy guard in front of fake-gcs-server, for the VMs only ------------------
    def _exists(self, bucket: str, name: str) -> bool:
        split = urllib.parse.urlsplit(self.upstream)
        conn = http.client.HTTPConnection(split.hostname, split.port, timeout=10)
        try:
            conn.request(
                "GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(name, safe='')}"
            )
            response = conn.getresponse()
            response.read()
            return response.status == 200
        finally:
            conn.close()

    def storage_guard(self, verb: str, path: str, headers: dict, body: bytes) -> tuple[int, dict] | None:
        request = storage_method(verb, path, body, self._exists)
        if request is None:
            return None
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        who = self.principal(auth)
        resource = f"projects/_/buckets/{request.bucket}" + (f"/objects/{request.object}" if request.object else "")
        if who is None or who == "anonymous":
            self._record(Call(who or "unknown", request.method, request.permissions, resource, False))
            if who is None:
                return 401, _gcs_error(401, "Invalid Credentials", "authError")
            return 401, _gcs_error(
                401,
                f"Anonymous caller does not have {request.permissions[0]} access to the Google Cloud Storage object.",
                "required",
            )
        missing = [p for p in request.permissions if p not in self.storage_permissions or request.bucket != self.bucket]
        self._record(Call("vm", request.method, request.permissions, resource, not missing))
        if missing:
            return 403, _gcs_error(
                403,
                f"{self.account} does not have {missing[0]} access to the Google Cloud Storage "
                f"object. Permission '{missing[0]}' denied on resource (or it may not exist).",
                "forbidden",
            )
        return None


def _gcs_error(code: int, message: str, reason: str) -> dict:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


# -- the IAM API: projects.serviceAccounts.get ------------------------------------------------------
class IamStandin:
    """``GET /v1/projects/{p}/serviceAccounts/{email}``: 200 for known accounts, 404 otherwise;
    ``denied`` answers 403 as IAM does to a caller without iam.serviceAccounts.get."""

    def __init__(self, accounts: Iterable[str] = (), denied: bool = False):
        self.accounts, self.denied = set(accounts), denied
        self.requests: list[str] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                standin.requests.append(self.path)
                status, body = standin.answer(urllib.parse.urlsplit(self.path).path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "IamStandin":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str) -> tuple[int, dict]:
        m = re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts/([^/]+)", path)
        if not m:
            return 404, {"error": {"code": 404, "message": f"no such endpoint: {path}", "status": "NOT_FOUND"}}
        email = urllib.parse.unquote(m.group(2))
        if self.denied:
            return 403, {
                "error": {
                    "code": 403,
                    "status": "PERMISSION_DENIED",
                    "message": "Permission 'iam.serviceAccounts.get' denied on resource (or it may not exist).",
                }
            }
        if email not in self.accounts:
            return 404, {"error": {"code": 404, "message": "Unknown service account", "status": "NOT_FOUND"}}
        project = email.split("@", 1)[1].split(".", 1)[0]
        return 200, {
            "name": f"projects/{project}/serviceAccounts/{email}",
            "projectId": project,
            "uniqueId": "104" + str(abs(hash(email)))[:18],
            "email": email,
            "oauth2ClientId": "1",
        }

"""Every Compute Engine call the fleet makes: it sends what fleet.gce.compute_requests builds.

Operations are waited on with our own operations clients, built with the same
client options as the resource clients: the library's
``ExtendedOperation.result()`` always polls the real Google endpoint.
Set ``FLEET_COMPUTE_ENDPOINT`` (like ``STORAGE_EMULATOR_HOST``) to talk to a
local stand-in; calls are then anonymous unless credentials are given.
"""

from __future__ import annotations

import functools
import os
import re
import time
from typing import Callable, TypeVar

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.cloud import compute_v1
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from fleet.gce.compute_requests import (
    DELETE_INSTANCES_LIMIT,
    ComputeError,
    MigState,
    Place,
    api_endpoint,
    delete_instances_body,
    mig_state,
    request_id,
)

# What a retry can cure: Google's 429 and 5xx, and the connection failing under the client. The
# REST transport raises requests' ConnectionError (a reset, a refused or dropped connection) and
# Timeout, which are not Python's ConnectionError; a token refresh that cannot reach its server
# raises google.auth's TransportError. Replaying a mutation is safe: each carries a requestId.
T = TypeVar("T")
_TRANSIENT = (
    gexc.TooManyRequests,
    gexc.InternalServerError,
    gexc.BadGateway,
    gexc.ServiceUnavailable,
    gexc.GatewayTimeout,
    ConnectionError,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    auth_exceptions.TransportError,
)

NO_CREDENTIALS = (
    "no Google credentials found on this machine: log in with `gcloud auth application-default "
    "login` (or set GOOGLE_APPLICATION_CREDENTIALS to a key file)"
)


class NoCredentials(ComputeError):
    """No Application Default Credentials: nothing can be asked of Compute Engine."""


def _one_line(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    text = re.sub(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ", "", text.strip())  # the client prefixes the URL
    return (text.splitlines() or [""])[0][:300]


def _reasons(e: gexc.GoogleAPICallError) -> set[str]:
    return {d.get("reason", "") for d in (getattr(e, "errors", None) or []) if isinstance(d, dict)}


_retrying = retry(
    retry=retry_if_exception_type(_TRANSIENT),
    wait=wait_exponential(multiplier=0.5, max=10),
    stop=stop_after_attempt(6),
    reraise=True,
)


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
            raise NoCredentials(
                f"GOOGLE_APPLICATION_CREDENTIALS={given}: {str(e).splitlines()[0]}" if given else NO_CREDENTIALS
            ) from None

    templates = functools.cached_property(lambda self: self._client(compute_v1.InstanceTemplatesClient))
    zone_ops = functools.cached_property(lambda self: self._client(compute_v1.ZoneOperationsClient))
    region_ops = functools.cached_property(lambda self: self._client(compute_v1.RegionOperationsClient))
    global_ops = functools.cached_property(lambda self: self._client(compute_v1.GlobalOperationsClient))

    @functools.cached_property
    def migs(self):
        cls = (
            compute_v1.RegionInstanceGroupManagersClient
            if self.place.regional
            else compute_v1.InstanceGroupManagersClient
        )
        return self._client(cls)

    # -- operations -----------------------------------------------------------------
    def wait(self, op: compute_v1.Operation, what: str, timeout: float = 900.0) -> None:
        """Until the operation is DONE (each `wait` call returns within about two minutes)."""
        deadline = time.monotonic() + timeout
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise ComputeError(f"{what}: operation {op.name} still {op.status.name} after {timeout:.0f}s")
            if op.zone:
                op = _retrying(self.zone_ops.wait)(
                    project=self.place.project, zone=op.zone.rsplit("/", 1)[-1], operation=op.name
                )
            elif op.region:
                op = _retrying(self.region_ops.wait)(
                    project=self.place.project, region=op.region.rsplit("/", 1)[-1], operation=op.name
                )
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

    def _create(self, what: str, get: Callable[[], T | None], insert, **request) -> tuple[bool, T | None]:
        """(True, None) once created now; else (False, what exists: None if it vanished meanwhile).

        The insert's retries share one requestId: a retry after a lost answer gets the first
        insert's operation back (and waits for it, errors and all), not a second resource."""
        existing = get()
        if existing is not None:
            return False, existing
        try:
            op = _retrying(insert)(request={**request, "request_id": request_id()})
        except gexc.Conflict:  # created meanwhile by someone else
            return False, get()
        except gexc.GoogleAPICallError as e:
            raise ComputeError(f"create {what}: {e.code} {_one_line(e)}") from e
        self.wait(op, f"create {what}")
        return True, None

    def get_template(self, name: str) -> compute_v1.InstanceTemplate | None:
        return self._get_or_none(
            self.templates.get, f"instance template {name}", project=self.place.project, instance_template=name
        )

    def ensure_template(self, template: compute_v1.InstanceTemplate) -> str:
        """Create the template, or reuse an existing one made from the same spec; 'created' or 'reused'."""
        what = f"instance template {template.name}"
        created, existing = self._create(
            what,
            lambda: self.get_template(template.name),
            self.templates.insert_unary,
            project=self.place.project,
            instance_template_resource=template,
        )
        if created:
            return "created"
        if existing is None or existing.description != template.description:
            raise ComputeError(
                f"{what} exists with other settings ({existing.description if existing else 'gone'!r}); "
                "templates cannot change: pick another --template or delete it with `fleet down`"
            )
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
                op = _retrying(self.templates.delete_unary)(
                    request={"project": self.place.project, "instance_template": name, "request_id": request_id()}
                )
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
        return self._get_or_none(
            self.migs.get, f"managed instance group {name}", instance_group_manager=name, **self.place.where()
        )

    def create_mig(self, mig: compute_v1.InstanceGroupManager) -> str:
        """Create the MIG; 'exists' if it already does with the same template (a repeated launch)."""
        what = f"managed instance group {mig.name} in {self.place.scope}"
        created, existing = self._create(
            what,
            lambda: self.get_mig(mig.name),
            self.migs.insert_unary,
            instance_group_manager_resource=mig,
            **self.place.where(),
        )
        if created:
            return "created"
        if existing is None or not existing.instance_template.endswith(mig.instance_template):
            raise ComputeError(
                f"{what} exists with template {existing.instance_template if existing else '?'}; "
                "remove it with `fleet down` first"
            )
        return "exists"

    def delete_mig(self, name: str, wait: bool = True) -> bool:
        """Delete the group and its VMs; False if absent."""
        try:
            op = _retrying(self.migs.delete_unary)(
                request={"instance_group_manager": name, **self.place.where(), "request_id": request_id()}
            )
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
            body = delete_instances_body(self.place, instances[i : i + DELETE_INSTANCES_LIMIT], skip_invalid)
            op = self._call(
                f"deleteInstances on {name}",
                self.migs.delete_instances_unary,
                request={"instance_group_manager": name, **body, **self.place.where(), "request_id": request_id()},
            )
            self.wait(op, f"deleteInstances on {name}")

    def managed_instances(self, name: str) -> list[compute_v1.ManagedInstance]:
        pager = self._call(
            f"listManagedInstances of {name}",
            self.migs.list_managed_instances,
            instance_group_manager=name,
            **self.place.where(),
        )
        return list(pager)

    def list_errors(self, name: str) -> list[compute_v1.InstanceManagedByIgmError]:
        pager = self._call(
            f"listErrors of {name}", self.migs.list_errors, instance_group_manager=name, **self.place.where()
        )
        return list(pager)

    def state(self, name: str) -> MigState | None:
        """The MIG, its instances with their current actions, and its recent errors (quota, stock-out)."""
        mig = self.get_mig(name)
        return None if mig is None else mig_state(name, mig, self.managed_instances(name), self.list_errors(name))

    # -- what `fleet launch` checks first: the region's quotas and the machine type --------------
    @property
    def region(self) -> str:
        return self.place.region_name

    def region_info(self) -> tuple[list[str], dict[str, tuple[float, float]]]:
        """The region's zones and its quotas, metric -> (limit, usage)."""
        region = self._call(
            f"regions.get {self.region}",
            self._client(compute_v1.RegionsClient).get,
            project=self.place.project,
            region=self.region,
        )
        zones = [z.rsplit("/", 1)[-1] for z in region.zones]
        return zones, {q.metric: (q.limit, q.usage) for q in region.quotas}

    def machine_vcpus(self, zone: str, machine_type: str) -> int:
        mt = self._call(
            f"machineTypes.get {machine_type} in {zone}",
            self._client(compute_v1.MachineTypesClient).get,
            project=self.place.project,
            zone=zone,
            machine_type=machine_type,
        )
        return int(mt.guest_cpus)

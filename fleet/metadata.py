"""What a worker VM knows about itself, read from the GCE metadata server.

Reads go through google-auth's metadata client, which honours
``GCE_METADATA_HOST`` (read once, when google-auth is imported), so a test
points a "VM" at a local metadata server by setting that variable before the
process starts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

ATTRIBUTES = "instance/attributes/"


class MetadataError(Exception):
    pass


@dataclass(frozen=True)
class VMIdentity:
    name: str
    project: str
    zone: str
    mig: str  # the managed instance group that created this VM
    mig_scope: str  # "zones/<zone>" or "regions/<region>": where the MIG lives

    @property
    def instance_url(self) -> str:
        return f"zones/{self.zone}/instances/{self.name}"


@functools.lru_cache(maxsize=1)
def _request():
    import google.auth.transport.requests

    return google.auth.transport.requests.Request()


def get(path: str, default: str | None = None) -> str:
    """One metadata value (text); ``default`` when the key does not exist."""
    from google.auth import exceptions
    from google.auth.compute_engine import _metadata

    try:
        value = _metadata.get(_request(), path, return_none_for_not_found_error=True)
    except exceptions.TransportError as e:
        raise MetadataError(f"metadata server: {path}: {str(e).splitlines()[0]}") from None
    if value is None:
        if default is not None:
            return default
        raise MetadataError(f"metadata server has no {path}")
    return value if isinstance(value, str) else str(value)


def attribute(key: str, default: str | None = None) -> str:
    return get(ATTRIBUTES + key, default)


def parse_created_by(created_by: str) -> tuple[str, str]:
    """'projects/123/zones/z/instanceGroupManagers/m' -> ('zones/z', 'm'); regions likewise."""
    parts = created_by.strip("/").split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] not in ("zones", "regions") \
            or parts[4] != "instanceGroupManagers":
        raise MetadataError(f"created-by {created_by!r}: this VM was not created by a managed instance group")
    return f"{parts[2]}/{parts[3]}", parts[5]


def identity() -> VMIdentity:
    scope, mig = parse_created_by(attribute("created-by"))
    return VMIdentity(
        name=get("instance/name"),
        project=get("project/project-id"),
        zone=get("instance/zone").rsplit("/", 1)[-1],
        mig=mig,
        mig_scope=scope,
    )


def credentials():
    """The VM's service account, as the metadata server hands out its tokens."""
    from google.auth import compute_engine

    return compute_engine.Credentials()

"""A finished item's outputs checked against what its lease recorded, and items reopened.

A done lease names each output with its size, sha256 and the generation the upload
created. Outputs are a pure function of the item, so an item whose outputs were
deleted or overwritten since can simply be converted again: it is reopened (its
``final/`` marker and its lease removed) and the next worker claims it as new.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Iterable

from fleet.lease import DONE, Lease
from fleet.run import RunSpec, final_prefix, lease_prefix
from fleet.store import Blob, NotFound, Store, open_store


@dataclass(frozen=True)
class Damage:
    item: str
    output: str
    why: str  # "missing", "size 10 then, 12 now", "other contents"

    def __str__(self) -> str:
        return f"item {self.item}: {self.output} {self.why}"


def _sha256_of(store: Store, name: str) -> str:
    with tempfile.TemporaryDirectory(prefix="fleet-verify-") as tmp:
        path = os.path.join(tmp, "object")
        store.download_file(name, path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()


def check_outputs(spec: RunSpec, leases: dict[str, Lease], deep: bool = False) -> list[Damage]:
    """Outputs of done items that are missing or differ from what their lease recorded.

    One listing of the output place finds missing and resized outputs. An output whose
    generation is not the one its commit recorded (rewritten since, or a lease from before
    generations were kept) is read and hashed; ``deep`` hashes every output."""
    output = open_store(spec.output)
    try:
        present: dict[str, Blob] = {b.name: b for b in output.list("part-")}
    except NotFound:
        present = {}
    damage = []
    for item, lease in sorted(leases.items()):
        if lease.state != DONE:
            continue
        for out in lease.outputs:
            name = out.get("name", "")
            blob = present.get(name)
            if blob is None:
                damage.append(Damage(item, name, "is missing"))
            elif "size" in out and blob.size != out["size"]:
                damage.append(Damage(item, name, f"has {blob.size:,} bytes, not the {out['size']:,} committed"))
            elif deep or out.get("generation") != blob.generation:
                try:
                    same = _sha256_of(output, name) == out.get("sha256")
                except NotFound:
                    damage.append(Damage(item, name, "is missing"))
                    continue
                if not same:
                    damage.append(Damage(item, name, "has other contents than committed (sha256 differs)"))
    return damage


def reopen(store: Store, run: str, items: Iterable[str]) -> None:
    """Send finished items back to pending: the marker first, so that no worker takes the
    item for finished once its lease is gone, then the lease, so the item is claimed as new."""
    for item in items:
        store.delete(final_prefix(run) + item)
        store.delete(lease_prefix(run) + item)

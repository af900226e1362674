"""A finished item's outputs checked against what its lease recorded, and items reopened.

A done lease names each output with its size, sha256, the generation the upload
created and the object's version then (in a local folder that includes the inode's
change time, which moves on a rewrite in place even when the mtime is put back).
Outputs are a pure function of the item, so an item whose outputs were deleted or
overwritten since can simply be converted again: it is reopened (its ``final/`` marker
and its lease removed) and the next worker claims it as new.

The lease is the item's one source of truth; a ``final/`` marker only caches "this lease
is finished" for a cheap listing. A marker whose lease is gone is stale: it is named and
removed, and the item is pending.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Iterable

from fleet.core.layout import (
    OUTPUT_PREFIX,
    counts_prefix,
    done_prefix,
    final_prefix,
    finishing_name,
    lease_prefix,
    shuffle_prefix,
)
from fleet.core.lease import DONE, Lease
from fleet.core.manifest import MANIFEST
from fleet.core.run import Item, RunSpec, load_items, load_spec, output_place
from fleet.core.store import Blob, NotFound, Store, open_store
from fleet.core.windows import Window, cut_windows


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


def check_outputs(
    spec: RunSpec, leases: dict[str, Lease], deep: bool = False, state: Store | None = None
) -> list[Damage]:
    """Outputs of done items that are missing or differ from what their lease recorded.

    One listing of the output place finds missing and resized outputs. An output whose
    version (or, in leases from before versions were kept, generation) is not the one its
    commit recorded is read and hashed; ``deep`` hashes every output. ``state``, the run's
    bucket: the records a stage left for the next one, and a grouped item's per-file counts
    (what the manifest's rows of its files come from), are checked there too, and the outputs are
    looked for where that state puts them (fleet.core.run.output_place: a copied or moved OUT_DIR
    of `fleet local` is checked against its own files)."""
    output = open_store(output_place(spec, state) if state is not None else spec.output)
    try:
        present: dict[str, Blob] = {b.name: b for b in output.list(OUTPUT_PREFIX)}
    except NotFound:
        present = {}
    # What items keep in the run's state: records for a stage, a grouped item's per-file counts.
    kept: dict[str, Blob] = (
        {b.name: b for prefix in (shuffle_prefix(spec.run), counts_prefix(spec.run)) for b in state.list(prefix)}
        if state is not None
        else {}
    )
    damage = []
    for item, lease in sorted(leases.items()):
        if lease.state != DONE:
            continue
        for out in lease.outputs:
            name = out.get("name", "")
            in_state = out.get("place") == "state"
            if in_state and state is None:
                continue
            blob = (kept if in_state else present).get(name)
            if blob is None:
                damage.append(Damage(item, name, "is missing"))
            elif "size" in out and blob.size != out["size"]:
                damage.append(Damage(item, name, f"has {blob.size:,} bytes, not the {out['size']:,} committed"))
            elif deep or _moved(out, blob):
                try:
                    same = _sha256_of(state if in_state and state is not None else output, name) == out.get("sha256")
                except NotFound:
                    damage.append(Damage(item, name, "is missing"))
                    continue
                if not same:
                    damage.append(Damage(item, name, "has other contents than committed (sha256 differs)"))
    return damage


def _moved(out: dict, blob: Blob) -> bool:
    """True when the object may no longer be the one committed: worth a hash."""
    if out.get("version"):
        return out["version"] != blob.version
    return out.get("generation") != blob.generation


def stale_markers(store: Store, run: str, repair: bool = False) -> list[str]:
    """Items with a ``final/`` marker but no lease: not finished, whatever the marker says.

    The leases are listed first: a marker is written after its lease is done and removed
    before its lease is, so a marker of a listed lease is never taken for stale. (One of an
    item claimed and finished between the two listings can be: removing it is harmless,
    as the next worker to read that done lease writes its marker again.)
    ``repair`` removes them (workers also do, before claiming such an item), and with them the
    ``done/`` markers of the windows (fleet.core.windows) that hold an unfinished item."""
    leased = {b.name[len(lease_prefix(run)) :] for b in store.list(lease_prefix(run))}
    finals = [b.name[len(final_prefix(run)) :] for b in store.list(final_prefix(run))]
    stale = sorted(name for name in finals if name not in leased)
    if repair:
        for item in stale:
            store.delete(final_prefix(run) + item)
        finished = set(finals) & leased
        marks = {b.name[len(done_prefix(run)) :] for b in store.list(done_prefix(run))}
        if marks:
            for w in _windows(store, run):
                if w.key in marks and not all(item in finished for item in w.items):
                    store.delete(done_prefix(run) + w.key)
    return stale


def _windows(store: Store, run: str) -> list[Window]:
    return cut_windows((i.id, i.step) for i in load_items(store, run))


def describe_stale(items: list[str]) -> str:
    """One line about stale markers, for `fleet local` and `fleet status --verify`."""
    shown = ", ".join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")
    return (
        f"{len(items)} item(s) had a final/ marker but no lease ({shown}): stale markers removed; "
        "the lease is the truth, so those items are pending and are converted again"
    )


def downstream(items: list[Item], reopened: Iterable[str]) -> list[str]:
    """The items to reopen with these in a run with stages: every item that read what one of them
    made, and so on down the chain. A combine item read only its group of the step before (its
    meta ``items``); a barrier read every item of the step before, and a stage's items read its
    barrier's index, so past the first barrier everything later is redone. They rewrite the same
    bytes; nothing else would be redone."""
    reopened = list(reopened)
    wanted = set(reopened)
    by_step: dict[int, list[Item]] = {}
    for item in items:
        by_step.setdefault(item.step, []).append(item)
    hit = {s for s, members in by_step.items() for i in members if i.id in wanted}
    if hit:
        for step in range(min(hit) + 1, max(by_step) + 1):
            before = by_step.get(step - 1, [])
            touched = [n for n, i in enumerate(before) if i.id in wanted]
            if not touched:
                continue
            for item in by_step.get(step, []):
                lo, hi = item.meta.get("items", (0, len(before))) if item.meta.get("combine") else (0, len(before))
                if any(lo <= n < hi for n in touched):
                    wanted.add(item.id)
    return list(dict.fromkeys([*reopened, *(i.id for i in items if i.id in wanted)]))


def reopen(store: Store, run: str, items: Iterable[str]) -> None:
    """Send finished items back to pending: the run's ``manifest.json`` (in the output place) and
    the claim to write it first, since a run with pending items is not finished (and finish_run,
    finding a manifest there, would write none when it finishes again); then the ``done/`` marker
    of their window, then each item's ``final/`` marker, so that no worker takes the item for
    finished once its lease is gone, then the lease, so the item is claimed as new. Workers that
    knew the window finished find out at their next sweep, which trusts the leases alone."""
    items = list(items)
    if not items:
        return
    open_store(output_place(load_spec(store, run), store)).delete(MANIFEST)
    store.delete(finishing_name(run))
    window_of = {item: w for w in _windows(store, run) for item in w.items}
    for key in sorted({window_of[item].key for item in items if item in window_of}):
        store.delete(done_prefix(run) + key)
    for item in items:
        store.delete(final_prefix(run) + item)
        store.delete(lease_prefix(run) + item)

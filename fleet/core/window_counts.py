"""A finished window's counts, kept in its ``done/`` marker, so that the end of a run reads one
object per window of items rather than one lease per item.

fleet.core.windows cuts a run's items into windows (64 items, fewer in a run under 4,096), and a worker whose listing shows
every item of a window finished writes the window's ``done/`` marker (create-only,
fleet.core.spawner). The marker's body is what :func:`window_body` gives, JSON with sorted keys::

    {"counts": 1,
     "items": {"<item>": [<lease generation>, "<state>"], ...},    # every item of the window
     "sources": {...}, "outputs": {...}}                          # manifest_of its done items

The worker that ends the run (one, fleet.core.manifest.claim_finish) then makes the manifest with
:func:`run_counts`: a listing of every lease, a read of every marker, and the leases read one by
one only where no marker holds. A marker's counts hold only if every item it names is listed now
with the generation it records, and no marker taken before names the item: a lease written since
the marker (an item reopened, or deleted by hand and converted again) makes its window's leases
be read. A marker written by code from before this (empty), or with counts that could not be read
(a grouped item's per-file counts missing), is no summary either. So the manifest is exactly
``manifest_of`` over the leases as listed, whatever the markers say; when they are all true, a
run of 100,000 items ends with 1,563 reads rather than 100,000 (about 5 minutes on Cloud Storage,
16 at a time, and 50 at a million items).

The reads move, they do not vanish: the worker marking a window reads the leases it did not
commit itself, as the run goes, spread over the fleet instead of queued on one worker at the end.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping

from fleet.core.layout import done_prefix
from fleet.core.lease import DONE, Lease
from fleet.core.manifest import CountsMissing, add_counts, manifest_of
from fleet.core.run import Item
from fleet.core.status import StatusReader
from fleet.core.store import NotFound
from fleet.core.sink import RunManifest

log = logging.getLogger("fleet.window_counts")

VERSION = 2  # 2: with "stages" (a stage's counters); a marker of 1 is no summary (its leases are read)


def window_body(items: Iterable[Item], leases: Mapping[str, tuple[Lease, int]]) -> bytes:
    """A finished window's marker body (its items' leases as read, with their generations), or
    empty when its counts cannot be exact (a lease gone, a grouped item's per-file counts unread):
    the run's end then reads that window's leases itself."""
    items = list(items)
    if any(item.id not in leases for item in items):
        return b""
    try:
        manifest = manifest_of(items, {i: lease for i, (lease, _) in leases.items()})
    except CountsMissing:
        return b""
    body = {
        "counts": VERSION,
        "items": {item.id: [leases[item.id][1], leases[item.id][0].state] for item in items},
        "sources": manifest.sources,
        "outputs": manifest.outputs,
        "stages": manifest.stages,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data) if data else None
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("counts") != VERSION:
        return None
    items = body.get("items")
    if not isinstance(items, dict) or not all(isinstance(body.get(k), dict) for k in ("sources", "outputs", "stages")):
        return None
    if not all(isinstance(v, list) and len(v) == 2 for v in items.values()):
        return None
    return body


def merge(parts: Iterable[RunManifest]) -> RunManifest:
    """Manifests of disjoint sets of items as one: a source's counters summed (a file's map items
    may fall in several windows), the outputs side by side; sorted as manifest_of sorts."""
    sources: dict[str, dict[str, int]] = {}
    outputs: dict[str, dict[str, int]] = {}
    stages: dict[str, dict[str, int]] = {}
    for part in parts:
        for name, counts in part.sources.items():
            add_counts(sources.setdefault(name, {}), counts)
        for name, counts in part.stages.items():
            add_counts(stages.setdefault(name, {}), counts)
        outputs.update(part.outputs)
    return RunManifest(
        {k: dict(sorted(v.items())) for k, v in sorted(sources.items())},
        {k: dict(sorted(v.items())) for k, v in sorted(outputs.items())},
        {k: dict(sorted(v.items())) for k, v in stages.items()},
    )


def run_counts(reader: StatusReader) -> RunManifest | None:
    """The run's manifest if every item is done as listed now, else None (an item not leased,
    unfinished, failed): from the ``done/`` markers' counts where they hold, from the leases
    elsewhere. Equal to ``manifest_of(reader.items, reader.leases())`` (see the module's note)."""
    listing = reader.listing()
    known = {item.id for item in reader.items}
    if not known <= listing.keys():
        return None
    prefix = done_prefix(reader.run)
    names = sorted(b.name for b in reader.store.list(prefix))

    def read(name: str) -> bytes:
        try:
            return reader.store.read(name)
        except NotFound:
            return b""

    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(read, names))
    covered: set[str] = set()
    parts = []
    for body in filter(None, map(_parse, bodies)):
        marked = body["items"]
        if any(i not in known or i in covered or listing[i] != gen for i, (gen, _) in marked.items()):
            continue  # a lease written since, or another window size's marker over the same items
        if any(state != DONE for _, state in marked.values()):
            return None  # failed, as listed now
        covered.update(marked)
        parts.append(RunManifest(body["sources"], body["outputs"], body["stages"]))
    rest = [item for item in reader.items if item.id not in covered]
    leases = {i: lease for i, (lease, _) in reader.read_leases({i.id: listing[i.id] for i in rest}).items()}
    if any(getattr(leases.get(item.id), "state", None) != DONE for item in rest):
        return None
    parts.append(manifest_of(rest, leases))
    log.info(
        "run counts: %d of %d items from %d window marker(s), %d lease(s) read",
        len(covered),
        len(known),
        len(parts) - 1,
        len(rest),
    )
    return merge(parts)

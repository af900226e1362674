"""The resume repair: what a run's state must have put right before its workers go on, in one
place for `fleet local` (resuming a run) and `fleet status --verify`.

A run's state can be left wrong by what no worker sees: a lease object damaged (a disk filled,
a hand edit), a ``final/`` marker whose lease was deleted by hand, a lease held by a worker of an
earlier `fleet local` that died (kill -9), an output removed or rewritten since its item was done.
Each is put right the same way: the item goes back to pending (fleet.core.verify.reopen), with
every later-stage item that read what it made (fleet.core.verify.downstream), and is converted
again into the same bytes. :func:`repair_run` does all of it and says what it did (:class:`Repair`);
the commands say it in their own words.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from fleet.core.layout import lease_prefix, released_prefix
from fleet.core.lease import DONE, LEASED, Lease
from fleet.core.liveness import worker_alive
from fleet.core.status import StatusReader
from fleet.core.store import NotFound, PreconditionFailed, Store
from fleet.core.verify import Damage, check_outputs, downstream, reopen, stale_markers


@dataclass
class Repair:
    """What :func:`repair_run` found and did, by item id."""

    stale: list[str] = field(default_factory=list)  # final/ markers without a lease: removed
    damaged: dict[str, str] = field(default_factory=dict)  # lease objects that could not be read: why
    freed: int = 0  # leases of dead workers given back (``release``)
    lost: list[Damage] = field(default_factory=list)  # done items whose outputs are gone or changed
    retried: list[str] = field(default_factory=list)  # failed items sent back (``retry_failed``)
    later: list[str] = field(default_factory=list)  # later-stage items redone with the ones above
    done: int = 0  # done items whose outputs were checked

    @property
    def hit(self) -> list[str]:
        """The items found wrong and sent back (``later`` went with them), in the order found."""
        return list(dict.fromkeys(list(self.damaged) + sorted({d.item for d in self.lost}) + self.retried))


def repair_run(
    store: Store, reader: StatusReader, deep: bool = False, release: bool = False, retry_failed: bool = False
) -> Repair:
    """Put the run's state right (see the module's note): stale markers removed; with
    ``release``, leases of workers that no longer beat given back (only where no other machine's
    worker may hold one: `fleet local`); then every damaged lease, every done item whose outputs
    are gone or changed (their digests read again with ``deep``, else their versions), and with
    ``retry_failed`` every failed item, sent back to pending with the later-stage items that
    read them."""
    fix = Repair(stale=stale_markers(store, reader.run, repair=True))
    if fix.stale:  # pending now: the run is not finished, so its manifest and its ended drain go too
        reopen(store, reader.run, fix.stale)
    if release:
        fix.freed = release_dead(store, reader)
    leases = reader.leases()
    fix.done = sum(1 for lease in leases.values() if lease.state == DONE)
    fix.damaged = {item: lease.error or "" for item, lease in leases.items() if lease.damaged}
    fix.lost = check_outputs(reader.spec, leases, deep=deep, state=store)
    if retry_failed:
        fix.retried = [item for item, lease in leases.items() if lease.state == "failed" and not lease.damaged]
    hit = fix.hit
    if hit:
        fix.later = [i for i in downstream(reader.items, hit) if i not in hit and i in leases]
        reopen(store, reader.run, hit + fix.later)
    return fix


def release_dead(store: Store, reader: StatusReader) -> int:
    """Leases still held by workers of an earlier `fleet local` that no longer run (a kill -9,
    a crash) are given back now, instead of making the resumed run wait out their TTL. Their
    attempt stays counted: an item that kills its worker must still end failed."""
    now = time.time()
    beats = {w.get("worker"): w for w in reader.workers()}
    freed = 0
    for item, lease in reader.leases().items():
        if lease.state != LEASED or not lease.live(now):
            continue
        beat = beats.get(lease.worker)
        if beat is not None and worker_alive(beat, reader.spec.lease_ttl, now):
            continue
        name = lease_prefix(reader.run) + item
        try:
            data, gen = store.read_generation(name)
            if Lease.parse(data, name) != lease:
                continue  # it moved on since we looked
            store.write(name, dataclasses.replace(lease, expires=0.0).to_json(), if_generation_match=gen)
            store.write(released_prefix(reader.run) + item, b"", idempotent=True)  # taken at once, not after TTL/2
            freed += 1
        except (PreconditionFailed, NotFound):
            continue
    return freed

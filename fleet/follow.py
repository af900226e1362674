"""Following a run from the trainer: each committed output once, in commit order, as items finish.

Every finished item is an immutable, committed output (its lease says done and names
its files), so training can start before the data is done: a follower polls the
``final/`` markers (one listing), reads the leases of the items newly finished, and
hands on their outputs sorted by commit time. It ends when every item is finished;
the failed ones are then in ``failed``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from fleet.layout import final_prefix, lease_prefix
from fleet.lease import DONE, FAILED, Lease
from fleet.run import load_spec
from fleet.store import NotFound, Store, open_store


@dataclass(frozen=True)
class Output:
    url: str  # where to read it: gs://... or a local path
    item: str
    committed: float  # when its item was committed (the lease's finish time)
    size: int
    sha256: str


@dataclass
class Follower:
    """Iterate over a run's outputs as they are committed.

    ``from_start``: also the outputs committed before the follower started (a trainer
    that starts mid-run catches up); otherwise only those committed after.
    """

    bucket: str
    run: str
    from_start: bool = True
    poll: float = 2.0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (item, error), known once drained
    _seen: set[str] = field(default_factory=set)

    def __iter__(self) -> Iterator[Output]:
        store = open_store(self.bucket)
        spec = load_spec(store, self.run)
        output_root = spec.output.rstrip("/")
        skip_before = 0.0 if self.from_start else time.time()
        prefix = final_prefix(self.run)
        idle = 0
        while True:
            finished = [b.name[len(prefix):] for b in store.list(prefix)]
            if idle >= 5:  # no marker for a while: a committer may have died before writing one
                finished += [b.name[len(lease_prefix(self.run)):] for b in store.list(lease_prefix(self.run))]
                idle = 0
            fresh = [item for item in dict.fromkeys(finished) if item not in self._seen]
            found: list[tuple[float, str, Lease]] = []
            for item in fresh:
                lease = _lease(store, self.run, item)
                if lease is None:
                    continue  # reopened since (fleet status --verify): it will finish again
                self._seen.add(item)
                if lease.state == FAILED:
                    self.failed.append((item, lease.error or ""))
                elif lease.state == DONE:
                    found.append((lease.finished, item, lease))
            for committed, item, lease in sorted(found):
                if committed < skip_before:
                    continue
                for out in lease.outputs:
                    yield Output(f"{output_root}/{out['name']}", item, committed, int(out.get("size", 0)),
                                 str(out.get("sha256", "")))
            if len(self._seen) >= spec.items:
                return
            idle = 0 if found or any(item in self._seen for item in fresh) else idle + 1
            time.sleep(self.poll)


def _lease(store: Store, run: str, item: str) -> Lease | None:
    name = lease_prefix(run) + item
    try:
        lease = Lease.parse(store.read(name), f"{store.url}/{name}")
    except NotFound:
        return None
    return lease if lease.state in (DONE, FAILED) else None


def follow(bucket: str, run: str, from_start: bool = True, poll: float = 2.0) -> Follower:
    """``for out in follow("gs://b", "wiki"): train_on(out.url)``; see Follower."""
    return Follower(bucket, run, from_start, poll)

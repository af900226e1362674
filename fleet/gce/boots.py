"""What a run's VMs record about their boots, and the run's stop when boots keep failing.

startup/startup.sh writes these with nothing but curl (it must, when Python or the code is
what failed), at the names fleet.core.layout gives it; this module reads them for `fleet status`
and clears the stop for a new launch:

    runs/<run>/boots/<instance>-<boot>      one record per VM boot: outcome, reason, last log lines.
                                            <boot> differs for every boot, so a VM the MIG recreates
                                            under the same name never overwrites its predecessor's
    runs/<run>/failed-boots/<n>/<name>      one marker per failed boot, n = items finished when it failed:
                                            the markers under the current n are the failures since the
                                            run last finished an item
    runs/<run>/stopped.json                 written by the VM whose failure made that count reach the
                                            limit (3), or whose boot the run's deadline ended (no VM can
                                            start after it); it then deleted the MIG and the template
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.core.layout import boots_prefix, failed_prefix, stop_name
from fleet.core.records import JsonRecord
from fleet.core.store import NotFound, Store


@dataclass
class BootRecord(JsonRecord):
    instance: str
    boot: str
    outcome: str  # booting, done, failed, stopped
    reason: str = ""
    zone: str = ""
    code_version: str = ""
    started: float = 0.0
    updated: float = 0.0
    log_tail: str = ""


@dataclass
class StopRecord(JsonRecord):
    instance: str  # <instance>-<boot> of the VM that stopped the run
    failed_boots: int
    items_finished: int
    reason: str  # the last failed boot's
    time: float = 0.0
    deadline: float = 0.0  # set when the run's deadline stopped it

    def line(self) -> str:
        """What `fleet status` says, in one line."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.time)) if self.time else "at an unknown time"
        if self.deadline:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.deadline))
            return (
                f"the run reached its deadline {at} with {self.items_finished} item(s) finished: every VM was "
                f"stopped and {self.instance} deleted the MIG and the template. `fleet launch` again (with a later "
                "--deadline or more --max-run-hours) to go on"
            )
        return (
            f"the run stopped itself {when}: {self.failed_boots} VM boots failed with no item finished "
            f"in between (the MIG and the template are deleted); last failure, on {self.instance}: "
            f"{self.reason}. Fix that, then `fleet launch` again"
        )


def load_stop(store: Store, run: str) -> StopRecord | None:
    try:
        data = store.read(stop_name(run))
    except NotFound:
        return None
    try:
        return StopRecord.from_json(data)
    except (ValueError, TypeError) as e:
        return StopRecord("?", 0, 0, f"{store.url}/{stop_name(run)} is damaged ({e})")


def boot_records(store: Store, run: str) -> list[BootRecord]:
    out = []
    for blob in store.list(boots_prefix(run)):
        try:
            out.append(BootRecord.from_json(store.read(blob.name)))
        except (NotFound, ValueError, TypeError):
            continue
    return sorted(out, key=lambda b: b.started)


def clear_stop(store: Store, run: str) -> None:
    """A new launch starts counting failed boots afresh (boot records stay: they are history)."""
    for blob in list(store.list(failed_prefix(run))):
        store.delete(blob.name)
    store.delete(stop_name(run))


def summary(records: list[BootRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    return counts

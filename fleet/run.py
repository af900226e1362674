"""A run: its spec (run.json) and its immutable list of work items.

Both are written once, create-only, by ``fleet plan``; every worker reads
them, so a worker never needs anything but the bucket URL and the run name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fleet.inputs import InputFile, Slice, cut_ranges, describe, find_inputs
from fleet.job import load_job
from fleet.records import JsonRecord
from fleet.store import PreconditionFailed, Store, open_store, read_url

log = logging.getLogger("fleet.plan")


class PlanError(Exception):
    pass


@dataclass(frozen=True)
class Item(Slice):
    """A work item: a slice of an input file, with the id its lease and outputs are named by."""

    id: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def slice(self) -> Slice:
        return Slice(self.url, self.name, self.start, self.end, self.format, self.compression)


@dataclass(frozen=True)
class RunSpec(JsonRecord):
    run: str
    job: str
    config: dict[str, Any]
    output: str
    code_version: str
    lease_ttl: float = 300.0
    max_attempts: int = 3
    items: int = 0
    input_bytes: int = 0
    created: float = field(default=0.0, compare=False)


def run_prefix(run: str) -> str:
    return f"runs/{run}"


def spec_name(run: str) -> str:
    return f"{run_prefix(run)}/run.json"


def items_name(run: str) -> str:
    return f"{run_prefix(run)}/items.jsonl"


def lease_prefix(run: str) -> str:
    return f"{run_prefix(run)}/leases/"


def final_prefix(run: str) -> str:
    """Create-once markers of finished items: one listing tells every worker what is left."""
    return f"{run_prefix(run)}/final/"


def worker_prefix(run: str) -> str:
    return f"{run_prefix(run)}/workers/"


def idle_prefix(run: str) -> str:
    """An empty object per idle worker: one listing finds the standby candidates."""
    return f"{run_prefix(run)}/idle/"


def check_run_name(run: str) -> None:
    if not run or not all(c.isalnum() or c in "-_." for c in run) or run.startswith("."):
        raise PlanError(f"run name {run!r}: use letters, digits, '-', '_' and '.' only")


def make_items(inputs: list[InputFile], item_bytes: int) -> list[Item]:
    """Cut every input into items of about item_bytes, at document boundaries."""
    pieces: list[tuple[InputFile, int, int, str, str]] = []
    stores: dict[str, Store] = {}
    for inp in inputs:
        if inp.size == 0:  # shown on stderr even where logging is not set up (logging.lastResort)
            log.warning("warning: %s: empty file, nothing to convert; skipped", inp.display)
            continue
        fmt, compression = describe(inp.name)
        if compression != "none":
            pieces.append((inp, 0, inp.size, fmt, compression))
            continue
        store = stores.setdefault(inp.url, open_store(inp.url))
        for start, end in cut_ranges(store, inp.name, inp.size, fmt, item_bytes):
            pieces.append((inp, start, end, fmt, compression))
    width = max(5, len(str(len(pieces) - 1)))
    return [
        Item(inp.url, inp.name, start, end, fmt, comp, id=f"{i:0{width}d}")
        for i, (inp, start, end, fmt, comp) in enumerate(pieces)
    ]


def plan(
    bucket: str,
    run: str,
    job_name: str,
    inputs: list[str],
    output: str,
    settings: dict[str, str],
    code_version: str,
    lease_ttl: float = 300.0,
    max_attempts: int = 3,
    item_bytes: int = 64 << 20,
) -> tuple[RunSpec, list[Item], bool]:
    """Write run.json and the items; returns (spec, items, created_now).

    Planning the same run again with the same inputs and options is a no-op,
    so `fleet local` can resume; different options are refused rather than
    mixed into one run.
    """
    check_run_name(run)
    job = load_job(job_name)
    config = job.parse_config(settings)
    job.check(config, read_url)
    found = find_inputs(inputs)
    if output.startswith("gs://"):
        # A missing or unreadable output bucket would otherwise show only at each item's upload.
        next(iter(open_store(output).list("")), None)
    items = make_items(found, item_bytes)
    if not items:
        raise PlanError(f"{', '.join(inputs)}: the inputs hold no data")
    spec = RunSpec(
        run=run,
        job=job_name,
        config=dataclasses.asdict(config),
        output=output,
        code_version=code_version,
        lease_ttl=lease_ttl,
        max_attempts=max_attempts,
        items=len(items),
        input_bytes=sum(i.size for i in items),
        created=time.time(),
    )
    store = open_store(bucket)
    items_blob = b"".join(json.dumps(dataclasses.asdict(i), sort_keys=True).encode() + b"\n" for i in items)
    created = True
    try:
        store.write(items_name(run), items_blob, if_generation_match=0)
    except PreconditionFailed:
        created = False
        if store.read(items_name(run)) != items_blob:
            raise PlanError(f"run {run!r} in {store.url} was planned with other inputs; use another run name") from None
    try:
        store.write(spec_name(run), spec.to_json(), if_generation_match=0)
    except PreconditionFailed:
        old = load_spec(store, run)
        if old != spec:
            changed = [f.name for f in dataclasses.fields(RunSpec) if f.compare and getattr(old, f.name) != getattr(spec, f.name)]
            raise PlanError(
                f"run {run!r} in {store.url} was planned with other {', '.join(changed)}; "
                "use another run name (or output folder)"
            ) from None
        return old, items, False
    return spec, items, created


def load_spec(store: Store, run: str) -> RunSpec:
    from fleet.store import BucketNotFound, NotFound

    try:
        return RunSpec.from_json(store.read(spec_name(run)))
    except BucketNotFound:
        raise
    except NotFound:
        raise PlanError(f"no run {run!r} in {store.url} (plan it first with `fleet plan`)") from None


def load_items(store: Store, run: str) -> list[Item]:
    data = store.read(items_name(run))
    return [Item(**json.loads(line)) for line in data.splitlines() if line.strip()]


def list_runs(store: Store) -> list[str]:
    return sorted({b.name.split("/")[1] for b in store.list("runs/") if b.name.endswith("/run.json")})

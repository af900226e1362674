"""A run's exact counts (fleet.core.sink.RunManifest), from its leases, and the files only a finished
run can write: ``manifest.json`` and the job's own (``Job.run_files``).

Per output: what the converter recorded with ``Sink.count`` (the lease keeps it in the output's
entry, ``"counts"``). Per source (input file): the integer counters of the map items cut from it,
summed. The items of later stages read no single file (a dedup or shard item mixes every
source), so their counters are in no source's row: they are in the run's totals, and what they
wrote is in the per-output counts. A grouped item (small files packed into one) is read file by
file: each file's row is its bytes and what the job counted of that file (``ItemInput.count``:
the text jobs count documents and bad records), kept in a counts object beside the lease
(fleet.core.attempt.part_counts); what the item made of its files together (examples that pack
several, tokens) is in the run's totals and the per-output counts, as a stage item's is.
``seconds`` (a duration, not a count) and float counters (ratios) are left out, so the manifest
is a pure function of the outputs (and of the plan's account of the input files, kept in the
run's spec) and is the same whoever computes it, whenever.

``manifest.json`` is written once every item is done (never with an item failed or blocked),
create-only: the workers that find the run drained and ``fleet local`` may all try, and all write
the same bytes (sorted keys, no time stamp), so the first wins and the others find it equal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any, Iterable, Iterator, Mapping

from fleet.core.job import Job
from fleet.core.sink import RunManifest
from fleet.core.layout import MANIFEST, OUTPUT_PREFIX, SUMMARY, finishing_name
from fleet.core.lease import DONE, Lease
from fleet.core.run import Item, RunSpec
from fleet.core.store import NotFound, PreconditionFailed, Store

log = logging.getLogger("fleet.manifest")

RESERVED = (MANIFEST, SUMMARY)  # names a job's run file may not take (fleet local writes the second)
NOT_COUNTS = ("seconds",)  # stats that are measured, not counted: they differ between attempts


def counters(stats: Mapping[str, Any]) -> dict[str, int]:
    """The exact counts among an item's stats: integers, durations left out."""
    return {k: v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool) and k not in NOT_COUNTS}


MAX_SUFFIX = "_max"  # a counter named so is a largest value: items' values combine by max, not sum


def add_counts(into: dict[str, Any], counts: Mapping[str, Any]) -> None:
    """Items' counters combined: summed, except those ending ``_max`` (the largest wins)."""
    for name, value in counts.items():
        into[name] = max(into.get(name, value), value) if name.endswith(MAX_SUFFIX) else into.get(name, 0) + value


class CountsMissing(ValueError):
    """A done grouped item's per-file counts could not be read: the manifest would be inexact."""


def manifest_of(items: Iterable[Item], leases: Mapping[str, Lease], strict: bool = True) -> RunManifest:
    """The counts of the done items (all of a finished run's), in name order. A grouped item's
    files each get the row its per-file counts give (``Lease.part_counts``, loaded by
    fleet.core.status.StatusReader); without them, CountsMissing, or (not ``strict``: a
    look at a run in progress) no rows for its files."""
    sources: dict[str, dict[str, int]] = {}
    outputs: dict[str, dict[str, int]] = {}
    stages: dict[str, dict[str, int]] = {}
    for item in items:
        lease = leases.get(item.id)
        if lease is None or lease.state != DONE:
            continue
        if item.parts:
            rows = lease.part_counts
            if rows is None or len(rows) != len(item.parts):
                if strict:
                    raise CountsMissing(
                        f"item {item.id}: its counts per input file "
                        f"({'not read' if rows is None else f'{len(rows)} rows'}, "
                        f"{len(item.parts)} files); `fleet status --verify` converts it again"
                    )
                rows = []
            for part, row in zip(item.parts, rows):
                add_counts(sources.setdefault(part.file, {}), counters(row))
        elif not item.step:
            add_counts(sources.setdefault(item.file, {}), counters(lease.stats))
        if item.step and item.meta.get("stage") and not item.meta.get("barrier") and not item.meta.get("combine"):
            add_counts(stages.setdefault(item.meta["stage"], {}), counters(lease.stats))
        for out in lease.outputs:
            if out.get("place") != "state":
                outputs[out["name"]] = counters(out.get("counts") or {})
    return RunManifest(
        {k: dict(sorted(v.items())) for k, v in sorted(sources.items())},
        {k: dict(sorted(v.items())) for k, v in sorted(outputs.items())},
        {k: dict(sorted(v.items())) for k, v in stages.items()},
    )


def totals(rows: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Each counter summed over the rows (sources or outputs)."""
    out: dict[str, int] = {}
    for counts in rows.values():
        add_counts(out, counts)
    return dict(sorted(out.items()))


def manifest_json(spec: RunSpec, manifest: RunManifest) -> bytes:
    """``manifest.json``: the run, its job, per source and per output counts and their totals, and
    the plan's account of every file found under the inputs (read or skipped: RunSpec.input_files).
    Bytes that depend on the leases and the run's spec only, so every writer writes the same."""
    body = {
        "run": spec.run,
        "job": spec.job,
        "sources": manifest.sources,
        "outputs": manifest.outputs,
        "totals": {"sources": totals(manifest.sources), "outputs": totals(manifest.outputs)},
    }
    if manifest.stages:  # per stage after the map, its items' counters (what dedup dropped, its clusters)
        body["stages"] = manifest.stages
    if spec.input_files:  # (a run planned before accounts were kept has none: its manifest as it was)
        body["input_files"] = spec.input_files
    return (json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def run_files(job: Job, config: Any, spec: RunSpec, manifest: RunManifest) -> dict[str, bytes]:
    """Every file the finished run writes into the output place, by name: the job's, then the
    manifest (written last, so that a manifest there says the job's files are there too)."""
    files = {}
    for name, data in sorted(job.run_files(config, manifest).items()):
        parts = name.split("/")
        if (
            name in RESERVED
            or name.startswith(OUTPUT_PREFIX)
            or any(p in ("", ".", "..") for p in parts)
            or "\\" in name
        ):
            raise ValueError(f"job {spec.job}: run file {name!r} is taken or not a plain relative name")
        if not isinstance(data, bytes):
            raise TypeError(f"job {spec.job}: run file {name!r} is {type(data).__name__}, not bytes")
        files[name] = data
    files[MANIFEST] = manifest_json(spec, manifest)
    return files


def write_run_files(output: Store, files: Mapping[str, bytes]) -> list[str]:
    """Create-only writes of the run's files. One already there with the same bytes was written by
    another worker (fine); with other bytes, it is left alone and named in the result."""
    differ = []
    for name, data in files.items():
        try:
            output.write(name, data, if_generation_match=0)
        except PreconditionFailed:
            try:
                there = output.read(name)
            except NotFound:  # removed between the two calls: whoever removed it meant it
                continue
            if there != data:
                differ.append(name)
    return differ


def finish_run(
    output: Store, job: Job, config: Any, spec: RunSpec, manifest: RunManifest | None
) -> tuple[RunManifest | None, list[str]]:
    """If every item is done (``manifest``: fleet.core.window_counts.run_counts, None if not):
    the manifest, written with the job's run files (and the names of those found there with
    other bytes). Else (None, []), nothing written."""
    if manifest is None:
        return None, []
    differ = write_run_files(output, run_files(job, config, spec, manifest))
    for name in differ:
        log.warning("%s/%s holds other bytes than this run's leases give; left as it is", output.url, name)
    return manifest, differ


def claim_finish(
    store: Store, run: str, worker: str, stale_after: float, now: float | None = None, started: float | None = None
) -> int | None:
    """Whether this worker is the one to confirm the drain and write the run's files (the claim's
    generation, or None): it created the claim, or took over one not renewed for ``stale_after``
    seconds (its writer died before the run ended), or one whose drain ended before this worker
    ``started`` (an earlier drain's: a lease deleted by hand since is this worker's to find).
    The holder renews it (:func:`holding_finish`) and ends it (:func:`end_claim`)."""
    now = time.time() if now is None else now
    name = finishing_name(run)
    try:
        return store.write(name, _claim(worker, now), if_generation_match=0)
    except PreconditionFailed:
        pass
    try:
        data, generation = store.read_generation(name)
        body = json.loads(data)
        claimed, ended = float(body.get("claimed", 0)), body.get("ended")
    except NotFound:
        return None  # removed between the calls: the next worker to look claims it
    except (ValueError, TypeError, AttributeError):
        claimed, ended = 0.0, None  # not a claim: take it over
    if ended is not None:
        if started is None or float(ended) >= started:
            return None  # this drain's: ended already (run_ended says so)
    elif now - claimed < stale_after:
        return None
    try:
        return store.write(name, _claim(worker, now), if_generation_match=generation)
    except PreconditionFailed:
        return None  # another took it over first


def _claim(worker: str, now: float) -> bytes:
    return json.dumps({"worker": worker, "claimed": now}, sort_keys=True).encode()


def run_ended(store: Store, run: str, since: float) -> bool:
    """Whether a worker ended the run's drain at or after ``since`` (wall clock): it confirmed by
    a listing of every lease and marker that every item is finished, and wrote the run's files
    (or found them due to no one: an item failed). A drain is a moment: the workers that were
    there when it ended trust it and leave, and one that starts later checks for itself."""
    try:
        ended = json.loads(store.read(finishing_name(run))).get("ended")
    except NotFound:
        return False
    except (ValueError, TypeError, AttributeError):
        return False
    return ended is not None and float(ended) >= since


def end_claim(store: Store, run: str, worker: str, generation: int, files: str, now: float | None = None) -> None:
    """The holder's last word on the claim: the drain is confirmed and the run's files are
    ``files`` ("written", "not due": an item failed, or why not). Generation-matched: a holder
    whose claim was taken over says nothing. Reopening an item removes the object first."""
    now = time.time() if now is None else now
    body = {"worker": worker, "claimed": now, "ended": now, "files": files}
    try:
        store.write(finishing_name(run), json.dumps(body, sort_keys=True).encode(), if_generation_match=generation)
    except PreconditionFailed:
        log.warning("the claim to end the run was taken over; its new holder ends it")


class Renewal:
    """The claim's generation as its renewals move it (what :func:`end_claim` must match)."""

    def __init__(self, generation: int):
        self.generation = generation


@contextlib.contextmanager
def holding_finish(store: Store, run: str, worker: str, generation: int, every: float) -> Iterator[Renewal]:
    """Renew the claim every ``every`` seconds while the drain is confirmed and the run's files are
    made: a listing of every lease and marker of a big run, and the windows' counts read, may
    take longer than a TTL, and a claim left to age would be taken over by each worker that
    drains meanwhile, every one of them listing and reading again. A
    renewal that fails (taken over, the store down) stops renewing: the files are create-only and
    the same bytes, so a second writer only costs reads."""
    stop = threading.Event()
    held = Renewal(generation)

    def renew() -> None:
        while not stop.wait(every):
            try:
                held.generation = store.write(
                    finishing_name(run), _claim(worker, time.time()), if_generation_match=held.generation
                )
            except Exception as e:  # advisory, as the claim is
                log.warning("the claim to write the run's files was not renewed (%s)", e)
                return

    thread = threading.Thread(target=renew, name="finish-claim", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()

"""Issue 28, the tail: the worker that ends a run read every lease to make the manifest (100,000
leases, 16 at a time: about 5 minutes on Cloud Storage, 50 at a million items, while the fleet
waits). A finished window's ``done/`` marker now holds its counts (fleet.core.window_counts), so
the end reads a marker per window, and a lease only where no marker holds.

The invariant: whatever the markers say (true, stale, empty, garbage, overlapping, missing), the
manifest is exactly ``manifest_of`` over the leases as listed, or None when an item is not done.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from fleet.core.layout import done_prefix, lease_prefix
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.manifest import MANIFEST, manifest_json, manifest_of
from fleet.core.run import Item, RunSpec, load_spec
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.core.store.metered import MeteredStore
from fleet.core.window_counts import run_counts, window_body
from tests.test_small_files import local, one_line_files
from tests.helpers.procs import LINEJOB

RUN = "r"
SPEC = RunSpec(run=RUN, job="j", config={}, output="/out", code_version="v")


def make_item(i: int, file: str, step: int = 0) -> Item:
    return Item("/in", file, 0, 1, id=f"{i:05d}", step=step)


def lease_of(item: Item, counts: int, state: str = DONE) -> Lease:
    return Lease(
        state,
        "w",
        1,
        0.0,
        outputs=[{"name": f"part-{item.id}.x", "counts": {"records": counts}}],
        stats={"documents": counts, "seconds": 0.5},
    )


def write_lease(store, item: Item, lease: Lease) -> int:
    return store.write(lease_prefix(RUN) + item.id, lease.to_json())


def mark(store, key: str, body: bytes) -> None:
    store.write(done_prefix(RUN) + key, body)


def windows(items: list[Item], size: int) -> list[list[Item]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def body_now(store, reader_items: list[Item], window: list[Item]) -> bytes:
    reader = StatusReader(store, RUN, spec=SPEC, items=reader_items)
    listed = reader.listing()
    return window_body(window, reader.read_leases({i.id: listed[i.id] for i in window}))


MARKERS = st.sampled_from(["true", "true", "stale", "empty", "garbage", "missing", "overlap"])


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 40),
    size=st.integers(1, 9),
    kinds=st.lists(MARKERS, min_size=1, max_size=12),
    failed=st.integers(-1, 60),
    gone=st.integers(-1, 60),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_counts_are_the_leases_exactly_whatever_the_markers_say(n, size, kinds, failed, gone, seed):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(folder)
        items = [make_item(i, f"f{rng.randrange(3)}.txt", step=0 if i < n * 2 // 3 else 2) for i in range(n)]
        for item in items:
            write_lease(store, item, lease_of(item, rng.randrange(1000)))
        for w, kind in zip(windows(items, size), kinds * n):
            key = f"{size}-0-{w[0].id}"
            if kind == "missing":
                continue
            if kind in ("true", "stale"):
                body = body_now(store, items, w)
            elif kind == "overlap":  # a marker of another window size, over this window and the item before
                body = body_now(store, items, items[max(0, items.index(w[0]) - 1) :][: size + 1])
            else:
                body = b"" if kind == "empty" else b'{"counts": 1, "items": ['
            mark(store, key if kind != "overlap" else f"{size + 1}-0-{w[0].id}", body)
            if kind == "stale":  # the item converted again since the marker (other counts, a new generation)
                write_lease(store, w[-1], lease_of(w[-1], 10**6 + rng.randrange(1000)))
        if 0 <= failed < n:
            write_lease(store, items[failed], lease_of(items[failed], 1, FAILED))
        if 0 <= gone < n:
            store.delete(lease_prefix(RUN) + items[gone].id)
        leases = StatusReader(store, RUN, spec=SPEC, items=items).leases()
        want = (
            manifest_of(items, leases) if len(leases) == n and all(x.state == DONE for x in leases.values()) else None
        )
        got = run_counts(StatusReader(store, RUN, spec=SPEC, items=items))
        assert got == want
        if want is not None:  # the same bytes of manifest.json, too
            assert manifest_json(SPEC, got) == manifest_json(SPEC, want)


def _reads_at_the_end(tmp_path: Path, n: int) -> tuple[int, int]:
    """(reads, list pages) of run_counts on a finished run of ``n`` items, 64 a window, every
    window's marker true."""
    store = open_store(str(tmp_path / f"n{n}"))
    items = [make_item(i, f"f{i % 7}.txt") for i in range(n)]
    for i, item in enumerate(items):
        write_lease(store, item, lease_of(item, i))
    for w in windows(items, 64):
        mark(store, f"64-0-{w[0].id}", body_now(store, items, w))
    metered = MeteredStore(store, page=1000)
    got = run_counts(StatusReader(metered, RUN, spec=SPEC, items=items))
    assert got == manifest_of(items, StatusReader(store, RUN, spec=SPEC, items=items).leases())
    counts = metered.meter.snapshot()
    return counts.reads, counts.list_pages


def test_the_end_of_a_run_reads_a_marker_per_window_not_a_lease_per_item(tmp_path):
    """At 640 and 2,560 items: one read per window of 64 (10 and 40), no lease read. The old end
    read every lease (640 and 2,560)."""
    small, big = _reads_at_the_end(tmp_path, 640), _reads_at_the_end(tmp_path, 2560)
    assert small == (640 // 64, 2) and big == (2560 // 64, 4)  # (pages: the leases' and the markers')


def test_workers_keep_each_windows_counts_and_the_end_reads_no_lease(tmp_path):
    """Three workers on 600 small files grouped into items (per-file counts beside each lease):
    every done/ marker holds its window's counts, taken as they are by the run's end, and
    manifest.json is what the leases give."""
    one_line_files(tmp_path / "in", 600)
    result, _ = local([tmp_path / "in"], tmp_path / "out", LINEJOB, workers=3, item_bytes=400)
    assert result.status.items >= 24
    store = open_store(str(tmp_path / "out" / ".fleet"))
    run = "local"
    reader = StatusReader(store, run)
    assert any(item.parts for item in reader.items)
    markers = [json.loads(store.read(b.name)) for b in store.list(done_prefix(run))]
    covered = [i for body in markers for i in body["items"]]
    assert sorted(covered) == sorted(item.id for item in reader.items)  # each item in one marker
    metered = MeteredStore(store)
    got = run_counts(StatusReader(metered, run))
    assert metered.meter.snapshot().reads == 2 + len(markers)  # run.json, items.jsonl, the markers: no lease
    spec = load_spec(store, run)
    assert manifest_json(spec, got) == (tmp_path / "out" / MANIFEST).read_bytes()
    assert got == manifest_of(reader.items, reader.leases())

"""The whole bill (issue 28): `fleet status` prints the store requests a run's workers made and
what they cost, saying where the count is not the whole; `fleet launch --dry-run`'s estimate
of the bucket operations grows with the items as the coordination model does, linearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.core.layout import STATE_DIR, worker_prefix
from fleet.core.store import open_store
from fleet.core.store.metered import RequestCounts
from fleet.gce import estimate
from tests.helpers.cli import fleet
from tests.helpers.procs import LINEJOB, write_corpus

WIDE = {"COLUMNS": "400"}  # one table row a line


def _status(out: Path, *args: str):
    proc = fleet("status", out, *args, env=WIDE)
    assert proc.returncode == 0, proc.stderr
    return proc


def _beats(out: Path) -> dict[str, dict]:
    store = open_store(str(out / STATE_DIR))
    prefix = worker_prefix("local")
    return {b.name[len(prefix) :]: json.loads(store.read(b.name)) for b in store.list(prefix)}


def _rewrite_beat(out: Path, name: str, beat: dict) -> None:
    open_store(str(out / STATE_DIR)).write(worker_prefix("local") + name, json.dumps(beat).encode())


def test_status_of_a_finished_local_run_prints_its_requests_and_their_cost(tmp_path):
    corpus = tmp_path / "in"
    corpus.mkdir()
    write_corpus(str(corpus / "a.txt"), 40)
    out = tmp_path / "out"
    run = fleet("local", corpus, out, "--job", LINEJOB, "--workers", "2", "--item-mb", "0.002", tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    beats = _beats(out)
    # Each worker's last heartbeat is a final one: it exited, or `fleet local` stopped it once the run
    # was done (a worker stopped before it ever beat, while it started, has none).
    assert beats and {b["state"] for b in beats.values()} <= {"exited", "stopped"}
    total = sum((RequestCounts.from_dict(b["requests"]) for b in beats.values()), RequestCounts())
    st = json.loads(_status(out, "--json").stdout)
    items = st["items"]
    assert items > 4
    assert st["requests"]["counts"] == total.to_dict()
    assert st["requests"]["complete"] == len(beats) and not (st["requests"]["cut"] or st["requests"]["missing"])
    # Each item is claimed and committed, marked final, its output uploaded and stat'ed.
    assert total.writes >= 4 * items and total.stats >= items and total.list_pages >= 2
    line = next(line for line in _status(out).stdout.splitlines() if "store requests" in line)
    cost = estimate.PRICES.usd(total.class_a, total.class_b)
    assert (
        f"{total.class_a:,} Class A ({total.list_pages:,} list pages, {total.writes:,} writes), "
        f"{total.class_b:,} Class B ({total.reads:,} reads, {total.stats:,} stats), {total.deletes:,} free "
        f"(deletes): ≈ {estimate.usd(cost)} at Cloud Storage list price"
    ) in line
    assert "so far" not in line

    # A worker that died before its final heartbeat, one whose heartbeat carries no counts: said so.
    name, beat = sorted(beats.items())[0]
    _rewrite_beat(out, name, dict(beat, state="working", updated=beat["updated"] - 3600))
    _rewrite_beat(out, "old", {k: v for k, v in beat.items() if k != "requests"} | {"worker": "old"})
    text = _status(out).stdout
    caveats = [line for line in text.splitlines() if line.startswith("requests:")]
    assert len(caveats) == 2, text
    assert f"1 worker(s) stopped before their final heartbeat (a VM killed, a kill -9: {name})" in caveats[0]
    assert "1 worker(s) left heartbeats without request counts (code from before they were counted: old)" in caveats[1]
    assert f"{total.class_a:,} Class A" in next(line for line in text.splitlines() if "store requests" in line)
    st = json.loads(_status(out, "--json").stdout)["requests"]
    assert (st["complete"], st["cut"], st["missing"]) == (len(beats) - 1, [name], ["old"])


# -- the dry run's estimate of the bucket's operations ------------------------------------------------
def test_bucket_operations_grow_linearly_with_the_items():
    """Four times the items, with the fleet the same: no more operations per item (the fleet's own
    share is spread over more items), and the per-item share four times over: nothing per item
    grows with the run."""
    small, big = (estimate.bucket_estimate([0] * n, n * 64_000_000, processes=800) for n in (25_000, 100_000))
    for what in ("list_pages", "writes", "reads", "usd"):  # per item, no more at four times the items
        assert getattr(big, what) / 100_000 <= getattr(small, what) / 25_000, what
    for what in ("writes", "reads"):  # and all but the fleet's fixed share grows as the items do
        assert 3.9 < getattr(big, what) / getattr(small, what) < 4.0001, what
    # What it is made of, by hand: 1.1 list calls an item, each of the 800 processes' 34 calls that do
    # not grow with its items, and the drain's 3 listings of leases/ and final/ (100 pages each).
    m = estimate.MODEL
    assert big.list_pages == pytest.approx(100_000 * 1.1 + 800 * 34 + 3 * 2 * 100)
    assert big.writes == pytest.approx(
        100_000 * (2.3 + 1.25 + 1.2 + 2 / 64 + 2.3 + 1.0)
    )  # (done/: created, then its counts)
    assert (m.list_calls, m.process_calls, m.drains) == (1.1, 34, 3)
    assert big.reads == pytest.approx(100_000 * (0.3 + 1.0 + 1.0 + 1 / 64 + 2.0) + 800 * 2)  # (+ a done/ read a window)
    assert big.usd == pytest.approx((big.list_pages + big.writes) * 0.005 / 1000 + big.reads * 0.0004 / 1000)
    assert big.shuffle is None


def test_the_shuffles_reads_are_one_formula_over_map_items_shards_and_bytes():
    reads = estimate.shuffle_reads(1563, 1024, 100 * 10**9)
    # docs/coordination.md projects 1.6 million ranged reads for 100 GB in 64 MB items, --shards 1024.
    assert reads.reads == 2 * 1563 + 1024 * (1563 + 3) and round(reads.reads / 1e6, 1) == 1.6
    assert 100 * 10**9 < reads.bytes < 101 * 10**9  # every record once, and headers and index rows
    steps = [0] * 1563 + [1] + [2] * 1024  # the map, the barrier, the stage (fleet.core.run.StepPlan)
    stages = [estimate.Boundary(1563, 1024)]
    with_stage = estimate.bucket_estimate(steps, 100 * 10**9, processes=1600, stages=stages)
    without = estimate.bucket_estimate(steps[:1563], 100 * 10**9, processes=1600)
    assert with_stage.shuffle == reads and with_stage.reads > reads.reads > without.reads
    lines = estimate.estimate(
        [64_000_000] * 1563 + [0] * 1025,
        200,
        8,
        0,
        True,
        estimate.Rates(5.0, 3.0, 0.0335, 0.01),
        None,
        item_steps=steps,
        stages=stages,
    ).lines()
    shuffle = next(line for line in lines if "shuffle" in line)
    assert f"{reads.reads:,} ranged reads" in shuffle and f"≈ {estimate.usd(reads.reads * 0.0004 / 1000)}" in shuffle


def test_the_dry_run_lines_state_the_bucket_operations_beside_the_machines():
    e = estimate.estimate(
        [64_000_000] * 100,
        workers=5,
        vcpus=4,
        workers_per_vm=0,
        spot=True,
        rates=estimate.Rates(5.0, 3.0, 0.0335, 0.01),
        max_run_hours=None,
    )
    text = "\n".join(e.lines())
    b = e.bucket
    assert b.items == 100 and e.bucket_usd == b.usd
    assert (
        f"bucket operations: ≈ {b.class_a:,.0f} Class A ({b.list_pages:,.0f} list pages, {b.writes:,.0f} writes) "
        f"and {b.class_b:,.0f} Class B (reads), ≈ {estimate.usd(b.usd)} at $0.005 and $0.0004 per 1,000"
    ) in text
    assert f"price range: ≈ $0.01 to $0.20 for the machines, + ≈ {estimate.usd(b.usd)} of bucket operations" in text


@pytest.mark.parametrize(
    "amount, shown",
    [(0, "$0.00"), (0.0123, "$0.01"), (1234.5, "$1,234.50"), (0.0043, "$0.0043"), (0.00004321, "$0.000043")],
)
def test_small_amounts_keep_two_significant_digits(amount, shown):
    assert estimate.usd(amount) == shown


def test_the_price_is_the_published_one_per_operation_class():
    """cloud.google.com/storage/pricing-examples: 10,000 Class A operations cost $0.05 and 50,000
    Class B $0.02 (Standard storage in a region)."""
    prices = estimate.OperationPrices()
    assert prices.usd(10_000, 0) == pytest.approx(0.05) and prices.usd(0, 50_000) == pytest.approx(0.02)


def test_a_combine_step_makes_the_shuffles_reads_grow_with_the_bytes_not_with_map_items_times_shards():
    """1 TB in 64 MB items and --shards 1024: 16 million ranged reads straight from the map's files;
    through the combine step the plan gives (groups of 64 in 5 key blocks: docs/coordination.md),
    about 490,000 (410,000 of them read records, the rest leases and index rows). And the run's
    own chain of steps says where its boundaries are."""
    from fleet.core.run import RunSpec, StepPlan
    from fleet.core.shuffle import Combine

    direct = estimate.shuffle_reads(15_625, 1024, 10**12)
    combined = estimate.shuffle_reads(15_625, 1024, 10**12, Combine(64, 5))
    assert direct.reads > 16_000_000 and 450_000 < combined.reads < 520_000
    double = estimate.shuffle_reads(2 * 15_625, 1024, 2 * 10**12, Combine(64, 5))
    assert 1.9 < double.reads / combined.reads < 2.1  # twice the data, twice the reads
    spec = RunSpec(
        "r",
        "j",
        {},
        "gs://b/o",
        "v",
        stages=[{"name": "shards", "items": 1024, "balanced": True}],
        combine=[{"group": 64, "blocks": 5}],
    )
    steps = [0] * 15_625 + [1] * 245 * 5 + [2] + [3] * 1024
    assert estimate.boundaries(StepPlan(spec), steps) == [estimate.Boundary(15_625, 1024, Combine(64, 5))]


# -- a name that lives again: a VM the MIG recreated, a `fleet local` resumed ------------------------------
def test_a_worker_that_takes_an_earlier_workers_name_keeps_that_lifes_requests_in_the_tally(tmp_path):
    """A Spot VM the MIG recreates keeps its name, and so its workers' names (<vm>-w0): the new
    life's heartbeat overwrites the old one's. The requests the old life made were dropped from
    `fleet status`'s count and cost; the new life carries them, and a life that died before its
    final heartbeat is named as cut."""
    from fleet.core.spawner import Worker
    from fleet.core.status import StatusReader
    from tests.test_run_state import RUN, _plan

    bucket, items = _plan(tmp_path, docs=30)
    assert len(items) > 3
    lives = []
    for _ in range(2):
        worker = Worker(bucket, RUN, name="vm-a-w0", poll=0.01)
        try:
            worker.run_until_drained()  # the second finds the run drained, and leaves
        finally:
            worker.close()
        lives.append(worker.store.meter.snapshot())
    store = open_store(bucket)
    beat = json.loads(store.read(worker_prefix(RUN) + "vm-a-w0"))
    beat.update(state="working")  # as a life the VM's preemption cut short
    store.write(worker_prefix(RUN) + "vm-a-w0", json.dumps(beat).encode())
    worker = Worker(bucket, RUN, name="vm-a-w0", poll=0.01)
    try:
        worker.run_until_drained()
    finally:
        worker.close()
    lives.append(worker.store.meter.snapshot())
    tally = StatusReader(open_store(bucket), RUN).collect(with_workers=True).requests
    assert tally is not None and tally.counts == lives[0] + lives[1] + lives[2]
    assert tally.counts.writes >= 4 * len(items)  # the first life's claims and commits among them
    assert tally.cut == ["vm-a-w0 (an earlier life)"] and tally.complete == 1


def test_vm_hours_count_every_life_of_a_vm_name_and_not_the_gap_between_them():
    """Per VM name: the union of its workers' spans (start to last beat) over its lives. A VM
    recreated an hour after its preemption ran 2 hours, not 3 (first start to last beat) and not 1
    (the last life alone, all a heartbeat held before it carried the earlier ones)."""
    from fleet.gce.gcp import vm_usage

    t = 1.8e9
    earlier = {"lives": [[t, t + 3600, False]], "requests": {}}
    workers = [
        {"worker": "vm-a-w0", "started": t + 7200, "updated": t + 10800, "earlier": earlier},
        {"worker": "vm-a-w1", "started": t + 7210, "updated": t + 9000, "earlier": earlier},
        {"worker": "vm-b-w0", "started": t, "updated": t + 1800},
        {"worker": "vm-c-w0", "started": t, "updated": 0},  # no beat with a time: no span
    ]
    vms, hours = vm_usage(workers)
    assert vms == 2 and hours == pytest.approx(2.0 + 0.5)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_LIVES = st.fixed_dictionaries(
    {},
    optional={
        "lives": st.lists(
            st.tuples(st.floats(1e9, 2e9), st.floats(1e9, 2e9), st.booleans()).map(list) | _JSON, max_size=3
        )
        | _JSON,
        "requests": st.fixed_dictionaries({"writes": st.integers(0, 9), "reads": st.integers(0, 9)}) | _JSON,
    },
)


@given(
    st.fixed_dictionaries(
        {"worker": st.just("vm-a-w0")},
        optional={
            "earlier": _LIVES | _JSON,
            "started": st.floats(1e9, 2e9) | _JSON,
            "updated": st.floats(1e9, 2e9) | _JSON,
            "requests": st.fixed_dictionaries({"writes": st.integers(0, 9)}) | _JSON,
            "state": st.sampled_from(["exited", "working", "idle"]) | _JSON,
        },
    )
)
def test_whatever_a_heartbeat_holds_the_lives_it_carries_are_read_without_an_error(beat):
    """A heartbeat is advisory: a malformed one (a bucket object anyone can write) never stops a
    worker that takes its name, nor `fleet status`; what it carries that is well formed is kept."""
    import time

    from fleet.core.status import EarlierLives, earlier_lives, tally_requests
    from fleet.gce.gcp import vm_usage

    lives = earlier_lives(beat)
    again = EarlierLives.of({"earlier": lives.to_dict()})
    assert again == lives and 1 <= len(lives.lives) <= 4  # the lives carried (at most 3), and this one
    tally_requests([beat, {"worker": "vm-b-w0", "earlier": lives.to_dict()}], 60, time.time())
    vm_usage([beat, {"worker": "vm-b-w0", "earlier": lives.to_dict()}])

"""Store requests per item of a run on a local folder, as its workers counted them, at a few sizes.

    .venv/bin/python bench/bench_requests.py [--items 400 1600] [--workers 4] [--standby N]
    .venv/bin/python bench/bench_requests.py --projection     # the dry run's model at 100 GB to 10 TB

For each size, a corpus cut into about that many 1 kB items of the line-copying test job
(tests/helpers/linejob.py: conversion costs nothing, so coordination is all there is), `fleet
plan` and one `fleet work --procs W` (not `fleet local`, which stops its workers once the items
are done, perhaps before their last heartbeat), and the request counts the heartbeats carry
(fleet.core.store.metered, summed as `fleet status` sums them): per item, by kind and billing
class, and what a million such items would cost at Cloud Storage's list price. Beside them,
what the dry run's model (fleet.gce.estimate.RequestModel) says for the same items and
processes. A count per item that grows with the items is a cost that grows with the run; the
model is the claim loop that should not (replace its figures with what this prints once the
claim loop is that one). The figures are for a local folder's latencies: a claim loop's
passes, and so its listings, are more where a request costs 50 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fleet.core.layout import worker_prefix  # noqa: E402
from fleet.core.run import load_items  # noqa: E402
from fleet.core.status import tally_requests  # noqa: E402
from fleet.core.store import open_store  # noqa: E402
from fleet.gce.estimate import PRICES, bucket_estimate  # noqa: E402
from tests.helpers.procs import LINEJOB, write_corpus  # noqa: E402

RUN = "bench"
ITEM_BYTES = 1000  # the smallest item `fleet local --item-mb` takes
KINDS = ("list_pages", "writes", "reads", "stats", "deletes")


def run(items: int, workers: int, standby: int | None, folder: str) -> tuple[int, object]:
    """`fleet plan` and `fleet work` of about ``items`` items on a local folder; the items planned
    and the workers' summed counts (each worker leaves on its own: its last heartbeat is final)."""
    corpus = os.path.join(folder, f"in-{items}")
    os.makedirs(corpus)
    probe = write_corpus(os.path.join(folder, "probe.txt"), docs=1000)
    per_doc = os.path.getsize(probe) / 1000
    write_corpus(os.path.join(corpus, "a.txt"), docs=round(items * ITEM_BYTES / per_doc))
    bucket = os.path.join(folder, f"bucket-{items}")
    for command in (
        [
            "plan",
            "--bucket",
            bucket,
            "--run",
            RUN,
            "--job",
            LINEJOB,
            "--input",
            corpus,
            "--output",
            os.path.join(folder, f"out-{items}"),
            "--item-mb",
            str(ITEM_BYTES / 1e6),
            "--lease-ttl",
            "60",
        ],
        [
            "work",
            "--bucket",
            bucket,
            "--run",
            RUN,
            "--procs",
            str(workers),
            "--log-dir",
            os.path.join(folder, f"logs-{items}"),
        ]
        + (["--standby", str(standby)] if standby is not None else []),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "fleet.cli", *command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=dict(os.environ, TMPDIR=folder),
        )
        if proc.returncode != 0:
            sys.exit(f"fleet {command[0]} failed: {proc.stderr.strip()[-2000:]}")
    store = open_store(bucket)
    planned = len(load_items(store, RUN))
    beats = [json.loads(store.read(b.name)) for b in store.list(worker_prefix(RUN))]
    tally = tally_requests(beats, 60.0, float("inf"))
    if tally.cut or tally.missing or tally.running:
        print(f"  note: {len(tally.cut) + len(tally.missing) + len(tally.running)} worker(s) without final counts")
    return planned, tally.counts


def projection() -> None:
    """The dry run's estimate (fleet.gce.estimate) at docs/costs.md's sizes: 200 VMs x 4 worker
    processes, 64 MB items, the planning figures of fleet.toml (5 MB/s per vCPU, e2-standard-4 Spot)."""
    from fleet.core.shuffle import CombineRule, partitions_for, plan_combine
    from fleet.gce.estimate import Boundary, Rates, estimate, usd

    rates = Rates(mb_per_vcpu_s=5.0, boot_minutes=3.0, vcpu_hour_usd=0.0335, spot_vcpu_hour_usd=0.0100)
    print("200 VMs x 4 worker processes, 64 MB items, e2-standard-4 Spot at 5 MB/s per vCPU")
    print(f"{'input':>34} {'items':>8} {'list pages':>11} {'writes':>10} {'reads':>10} {'bucket':>8} {'machines':>9}")
    runs = [(f"{gb:,} GB", [64_000_000] * (gb * 1000 // 64), None, ()) for gb in (100, 1000, 10_000)]
    for gb in (100, 1000):
        maps = gb * 1000 // 64
        # A stage of 1,024 items: the map, its barrier and the stage, and the combine step the plan
        # gives it by default (fleet.core.run.plan_combines), or none.
        combine = plan_combine(CombineRule(), maps, partitions_for(1024, True), 1024, 64e6)
        for c, label in ((None, "no combine"), (combine, f"combine {combine.group}x{combine.blocks}")):
            extra = [1] * (math.ceil(maps / c.group) * c.blocks) if c else []
            steps = [0] * maps + extra + [2 if c else 1] + [3 if c else 2] * 1024
            stage = Boundary(maps, 1024, c) if c else Boundary(maps, 1024)
            runs.append(
                (f"{gb:,} GB, --shards 1024, {label}", [64_000_000] * maps + [0] * (len(steps) - maps), steps, [stage])
            )
    for label, sizes, steps, stages in runs:
        e = estimate(sizes, 200, 4, 0, True, rates, None, item_steps=steps, stages=stages)
        b = e.bucket
        print(
            f"{label:>34} {len(sizes):>8,} {b.list_pages:>11,.0f} {b.writes:>10,.0f} {b.class_b:>10,.0f} "
            f"{usd(b.usd):>8} {usd(e.expected_usd):>9}"
            + (
                f"   (the shuffle: {b.shuffle.reads:,} reads, {usd(PRICES.usd(0, b.shuffle.reads))})"
                if b.shuffle
                else ""
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[400, 1600])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--standby", type=int, default=None, help="fleet work --standby (a VM's is 2)")
    parser.add_argument(
        "--projection",
        action="store_true",
        help="Print the dry run's estimate at 100 GB, 1 TB and 10 TB instead (no runs)",
    )
    args = parser.parse_args()
    if args.projection:
        projection()
        return
    print(
        f"fleet work --procs {args.workers}, the line-copying job on ~1 kB items; requests per item "
        f"(the workers' heartbeats), and $ per million items at ${PRICES.class_a_per_1000:g} (Class A) and "
        f"${PRICES.class_b_per_1000:g} (Class B) per 1,000"
    )
    header = (
        f"{'items':>7} {'':9}" + "".join(f"{k:>11}" for k in KINDS) + f"{'Class A':>9}{'Class B':>9}{'$/M items':>11}"
    )
    print(header)
    with tempfile.TemporaryDirectory(prefix="bench-requests-") as folder:
        for n in args.items:
            items, counts = run(n, args.workers, args.standby, folder)
            model = bucket_estimate([0] * items, items * 1000, processes=args.workers)
            rows = [
                (
                    "measured",
                    [getattr(counts, k) / items for k in KINDS],
                    counts.class_a / items,
                    counts.class_b / items,
                ),
                (
                    "model",
                    [model.list_pages / items, model.writes / items, model.reads / items, 0.0, 0.0],
                    model.class_a / items,
                    model.class_b / items,
                ),
            ]
            for label, per, a, b in rows:
                cost = PRICES.usd(a, b) * 1e6
                print(
                    f"{items if label == 'measured' else '':>7} {label:9}"
                    + "".join(f"{v:11.2f}" for v in per)
                    + f"{a:9.2f}{b:9.2f}{cost:11.2f}"
                )
    print(
        "(the model counts stats among reads, and a map item's input reads, 2.0, which the workers do not count:\n"
        " the job reads its input through a store of its own; deletes are free)"
    )


if __name__ == "__main__":
    main()

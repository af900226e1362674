"""A run of a million items: what planning it costs, and what a worker holds to work on it.

Plans a run of N one-document items (a local corpus of N short documents, ``--item-mb`` just
under one document, so each document is an item) on a local store, in a process of its own, and
prints the plan's wall time and peak RSS; then, in another process, what a worker does before its
first claim (reads the item list, builds its claim policy: fleet.core.claims) and its peak RSS.
Both grow with N (the item list is the run); the point is that a million fits.

    .venv/bin/python bench/bench_plan.py                 # 100,000 and 1,000,000 items: ~6 min
    .venv/bin/python bench/bench_plan.py --items 20000
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = "document {:07d} of the corpus, one line\n\n"


def plan_one(folder: str, n: int) -> None:
    from fleet.core.run import PlanRequest, plan

    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(n):
            f.write(DOC.format(i))
    t0 = time.perf_counter()
    _, items, _ = plan(
        os.path.join(folder, "bucket"),
        PlanRequest(
            run="big",
            job="tests.helpers.sleepjob:JOB",
            inputs=[corpus],
            output=os.path.join(folder, "out"),
            code_version="bench",
            item_bytes=len(DOC.format(0)) - 1,
        ),
    )
    assert len(items) == n, len(items)
    print(f"{time.perf_counter() - t0:.1f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}")


def worker_start(folder: str, n: int) -> None:
    from fleet.core.claims import ClaimPolicy
    from fleet.core.run import load_items
    from fleet.core.store import open_store

    t0 = time.perf_counter()
    items = load_items(open_store(os.path.join(folder, "bucket")), "big")
    ClaimPolicy([i.id for i in items], "bench-w0", 300.0, steps={i.id: i.step for i in items if i.step}, barriers=[])
    by_id = {i.id: i for i in items}
    assert len(by_id) == n
    print(f"{time.perf_counter() - t0:.1f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}")


def child(what: str, folder: str, n: int) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, folder, str(n)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, ROOT)
        what, folder, n = args.child
        (plan_one if what == "plan" else worker_start)(folder, int(n))
        return
    print(f"{'items':>10} {'plan s':>8} {'plan peak MB':>13} {'worker start s':>15} {'worker peak MB':>15}")
    for n in args.items:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-plan-") as folder:
            plan_s, plan_mb = child("plan", folder, n)
            start_s, start_mb = child("start", folder, n)
        print(f"{n:>10,} {plan_s:>8.1f} {plan_mb:>13,} {start_s:>15.1f} {start_mb:>15,}", flush=True)


if __name__ == "__main__":
    main()

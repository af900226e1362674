"""Throughput of the shuffle's data path in pure Python: PartitionWriter (emit + finish, with a
budget smaller than the data, so it spills and merges) and reduce_records over the files.

Records of 600 bytes (an ELECTRA record). The shuffle stage must cost at most 25% of the map
stage, which tokenizes at ~5 MB/s per core: so >= 20 MB/s per core end to end, and we aim for
>= 40 MB/s for write + merge.

    .venv/bin/python bench/bench_shuffle.py [--mb 100] [--budget-mb 32] [--pieces 4] [--items 8]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import tempfile
import time

from fleet.core.shuffle import PartitionWriter, ShufflePiece, build_index, load_index, partitions_for, reduce_records
from fleet.core.store import open_store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--budget-mb", type=int, default=32)
    ap.add_argument("--record", type=int, default=600)
    ap.add_argument("--pieces", type=int, default=4, help="map items (partition files)")
    ap.add_argument("--items", type=int, default=8, help="reduce items")
    ap.add_argument("--balanced", action="store_true")
    args = ap.parse_args()
    rng = random.Random(0)
    blob = os.urandom(1 << 20)
    n = args.mb * 1_000_000 // args.record
    per_piece = n // args.pieces
    data_mb = per_piece * args.pieces * (args.record + 12) / 1e6
    partitions = partitions_for(args.items, args.balanced)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(os.path.join(tmp, "bucket"))
        os.makedirs(store.root)
        pieces = []
        t_emit = t_finish = 0.0
        spills = 0
        for p in range(args.pieces):
            work = os.path.join(tmp, f"map{p}")
            os.makedirs(work)
            values = [blob[(o := rng.randrange(len(blob) - args.record)) : o + args.record] for _ in range(per_piece)]
            keys = [rng.getrandbits(64) for _ in range(per_piece)]
            writer = PartitionWriter(work, partitions, budget=(args.budget_mb << 20) // args.pieces)
            t0 = time.perf_counter()
            for k, v in zip(keys, values):
                writer.emit(k, v)
            t1 = time.perf_counter()
            del keys, values
            path = writer.finish()
            t2 = time.perf_counter()
            t_emit, t_finish, spills = t_emit + t1 - t0, t_finish + t2 - t1, spills + writer.spills
            store.upload_file(f"map/{p}.kv", path)
            os.unlink(path)
            pieces.append(ShufflePiece(str(p), f"map/{p}.kv", store.stat(f"map/{p}.kv").version))
        t0 = time.perf_counter()
        store.write("index", build_index(store, pieces, partitions))
        index = load_index(store, "index")
        t_index = time.perf_counter() - t0
        work = os.path.join(tmp, "reduce")
        os.makedirs(work)
        t0 = time.perf_counter()
        got = 0
        for i in range(args.items):
            for _ in reduce_records(store, index, i, args.items, args.balanced, work):
                got += 1
        t_reduce = time.perf_counter() - t0
        assert got == per_piece * args.pieces, (got, per_piece * args.pieces)
    write = t_emit + t_finish
    print(
        f"{data_mb:.0f} MB in {per_piece * args.pieces} records of {args.record} B, {args.pieces} pieces, "
        f"P={partitions}, budget {args.budget_mb} MB over the pieces ({spills} spills)"
    )
    print(
        f"write:  {data_mb / write:6.1f} MB/s  (emit {data_mb / t_emit:.1f} MB/s, finish {data_mb / t_finish:.1f} MB/s)"
    )
    print(f"index:  {t_index * 1000:.0f} ms")
    print(f"reduce: {data_mb / t_reduce:6.1f} MB/s  ({args.items} items{', balanced' if args.balanced else ''})")
    print(
        f"write + reduce: {data_mb / (write + t_reduce):6.1f} MB/s; peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (with one piece's records "
        "generated up front: see tests/test_shuffle.py for memory)"
    )


if __name__ == "__main__":
    main()

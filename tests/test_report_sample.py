"""The report of a run's records reads a uniform sample of them all, not its first files (issue 33,
item 6): on a run whose files differ, its figures match a full parse within sampling error."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.formats import tfrecord
from fleet_jobs.text.tools.report import ReportError, count_records, read_report, sample

BLOCK = 64


def blocks(fills: list[int]) -> list[dict[str, list[int]]]:
    """causal_lm-like blocks: ``fill`` real tokens each, the rest padding masked out."""
    return [
        {"input_ids": list(range(1, n + 1)) + [0] * (BLOCK - n), "attention_mask": [1] * n + [0] * (BLOCK - n)}
        for n in fills
    ]


def write_tfrecord(path, rows, gz=False):
    data = b"".join(tfrecord.frame(tfrecord.int64_example(row)) for row in rows)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def write_parquet(path, rows):
    pq.write_table(pa.table({k: [r[k] for r in rows] for k in rows[0]}), path, row_group_size=100)


@pytest.fixture
def uneven_run(tmp_path):
    """A run whose first file is all full blocks and the others short ones, in every format:
    the first file alone says fill 1.0; the run's is far lower."""
    rng = np.random.default_rng(7)
    fills = []
    first = [BLOCK] * 1500
    write_tfrecord(tmp_path / "part-00000.tfrecord", blocks(first))
    fills += first
    for i, kind in enumerate(("tfrecord", "tfrecord.gz", "parquet", "tfrecord"), start=1):
        mine = rng.integers(4, 24, size=1500).tolist()
        path = tmp_path / f"part-{i:05d}.{kind}"
        if kind == "parquet":
            write_parquet(path, blocks(mine))
        else:
            write_tfrecord(path, blocks(mine), gz=kind.endswith(".gz"))
        fills += mine
    return tmp_path, np.array(fills)


def test_a_sample_of_the_run_matches_its_full_parse_within_sampling_error(uneven_run):
    folder, fills = uneven_run
    full = read_report(str(folder), max_records=10**9)
    assert full.records == full.total == len(fills) and not full.sampled
    assert full.fill_ratio == pytest.approx(fills.mean() / BLOCK)
    part = read_report(str(folder), max_records=600)
    assert part.records == 600 and part.total == len(fills) and part.sampled
    # the fill of one block is a share in [0, 1]: its standard error is at most 0.5 / sqrt(n)
    assert abs(part.fill_ratio - full.fill_ratio) < 4 * 0.5 / math.sqrt(600), (part.fill_ratio, full.fill_ratio)
    assert full.fill_ratio < 0.4 < 0.9 < fills[:1500].mean() / BLOCK  # the first file alone is far off
    text = part.text()
    assert text.startswith(
        f"records: 600 sampled at random from {len(fills):,} in 5 files (a share within ±4.00% at 95%"
    )
    assert read_report(str(folder), max_records=600).text() == text  # seeded: the same report again


@settings(max_examples=60)
@given(counts=st.lists(st.integers(0, 50), min_size=1, max_size=8), share=st.floats(0.01, 1.5))
def test_the_sample_is_max_records_distinct_records_within_each_file(counts, share):
    total = sum(counts)
    wanted = max(1, int(total * share))
    drawn = sample(counts, wanted)
    if total <= wanted:
        assert drawn is None
        return
    assert drawn is not None and len(drawn) == len(counts)
    assert sum(len(d) for d in drawn) == wanted
    for d, n in zip(drawn, counts):
        assert all(0 <= i < n for i in d.tolist()) and list(d) == sorted(set(d.tolist()))


def test_counting_walks_every_format_and_a_damaged_file_is_named(uneven_run):
    folder, _ = uneven_run
    assert [count_records(str(p)) for p in sorted(folder.iterdir())] == [1500] * 5
    plain = folder / "part-00001.tfrecord"
    plain.write_bytes(plain.read_bytes()[:-7])  # the last record cut short
    with pytest.raises(ReportError, match=r"part-00001.tfrecord: truncated record at byte \d+"):
        count_records(str(plain))
    gz = folder / "part-00002.tfrecord.gz"
    cut = gz.read_bytes()
    gz.write_bytes(cut[: len(cut) // 2])
    with pytest.raises(ReportError, match="part-00002.tfrecord.gz: "):
        count_records(str(gz))

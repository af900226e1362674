"""``output=mds`` (issue 33 item 2): MosaicML Streaming's MDS shards and the run's ``index.json``,
held to mosaicml-streaming's own ``MDSWriter`` (the same shard bytes for the same samples) and read
back with its own ``StreamingDataset`` (the rows the Parquet output of the same run holds), with
``--shards``, zstd, and the fleet's own readers (``follow_examples``, the report).

mosaicml-streaming runs in a child process (tests/helpers/mosaic.py says why).
"""

from __future__ import annotations

import glob
import io
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.follow import follow_examples
from fleet.formats import mds
from fleet.formats.writer import Column
from fleet.job import ConfigError, StageOptions
from fleet_jobs.text.output import check_output
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from fleet_jobs.text.tools.report import read_report
from tests.helpers.mosaic import Child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("en", "zh")]
mosaic = Child().call  # mosaicml-streaming's reader and writer, one child process for the tests here


def streaming_rows(out, tmp_path) -> dict[str, np.ndarray]:
    """Every sample of the run in ``out`` as ``StreamingDataset(remote=out)`` reads them, per column
    (an array per feature; a list per column of other values: the fields carried along)."""
    dump = str(tmp_path / "rows.npz")
    mosaic("read", str(out), str(tmp_path / "cache"), dump)
    with open(dump + ".json") as f:
        return {**dict(np.load(dump)), **json.load(f)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """The samples' first 8 lines of every document, in three files (several items each)."""
    docs = []
    for path in SAMPLES:
        with open(path, encoding="utf-8") as f:
            docs += [
                "\n".join([ln for ln in block.split("\n") if ln.strip()][:8])
                for block in f.read().split("\n\n")
                if block.strip()
            ]
    folder = tmp_path_factory.mktemp("corpus")
    paths = []
    for i in range(3):
        path = folder / f"in-{i}.txt"
        path.write_text("".join(doc + "\n\n" for doc in docs[i::3]), encoding="utf-8")
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, corpus) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    lines = [ln for p in corpus for ln in open(p, encoding="utf-8").read().split("\n") if ln.strip()]
    write_vocab(train_vocab(lines, 3000), path)
    return path


def run(corpus, out, vocab, job: str, shards: int = 0, **settings) -> None:
    console = Console(file=io.StringIO(), width=200)
    values = {"vocab_file": vocab, "max_seq_length": "64", **{k: str(v) for k, v in settings.items()}}
    if job == "causal_lm":
        values = {"vocab_file": vocab, "max_seq_length": "64", **{k: str(v) for k, v in settings.items()}}
    result = run_local(
        corpus, str(out), job, 2, values, item_bytes=20_000, console=console, stage_options=StageOptions(shards, "")
    )
    assert result.exit_code == 0, console.file.getvalue()


def parquet_rows(out) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(glob.glob(os.path.join(str(out), "part-*.parquet")))]
    names = tables[0].column_names
    return {name: np.array([row for t in tables for row in t.column(name).to_pylist()]) for name in names}


# -- real runs, read by StreamingDataset ------------------------------------------------------


@pytest.mark.parametrize(
    "job, shards, compression",
    [("electra_zh_en", 0, "none"), ("bert", 2, "zstd"), ("causal_lm", 0, "zstd:9")],
)
def test_streaming_dataset_reads_the_rows_the_parquet_output_of_the_run_holds(
    corpus, vocab, tmp_path, job, shards, compression
):
    run(corpus, tmp_path / "parquet", vocab, job, shards, output="parquet")
    run(corpus, tmp_path / "mds", vocab, job, shards, output="mds", compression=compression)
    want = parquet_rows(tmp_path / "parquet")
    got = streaming_rows(tmp_path / "mds", tmp_path)
    assert int(got.pop("__length__")) == len(next(iter(want.values()))) > 0
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        assert got[name].shape == values.shape
        np.testing.assert_array_equal(got[name], values, err_msg=name)
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    suffix = ".mds" if compression == "none" else ".mds.zstd"
    listed = [s["zip_data"]["basename"] if s["zip_data"] else s["raw_data"]["basename"] for s in index["shards"]]
    assert listed == sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(str(tmp_path / "mds"), "part-*" + suffix))
    )
    if shards:
        assert len(listed) == shards
    summary = json.loads((tmp_path / "mds" / "summary.json").read_text())
    assert sum(s["samples"] for s in index["shards"]) == summary["examples"]


def test_the_fleets_own_readers_read_mds_as_parquet(corpus, vocab, tmp_path):
    run(corpus, tmp_path / "parquet", vocab, "bert", output="parquet")
    run(corpus, tmp_path / "mds", vocab, "bert", output="mds", compression="zstd")

    def in_order(examples):  # follow hands items over as they were committed: workers race
        return sorted(examples, key=lambda ex: [ex[name].tobytes() for name in sorted(ex)])

    got = in_order(follow_examples(str(tmp_path / "mds")))
    want = in_order(follow_examples(str(tmp_path / "parquet")))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
            assert a[name].dtype == b[name].dtype
    report = read_report(str(tmp_path / "mds"))
    assert report.records == report.total == len(want)


def test_mds_and_its_compressions_are_checked_at_plan_time():
    for output, compression in (("mds", "GZIP"), ("mds", "zstd:23"), ("mds", "snappy"), ("parquet", "zstd")):
        with pytest.raises(ConfigError, match="option compression"):
            check_output(output, compression)
    for compression in ("none", "zstd", "ZSTD:1", "zstd:22"):
        check_output("mds", compression)


# -- the shards, byte for byte as MDSWriter writes them ---------------------------------------


def fleet_shards(columns, values, compression, size_limit, encodings=None) -> list[tuple[str, bytes, dict]]:
    files: list[tuple[str, bytes, dict]] = []
    writer = mds.MDSExampleWriter(
        lambda suffix, data, counts: files.append((suffix, data, dict(counts))),
        columns,
        compression,
        size_limit,
        encodings,
    )
    writer.write_columns(values)
    writer.close()
    return files


@pytest.mark.parametrize("compression", [None, "zstd:5"])
def test_the_shards_are_mdswriters_bytes_for_the_same_samples(tmp_path, compression):
    rng = np.random.default_rng(7)
    n = 300
    values = {
        "input_ids": rng.integers(0, 50_000, (n, 33)),
        "weights": rng.random((n, 5)).astype(np.float32),
        "url": np.array([f"https://example.com/{'é' * int(k)}" for k in rng.integers(0, 40, n)]),
    }
    columns = [Column("input_ids", length=33), Column("weights", "float", 5)]
    codes = {"input_ids": "ndarray:int32:33", "weights": "ndarray:float32:5", "url": "str"}
    size_limit = 9_000  # several shards
    ours = fleet_shards(columns, values, compression, size_limit, {"url": "str"})
    rows = str(tmp_path / "rows.npz")
    np.savez(rows, input_ids=values["input_ids"].astype(np.int32), weights=values["weights"], url=values["url"])
    mosaic("write", rows, json.dumps(codes), compression or "none", str(size_limit), str(tmp_path / "theirs"))
    index = json.loads((tmp_path / "theirs" / "index.json").read_text())
    assert len(index["shards"]) == len(ours) > 3
    for k, ((suffix, data, counts), entry) in enumerate(zip(ours, index["shards"])):
        theirs_name = entry["zip_data"]["basename"] if compression else entry["raw_data"]["basename"]
        theirs = (tmp_path / "theirs" / theirs_name).read_bytes()
        raw = data if not compression else _unzstd(data)
        assert raw == (theirs if not compression else _unzstd(theirs)), f"shard {k}"
        assert counts["examples"] == entry["samples"] and counts[mds.RAW_BYTES] == entry["raw_data"]["bytes"]
        assert suffix == f".{k:05d}.mds" + (".zstd" if compression else "")
    # index.json: each entry as MDSWriter's, but for the shards' names and the compressed bytes
    config = mds.ShardConfig.of(codes, compression, size_limit)
    outputs = {f"part-00000{suffix}": counts for suffix, _, counts in ours}
    mine = json.loads(mds.root_index(config, outputs))
    for entry in (*mine["shards"], *index["shards"]):
        entry["raw_data"]["basename"] = ""
        if entry["zip_data"]:
            entry["zip_data"]["basename"] = entry["zip_data"]["bytes"] = ""
    assert mine == index


def _unzstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40),
    width=st.integers(1, 9),
    texts=st.lists(st.text(max_size=30), min_size=40, max_size=40),
    size_limit=st.integers(40, 2_000),
    compression=st.sampled_from([None, "zstd"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_shards_hold_every_sample_in_order_each_within_the_size_limit(n, width, texts, size_limit, compression, seed):
    """Whatever the samples and the limit: read back, the shards give every sample in order; a
    shard passes the limit only when it holds one sample that alone does; index.json lists
    every shard that holds a sample, with its exact counts."""
    rng = np.random.default_rng(seed)
    values = {
        "a": rng.integers(-(2**31), 2**31, (n, width)),
        "b": rng.standard_normal((n, 2)).astype(np.float32),
        "t": np.array(texts[:n], dtype=object),
    }
    columns = [Column("a", length=width), Column("b", "float", 2)]
    files = fleet_shards(columns, values, compression, size_limit, {"t": "str"})
    back: list[dict] = []
    for _, data, counts in files:
        _, samples = mds.read_shard(data)
        got = list(samples)
        raw = _unzstd(data) if compression else data
        assert len(raw) == counts[mds.RAW_BYTES] and len(got) == counts["examples"]
        assert mds.shard_samples(io.BytesIO(data)) == len(got)
        assert len(raw) <= size_limit or len(got) == 1 or (not got and len(files) == 1)
        back += got
    assert len(back) == n
    for i, sample in enumerate(back):
        np.testing.assert_array_equal(sample["a"], values["a"][i].astype(np.int32))
        np.testing.assert_array_equal(sample["b"], values["b"][i])
        assert sample["t"] == values["t"][i]
    config = mds.ShardConfig.of(
        {"a": f"ndarray:int32:{width}", "b": "ndarray:float32:2", "t": "str"}, compression, size_limit
    )
    index = json.loads(mds.root_index(config, {f"part-1{s}": c for s, _, c in files}))
    assert [e["samples"] for e in index["shards"]] == [c["examples"] for _, _, c in files if c["examples"]]


def test_a_value_past_int32_is_refused_not_wrapped():
    with pytest.raises(ValueError, match="int32"):
        fleet_shards([Column("a", length=1)], {"a": np.array([[2**31]])}, None, mds.SIZE_LIMIT)


def test_a_damaged_shard_is_named_not_misread():
    ((_, data, _),) = fleet_shards([Column("a", length=2)], {"a": np.ones((5, 2), int)}, None, mds.SIZE_LIMIT)
    with pytest.raises(mds.MDSError):
        list(mds.read_shard(data[:-3])[1])
    with pytest.raises(mds.MDSError):
        mds.read_shard(b"\x28\xb5\x2f\xfd" + b"x" * 20)

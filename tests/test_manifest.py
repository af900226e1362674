"""The run's manifest of exact counts (issue 20, item 4): per output what its converter counted
(``Sink.count``), per input file the map items' counters summed, in summary.json, `fleet status`
and ``manifest.json``, with the job's run files, written once every item is done.

Round trips: the counts equal what the users' readers count in the files (TFRecords through
fleet.formats.tfrecord, Parquet rows through pyarrow), for electra, bert, a sharded and a dedup run.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.attempt import DirSink
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.manifest import (
    MANIFEST,
    claim_finish,
    counters,
    finishing_name,
    manifest_json,
    manifest_of,
    totals,
    write_run_files,
)
from fleet.core.run import Item, PlanRequest, RunSpec, plan
from fleet.core.spawner import Worker
from fleet.core.status import build_manifest
from fleet.core.store import open_store
from fleet.formats.tfrecord import parse_example, records
from fleet.job import StageOptions
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.procs import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = [os.path.join(ROOT, "corpus", f"sample_{lang}.txt") for lang in ("en", "zh")]
RUNFILEJOB = "tests.helpers.runfilejob:JOB"


# -- the corpus and the runs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    docs = []
    for path in SAMPLES:
        with open(path, encoding="utf-8") as f:
            docs += [
                [line for line in block.split("\n") if line.strip()][:6]
                for block in f.read().split("\n\n")
                if block.strip()
            ]
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, documents) -> list[str]:
    """Three files, one holding every tenth document twice (something for --dedup to drop)."""
    folder = tmp_path_factory.mktemp("corpus")
    paths = []
    for i in range(3):
        docs = documents[i::3] + (documents[::10] if i == 2 else [])
        path = folder / f"in-{i}.txt"
        path.write_text("".join("\n".join(doc) + "\n\n" for doc in docs), encoding="utf-8")
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, documents) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for doc in documents for line in doc), 3000), path)
    return path


def local(
    inputs,
    out,
    job: str,
    settings: dict,
    workers: int = 1,
    shards: int = 0,
    dedup: str = "",
    expect: int = 0,
    item_bytes: int = 15_000,
    **kw,
):
    console = Console(file=io.StringIO(), width=200)
    result = run_local(
        inputs,
        str(out),
        job,
        workers,
        settings,
        item_bytes=item_bytes,
        console=console,
        stage_options=StageOptions(shards, dedup),
        lease_ttl=20,
        **kw,
    )
    assert result.exit_code == expect, console.file.getvalue()
    return result, console.file.getvalue()


def text_settings(vocab: str, **more) -> dict[str, str]:
    return {"vocab_file": vocab, "max_seq_length": "64", **{k: str(v) for k, v in more.items()}}


def manifest_file(out) -> dict:
    with open(os.path.join(str(out), MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def read_back(out, name: str) -> dict[str, int]:
    """What a reader counts in one output: examples, and tokens (the input_mask's ones)."""
    path = os.path.join(str(out), name)
    if name.endswith(".parquet"):
        table = pq.read_table(path)
        masks = table.column("input_mask").to_pylist()
        return {"examples": table.num_rows, "tokens": int(sum(map(sum, masks)))}
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as f:
        examples = [parse_example(r) for r in records(f)]
    return {"examples": len(examples), "tokens": int(sum(int(np.sum(e["input_mask"])) for e in examples))}


def check_round_trip(out, result, per_output_tokens: bool = True) -> dict:
    """The manifest's per-output counts are what the readers count; its sums are the run's."""
    manifest = manifest_file(out)
    st = result.status
    assert sorted(manifest["outputs"]) == sorted(st.outputs) == result.summary["outputs"]
    assert manifest["outputs"] == st.output_counts == result.summary["output_counts"]
    assert manifest["sources"] == st.sources == result.summary["sources"]
    for name, counts in manifest["outputs"].items():
        got = read_back(out, name)
        assert counts["examples"] == got["examples"], name
        if per_output_tokens:
            assert counts["tokens"] == got["tokens"], name
    # The sums: over the outputs, over the sources, and each against the other and the run's totals.
    assert manifest["totals"] == {"outputs": totals(manifest["outputs"]), "sources": totals(manifest["sources"])}
    assert manifest["totals"]["outputs"]["examples"] == sum(read_back(out, n)["examples"] for n in manifest["outputs"])
    return manifest


# -- electra, bert, shards, dedup: counts = what the readers count ---------------------------------------


def test_electra_manifest_is_what_the_records_hold_and_the_same_for_any_worker_count(corpus, vocab, tmp_path):
    one, _ = local(corpus, tmp_path / "one", "electra_zh_en", text_settings(vocab), workers=1)
    two, printed = local(corpus, tmp_path / "two", "electra_zh_en", text_settings(vocab), workers=2)
    manifest = check_round_trip(tmp_path / "one", one)
    assert (tmp_path / "one" / MANIFEST).read_bytes() == (tmp_path / "two" / MANIFEST).read_bytes()
    # Without stages every counter is a map item's: the sources sum to the run's totals exactly.
    for name, value in manifest["totals"]["sources"].items():
        assert value == one.status.totals[name], name
    assert manifest["totals"]["outputs"]["tokens"] == one.status.totals["tokens"]
    assert manifest["totals"]["outputs"]["documents"] == one.status.totals["documents"]
    assert sorted(manifest["sources"]) == sorted(corpus)
    assert "seconds" not in manifest["totals"]["sources"]
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["sources"] == manifest["sources"] and summary["output_counts"] == manifest["outputs"]
    assert f"{manifest['totals']['outputs']['tokens']:,} tokens" in printed  # the table's line of the outputs


def test_bert_parquet_manifest_is_what_pyarrow_reads(corpus, vocab, tmp_path):
    result, _ = local(corpus, tmp_path, "bert", text_settings(vocab, output="parquet"))
    manifest = check_round_trip(tmp_path, result)
    assert all(name.endswith(".parquet") for name in manifest["outputs"])
    assert manifest["totals"]["outputs"]["examples"] == result.status.totals["examples"]


def test_sharded_manifest_counts_each_shard_and_the_sources_carry_the_map(corpus, vocab, tmp_path):
    result, _ = local(corpus, tmp_path, "electra_zh_en", text_settings(vocab, compression="GZIP"), shards=2)
    manifest = check_round_trip(tmp_path, result, per_output_tokens=False)
    assert sorted(manifest["outputs"]) == ["part-00000-of-00002.tfrecord.gz", "part-00001-of-00002.tfrecord.gz"]
    # The map's examples went through the shuffle into the shards: every one is counted once.
    assert manifest["totals"]["outputs"]["examples"] == manifest["totals"]["sources"]["examples"]
    assert manifest["totals"]["sources"]["tokens"] == result.status.totals["tokens"]
    shards = [c["examples"] for c in manifest["outputs"].values()]
    assert max(shards) - min(shards) <= 1


def test_dedup_manifest_counts_what_was_kept_and_the_sources_what_was_read(corpus, vocab, tmp_path):
    result, _ = local(corpus, tmp_path, "electra_zh_en", text_settings(vocab), dedup="exact")
    manifest = check_round_trip(tmp_path, result)
    totals_ = result.status.totals
    assert totals_["dedup_documents_dropped"] > 0
    # Per source: the map's counters only (what was read); the dedup items' belong to no one file.
    assert manifest["totals"]["sources"]["documents_read"] == totals_["documents_read"]
    assert "tokens" not in manifest["totals"]["sources"]
    assert manifest["totals"]["outputs"]["documents"] == totals_["dedup_documents_kept"]
    assert manifest["totals"]["outputs"]["tokens"] == totals_["tokens"]


# -- the run's files: written once every item is done, by fleet local and by the workers ------------------


def test_run_files_are_written_when_the_run_is_done_and_status_shows_the_counts(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 30)
    write_corpus(str(folder / "b.txt"), 12, seed=1)
    result, _ = local([str(folder)], tmp_path / "out", RUNFILEJOB, {}, item_bytes=700)
    manifest = manifest_file(tmp_path / "out")
    assert manifest["totals"]["outputs"]["documents"] == 42 == manifest["totals"]["sources"]["documents"]
    assert {os.path.basename(k): v["documents"] for k, v in manifest["sources"].items()} == {"a.txt": 30, "b.txt": 12}
    listed = (tmp_path / "out" / "outputs.txt").read_text().splitlines()
    assert listed == [f"{c['documents']} {name}" for name, c in manifest["outputs"].items()]
    for name, counts in manifest["outputs"].items():  # linejob writes one line per document
        assert counts["documents"] == len((tmp_path / "out" / name).read_text().splitlines())
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "status", str(tmp_path / "out"), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["sources"] == manifest["sources"] and shown["output_counts"] == manifest["outputs"]
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "status", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "a.txt" in proc.stdout and "42 documents" in proc.stdout, proc.stdout


def test_no_run_files_while_an_item_failed_then_written_once_it_is_retried(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 20)
    out = tmp_path / "out"
    monkeypatch.setenv("LINEJOB_CRASH", "doc 3 ")  # a crash that goes with the variable
    result, _ = local([str(folder)], out, RUNFILEJOB, {}, item_bytes=700, expect=1, max_attempts=1)
    assert result.status.failed == 1
    assert not (out / MANIFEST).exists() and not (out / "outputs.txt").exists()
    assert not (out / ".fleet" / finishing_name("local")).exists()  # the next drain may write them
    assert result.summary["sources"]  # the done items are still counted, for the summary
    monkeypatch.delenv("LINEJOB_CRASH")
    result, _ = local([str(folder)], out, RUNFILEJOB, {}, item_bytes=700, max_attempts=1, retry_failed=True)
    assert manifest_file(out)["totals"]["outputs"]["documents"] == 20
    assert (out / "outputs.txt").exists()


def test_a_worker_that_finds_the_run_drained_writes_the_run_files(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 25)
    bucket, output = str(tmp_path / "bucket"), str(tmp_path / "out")
    plan(
        bucket,
        PlanRequest(
            run="r",
            job=RUNFILEJOB,
            inputs=[str(folder)],
            output=output,
            code_version="test",
            lease_ttl=30,
            item_bytes=600,
        ),
    )
    worker = Worker(bucket, "r", name="w", poll=0.01)
    try:
        worker.run_until_drained()
    finally:
        worker.close()
    written = open_store(output).read(MANIFEST)
    manifest = build_manifest(open_store(bucket), "r")
    assert json.loads(written)["outputs"] == manifest.outputs
    assert json.loads(written)["totals"]["outputs"]["documents"] == 25
    assert open_store(output).read("outputs.txt").decode().count("\n") == len(manifest.outputs)
    # A second writer (another worker, fleet local) finds the same bytes: nothing to report.
    assert write_run_files(open_store(output), {MANIFEST: written}) == []
    assert write_run_files(open_store(output), {MANIFEST: b"{}\n"}) == [MANIFEST]
    assert open_store(output).read(MANIFEST) == written  # never overwritten


# -- the pieces -------------------------------------------------------------------------------------------


def test_counts_of_an_output_the_item_did_not_write_fail_the_item(tmp_path):
    sink = DirSink(str(tmp_path))
    sink.open(".txt").close()
    sink.count(".txt", {"documents": 2})
    sink.count(".txt", {"documents": 3, "tokens": 7})
    outputs = [{"name": "part-0.txt"}]
    sink.describe(outputs)
    assert outputs[0]["counts"] == {"documents": 5, "tokens": 7}
    sink.count(".bin", {"tokens": 1})
    with pytest.raises(ValueError, match="'.bin'"):
        sink.describe([{"name": "part-0.txt"}])


def test_counters_are_exact_integers_only():
    assert counters({"tokens": 5, "seconds": 3, "fill": 0.5, "flag": True, "bad_examples": ["x"]}) == {"tokens": 5}


SPEC = RunSpec(run="r", job="j", config={}, output="/out", code_version="v")
STATS = st.dictionaries(
    st.sampled_from(["tokens", "documents", "seconds", "ratio"]), st.integers(0, 10**12) | st.floats(0, 1), max_size=4
)


@st.composite
def runs(draw):
    """Map items over a few files and a stage's items, with done or failed leases."""
    items, leases = [], {}
    n_map, n_stage = draw(st.integers(1, 8)), draw(st.integers(0, 3))
    for i in range(n_map + n_stage):
        step = 0 if i < n_map else 2
        item = Item("/in", f"f{draw(st.integers(0, 2))}.txt", 0, 1, id=f"{i:05d}", step=step)
        outputs = [{"name": f"part-{item.id}.x", "counts": draw(STATS)}]
        if step == 0 and n_stage:
            outputs = [{"name": f"runs/r/shuffle/{item.id}", "place": "state"}]
        state = draw(st.sampled_from([DONE, DONE, FAILED]))
        leases[item.id] = Lease(state, "w", 1, 0.0, outputs=outputs, stats=draw(STATS))
        items.append(item)
    return items, leases


@settings(max_examples=60, deadline=None)
@given(runs(), st.randoms(use_true_random=False))
def test_per_source_sums_are_the_done_map_items_and_the_bytes_do_not_depend_on_order(run, rng):
    items, leases = run
    manifest = manifest_of(items, leases)
    done_map = [i for i in items if leases[i.id].state == DONE and not i.step]
    want: dict[str, int] = {}
    for item in done_map:
        for k, v in counters(leases[item.id].stats).items():
            want[k] = want.get(k, 0) + v
    assert totals(manifest.sources) == dict(sorted(want.items()))
    assert set(manifest.sources) == {i.file for i in done_map}
    assert all(not name.startswith("runs/") for name in manifest.outputs)  # records between stages are no outputs
    shuffled_items = list(items)
    rng.shuffle(shuffled_items)
    shuffled_leases = dict(sorted(leases.items(), key=lambda kv: rng.random()))
    assert manifest_json(SPEC, manifest_of(shuffled_items, shuffled_leases)) == manifest_json(SPEC, manifest)


def test_one_drained_worker_claims_the_run_files_and_a_dead_claimant_is_replaced(tmp_path):
    store = open_store(str(tmp_path))
    assert claim_finish(store, "r", "a", stale_after=60, now=1000.0)
    assert not claim_finish(store, "r", "b", stale_after=60, now=1030.0)  # a is at it
    assert claim_finish(store, "r", "c", stale_after=60, now=1061.0)  # a died before the manifest
    assert json.loads(store.read(finishing_name("r")))["worker"] == "c"


def test_an_ended_drain_is_trusted_by_the_workers_there_and_checked_again_by_a_later_one(tmp_path):
    """The claim's last word (end_claim): workers that started before the drain ended leave at it
    (run_ended), none of them takes the claim over however old it gets; a worker that started
    after it (a rerun, after a lease was deleted by hand) takes it at once and checks for itself."""
    from fleet.core.manifest import end_claim, run_ended

    store = open_store(str(tmp_path))
    gen = claim_finish(store, "r", "a", stale_after=60, now=1000.0, started=900.0)
    assert gen and not run_ended(store, "r", since=900.0)
    end_claim(store, "r", "a", gen, "written", now=1010.0)
    assert run_ended(store, "r", since=900.0)  # b, there since 900, leaves
    assert claim_finish(store, "r", "b", stale_after=60, now=5000.0, started=900.0) is None  # never stale
    assert not run_ended(store, "r", since=1020.0)  # c started after it ended
    assert claim_finish(store, "r", "c", stale_after=60, now=1030.0, started=1020.0)
    assert not run_ended(store, "r", since=900.0)  # c's drain is under way: b waits for its word
    end_claim(store, "r", "a", gen, "written", now=1040.0)  # a stale holder's word is not taken
    assert json.loads(store.read(finishing_name("r")))["worker"] == "c"


def test_a_claim_to_the_run_files_held_longer_than_its_ttl_is_renewed_not_taken_over(tmp_path):
    """The 20,000-item simulation: reading every lease took the claimant longer than a TTL, and
    every worker that drained meanwhile took the claim over and read every lease again (11 lease
    reads an item instead of 1). The holder renews it while it works."""
    import time

    from fleet.core.manifest import holding_finish

    store = open_store(str(tmp_path))
    gen = claim_finish(store, "r", "a", stale_after=2.0)
    assert gen
    with holding_finish(store, "r", "a", gen, every=0.1):  # (margins for a loaded machine)
        for _ in range(5):
            time.sleep(1.0)  # in all 5 s, more than twice the ttl
            assert claim_finish(store, "r", "b", stale_after=2.0) is None
    time.sleep(2.2)
    assert claim_finish(store, "r", "c", stale_after=2.0)  # no longer renewed: its holder is gone


def test_the_summary_line_counts_the_files_that_hold_the_counts():
    """A Megatron dataset's .idx (or a provenance sidecar) holds no examples: the line says how
    many files hold the counts, and how many more are beside them."""
    from rich.console import Console

    from fleet.cli.render import print_counts

    out = Console(file=io.StringIO(), width=300)
    print_counts(
        out,
        {},
        {
            "part-00000.bin": {"documents": 2, "tokens": 10},
            "part-00000.idx": {},
            "part-00001.bin": {"documents": 1, "tokens": 4},
            "part-00001.idx": {},
        },
    )
    assert out.file.getvalue().strip() == (
        "counted: 2 output files hold 3 documents, 14 tokens (2 more beside them: indexes, sidecars)"
    )
    out = Console(file=io.StringIO(), width=300)
    print_counts(out, {}, {"part-00000.tfrecord": {"examples": 5}})
    assert out.file.getvalue().strip() == "counted: 1 output files hold 5 examples"

"""Stages: MapReduce through the bucket, on the same leases and workers (issue 19).

A tiny job with stages (tests/helpers/stagejob.py) keeps the fleet's part apart from any
real job's: lines are mapped to keyed records, an optional ``uniq`` stage drops repeated
lines, and ``--shards N`` writes them in the seeded global order to N balanced files.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from fleet.cli.local import run_local
from fleet.core import shuffle
from fleet.core.claims import ClaimPolicy
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.run import BARRIER, COMBINE, ITEMS, MAP, PlanRequest, StepPlan, load_items, load_spec, plan, stage_items
from fleet.core.shuffle import Combine, CombineRule
from fleet.core.store import open_store
from fleet.core.verify import downstream
from fleet.job import StageOptions, shuffle_key
from tests.helpers.procs import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "tests.helpers.stagejob:JOB"
FLEET = [sys.executable, "-m", "fleet.cli"]


# -- the claim policy's gate, pure -----------------------------------------------------------
def _policy():
    steps = {"shards-index": 1, "00000-of-00002": 2, "00001-of-00002": 2}
    return ClaimPolicy(["00000", "00001", *steps], "w", 10.0, steps=steps, barriers=["shards-index"])


def _lease(state):
    return Lease(state=state, worker="x", attempt=1, expires=0.0)


def _claimable(policy):
    return {item for item, _ in policy.candidates(0.0, 0.0)}


def test_a_step_opens_only_when_every_step_before_is_done():
    policy = _policy()
    policy.observe([], {}, 0.0)
    assert _claimable(policy) == {"00000", "00001"}
    assert policy.waiting() and not policy.drained()
    policy.observe(["00000"], {"00000": 1}, 0.0)
    assert "shards-index" not in _claimable(policy)  # one map item still open
    policy.observe(["00000", "00001"], {"00000": 1, "00001": 1}, 0.0)
    assert _claimable(policy) == {"shards-index"}
    listing = {"00000": 1, "00001": 1, "shards-index": 4}
    policy.observe(["00000", "00001", "shards-index"], listing, 0.0)
    assert policy.unknown_barriers() == ["shards-index"]
    assert _claimable(policy) == set()  # the barrier finished, but done or failed is not known yet
    policy.remember("shards-index", _lease(DONE), 4)
    policy.observe(["00000", "00001", "shards-index"], listing, 0.0)
    assert _claimable(policy) == {"00000-of-00002", "00001-of-00002"}
    assert not policy.waiting()
    policy.observe(
        list(listing) + ["00000-of-00002", "00001-of-00002"], {**listing, "00000-of-00002": 1, "00001-of-00002": 1}, 0.0
    )
    assert policy.drained()


def test_a_failed_barrier_blocks_the_steps_after_it_and_the_run_drains():
    policy = _policy()
    listing = {"00000": 1, "00001": 1, "shards-index": 4}
    policy.remember("shards-index", _lease(FAILED), 4)
    policy.observe(list(listing), listing, 0.0)
    assert _claimable(policy) == set()
    assert policy.drained() and not policy.waiting()


def test_a_reopened_map_item_closes_the_steps_after_it_again():
    policy = _policy()
    policy.remember("shards-index", _lease(DONE), 4)
    policy.observe(["00001", "shards-index"], {"00001": 1, "shards-index": 4}, 0.0)  # 00000's lease deleted
    assert _claimable(policy) == {"00000"}


def test_a_barrier_known_done_from_its_windows_marker_is_read_and_opens_the_stage():
    """A worker that knows the barrier's window finished from a done/ marker (a sweep of the
    unfinished windows does not list it) reads the barrier's lease, and the stage opens: the
    rerun after `fleet status --verify` reopened a shard hung here when the gate waited for a
    listing of the barrier that never came."""
    policy = _policy()
    marks = [w.key for w in policy.windows if w.step < 2]
    policy.observe_marks(marks)
    assert policy.unknown_barriers() == ["shards-index"]
    assert _claimable(policy) == set()
    policy.remember("shards-index", _lease(DONE), 4)
    policy.observe([], {}, 0.0, window=next(w.index for w in policy.windows if w.step == 2))
    assert _claimable(policy) == {"00000-of-00002", "00001-of-00002"}


def test_a_barrier_listed_while_it_ran_then_known_done_from_a_marker_opens_the_stage():
    """The chaos run's hang: a worker listed the barrier while it ran (generation 3), then learned
    its window finished from a done/ marker, so never listed it again; the lease it read then
    (generation 9) never matched the old listing, and the worker read it every pass, forever."""
    policy = _policy()
    barrier = policy.window_of["shards-index"]
    policy.observe(["00000", "00001"], {"00000": 1, "00001": 1}, 0.0)
    policy.observe([], {"shards-index": 3}, 0.0, window=barrier)
    policy.observe_marks([policy.windows[barrier].key])
    assert policy.unknown_barriers() == ["shards-index"]
    policy.remember("shards-index", _lease(DONE), 9)
    assert policy.unknown_barriers() == [] and policy.barrier_state("shards-index") == DONE
    policy.observe([], {}, 0.0, window=next(w.index for w in policy.windows if w.step == 2))
    assert _claimable(policy) == {"00000-of-00002", "00001-of-00002"}


# -- fleet local with stages -------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("stages") / "corpus.txt"), docs=120, seed=3)


def _lines(corpus):
    return [line for line in open(corpus, encoding="utf-8").read().split("\n") if line]


def _run(corpus, out, workers=1, item_bytes=2000, shards=0, dedup="", **settings):
    console = Console(file=io.StringIO(), width=200)
    result = run_local(
        [corpus],
        str(out),
        JOB,
        workers,
        {k: str(v) for k, v in settings.items()},
        item_bytes=item_bytes,
        console=console,
        stage_options=StageOptions(shards, dedup),
        lease_ttl=10,
    )
    return result, console.file.getvalue()


def _shards(out):
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(out, "part-*")))}


def _global_order(lines, seed=7):
    return sorted((line.encode() for line in lines), key=lambda v: (shuffle_key(seed, v), v))


def test_shards_are_n_balanced_files_of_every_record_in_the_seeded_global_order(corpus, tmp_path):
    result, text = _run(corpus, tmp_path / "a", shards=4)
    assert result.exit_code == 0, text
    files = _shards(str(tmp_path / "a"))
    assert list(files) == [f"part-0000{i}-of-00004.txt" for i in range(4)]
    counts = [len(data.splitlines()) for data in files.values()]
    assert max(counts) - min(counts) <= 1
    assert b"".join(files.values()).splitlines() == _global_order(_lines(corpus))
    assert result.status.stages == [
        {
            "name": "map",
            "items": result.status.stages[0]["items"],
            "done": result.status.stages[0]["items"],
            "failed": 0,
            "leased": 0,
            "blocked": 0,
        },
        {"name": "shards", "items": 4, "done": 4, "failed": 0, "leased": 0, "blocked": 0},
    ]
    assert result.status.stages[0]["items"] > 4  # several map items fed every shard
    assert sorted(result.summary["outputs"]) == list(files)  # the records between stages are no outputs


def test_shards_are_the_same_bytes_whatever_the_workers_or_the_item_size(corpus, tmp_path):
    one, _ = _run(corpus, tmp_path / "one", workers=1, item_bytes=2000, shards=3)
    two, _ = _run(corpus, tmp_path / "two", workers=2, item_bytes=7000, shards=3)
    assert one.exit_code == two.exit_code == 0
    assert _shards(str(tmp_path / "one")) == _shards(str(tmp_path / "two"))
    other_seed, _ = _run(corpus, tmp_path / "seed", shards=3, seed=8)
    assert _shards(str(tmp_path / "seed")) != _shards(str(tmp_path / "one"))


def test_a_chain_of_two_stages_drops_repeats_then_shards(corpus, tmp_path):
    doubled = tmp_path / "doubled.txt"
    doubled.write_text(open(corpus, encoding="utf-8").read() * 2, encoding="utf-8")
    result, text = _run(str(doubled), tmp_path / "out", workers=2, shards=2, dedup="lines")
    assert result.exit_code == 0, text
    files = _shards(str(tmp_path / "out"))
    assert list(files) == ["part-00000-of-00002.txt", "part-00001-of-00002.txt"]
    assert b"".join(files.values()).splitlines() == _global_order(set(_lines(corpus)))
    assert result.summary["lines_dropped"] == len(_lines(str(doubled))) - len(set(_lines(corpus)))
    assert [s["name"] for s in result.status.stages] == ["map", "uniq", "shards"]


@pytest.mark.parametrize("combine", [False, True])
def test_a_failed_map_item_blocks_the_stages_after_it_and_writes_no_output(corpus, tmp_path, monkeypatch, combine):
    if combine:
        monkeypatch.setattr(shuffle, "COMBINE_RULE", CombineRule(group=4, blocks=2))
    out = tmp_path / "out"
    result, text = _run(corpus, out, shards=2, poison="doc 7 ")
    assert result.exit_code == 1
    st = result.status
    # The poisoned map item, the combine items of its group (which refused to merge without it),
    # and the barrier that refused to index without them.
    assert st.failed == (4 if combine else 2)
    assert st.blocked == 2 and st.finished
    assert not _shards(str(out))
    assert "stage shards cannot run: " in text
    assert "stage shards cannot run: 1 item(s) before it failed (item 00000: " in text  # each names the map item
    assert "2 item(s) of later stages did not run" in text


def _cli(*args, check_traceback=True):
    proc = subprocess.run(FLEET + list(args), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_more_shards_than_records_is_one_line_exit_2_and_no_output(corpus, tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("one\ntwo\n\nthree\n", encoding="utf-8")
    out = tmp_path / "out"
    proc = _cli("local", str(small), str(out), "--job", JOB, "--shards", "4", "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "fleet: error: --shards 4: the run holds only 3 record(s); give at most 3"
    assert not os.path.exists(out)  # nothing kept: the same command with --shards 3 plans afresh
    proc = _cli("local", str(small), str(out), "--job", JOB, "--shards", "3", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert len(_shards(str(out))) == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shards", "0"], "--shards 0: give 1 to 100000"),
        (["--shards", "-3"], "--shards -3: give 1 to 100000"),
        (["--dedup", "fuzzy"], "--dedup 'fuzzy': unknown mode; known: lines"),
    ],
)
def test_bad_stage_options_are_one_line_exit_2_and_nothing_written(corpus, tmp_path, args, message):
    out = tmp_path / "out"
    proc = _cli("local", corpus, str(out), "--job", JOB, "--workers", "1", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(out / ".fleet" / "runs")


@pytest.mark.parametrize(
    "job, settings, message",
    [
        (
            "command",
            ["--set", "command=cp {input} {output}/x"],
            "--shards: job command cannot shard its outputs (it has no stages)",
        ),
        ("tests.helpers.linejob:JOB", [], "--shards: job linejob writes no examples of fixed features"),
    ],
)
def test_a_job_that_cannot_shard_refuses_shards_in_one_line(corpus, tmp_path, job, settings, message):
    proc = _cli("local", corpus, str(tmp_path / "out"), "--job", job, "--shards", "2", "--workers", "1", *settings)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(tmp_path / "out" / ".fleet" / "runs")


def test_a_shard_deleted_after_the_run_is_named_by_verify_and_redone_the_same(corpus, tmp_path):
    out = tmp_path / "out"
    result, _ = _run(corpus, out, workers=2, shards=3)
    before = _shards(str(out))
    os.remove(out / "part-00001-of-00003.txt")
    with open(out / "part-00002-of-00003.txt", "ab") as f:
        f.write(b"garbage\n")
    proc = _cli("status", str(out), "--verify")
    assert proc.returncode == 1, proc.stderr  # damage found: exit 1
    assert "part-00001-of-00003.txt is missing" in proc.stderr
    assert "part-00002-of-00003.txt has" in proc.stderr
    again, text = _run(corpus, out, workers=2, shards=3)
    assert again.exit_code == 0, text
    assert _shards(str(out)) == before


def test_records_between_stages_lost_after_the_run_are_redone_with_what_read_them(corpus, tmp_path):
    out = tmp_path / "out"
    result, _ = _run(corpus, out, shards=2)
    before = _shards(str(out))
    bucket = open_store(str(out / ".fleet"))
    pieces = [b.name for b in bucket.list("runs/local/shuffle/") if not b.name.endswith(".index")]
    bucket.delete(pieces[0])
    again, text = _run(corpus, out, shards=2)
    assert again.exit_code == 0, text
    assert "is missing" in text
    assert _shards(str(out)) == before
    assert len(load_items(bucket, "local")) == result.status.items


# -- combine steps (issue 28): reads that grow with the data, the same bytes --------------------------
# What the code before combine steps (e5df450) wrote on this module's corpus (``doubled``: it twice),
# items of 2,000 bytes, 2 workers: sha256 over each part-* file's name and bytes, in name order.
BEFORE = {
    "shards4": "759bb38aca7dc18c09c438a5d7d7ac1e4df61d4900df98f56baf4f4325b72170",
    "uniq_shards3": "693432a752b82da281b6ca14a499a2a033d64e90371a001026053201c799c220",
    "uniq": "330158d45837d3a44c21d69743bc3305cda2259ebbcb6c43d8a3557afd13beea",
}
NEVER = CombineRule(min_reads=10**18)


def _digest(out) -> str:
    h = hashlib.sha256()
    for name, data in _shards(str(out)).items():
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="module")
def doubled(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("doubled") / "doubled.txt"
    path.write_text(open(corpus, encoding="utf-8").read() * 2, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "rule, workers, item_bytes",
    [
        (NEVER, 2, 2000),
        (CombineRule(group=4, blocks=2), 1, 2000),
        (CombineRule(group=100, blocks=7), 2, 2000),
        (CombineRule(group=3), 2, 7000),
    ],
)
def test_outputs_are_the_bytes_the_code_before_combine_steps_wrote(
    corpus, doubled, tmp_path, monkeypatch, rule, workers, item_bytes
):
    """With a combine step or without, whatever its groups and key blocks, the workers or (for
    shards) the item size: the outputs are the bytes the code before combine steps wrote."""
    monkeypatch.setattr(shuffle, "COMBINE_RULE", rule)
    runs = {"shards4": (corpus, 4, ""), "uniq_shards3": (doubled, 3, "lines"), "uniq": (doubled, 0, "lines")}
    if item_bytes != 2000:
        del runs["uniq"]  # its outputs are one file per map item: another cut, other files
    for name, (inputs, shards, dedup) in runs.items():
        result, text = _run(inputs, tmp_path / name, workers=workers, item_bytes=item_bytes, shards=shards, dedup=dedup)
        assert result.exit_code == 0, text
        assert _digest(tmp_path / name) == BEFORE[name], name
        rows = [row["name"] for row in result.status.stages]
        stages = (["uniq"] if dedup else []) + (["shards"] if shards else [])
        combined = [] if rule is NEVER else [f"{stage} combine" for stage in stages]
        assert sorted(rows) == sorted(["map", *stages, *combined])


def test_fleet_status_shows_a_combine_step_as_a_row_of_its_own(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(shuffle, "COMBINE_RULE", CombineRule(group=4, blocks=2))
    out = tmp_path / "out"
    result, text = _run(corpus, out, workers=2, shards=3)
    assert result.exit_code == 0, text
    maps = result.status.stages[0]["items"]
    combines = -(-maps // 4) * 2
    row = {"failed": 0, "leased": 0, "blocked": 0}
    assert result.status.stages == [
        {"name": "map", "items": maps, "done": maps, **row},
        {"name": "shards combine", "items": combines, "done": combines, **row},
        {"name": "shards", "items": 3, "done": 3, **row},
    ]
    assert result.status.items == maps + combines + 1 + 3
    assert result.summary["stages"] == f"map {maps}/{maps} · shards combine {combines}/{combines} · shards 3/3"
    proc = _cli("status", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = [" ".join(line.replace("│", " ").split()) for line in proc.stdout.splitlines()]
    assert f"stage shards combine {combines:,}/{combines:,} done" in lines, proc.stdout


def _leases(bucket) -> dict[str, bytes]:
    prefix = "runs/local/leases/"
    return {b.name[len(prefix) :]: bucket.read(b.name) for b in bucket.list(prefix)}


def test_a_lost_or_damaged_combined_file_is_named_by_verify_and_redone_with_what_read_it(corpus, tmp_path, monkeypatch):
    """`fleet status --verify` checks the combined files too; a lost or damaged one is redone with
    the barrier and the stage after it (which read it), nothing else, and the outputs are the same."""
    monkeypatch.setattr(shuffle, "COMBINE_RULE", CombineRule(group=4, blocks=2))
    out = tmp_path / "out"
    result, _ = _run(corpus, out, workers=2, shards=3)
    before, bucket = _shards(str(out)), open_store(str(out / ".fleet"))
    items = load_items(bucket, "local")
    combined = [i.id for i in items if i.meta.get("combine")]
    leases = _leases(bucket)
    bucket.delete(f"runs/local/shuffle/{combined[1]}")
    damaged = f"runs/local/shuffle/{combined[2]}"
    data = bucket.read(damaged)
    bucket.write(damaged, data[:-1] + bytes([data[-1] ^ 1]))
    proc = _cli("status", str(out), "--verify")
    assert proc.returncode == 1, proc.stderr  # damage found: exit 1
    assert f"item {combined[1]}: runs/local/shuffle/{combined[1]} is missing" in proc.stderr
    assert f"item {combined[2]}: {damaged} has other contents than committed" in proc.stderr
    assert "4 item(s) of later stages read those and are redone with them" in proc.stderr  # the barrier, 3 shards
    again, text = _run(corpus, out, workers=2, shards=3)
    assert again.exit_code == 0, text
    assert _shards(str(out)) == before
    redone = {item for item, lease in _leases(bucket).items() if lease != leases[item]}
    assert redone == {combined[1], combined[2], "shards-index", *(i.id for i in items if i.step == 3)}


def test_a_lost_map_file_is_redone_with_the_combine_items_of_its_group_only(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(shuffle, "COMBINE_RULE", CombineRule(group=4, blocks=2))
    out = tmp_path / "out"
    _run(corpus, out, workers=2, shards=3)
    before, bucket = _shards(str(out)), open_store(str(out / ".fleet"))
    items = load_items(bucket, "local")
    leases = _leases(bucket)
    bucket.delete("runs/local/shuffle/00005")  # map item 5: group 1 (items 4-7), both key blocks
    again, text = _run(corpus, out, workers=2, shards=3)
    assert again.exit_code == 0, text
    assert "is missing" in text
    assert _shards(str(out)) == before
    redone = {item for item, lease in _leases(bucket).items() if lease != leases[item]}
    assert redone == {
        "00005",
        "shards-combine-00002",
        "shards-combine-00003",
        "shards-index",
        *(i.id for i in items if i.step == 3),
    }


def _chain(maps, combines):
    """The items of a run of ``maps`` map items with stages uniq (one item per map item) and
    shards (3), and the given combine steps."""
    from fleet.core.run import Item
    from fleet.job import Stage

    return [Item("", "", 0, 1, id=f"{i:05d}") for i in range(maps)] + stage_items(
        [Stage("uniq", maps), Stage("shards", 3, balanced=True)], maps, combines
    )


def test_downstream_follows_what_each_item_read():
    """A map item's file was read by the combine items of its group (every key block), those by the
    barrier, the barrier's index by every item of the stage, those by the next combine step..."""
    items = _chain(10, [Combine(4, 2), Combine(3, 1)])
    step = {i.id: i.step for i in items}
    later = downstream(items, ["00005"])
    assert later[0] == "00005"
    assert sorted(i for i in later if step[i] == 1) == ["uniq-combine-00002", "uniq-combine-00003"]  # items 3-5
    assert all(i.id in later for i in items if i.step >= 2)  # the barrier on: all read it
    assert not any(step[i] == 0 for i in later[1:])
    # A stage item of uniq: only the shards combine item of its group, then everything after.
    later = downstream(items, ["uniq-00007"])
    combines = [i for i in items if i.meta.get("combine") and i.meta["stage"] == "shards"]
    mine = [i.id for i in combines if i.meta["items"][0] <= 7 < i.meta["items"][1]]
    assert [i.id for i in combines if i.id in later] == mine and len(mine) == 1
    assert set(later) >= {"shards-index", "00000-of-00003", "00001-of-00003", "00002-of-00003"}
    # Without combine steps (a run planned before them): every item of every later step, as ever.
    old = _chain(10, [])
    assert downstream(old, ["00005"]) == ["00005"] + [i.id for i in old if i.step > 0]
    assert downstream(old, ["uniq-00003"]) == ["uniq-00003"] + [i.id for i in old if i.step > 2]


def test_a_run_planned_before_combine_steps_resumes_with_its_own_steps(corpus, tmp_path, monkeypatch):
    """run.json and items.jsonl as the code before combine steps wrote them (tests/helpers/
    old_stage_run, from e5df450): planning the run again with a rule that would give both stages
    a combine step plans nothing new, its workers run map, barrier and stage as planned, and the
    outputs are the bytes that code wrote."""
    monkeypatch.setattr(shuffle, "COMBINE_RULE", CombineRule(group=2))
    base = tmp_path / "old"
    base.mkdir()
    data = open(corpus, "rb").read()
    (base / "corpus.txt").write_bytes(data)
    bucket = str(base / "bucket")
    version = open_store(str(base)).stat("corpus.txt").version
    old = os.path.join(os.path.dirname(__file__), "helpers", "old_stage_run")
    for name in ("run.json", "items.jsonl"):
        text = open(os.path.join(old, name), encoding="utf-8").read()
        text = text.replace("{BASE}", json.dumps(str(base))[1:-1]).replace("{VERSION}", json.dumps(version)[1:-1])
        os.makedirs(os.path.join(bucket, "runs", "old"), exist_ok=True)
        with open(os.path.join(bucket, "runs", "old", name), "w", encoding="utf-8") as f:
            f.write(text)
    planned = open(os.path.join(bucket, "runs", "old", "items.jsonl"), "rb").read()
    spec, items, created = plan(
        bucket,
        PlanRequest(
            run="old",
            job=JOB,
            inputs=[str(base / "corpus.txt")],
            output=str(base / "out"),
            code_version="test",
            lease_ttl=30,
            max_attempts=10,
            item_bytes=2500,
            stage_options=StageOptions(3, "lines"),
        ),
    )
    assert not created and spec.combine == []
    assert open(os.path.join(bucket, "runs", "old", "items.jsonl"), "rb").read() == planned
    steps = StepPlan(spec)
    assert [steps.kind(s) for s in range(steps.last + 1)] == [MAP, BARRIER, ITEMS, BARRIER, ITEMS]
    assert not any(i.meta.get("combine") for i in items)
    from fleet.core.spawner import Worker

    Worker(bucket, "old", "w").run_until_drained()
    assert _digest(base / "out") == BEFORE["uniq_shards3"]
    # A new run of the same stages does get the combine steps.
    _, fresh, _ = plan(
        bucket,
        PlanRequest(
            run="new",
            job=JOB,
            inputs=[str(base / "corpus.txt")],
            output=str(base / "out-new"),
            code_version="test",
            item_bytes=2500,
            stage_options=StageOptions(3, "lines"),
        ),
    )
    assert any(i.meta.get("combine") for i in fresh)


def _shuffle_reads(tmp_path, monkeypatch, docs: int, shards: int, rule: CombineRule) -> tuple[int, int, int]:
    """A sharded run by one in-process worker: (reads of records between stages: headers, index,
    ranges and whole files, the map items, bytes of the map's records)."""
    from fleet.core.spawner import Worker
    from fleet.core.status import StatusReader
    from fleet.core.store.local import LocalStore
    from tests.helpers.procs import write_corpus

    base = tmp_path / f"{docs}-{shards}-{rule.read_min}"
    base.mkdir()
    corpus = write_corpus(str(base / "corpus.txt"), docs=docs, seed=11)
    bucket = str(base / "bucket")
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run="count",
            job=JOB,
            inputs=[corpus],
            output=str(base / "out"),
            code_version="test",
            lease_ttl=30,
            item_bytes=2000,
            stage_options=StageOptions(shards),
            combine=rule,
        ),
    )
    reads = [0]
    for method in ("read", "download_file"):
        original = getattr(LocalStore, method)

        def counted(store, name, *args, _original=original, **kwargs):
            if "/shuffle/" in name:
                reads[0] += 1
            return _original(store, name, *args, **kwargs)

        monkeypatch.setattr(LocalStore, method, counted)
    Worker(bucket, "count", "w").run_until_drained()
    monkeypatch.undo()
    leases = StatusReader(open_store(bucket), "count").leases()
    maps = [i for i in items if i.step == 0]
    assert all(lease.state == DONE for lease in leases.values()) and len(leases) == len(items)
    data = sum(o["size"] for i in maps for o in leases[i.id].outputs if o.get("place") == "state")
    return reads[0], len(maps), data


def test_reads_per_byte_do_not_grow_with_map_items_times_shards(tmp_path, monkeypatch):
    """Counted at two sizes, 4x the map items and 4x the shards (16x the pairs): with the rule's
    combine step (scaled to this corpus: ranges of >= 1 kB) the reads per byte of records stay
    flat; read straight from the map's files they grow about as the shards do."""
    rule = CombineRule(read_min=1000, file_max=10**9, min_reads=0)
    small = _shuffle_reads(tmp_path, monkeypatch, 80, 4, rule)
    large = _shuffle_reads(tmp_path, monkeypatch, 320, 16, rule)
    assert large[1] >= 3.5 * small[1]  # the map items
    per_byte = [reads / data for reads, _, data in (small, large)]
    assert per_byte[1] <= 1.3 * per_byte[0], (small, large)
    small_direct = _shuffle_reads(tmp_path, monkeypatch, 80, 4, NEVER)
    large_direct = _shuffle_reads(tmp_path, monkeypatch, 320, 16, NEVER)
    direct = [reads / data for reads, _, data in (small_direct, large_direct)]
    assert direct[1] >= 2 * direct[0], (small_direct, large_direct)
    print(f"reads, map items, bytes: combine {small} -> {large}; direct {small_direct} -> {large_direct}")
    assert per_byte[1] < direct[1] / 4


# -- worker deaths in every step ------------------------------------------------------------------
CHAOS_PAUSES = {"FLEET_TEST_PAUSE": "claimed=0.6,uploaded=0.8"}
WINDOW = {"claimed": 0.6, "uploaded": 0.8}


def _plan(bucket, run, corpus, shards, ttl, **settings):
    """Both stages with a combine step (groups of 3 files in 2 key blocks): every kind of step."""
    plan(
        bucket,
        PlanRequest(
            run=run,
            job=JOB,
            inputs=[corpus],
            output=f"{bucket}/out-{run}",
            code_version="test",
            settings={k: str(v) for k, v in settings.items()},
            lease_ttl=ttl,
            max_attempts=10,
            item_bytes=2500,
            stage_options=StageOptions(shards, "lines"),
            combine=CombineRule(group=3, blocks=2),
        ),
    )


def _digests(bucket, run):
    """Every lease done; name -> sha256 of everything committed, outputs and records between stages
    alike. Not the indexes: they pin the object versions of the records they index, which differ
    from run to run (and after a retry rewrote a piece) while the bytes stay the same."""
    from tests.helpers.procs import committed

    return {
        name.replace(f"runs/{run}/", ""): sha
        for name, sha in committed(bucket, run).items()
        if not name.endswith(".index")
    }


def test_sigkills_in_every_step_leave_the_bytes_of_a_clean_run(store_url, corpus, tmp_path):
    from fleet.core.spawner import Worker
    from tests.helpers.procs import kill_at_pauses

    logs = str(tmp_path / "logs")
    _plan(store_url, "clean", corpus, 3, ttl=30)
    solo = Worker(store_url, "clean", "solo", poll=0.05)  # the clean run's bytes: in-process, no kill here
    try:
        solo.run_until_drained()
    finally:
        solo.close()
    expected = _digests(store_url, "clean")
    items = {i.id: i for i in load_items(open_store(store_url), "clean")}
    assert sum(1 for i in items.values() if i.step == 0) >= 6

    # A TTL above the two pauses together: an item too short to renew its lease is not taken over
    # (no renewal in either pause: the claimed one is before the renewer starts, the uploaded one
    # after it stops; at 2 s, 0.5 s to spare beyond a renewal's third of a TTL and the longer
    # pause). Each kill on the way to a step's end waits about a TTL for the lease to expire.
    _plan(store_url, "chaos", corpus, 3, ttl=2.0, delay=0.03, reduce_delay=0.01)
    kind = {
        0: "map",
        1: "uniq combine",
        2: "uniq-index",
        3: "uniq",
        4: "shards combine",
        5: "shards-index",
        6: "shards",
    }
    steps = {i.id: i.step for i in load_items(open_store(store_url), "chaos")}
    plan_of = StepPlan(load_spec(open_store(store_url), "chaos"))
    assert [plan_of.kind(s) for s in kind] == [MAP, COMBINE, BARRIER, ITEMS, COMBINE, BARRIER, ITEMS]
    targets = [(point, step) for step in kind for point in ("claimed", "uploaded")]
    kill_at_pauses(store_url, "chaos", 3, logs, CHAOS_PAUSES, targets, steps.get, lambda point: WINDOW[point] - 0.3)
    assert _digests(store_url, "chaos") == expected

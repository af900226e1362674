"""Stages: MapReduce through the bucket, on the same leases and workers (issue 19).

A tiny job with stages (tests/helpers/stagejob.py) keeps the fleet's part apart from any
real job's: lines are mapped to keyed records, an optional ``uniq`` stage drops repeated
lines, and ``--shards N`` writes them in the seeded global order to N balanced files.
"""

from __future__ import annotations

import glob
import io
import os
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from fleet.cli.local import run_local
from fleet.core.claims import ClaimPolicy
from fleet.core.lease import DONE, FAILED, Lease
from fleet.core.run import load_items
from fleet.core.store import open_store
from fleet.job import StageOptions, shuffle_key
from tests.helpers.procs import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "tests.helpers.stagejob:JOB"
FLEET = [sys.executable, "-m", "fleet.cli"]


# -- the claim policy's gate, pure -----------------------------------------------------------
def _policy(standby=False):
    steps = {"shards-index": 1, "00000-of-00002": 2, "00001-of-00002": 2}
    return ClaimPolicy(["00000", "00001", *steps], "w", 10.0, standby, steps=steps, barriers=["shards-index"])


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
    policy.observe(list(listing) + ["00000-of-00002", "00001-of-00002"],
                   {**listing, "00000-of-00002": 1, "00001-of-00002": 1}, 0.0)
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
    result = run_local([corpus], str(out), JOB, workers, {k: str(v) for k, v in settings.items()},
                       item_bytes=item_bytes, console=console, stage_options=StageOptions(shards, dedup),
                       lease_ttl=10)
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
        {"name": "map", "items": result.status.stages[0]["items"], "done": result.status.stages[0]["items"],
         "failed": 0, "leased": 0, "blocked": 0},
        {"name": "shards", "items": 4, "done": 4, "failed": 0, "leased": 0, "blocked": 0}]
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


def test_a_failed_map_item_blocks_the_stages_after_it_and_writes_no_output(corpus, tmp_path):
    out = tmp_path / "out"
    result, text = _run(corpus, out, shards=2, poison="doc 7 ")
    assert result.exit_code == 1
    st = result.status
    assert st.failed == 2  # the poisoned map item and the barrier that refused to index without it
    assert st.blocked == 2 and st.finished
    assert not _shards(str(out))
    assert "stage shards cannot run: 1 item(s) before it failed" in text
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


@pytest.mark.parametrize("args, message", [
    (["--shards", "0"], "--shards 0: give 1 to 100000"),
    (["--shards", "-3"], "--shards -3: give 1 to 100000"),
    (["--dedup", "fuzzy"], "--dedup 'fuzzy': unknown mode; known: lines"),
])
def test_bad_stage_options_are_one_line_exit_2_and_nothing_written(corpus, tmp_path, args, message):
    out = tmp_path / "out"
    proc = _cli("local", corpus, str(out), "--job", JOB, "--workers", "1", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(out / ".fleet" / "runs")


@pytest.mark.parametrize("job, settings, message", [
    ("command", ["--set", "command=cp {input} {output}/x"], "--shards: job command cannot shard its outputs (it has no stages)"),
    ("tests.helpers.linejob:JOB", [], "--shards: job linejob writes no examples of fixed features"),
])
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
    assert proc.returncode == 0, proc.stderr
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


# -- worker deaths in every step ------------------------------------------------------------------
CHAOS_PAUSES = {"FLEET_TEST_PAUSE": "claimed=0.6,uploaded=0.8"}
WINDOW = {"claimed": 0.6, "uploaded": 0.8}


def _plan(bucket, run, corpus, shards, ttl, **settings):
    from fleet.core.run import plan

    plan(bucket, run, JOB, [corpus], f"{bucket}/out-{run}", {k: str(v) for k, v in settings.items()}, "test",
         lease_ttl=ttl, max_attempts=10, item_bytes=2500, stage_options=StageOptions(shards, "lines"))


def _digests(bucket, run):
    """Every lease done; name -> sha256 of everything committed, outputs and records between stages
    alike. Not the indexes: they pin the object versions of the records they index, which differ
    from run to run (and after a retry rewrote a piece) while the bytes stay the same."""
    from tests.helpers.procs import committed

    return {name.replace(f"runs/{run}/", ""): sha for name, sha in committed(bucket, run).items()
            if not name.endswith(".index")}


def test_sigkills_in_every_step_leave_the_bytes_of_a_clean_run(store_url, corpus, tmp_path):
    from tests.helpers.procs import start_worker, wait_exit

    logs = str(tmp_path / "logs")
    _plan(store_url, "clean", corpus, 3, ttl=30)
    solo = start_worker(store_url, "clean", "solo", logs)
    wait_exit([solo], 120)
    expected = _digests(store_url, "clean")
    items = {i.id: i for i in load_items(open_store(store_url), "clean")}
    assert sum(1 for i in items.values() if i.step == 0) >= 6

    # A TTL above the two pauses together: an item too short to renew its lease is not taken over.
    _plan(store_url, "chaos", corpus, 3, ttl=2.5, delay=0.03, reduce_delay=0.01)
    live = [start_worker(store_url, "chaos", f"w{i}", logs, CHAOS_PAUSES) for i in range(3)]
    everyone, serial = list(live), 3
    kind = {0: "map", 1: "uniq-index", 2: "uniq", 3: "shards-index", 4: "shards"}
    steps = {i.id: i.step for i in load_items(open_store(store_url), "chaos")}
    targets = [(point, step) for step in (0, 1, 2, 3, 4) for point in ("claimed", "uploaded")]
    killed = []
    deadline = time.time() + 150
    while targets and any(w.alive() for w in live):
        assert time.time() < deadline, f"kills left: {targets}; done: {killed}"
        for w in [w for w in live if w.alive()]:
            at = w.paused()
            if at and (at[0], steps[at[1]]) in targets and at[2] < WINDOW[at[0]] - 0.3:
                w.popen.send_signal(signal.SIGKILL)
                w.popen.wait()
                targets.remove((at[0], steps[at[1]]))
                killed.append((at[0], kind[steps[at[1]]], at[1]))
                live.remove(w)
                fresh = start_worker(store_url, "chaos", f"w{serial}", logs, CHAOS_PAUSES)
                serial += 1
                live.append(fresh)
                everyone.append(fresh)
                break
        time.sleep(0.02)
    wait_exit([w for w in live if w.alive()], 120)
    assert not targets, f"no kill landed at {targets} (killed: {killed})"
    for w in everyone:
        assert "Traceback" not in w.stderr_text(), w.stderr_text()
    assert _digests(store_url, "chaos") == expected

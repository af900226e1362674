"""Worker deaths: SIGKILL at random moments, and at the moments that matter.

Workers are real processes running the real loop on a local folder and on
fake-gcs-server. The test-only hook FLEET_TEST_PAUSE (fleet/core/attempt.py) makes
each worker log and linger at three points: right after its claim is written
("claimed"), at its first document ("converting"), and after its outputs are
written but before its lease says done ("uploaded"). The test kills workers
there and anywhere else, starts replacements, and checks at the end that
every item is done exactly once in effect, with the bytes of a clean run.
"""

from __future__ import annotations

import collections
import json
import random
import re
import signal
import time

import pytest

from fleet.core.lease import DONE, LEASED, Lease
from fleet.core.layout import lease_prefix, worker_prefix
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from tests.helpers.procs import clean_run, committed, listed_outputs, plan_lines, start_worker, wait_exit, write_corpus

TTL = 1.5
PAUSES = {"FLEET_TEST_PAUSE": "claimed=0.5,converting=0,uploaded=0.8"}
POINTS = ("claimed", "converting", "uploaded", "anywhere")
# How long a worker stays at each point: the pauses above, and for "converting" the
# conversion itself (about six documents at 0.1 s each). A kill aimed at a point must land
# at least MARGIN seconds before the window closes.
WINDOW = {"claimed": 0.5, "converting": 0.5, "uploaded": 0.8}
MARGIN = 0.2
KILLS_PER_STORE = 12  # two stores: 24 kills in all
ITEM_BYTES = 1800  # about six documents of the corpus below
DONE_LINE = re.compile(r"item (\S+) done in")


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(str(tmp_path / "corpus.txt"), docs=150, seed=5)


def test_random_sigkills_lose_nothing_and_commit_nothing_twice(store_url, corpus, tmp_path):
    rng = random.Random(20240605)
    logs = str(tmp_path / "logs")
    expected = clean_run(store_url, "clean", corpus, ITEM_BYTES, logs)
    assert len(expected) >= 20

    store = open_store(store_url)
    kills: list[tuple[str, str, str, str]] = []  # (run, point, victim, item)
    workers = []
    runs = []
    deadline = time.time() + 75
    while len(kills) < KILLS_PER_STORE:
        # A run with 3 workers, then another if the first drains before enough kills.
        run = f"chaos{len(runs)}"
        runs.append(run)
        plan_lines(store_url, run, corpus, ITEM_BYTES, ttl=TTL, delay=0.1)
        live = [start_worker(store_url, run, f"{run}-w{i}", logs, PAUSES) for i in range(3)]
        workers += live
        serial = 3
        while len(kills) < KILLS_PER_STORE and any(w.alive() for w in live):
            assert time.time() < deadline, f"chaos did not finish: {len(kills)} kills"
            point = POINTS[len(kills) % len(POINTS)]
            victim, item = None, ""
            until = time.time() + 5
            wait = rng.uniform(0, 0.15) if point != "anywhere" else rng.uniform(0, 0.6)
            while victim is None and time.time() < until and any(w.alive() for w in live):
                ready = [(w, w.paused()) for w in live if w.alive()]
                if point == "anywhere":
                    ready = [(w, at) for w, at in ready if w.log_lines()]  # started, somewhere in its loop
                else:
                    # Only a worker that will still be inside the pause when the signal lands:
                    # one found late (a loaded machine) may already have moved on.
                    ready = [
                        (w, at) for w, at in ready if at and at[0] == point and at[2] + wait < WINDOW[point] - MARGIN
                    ]
                if ready:
                    victim, at = rng.choice(ready)
                    item = at[1] if at else ""
                else:
                    time.sleep(0.01)
            if victim is None:
                continue  # this run is draining; try the next point or the next run
            time.sleep(wait)
            victim.popen.send_signal(signal.SIGKILL)
            victim.popen.wait()
            if point != "anywhere" and _committed_by(store, run, item, victim.name):
                point = "anywhere"  # this test process stalled past the window: say where the kill really fell
            kills.append((run, point, victim.name, item))
            live.remove(victim)
            replacement = start_worker(store_url, run, f"{run}-w{serial}", logs, PAUSES)
            serial += 1
            live.append(replacement)
            workers.append(replacement)
        wait_exit([w for w in live if w.alive()], 90)

    assert len(kills) >= KILLS_PER_STORE
    assert {k[1] for k in kills} == set(POINTS), kills
    for w in workers:
        assert "Traceback" not in w.stderr_text(), w.stderr_text()
        assert w.popen.returncode in (0, -signal.SIGKILL), (w.name, w.popen.returncode, w.log_lines()[-5:])

    for run in runs:
        st = StatusReader(store, run).collect()
        assert (st.done, st.leased, st.pending, st.failed) == (st.items, 0, 0, 0), st
        got = committed(store_url, run)
        assert got == expected, f"{run}: outputs differ from the clean run's"
        # What is listed under the output prefix is exactly what the leases name, byte for byte:
        # a killed worker's upload was either rewritten identically or never happened.
        assert listed_outputs(f"{store_url}/out-{run}") == expected
        leases = StatusReader(store, run).leases()
        # No item committed by two workers: each "done" log line names a distinct item.
        done_by = collections.defaultdict(set)
        for w in workers:
            if w.name.startswith(f"{run}-"):
                for line in w.log_lines():
                    m = DONE_LINE.search(line)
                    if m:
                        done_by[m.group(1)].add(w.name)
        assert all(len(names) == 1 for names in done_by.values()), done_by
        for run_, point, victim, item in kills:
            if run_ == run and point != "anywhere":
                lease = leases[item]
                # The victim held the item and had not committed; someone else finished it.
                assert lease.state == DONE and lease.worker != victim and lease.attempt >= 2, (point, victim, lease)
                assert victim not in done_by.get(item, set())


def _committed_by(store, run, item, worker) -> bool:
    lease = StatusReader(store, run).leases().get(item)
    return bool(lease and lease.state == DONE and lease.worker == worker)


def _stop_at(store_url, tmp_path, point):
    """Freeze a worker (SIGSTOP) at `point` until another worker has taken its item
    over and finished the run, then let it go on: it must discard, not commit."""
    logs = str(tmp_path / "logs")
    corpus = write_corpus(str(tmp_path / "small.txt"), docs=36, seed=6)  # three items of ~12 documents
    expected = clean_run(store_url, "clean", corpus, ITEM_BYTES * 2, logs)
    plan_lines(store_url, "stop", corpus, ITEM_BYTES * 2, ttl=TTL, delay=0.08)
    store = open_store(store_url)
    pause = "converting=0.3,uploaded=0" if point == "converting" else "uploaded=0.3"
    frozen = start_worker(store_url, "stop", "frozen", logs, {"FLEET_TEST_PAUSE": pause})
    deadline = time.time() + 30
    while not (frozen.at() and frozen.at()[0] == point):
        assert time.time() < deadline and frozen.alive(), frozen.log_lines()
        time.sleep(0.01)
    item = frozen.at()[1]
    frozen.popen.send_signal(signal.SIGSTOP)
    try:
        other = start_worker(store_url, "stop", "other", logs)
        wait_exit([other], 60)
        assert other.popen.returncode == 0, other.stderr_text()
        lease = Lease.from_json(store.read(lease_prefix("stop") + item))
        assert lease.state == DONE and lease.worker == "other" and lease.attempt == 2
    finally:
        frozen.popen.send_signal(signal.SIGCONT)
    wait_exit([frozen], 30)
    assert frozen.popen.returncode == 0, frozen.stderr_text()
    log = "\n".join(frozen.log_lines())
    assert f"item {item}: lease taken over" in log and "discarding its work" in log, log
    assert f"item {item} done" not in log
    beat = json.loads(store.read(worker_prefix("stop") + "frozen"))
    assert (beat["items_lost"], beat["items_done"], beat["state"]) == (1, 0, "exited")
    final = Lease.from_json(store.read(lease_prefix("stop") + item))
    assert final == lease  # the frozen worker wrote nothing to the lease after waking
    assert committed(store_url, "stop") == expected
    assert listed_outputs(f"{store_url}/out-stop") == expected
    return log, item


def test_a_worker_that_lost_its_lease_mid_conversion_stops_and_discards(store_url, tmp_path):
    log, item = _stop_at(store_url, tmp_path, "converting")
    # The renewal found the lease taken over and stopped the conversion before any upload.
    assert "before commit" not in log
    assert f"test pause at uploaded, item {item}" not in log


def test_a_worker_that_lost_its_lease_after_uploading_never_commits(store_url, tmp_path):
    log, item = _stop_at(store_url, tmp_path, "uploaded")
    # Frozen after its last renewal, it woke up and tried to commit: the conditional write refused.
    assert f"item {item}: lease taken over before commit" in log


def test_no_lease_left_leased_after_kills_is_checked_by_status(store_url, corpus, tmp_path):
    """The checks above rely on StatusReader; make sure it does see a dead worker's lease as leased."""
    plan_lines(store_url, "held", corpus, ITEM_BYTES, ttl=30, delay=0.1)
    w = start_worker(store_url, "held", "victim", str(tmp_path / "logs"), {"FLEET_TEST_PAUSE": "claimed=5"})
    deadline = time.time() + 30
    while not w.at():
        assert time.time() < deadline and w.alive()
        time.sleep(0.01)
    w.popen.send_signal(signal.SIGKILL)
    w.popen.wait()
    st = StatusReader(open_store(store_url), "held").collect()
    assert st.leased == 1 and st.done == 0
    lease = StatusReader(open_store(store_url), "held").leases()[w.at()[1]]
    assert lease.state == LEASED and lease.worker == "victim"

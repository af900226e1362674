"""An item's state has one source of truth, its lease; outputs a done item names exist and match (issue 17).

The ``final/`` markers are a cache of "this lease is done or failed", so that one listing
tells a worker what is left. A marker whose lease is gone is stale: it must neither strand
the item nor let a run, `fleet status --verify` or a rerun call it finished. And the cheap
check of a done item's outputs (no hashing) must see an output rewritten in place even
when its mtime was put back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path
import pytest

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleet.core.claims import ClaimPolicy
from fleet.core.lease import DONE, Lease
from fleet.core.run import PlanRequest, load_spec, plan
from fleet.core.layout import final_prefix, lease_prefix
from fleet.core.spawner import Worker
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.core import verify
from fleet.core.verify import check_outputs, reopen
from tests.helpers.cli import fleet
from tests.helpers.procs import LINEJOB, write_corpus

RUN = "r"


def local(inputs, out, *extra, tmp=None):
    return fleet("local", inputs, out, "--job", LINEJOB, "--workers", "1", *extra, tmp=tmp)


def outputs(out) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(out).glob("part-*"))}


ONE_EACH = ("--item-mb", "0.015")  # a.txt and b.txt below an item each, not grouped into one


def corpus(folder: Path) -> Path:
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 60)
    write_corpus(str(folder / "b.txt"), 40, seed=1)
    return folder


# -- the claim policy and the drain check take the lease for the truth -----------------------------
def test_a_final_marker_without_its_lease_is_stale_and_the_item_is_claimable():
    policy = ClaimPolicy(["a", "b"], "w", 60.0)
    policy.observe(finals=["a", "b"], listing={"b": 7}, now=0.0)
    assert policy.stale == {"a"}
    assert ("a", True) in policy.candidates(0.0, 0.0)  # unleased: claimed as new
    assert not policy.drained()


def test_a_marker_counts_only_while_its_lease_is_listed():
    policy = ClaimPolicy(["a"], "w", 60.0)
    policy.observe(finals=["a"], listing={"a": 3}, now=0.0)
    assert policy.drained()
    policy.observe(finals=["a"], listing={}, now=1.0)  # the lease deleted since: not finished any more
    assert not policy.drained() and policy.candidates(1.0, 1.0) == [("a", True)]


# -- in process: a worker converts an item whose marker is stale ----------------------------------------
def _plan(tmp_path: Path, docs: int = 30, bucket: str | None = None, lease_ttl: float = 30):
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    write_corpus(str(folder / "a.txt"), docs)
    bucket = bucket or str(tmp_path / "bucket")
    output = f"{bucket}/out" if bucket.startswith("gs://") else str(tmp_path / "out")
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run=RUN,
            job=LINEJOB,
            inputs=[str(folder)],
            output=output,
            code_version="test",
            lease_ttl=lease_ttl,
            max_attempts=3,
            item_bytes=600,
        ),
    )
    return bucket, items


def _drain(bucket: str) -> None:
    worker = Worker(bucket, RUN, name="w", poll=0.01)
    try:
        worker.run_until_drained()
    finally:
        worker.close()


def _state(bucket: str) -> tuple[dict[str, Lease], set[str]]:
    store = open_store(bucket)
    reader = StatusReader(store, RUN)
    return reader.leases(), {b.name[len(final_prefix(RUN)) :] for b in store.list(final_prefix(RUN))}


def _drained(bucket: str):
    """(the run's store, its output store, the outputs' bytes) once a worker drained the run."""
    _drain(bucket)
    store = open_store(bucket)
    out = open_store(load_spec(store, RUN).output)
    return store, out, {b.name: out.read(b.name) for b in out.list("part-")}


def _assert_as_clean(bucket: str, items, out, clean) -> dict[str, Lease]:
    """Every item done once, its marker beside its lease, and the outputs a clean run's."""
    leases, finals = _state(bucket)
    assert all(lease.state == DONE for lease in leases.values()) and len(leases) == len(items)
    assert finals == set(leases)
    assert {b.name: out.read(b.name) for b in out.list("part-")} == clean
    return leases


def test_a_worker_converts_again_an_item_whose_lease_was_deleted_under_its_marker(tmp_path, caplog, store_url):
    bucket, items = _plan(tmp_path, bucket=store_url)
    store, out, clean = _drained(bucket)
    store.delete(lease_prefix(RUN) + items[0].id)
    out.delete(f"part-{items[0].id}.txt")
    _drain(bucket)
    _assert_as_clean(bucket, items, out, clean)
    assert any("stale" in r.getMessage() and items[0].id in r.getMessage() for r in caplog.records), caplog.text


def test_a_run_left_by_workers_before_windows_resumes_and_finishes_every_item_once(tmp_path, store_url):
    """A run planned and partly worked by the code before issue 28 has leases and final/ markers
    but no done/ markers of windows: workers of this code pick it up where it stands."""
    from fleet.core.layout import done_prefix

    bucket, items = _plan(tmp_path, docs=120, bucket=store_url)
    assert len(items) > 16  # several windows
    store, out, clean = _drained(bucket)
    assert list(store.list(done_prefix(RUN)))
    for b in store.list(done_prefix(RUN)):
        store.delete(b.name)
    pending = [items[1].id, items[len(items) // 2].id, items[-1].id]
    for item in pending:  # as the old code's reopen left them: the marker, then the lease
        store.delete(final_prefix(RUN) + item)
        store.delete(lease_prefix(RUN) + item)
        out.delete(f"part-{item}.txt")
    _drain(bucket)
    leases = _assert_as_clean(bucket, items, out, clean)
    assert all(leases[i].attempt == 1 for i in pending)


# -- as a user meets it: `fleet local` reruns and `fleet status --verify` -------------------------------
def test_fleet_local_converts_again_an_item_whose_lease_was_deleted_and_says_so(tmp_path):
    src, out = corpus(tmp_path / "in"), tmp_path / "out"
    assert local(src, out, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    (out / ".fleet" / "runs" / "local" / "leases" / "00000").unlink()
    (out / "part-00000.txt").unlink()
    proc = local(src, out, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "stale" in line]
    assert len(lines) == 1 and "00000" in lines[0], proc.stderr
    assert outputs(out) == clean


def test_status_verify_names_a_stale_marker_and_a_rerun_finishes(tmp_path):
    src, out = corpus(tmp_path / "in"), tmp_path / "out"
    assert local(src, out, *ONE_EACH, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    (out / ".fleet" / "runs" / "local" / "leases" / "00000").unlink()
    (out / "part-00000.txt").unlink()
    proc = fleet("status", out, "--verify")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "stale" in line]
    assert len(lines) == 1 and "00000" in lines[0], proc.stderr
    assert not (out / ".fleet" / "runs" / "local" / "final" / "00000").exists()  # repaired
    proc = local(src, out, *ONE_EACH, tmp=tmp_path)
    assert proc.returncode == 0 and "1 of 2 items already done" in proc.stderr, proc.stderr
    assert outputs(out) == clean


# -- 12a: an output rewritten in place with its mtime put back --------------------------------------------
def _rewrite_keeping_mtime(path: Path) -> None:
    before = path.stat()
    data = path.read_bytes()
    with open(path, "r+b") as f:  # in place: the same inode, the same size
        f.write(b"X" if data[:1] != b"X" else b"Y")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_the_cheap_output_check_sees_an_in_place_rewrite_with_the_mtime_restored(tmp_path):
    bucket, items = _plan(tmp_path)
    _drain(bucket)
    spec = load_spec(open_store(bucket), RUN)
    leases, _ = _state(bucket)
    assert check_outputs(spec, leases) == []
    _rewrite_keeping_mtime(tmp_path / "out" / f"part-{items[1].id}.txt")
    damage = check_outputs(spec, leases)  # not deep: no output hashed unless its version moved
    assert [(d.item, "sha256" in d.why) for d in damage] == [(items[1].id, True)], damage


def test_fleet_local_converts_again_an_output_rewritten_with_its_mtime_restored(tmp_path):
    src, out = corpus(tmp_path / "in"), tmp_path / "out"
    assert local(src, out, *ONE_EACH, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    _rewrite_keeping_mtime(out / "part-00001.txt")
    proc = local(src, out, *ONE_EACH, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "part-00001.txt" in proc.stderr and "converted again" in proc.stderr, proc.stderr
    assert outputs(out) == clean


# -- the invariant: whatever is deleted or rewritten, a rerun ends with every item done and matching -----
ACTIONS = st.lists(
    st.tuples(st.sampled_from(["lease", "marker", "output", "rewrite", "reopen", "run"]), st.integers(0, 5)), max_size=8
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_any_deletions_of_leases_markers_and_outputs_end_in_a_clean_run(tmp_path_factory, actions):
    tmp = tmp_path_factory.mktemp("state")
    # A deleted final/ marker leaves a done/ window marker over an unfinished item: the worker reads
    # that lease once it stood still for half a TTL. 2 s (a 1 s wait, not 15) for the 25 examples;
    # the items convert in milliseconds, renewed every third of it, and one in-process worker at a
    # time drains the run, so no other worker could take a lease over (the TTL is the wait, only).
    bucket, items = _plan(tmp, docs=12, lease_ttl=2)
    _drain(bucket)
    store, out = open_store(bucket), open_store(str(tmp / "out"))
    clean = {b.name: out.read(b.name) for b in out.list("part-")}
    for action, n in actions:
        item = items[n % len(items)].id
        if action == "lease":
            store.delete(lease_prefix(RUN) + item)
        elif action == "marker":
            store.delete(final_prefix(RUN) + item)
        elif action == "output":
            out.delete(f"part-{item}.txt")
        elif action == "rewrite":
            path = tmp / "out" / f"part-{item}.txt"
            if path.exists():
                _rewrite_keeping_mtime(path)
        elif action == "reopen":
            reopen(store, RUN, [item])
        else:
            _drain(bucket)
    # A rerun, as `fleet local` does it, but leaving stale markers to the workers: lost outputs
    # found by the cheap check and reopened, then workers.
    spec = load_spec(store, RUN)
    leases, _ = _state(bucket)
    reopen(store, RUN, sorted({d.item for d in check_outputs(spec, leases)}))
    _drain(bucket)
    leases, finals = _state(bucket)
    assert sorted(leases) == [i.id for i in items] and all(lease.state == DONE for lease in leases.values())
    assert finals == set(leases)
    assert check_outputs(spec, leases, deep=True) == []
    assert {b.name: out.read(b.name) for b in out.list("part-")} == clean
    assert verify.stale_markers(store, RUN) == []


# -- `fleet local` stops its workers once the run is finished: a worker already leaving ignores it ----------
def test_a_sigterm_while_a_drained_worker_sweeps_its_scratch_is_no_traceback(tmp_path, monkeypatch):
    import signal

    from fleet.core import processes, spawner

    bucket, _ = _plan(tmp_path)
    close = spawner.Worker.close

    def close_under_sigterm(self):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the sweep, as the race had it
        close(self)

    monkeypatch.setattr(spawner.Worker, "close", close_under_sigterm)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        assert processes.work_one(bucket, RUN, "w", log_file=str(tmp_path / "w.log")) == 0
    finally:  # work_one sets up the process's logging: give pytest its own back
        root.handlers[:], root.level = handlers, level
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    leases, _ = _state(bucket)
    assert leases and all(lease.state == DONE for lease in leases.values())


def _work_one_here(bucket: str, log_file: Path) -> int:
    """processes.work_one in this process, the test process's signal handlers and logging put back."""
    import signal

    from fleet.core import processes

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return processes.work_one(bucket, RUN, "w", log_file=str(log_file))
    finally:
        root.handlers[:], root.level = handlers, level
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


@pytest.mark.parametrize("step", ["progress", "freeze"])
def test_a_sigterm_while_a_worker_sets_up_after_its_start_is_no_traceback(tmp_path, monkeypatch, step):
    """A loaded suite run: a forked worker, started as its sibling finished the run, was SIGTERMed by
    `fleet local` while it started its progress thread, and the Shutdown escaped as a traceback.
    Invariant: from the worker's start to its end, a signal is a stop, never a traceback."""
    import gc
    import signal

    from fleet.core import processes

    bucket, _ = _plan(tmp_path)
    if step == "progress":
        monkeypatch.setattr(processes._ProgressLog, "start", lambda self: os.kill(os.getpid(), signal.SIGTERM))
    else:
        monkeypatch.setattr(gc, "freeze", lambda: os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        assert processes.work_one(bucket, RUN, "w", log_file=str(tmp_path / "w.log")) == 0
    finally:
        root.handlers[:], root.level = handlers, level
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # work_one put them back
    assert "stopped by a signal" in (tmp_path / "w.log").read_text()
    leases, _ = _state(bucket)
    assert not leases  # it held nothing yet


def test_a_run_planned_before_an_option_existed_resumes_with_its_default(tmp_path):
    """A job that gains an option (causal_lm's provenance, tokenizer_type...) must not refuse to
    resume the runs planned before: they ran with what is now the default. Another value is refused."""
    import json

    import pytest

    from fleet.core.run import PlanError

    corpus = tmp_path / "c.txt"
    corpus.write_text("a\nb\n\nc\n", encoding="utf-8")
    bucket, job = str(tmp_path / "b"), "tests.helpers.linejob:JOB"
    plan(bucket, PlanRequest(run="r", job=job, inputs=[str(corpus)], output=str(tmp_path / "out"), code_version="v"))
    spec_path = tmp_path / "b" / "runs" / "r" / "run.json"
    old = json.loads(spec_path.read_text())
    del old["config"]["poison"]  # as written by a version of the job without that option
    spec_path.write_text(json.dumps(old))
    spec, _, created = plan(
        bucket, PlanRequest(run="r", job=job, inputs=[str(corpus)], output=str(tmp_path / "out"), code_version="v")
    )
    assert not created and spec.config["poison"] == ""
    with pytest.raises(PlanError, match="option poison is 'x', was ''"):
        plan(
            bucket,
            PlanRequest(
                run="r",
                job=job,
                inputs=[str(corpus)],
                output=str(tmp_path / "out"),
                code_version="v",
                settings={"poison": "x"},
            ),
        )


# -- the resume repair, one function for `fleet local` and `fleet status --verify` (issue 31) -----------
DAMAGES = st.sampled_from(
    ["none", "none", "lease deleted", "lease damaged", "output deleted", "output changed", "failed"]
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damages=st.lists(DAMAGES, min_size=1, max_size=8))
@example(damages=["lease deleted"])  # (found by the property: the stale marker went, the manifest stayed)
def test_the_repair_reopens_exactly_what_is_wrong_and_a_drain_then_gives_the_clean_run(tmp_path_factory, damages):
    """Whatever mix of damage a finished run takes (a lease deleted under its marker or made
    unreadable, an output deleted or rewritten, an item failed), fleet.core.repair.repair_run
    sends back exactly the items hit, and one drain after it gives the clean run's outputs and
    manifest, byte for byte."""
    from fleet.core.manifest import MANIFEST
    from fleet.core.repair import repair_run

    bucket, items = _plan(tmp_path_factory.mktemp("run"))
    store, out, clean = _drained(bucket)
    manifest = out.read(MANIFEST)
    hit: dict[str, set[str]] = {}
    for item, damage in zip(items, damages):
        hit.setdefault(damage, set()).add(item.id)
        name, part = lease_prefix(RUN) + item.id, f"part-{item.id}.txt"
        if damage == "lease deleted":
            store.delete(name)
        elif damage == "lease damaged":
            store.write(name, b"{not a lease")
        elif damage == "output deleted":
            out.delete(part)
        elif damage == "output changed":
            out.write(part, b"other bytes\n")
        elif damage == "failed":
            store.write(name, Lease("failed", "w", 3, 0.0, error="boom").to_json())
    fix = repair_run(store, StatusReader(store, RUN), deep=True, retry_failed=True)
    assert fix.stale == sorted(hit.get("lease deleted", ()))
    assert set(fix.damaged) == hit.get("lease damaged", set())
    assert {d.item for d in fix.lost} == hit.get("output deleted", set()) | hit.get("output changed", set())
    assert set(fix.retried) == hit.get("failed", set())
    wrong = set().union(*(v for k, v in hit.items() if k != "none"))
    leases, finals = _state(bucket)
    assert not wrong & {i for i, lease in leases.items() if lease.state == DONE} and not wrong & finals
    if wrong:
        assert not out.stat(MANIFEST)  # a run with pending items is not finished
    _drain(bucket)
    _assert_as_clean(bucket, items, out, clean)
    assert out.read(MANIFEST) == manifest


def _sigterm_at_line(n: int, tmp: Path) -> tuple[int, int, str, dict[str, Lease]]:
    """work_one traced, line by line in fleet/core/processes.py, with a SIGTERM sent to itself at
    its n-th line while one of the worker's own handlers is in place (pytest's would end the test
    run): (its exit code, the lines it ran, its log, the run's leases)."""
    import signal
    import sys

    from fleet.core import processes

    bucket, _ = _plan(tmp)
    seen = [0]
    ours = (processes._on_sigterm, processes._ignore)

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != processes.__file__:
            return None
        if event == "line":
            seen[0] += 1
            if seen[0] == n and signal.getsignal(signal.SIGTERM) in ours:
                os.kill(os.getpid(), signal.SIGTERM)
        return tracer

    sys.settrace(tracer)
    try:
        code = _work_one_here(bucket, tmp / "w.log")
    finally:
        sys.settrace(None)
    leases, _ = _state(bucket)
    log_file = tmp / "w.log"  # (none when stopped before the worker set up its logging)
    return code, seen[0], log_file.read_text() if log_file.exists() else "", leases


def test_a_sigterm_at_any_line_of_a_workers_life_is_a_stop_not_a_traceback(tmp_path_factory):
    """A SIGTERM after the drain loop's last turn, before the worker's handlers were quieted, raised
    its Shutdown outside every handler that expects one: a traceback and exit 1 for a worker that
    held nothing. Invariant: whichever line of the worker's own code a SIGTERM lands on, it exits 0,
    says no traceback, and leaves no live lease (its item given back, or done)."""
    import time

    code, lines, _, _ = _sigterm_at_line(10**9, tmp_path_factory.mktemp("clean"))  # (no signal)
    assert code == 0 and lines > 50

    @settings(max_examples=30, deadline=None, database=None)
    @given(at=st.integers(min_value=1, max_value=lines))
    def stopped(at):
        code, _, log_text, leases = _sigterm_at_line(at, tmp_path_factory.mktemp("w"))
        assert code == 0
        assert "Traceback" not in log_text
        assert not [lease for lease in leases.values() if lease.live(time.time())]

    stopped()


class _SigtermWhenCollected:
    """An object whose finalizer sends this process a SIGTERM: the worker's handler then runs inside
    the finalizer, where Python prints and drops whatever it raises."""

    def __del__(self):
        import signal

        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):  # (the handler runs between these bytecodes, still inside __del__)
            pass


def test_a_sigterm_that_python_swallows_in_a_finalizer_still_stops_the_worker(tmp_path, monkeypatch):
    """Seen while interrupting `fleet local` at every line: a worker's SIGTERM landed while the
    collector ran a finalizer, whose Shutdown Python printed ("Exception ignored") and dropped; the
    handlers, quiet since, let the worker drain the whole run, and the stop came only by SIGKILL.
    Invariant: a signal the worker got is a stop, wherever its Shutdown was raised, and says no
    traceback."""
    import sys
    import time

    from fleet.core.attempt import ItemRunner

    bucket, items = _plan(tmp_path)
    assert len(items) > 2
    real, fired = ItemRunner.process, []

    def process(self, item, held):
        real(self, item, held)
        if not fired:
            fired.append(1)
            _SigtermWhenCollected()  # (dropped at once: its __del__ runs now)

    monkeypatch.setattr(ItemRunner, "process", process)
    printed: list[BaseException] = []  # what Python would print as "Exception ignored in ..."
    ours = lambda u: printed.append(u.exc_value)  # noqa: E731
    monkeypatch.setattr(sys, "unraisablehook", ours)
    assert _work_one_here(bucket, tmp_path / "w.log") == 0
    assert fired and not printed
    assert sys.unraisablehook is ours  # put back as the worker left
    assert "stopped by a signal" in (tmp_path / "w.log").read_text()
    leases, _ = _state(bucket)
    assert sum(lease.state == DONE for lease in leases.values()) < len(items)  # it left the rest
    assert not [lease for lease in leases.values() if lease.live(time.time())]


def test_a_swallowed_sigterm_stops_an_idle_worker_at_its_next_pass(tmp_path, monkeypatch):
    """The same swallowed Shutdown, in a worker idle while another holds the last item: noted, it is
    raised at the worker's next pass, not when that lease expires and the worker claims the item."""
    import time

    from fleet.core import spawner
    from fleet.core.layout import lease_prefix
    from fleet.core.lease import Leases

    bucket, items = _plan(tmp_path)
    other = Leases(open_store(bucket), lease_prefix(RUN), "other", ttl=30, max_attempts=3)
    assert other.claim(items[-1].id, None) is not None  # held by a live worker elsewhere
    real, fired = time.sleep, []

    def sleep(seconds):  # the idle worker's sleep between sweeps; no waiting
        if not fired:
            fired.append(1)
            _SigtermWhenCollected()  # (dropped at once: its __del__ runs now)
        real(0.001)

    monkeypatch.setattr(spawner.time, "sleep", sleep)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    assert _work_one_here(bucket, tmp_path / "w.log") == 0
    assert fired
    assert "stopped by a signal" in (tmp_path / "w.log").read_text()
    leases, _ = _state(bucket)
    assert leases[items[-1].id].worker == "other" and leases[items[-1].id].live(time.time())

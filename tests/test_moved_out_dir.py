"""`fleet status --verify DIR` checks DIR, and `fleet local` resumes in DIR, wherever the run was planned (issue 30).

A `fleet local` run keeps its state in its output folder (OUT_DIR/.fleet), and run.json names the
folder it was planned in. A copied OUT_DIR was checked against the original folder (a deleted output
reported as fine); a moved one had every output called missing and every done item sent back to
pending; and `--verify` exited 0 whatever it found.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.core.lease import DONE
from fleet.core.layout import LOCAL_RUN, STATE_DIR
from fleet.core.run import PlanRequest, load_spec, output_place, plan
from fleet.core.spawner import Worker
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.core.verify import check_outputs
from tests.helpers.cli import fleet
from tests.helpers.procs import LINEJOB, write_corpus

ONE_EACH = ("--item-mb", "0.015")  # a.txt and b.txt an item each


def corpus(folder: Path) -> Path:
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 60)
    write_corpus(str(folder / "b.txt"), 40, seed=1)
    return folder


def local(inputs, out, *extra, tmp=None):
    return fleet("local", inputs, out, "--job", LINEJOB, "--workers", "1", *ONE_EACH, *extra, tmp=tmp)


def outputs(out) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(out).glob("part-*"))}


def done_items(out) -> list[str]:
    reader = StatusReader(open_store(str(Path(out) / STATE_DIR)), LOCAL_RUN)
    return sorted(i for i, lease in reader.leases().items() if lease.state == DONE)


# -- as a user meets it -------------------------------------------------------------------------------
def test_verify_of_a_copy_checks_the_copy_and_exits_1_on_damage(tmp_path):
    src, out, copy = corpus(tmp_path / "in"), tmp_path / "out", tmp_path / "copy"
    assert local(src, out, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    shutil.copytree(out, copy)
    (copy / "part-00000.txt").unlink()
    proc = fleet("status", copy, "--verify")
    assert proc.returncode == 1, proc.stderr
    assert "part-00000.txt is missing" in proc.stderr and "1 of 2 done items sent back" in proc.stderr, proc.stderr
    assert done_items(copy) == ["00001"]
    assert done_items(out) == ["00000", "00001"] and outputs(out) == clean  # the original: untouched
    proc = fleet("status", out, "--verify")
    assert proc.returncode == 0 and "all 2 done items match" in proc.stderr, proc.stderr
    proc = local(src, copy, tmp=tmp_path)  # resumed in the copy: the copy made whole, the original untouched
    assert proc.returncode == 0 and "copied or moved" in proc.stderr, proc.stderr
    assert outputs(copy) == clean and outputs(out) == clean


def test_verify_of_a_moved_out_dir_finds_its_outputs_and_a_rerun_resumes_there(tmp_path):
    src, out, moved = corpus(tmp_path / "in"), tmp_path / "out", tmp_path / "moved"
    assert local(src, out, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    out.rename(moved)
    proc = fleet("status", moved, "--verify")
    assert proc.returncode == 0 and "all 2 done items match" in proc.stderr, proc.stderr
    assert done_items(moved) == ["00000", "00001"]  # nothing sent back to pending
    (moved / "part-00001.txt").unlink()
    proc = local(src, moved, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "resuming it here" in proc.stderr and "1 of 2 items already done" in proc.stderr, proc.stderr
    assert outputs(moved) == clean and not out.exists()  # written where the run is now, not where it was


def test_verify_exits_1_when_an_output_in_place_is_gone(tmp_path):
    src, out = corpus(tmp_path / "in"), tmp_path / "out"
    assert local(src, out, tmp=tmp_path).returncode == 0
    (out / "part-00001.txt").write_bytes(b"other\n")
    proc = fleet("status", out, "--verify")
    assert proc.returncode == 1 and "part-00001.txt has" in proc.stderr, proc.stderr
    proc = fleet("status", out, "--verify")  # sent back to pending: nothing done is damaged now
    assert proc.returncode == 0, proc.stderr


# -- the invariant, over copies, moves and damage -------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished `fleet local`-shaped run planned in PLANNED (state in PLANNED/.fleet), kept as TEMPLATE."""
    base = tmp_path_factory.mktemp("moved")
    folder = base / "in"
    folder.mkdir()
    for n in range(5):
        write_corpus(str(folder / f"{n}.txt"), 12, seed=n)
    planned = base / "planned"
    _, items, _ = plan(
        str(planned / STATE_DIR),
        PlanRequest(
            run=LOCAL_RUN,
            job=LINEJOB,
            inputs=[str(folder)],
            output=str(planned),
            code_version="test",
            lease_ttl=30,
            item_bytes=600,
        ),
    )
    worker = Worker(str(planned / STATE_DIR), LOCAL_RUN, name="w", poll=0.01)
    try:
        worker.run_until_drained()
    finally:
        worker.close()
    template = base / "template"
    planned.rename(template)
    return base, planned, template


DAMAGE = st.dictionaries(st.integers(0, 9), st.sampled_from(["delete", "rewrite"]), max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(copied=st.booleans(), damage=DAMAGE, damage_planned=DAMAGE, renamed=st.booleans())
def test_the_outputs_checked_are_those_of_the_folder_named(finished, copied, damage, damage_planned, renamed):
    """Invariant: checking a `fleet local` run's outputs through the state in folder D finds damaged
    exactly the done items whose outputs in D are gone or changed, whether D is the folder the run was
    planned in, a copy of it (the original there, damaged or not) or the folder moved; the place
    checked is D itself."""
    base, planned, template = finished
    here = base / ("here" if renamed else "planned")
    try:
        if copied or not renamed:  # the folder planned in is there: D itself, or the copy's original
            shutil.copytree(template, planned)
        if renamed:  # D elsewhere: a copy, or the folder moved (then the planned one is gone)
            shutil.copytree(template, here)
        names = sorted(p.name for p in here.glob("part-*"))
        hit = _damage(here, names, damage)
        if here != planned and planned.exists():
            _damage(planned, names, damage_planned)  # the original's damage is not the copy's
        state = open_store(str(here / STATE_DIR))
        spec = load_spec(state, LOCAL_RUN)
        assert output_place(spec, state) == str(here) and spec.output == str(planned)
        leases = StatusReader(state, LOCAL_RUN).leases()
        found = check_outputs(spec, leases, deep=True, state=state)
        by_output = {out["name"]: item for item, lease in leases.items() for out in lease.outputs}
        assert sorted({d.item for d in found}) == sorted({by_output[n] for n in hit})
    finally:
        for folder in (planned, here):
            shutil.rmtree(folder, ignore_errors=True)


def _damage(folder: Path, names: list[str], damage: dict[int, str]) -> set[str]:
    hit = set()
    for n, how in damage.items():
        name = names[n % len(names)]
        if how == "delete":
            (folder / name).unlink(missing_ok=True)
        else:
            (folder / name).write_bytes(b"not what was committed\n")
        hit.add(name)
    return hit


# -- a reopened run is not finished: its manifest goes ---------------------------------------------------
def test_a_reopened_item_takes_the_manifest_with_it_and_the_run_writes_it_again(tmp_path):
    """Invariant: manifest.json is in the output place only while every item is done. (verify.reopen
    left it, and finish_run returns early when one is there: a run with pending items kept
    claiming it was finished, counts and all.)"""
    from fleet.core.layout import finishing_name
    from fleet.core.manifest import MANIFEST
    from fleet.core.verify import reopen

    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 30)
    out = tmp_path / "out"
    bucket = str(out / STATE_DIR)
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run=LOCAL_RUN,
            job=LINEJOB,
            inputs=[str(folder)],
            output=str(out),
            code_version="test",
            lease_ttl=30,
            item_bytes=600,
        ),
    )

    def drain():
        worker = Worker(bucket, LOCAL_RUN, name="w", poll=0.01)
        try:
            worker.run_until_drained()
        finally:
            worker.close()

    drain()
    manifest = (out / MANIFEST).read_bytes()
    reopen(open_store(bucket), LOCAL_RUN, [items[1].id])
    assert not (out / MANIFEST).exists()
    assert open_store(bucket).stat(finishing_name(LOCAL_RUN)) is None  # the next drain writes it at once
    drain()
    assert (out / MANIFEST).read_bytes() == manifest

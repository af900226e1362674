"""The `command` job's program as a tree of processes, and what it prints.

The invariant: when an item ends (exit, failure, timeout, lost lease, give-back), no process
it started is left running, whatever session it put itself in (setsid, a double fork). And
what a program prints costs no scratch disk: stdout is discarded, stderr's tail kept in memory.

The programs are written here: SPAWN starts chains of processes described by letters, the
last of each chain sleeping, each live one writing its pid, then exits or hangs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.core.lease import LEASED, Lease, Lost
from fleet.core.layout import lease_prefix
from fleet.core.run import PlanRequest, plan
from fleet.core.store import open_store
from fleet.job import ItemContext, ItemFailed, ItemInput, load_job
from fleet_jobs.command import process
from tests.helpers.procs import listed_outputs, start_worker, wait_exit
from tests.helpers.sinks import MemorySink

PY = sys.executable

# argv: PIDFILE CHAINS THEN OUTPUT. CHAINS is ','-separated, each "c" and the steps taken by a child
# of the program: f = fork, the parent exits (a daemon's double fork); k = fork, the parent stays
# (sleeps); s = setsid, a session of its own. The end of each chain sleeps. THEN: exit0, exit3, hang.
SPAWN = """\
import os, sys, time
pidfile, chains, then = sys.argv[1], [c[1:] for c in sys.argv[2].split(",") if c], sys.argv[3]

def note():
    fd = os.open(pidfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{os.getpid()}\\n".encode())
    os.close(fd)

def sleep():
    os.execvp("sleep", ["sleep", "1000"])

for chain in chains:
    if os.fork() == 0:
        for step in chain:
            if step == "s":
                try:
                    os.setsid()
                except OSError:
                    pass
            elif os.fork() != 0:
                if step == "f":
                    os._exit(0)
                note()
                sleep()
        note()
        sleep()
expected = len(chains) + sum(c.count("k") for c in chains)
deadline = time.time() + 120
while expected and (not os.path.exists(pidfile) or len(open(pidfile).read().split()) < expected):
    assert time.time() < deadline, "the chains never started"
    time.sleep(0.02)
print("all started", file=sys.stderr)
if then == "hang":
    time.sleep(1000)
open(os.path.join(sys.argv[4], "done.txt"), "w").write("done")
sys.exit(0 if then == "exit0" else 3)
"""


def _alive(pid: int) -> bool:
    """Running: a zombie waiting to be reaped counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _marked(owner: int) -> list[int]:
    """Live processes whose environment says worker ``owner`` started them (process.MARK)."""
    found = []
    mark = f"{process.MARK}={owner}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0") and _alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _left_running(pidfile: Path) -> list[int]:
    """What the item's program started and is still running, by pid file and by MARK."""
    return sorted({p for p in _pids(pidfile) if _alive(p)} | set(_marked(os.getpid())))


def _item(tmp_path: Path) -> ItemInput:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "in.txt").write_text("one line\n")
    return ItemInput(str(folder), "in.txt", 0, (folder / "in.txt").stat().st_size)


def _convert(tmp_path: Path, options: dict, checkpoint=None, workdir: str = "work"):
    job = load_job("command")
    converter = job.converter(job.parse_config(options), lambda url: b"")
    work = tmp_path / workdir
    work.mkdir()
    sink = MemorySink()
    ctx = ItemContext("00000", 1, "x", str(work), {}, checkpoint or (lambda: None))
    return converter.convert(_item(tmp_path), ctx, sink), sink


def _spawn_command(tmp_path: Path, pidfile: Path, chains: list[str], then: str) -> str:
    spawn = tmp_path / "spawn.py"
    spawn.write_text(SPAWN)
    return f"{PY} {spawn} {pidfile} {','.join('c' + c for c in chains)} {then} {{output}} # {{input}}"


# -- the process tree -----------------------------------------------------------------------------
@pytest.mark.parametrize("then", ["exit0", "exit3", "hang"])
def test_setsid_and_double_forked_descendants_end_with_the_item(then, tmp_path):
    """When an item ends, no process it started is left running, whatever session it put itself
    in: a setsid child, a daemon's double fork in a new session, a live middle process."""
    pidfile = tmp_path / "pids"
    options = {"command": _spawn_command(tmp_path, pidfile, ["s", "fsf", "ksk"], then), "grace": "1", "timeout": "4"}
    if then == "exit0":
        stats, sink = _convert(tmp_path, options)
        assert sink.files == {"-done.txt": b"done"} and stats["output_files"] == 1
    else:
        with pytest.raises(ItemFailed) as failed:
            _convert(tmp_path, options)
        assert failed.value.detail["stderr_tail"][-1] == "all started"
        assert ("longer than timeout" if then == "hang" else "exit code 3") in str(failed.value)
    assert len(_pids(pidfile)) == 5
    assert _left_running(pidfile) == []


@pytest.mark.parametrize("raised", [Lost("item 00000: lease taken over"), KeyboardInterrupt()])
def test_a_lost_lease_or_ctrl_c_ends_every_descendant(raised, tmp_path):
    """When an item ends by a lost lease or Ctrl-C, no process it started is left running,
    whatever session it put itself in."""
    pidfile = tmp_path / "pids"

    def checkpoint():
        if len(_pids(pidfile)) >= 3:
            raise raised

    options = {"command": _spawn_command(tmp_path, pidfile, ["fsf", "sk"], "hang"), "grace": "1"}
    with pytest.raises(type(raised)):
        _convert(tmp_path, options, checkpoint)
    assert len(_pids(pidfile)) == 3
    assert _left_running(pidfile) == []
    assert not (tmp_path / "work" / "output").exists()


_chain = st.text(alphabet="fks", max_size=4)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chains=st.lists(_chain, min_size=1, max_size=3), then=st.sampled_from(["exit0", "exit3", "hang"]))
def test_no_mix_of_forks_and_sessions_outlives_its_item(chains, then, tmp_path_factory):
    """When an item ends, no process it started is left running, whatever session it put
    itself in, however deep it forked, whether the program exited or hung."""
    tmp_path = tmp_path_factory.mktemp("tree")
    pidfile = tmp_path / "pids"
    options = {"command": _spawn_command(tmp_path, pidfile, chains, then), "grace": "1", "timeout": "3"}
    try:
        _convert(tmp_path, options)
    except ItemFailed:
        assert then != "exit0"
    started = len(chains) + sum(c.count("k") for c in chains)
    assert len(_pids(pidfile)) == started or then == "hang"  # (the timeout may come first on a busy machine)
    assert _left_running(pidfile) == []


def test_sigterm_to_a_worker_ends_the_setsid_grandchildren_of_its_item(store_url, tmp_path):
    """Give-back: the worker's item ends, and no process it started is left, a new session or not."""
    src = tmp_path / "in.txt"
    src.write_text("x\n")
    store = open_store(store_url)
    store.upload_file("in/x.txt", str(src))
    pidfile = tmp_path / "pids"
    plan(
        store_url,
        PlanRequest(
            run="tree",
            job="command",
            inputs=[f"{store_url}/in/"],
            output=f"{store_url}/out-tree",
            code_version="test",
            settings={"command": _spawn_command(tmp_path, pidfile, ["s", "fsf"], "hang"), "grace": "1"},
            lease_ttl=60,
            max_attempts=3,
        ),
    )
    w = start_worker(store_url, "tree", "w", str(tmp_path / "logs"))
    deadline = time.time() + 120
    while len(_pids(pidfile)) < 2:
        assert time.time() < deadline and w.alive(), w.stderr_text()
        time.sleep(0.05)
    started = _pids(pidfile)
    w.popen.send_signal(signal.SIGTERM)
    wait_exit([w], 120)
    assert w.popen.returncode == 0, w.stderr_text()
    assert [p for p in started if _alive(p)] == [] and _marked(w.pid) == []
    lease = Lease.from_json(store.read(lease_prefix("tree") + "00000"))
    assert lease.state == LEASED and lease.expires == 0.0
    assert listed_outputs(f"{store_url}/out-tree") == {}


# -- what it prints --------------------------------------------------------------------------------
CHATTY_MB = 200


def _scratch_bytes(folder: Path) -> int:
    """Bytes of the scratch folder outside {output} (whose files are the item's outputs)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        if Path(dirpath).is_relative_to(folder / "output"):
            continue
        for name in names:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


@pytest.mark.parametrize("fails", [False, True])
def test_a_chatty_program_costs_no_scratch_disk(fails, tmp_path):
    """A program that prints hundreds of MB on stdout and stderr leaves at most a few kB on the
    scratch disk, during its item and after; its outputs are committed, and a failure still
    shows stderr's last lines."""
    mb = CHATTY_MB * 1_000_000
    cmd = (
        f"yes out-line | head -c {mb}; yes err-line | head -c {mb} >&2; "
        f"echo >&2; echo last words >&2; cp {{input}} {{output}}/copy.txt" + ("; exit 5" if fails else "")
    )
    seen = []
    work = tmp_path / "work"

    def checkpoint():
        seen.append(_scratch_bytes(work))

    if fails:
        with pytest.raises(ItemFailed) as failed:
            _convert(tmp_path, {"command": cmd}, checkpoint)
        tail = failed.value.detail["stderr_tail"]
        assert failed.value.detail["exit_code"] == 5 and tail[-1] == "last words"
        assert len(tail) == process.TAIL_LINES and set(tail[:-2]) == {"err-line"}  # (head cut the last one)
    else:
        stats, sink = _convert(tmp_path, {"command": cmd}, checkpoint)
        assert sink.files == {"-copy.txt": b"one line\n"} and stats["output_files"] == 1
    seen.append(_scratch_bytes(work))
    assert seen and max(seen) <= 64 * 1024, max(seen)


def test_without_proc_or_prctl_the_keeper_still_stops_the_programs_process_group(tmp_path):
    """Elsewhere than Linux (no /proc, no subreaper), the keeper falls back to the program's
    process group, as the command job did before it: a background child in it ends with it."""
    pidfile = tmp_path / "pids"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import reaper; "
        "reaper.descendants = lambda root: None; reaper._prctl = lambda: None; sys.exit(reaper.main(sys.argv[2:]))"
    )
    keeper = subprocess.Popen(
        [
            PY,
            "-I",
            "-S",
            "-c",
            code,
            os.path.dirname(process.KEEPER),
            "1",
            "/bin/sh",
            "-c",
            f"sleep 1000 & echo $! > {pidfile}; wait",
        ],
        stdout=subprocess.PIPE,
    )
    deadline = time.time() + 60
    while not _pids(pidfile):
        assert time.time() < deadline and keeper.poll() is None
        time.sleep(0.05)
    keeper.send_signal(signal.SIGTERM)
    out, _ = keeper.communicate(timeout=60)
    assert keeper.returncode == 0 and out == b""  # stopped: no exit code of the program to tell
    assert [p for p in _pids(pidfile) if _alive(p)] == []

"""The `command` job: an existing program run once per item, through `fleet local` and workers.

The programs are small scripts written by each test (never Google's code). What is checked:
outputs named part-<item>-<name> with the digests of what the program wrote, placeholders,
split=lines and stdin, a failure's exit code and stderr tail in the lease and on screen,
retries, the timeout, give-back on SIGTERM (the program's process group gone, nothing
committed), a lost lease, SIGKILLed workers (each item committed once, the bytes of a clean
run), items without outputs, files written outside {output}, the plan-time one-liners, and
packages installed from a requirements file pinned by hash.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import os
import random
import re
import shlex
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console
from typer.testing import CliRunner

from fleet.cli.commands import app
from fleet.job import ConfigError, ItemContext, ItemFailed, item_seed, load_job
from fleet.core.lease import DONE, LEASED, Lease, Lost
from fleet.cli.local import run_local
from fleet.core.run import PlanRequest, load_items, plan
from fleet.core.layout import lease_prefix, released_prefix
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet_jobs.command.job import input_name, substitute
from tests.helpers.procs import committed, listed_outputs, start_worker, wait_exit
from tests.helpers.sinks import MemorySink

PY = sys.executable
DONE_LINE = re.compile(r"item (\S+) done in")

UPPER = """\
import os, sys
src, out = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
open(os.path.join(out, "upper.txt"), "wb").write(data.upper())
os.makedirs(os.path.join(out, "sub"))
open(os.path.join(out, "sub", "lines.txt"), "w").write(str(data.count(b"\\n")))
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def corpus(tmp_path: Path, files: int = 3, lines: int = 40, seed: int = 1) -> Path:
    rng = random.Random(seed)
    folder = tmp_path / "in"
    folder.mkdir()
    for f in range(files):
        (folder / f"shard-{f}.txt").write_text(
            "".join(
                f"file {f} line {i}: {' '.join(rng.choice('abc xyz qrs') for _ in range(rng.randint(1, 9)))}\n"
                for i in range(lines)
            )
        )
    return folder


def local(inputs, out, settings: dict, workers: int = 2, **kw):
    console = io.StringIO()
    result = run_local(
        [str(i) for i in inputs], str(out), "command", workers, settings, console=Console(file=console, width=200), **kw
    )
    return result, console.getvalue()


def leases(bucket: str, run: str) -> dict[str, Lease]:
    return StatusReader(open_store(bucket), run).leases()


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# -- fleet local ------------------------------------------------------------------------------------
def test_each_file_is_an_item_and_the_files_of_output_are_its_outputs(tmp_path):
    src = corpus(tmp_path)
    conv = script(tmp_path, "conv.py", UPPER)
    result, shown = local([src], tmp_path / "out", {"command": f"{PY} {conv} {{input}} {{output}}"})
    assert result.exit_code == 0, shown
    out = tmp_path / "out"
    items = sorted(p.name for p in src.iterdir())
    names = sorted(
        n for n in (p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) if n.startswith("part-")
    )
    assert names == sorted(
        [f"part-{i:05d}-upper.txt" for i in range(3)] + [f"part-{i:05d}-sub/lines.txt" for i in range(3)]
    )
    for i, name in enumerate(items):  # items are the files, in order, and the bytes are the program's
        assert (out / f"part-{i:05d}-upper.txt").read_bytes() == (src / name).read_bytes().upper()
        assert (out / f"part-{i:05d}-sub" / "lines.txt").read_text() == "40"
    digests = committed(str(out / ".fleet"), "local")
    assert digests == {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in names}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["output_files"] == 6 and summary["items_without_outputs"] == 0


def test_split_lines_cuts_byte_ranges_at_newlines_and_the_outputs_give_back_the_input(tmp_path):
    src = corpus(tmp_path, files=1, lines=400)
    text = (src / "shard-0.txt").read_bytes()
    cat = "cat {input} > {output}/piece.txt; echo {item} {seed} > {output}/who.txt"
    result, shown = local([src], tmp_path / "out", {"command": cat, "split": "lines", "seed": "5"}, item_bytes=1000)
    assert result.exit_code == 0, shown
    out = tmp_path / "out"
    items = load_items(open_store(str(out / ".fleet")), "local")
    assert len(items) >= 5
    pieces = [(out / f"part-{item.id}-piece.txt").read_bytes() for item in items]
    assert b"".join(pieces) == text and all(p.endswith(b"\n") for p in pieces)
    for item in items:
        assert (out / f"part-{item.id}-who.txt").read_text().split() == [item.id, str(item_seed(5, item.id))]


def test_stdin_streams_the_item_instead_of_a_file(tmp_path):
    src = corpus(tmp_path, files=2)
    result, shown = local([src], tmp_path / "out", {"command": "tr a-z A-Z > {output}/up.txt", "stdin": "true"})
    assert result.exit_code == 0, shown
    for i, name in enumerate(sorted(p.name for p in src.iterdir())):
        assert (tmp_path / "out" / f"part-{i:05d}-up.txt").read_bytes() == (src / name).read_bytes().upper()


def test_stdin_streams_only_the_items_byte_range(tmp_path):
    src = corpus(tmp_path, files=1, lines=300)
    result, shown = local(
        [src], tmp_path / "out", {"command": "cat > {output}/piece", "stdin": "true", "split": "lines"}, item_bytes=2000
    )
    assert result.exit_code == 0, shown
    items = load_items(open_store(str(tmp_path / "out" / ".fleet")), "local")
    assert len(items) >= 4
    pieces = [(tmp_path / "out" / f"part-{item.id}-piece").read_bytes() for item in items]
    assert b"".join(pieces) == (src / "shard-0.txt").read_bytes()


def test_a_rerun_writes_the_same_bytes(tmp_path):
    """Outputs are as deterministic as the command: this one is, so two runs agree byte for byte."""
    src = corpus(tmp_path)
    conv = script(tmp_path, "conv.py", UPPER)
    settings_ = {"command": f"{PY} {conv} {{input}} {{output}}"}
    local([src], tmp_path / "a", settings_, workers=1)
    local([src], tmp_path / "b", settings_, workers=2)
    a, b = committed(str(tmp_path / "a" / ".fleet"), "local"), committed(str(tmp_path / "b" / ".fleet"), "local")
    assert a == b and len(a) == 6


def test_a_command_that_writes_nothing_is_done_with_zero_outputs_and_counted(tmp_path):
    src = corpus(tmp_path, files=2)
    quiet = script(
        tmp_path,
        "quiet.py",
        "import sys, os\nif 'shard-1' in sys.argv[1]:\n    open(os.path.join(sys.argv[2], 'x.txt'), 'w').write('x')\n",
    )
    result, shown = local([src], tmp_path / "out", {"command": f"{PY} {quiet} {{input}} {{output}}"})
    assert result.exit_code == 0, shown
    assert result.status.done == 2 and result.status.totals["items_without_outputs"] == 1
    assert re.search(r"items_without_outputs\s*│\s*1", shown), shown
    lease = leases(str(tmp_path / "out" / ".fleet"), "local")["00000"]
    assert lease.state == DONE and lease.outputs == [] and lease.stats["items_without_outputs"] == 1
    status = invoke("status", tmp_path / "out")
    assert status.exit_code == 0 and re.search(r"items without outputs\s*│\s*1", status.output), status.output


def test_files_written_outside_output_and_hidden_files_are_not_committed(tmp_path):
    src = corpus(tmp_path, files=1)
    elsewhere = tmp_path / "elsewhere.txt"
    cmd = (
        f"echo a > {{output}}/../beside.txt; echo b > {elsewhere}; echo c > {{output}}/.hidden; "
        f"mkdir {{output}}/.cache; echo d > {{output}}/.cache/x; echo e > {{output}}/kept.txt # {{input}}"
    )
    result, shown = local([src], tmp_path / "out", {"command": cmd})
    assert result.exit_code == 0, shown
    lease = leases(str(tmp_path / "out" / ".fleet"), "local")["00000"]
    assert [o["name"] for o in lease.outputs] == ["part-00000-kept.txt"]
    assert lease.stats["hidden_files_left_out"] == 2
    assert elsewhere.exists()  # the command did write it; the fleet did not commit it


# -- failures ----------------------------------------------------------------------------------------
FAILING = """\
import sys
for i in range(30):
    print(f"progress line {i}", file=sys.stderr)
print("ValueError: bad shard " + sys.argv[1].rsplit("/", 1)[-1], file=sys.stderr)
sys.exit(3)
"""


def test_a_failing_command_is_retried_and_its_exit_code_and_stderr_tail_are_shown(tmp_path):
    src = corpus(tmp_path, files=1)
    bad = script(tmp_path, "bad.py", FAILING)
    result, shown = local([src], tmp_path / "out", {"command": f"{PY} {bad} {{input}} {{output}}"}, max_attempts=2)
    assert result.exit_code == 1
    lease = leases(str(tmp_path / "out" / ".fleet"), "local")["00000"]
    assert lease.state == "failed" and lease.attempt == 2
    assert "exit code 3" in lease.error and "ValueError: bad shard shard-0.txt" in lease.error
    tail = lease.detail["stderr_tail"]
    assert lease.detail["exit_code"] == 3 and len(tail) == 20
    assert tail[-1] == "ValueError: bad shard shard-0.txt" and tail[0] == "progress line 11"
    assert "Traceback" not in shown and "| ValueError: bad shard shard-0.txt" in shown and "exit code 3" in shown
    status = invoke("status", tmp_path / "out")
    assert "| progress line 29" in status.output and "exit code 3" in status.output, status.output
    logs = "".join(p.read_text() for p in (tmp_path / "out" / ".fleet" / "logs").iterdir())
    assert "attempt 1 failed" in logs and "Traceback" not in logs


def test_an_attempt_that_fails_once_succeeds_on_the_retry(tmp_path):
    src = corpus(tmp_path, files=1)
    flaky = script(
        tmp_path,
        "flaky.py",
        f"""\
import os, sys
mark = {str(tmp_path / "tried")!r}
if not os.path.exists(mark):
    open(mark, "w").close()
    sys.exit("first attempt fails")
open(os.path.join(sys.argv[2], "ok.txt"), "w").write("ok")
""",
    )
    result, shown = local([src], tmp_path / "out", {"command": f"{PY} {flaky} {{input}} {{output}}"}, workers=1)
    assert result.exit_code == 0, shown
    lease = leases(str(tmp_path / "out" / ".fleet"), "local")["00000"]
    assert lease.state == DONE and lease.attempt == 2 and lease.error is None and lease.detail == {}


def test_a_command_that_runs_too_long_is_stopped_with_its_children(tmp_path):
    src = corpus(tmp_path, files=1)
    pids = tmp_path / "pids"
    cmd = f"sleep 300 & echo $! > {pids}; echo started >&2; wait"
    result, shown = local(
        [src], tmp_path / "out", {"command": cmd + " # {input} {output}", "timeout": "1", "grace": "1"}, max_attempts=1
    )
    assert result.exit_code == 1
    lease = leases(str(tmp_path / "out" / ".fleet"), "local")["00000"]
    assert lease.state == "failed" and "longer than timeout=1 s" in lease.error
    assert lease.detail["stderr_tail"] == ["started"]
    assert not _alive(int(pids.read_text()))  # the background child went with the group


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by init counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) process of this group is left."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.getpgid(pid) == pgid and _alive(pid):
                return True
        except OSError:
            continue
    return False


def _wait_for(path: Path, proc=None, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.time() < deadline, f"{path} never written"
        if proc is not None:
            assert proc.alive(), proc.stderr_text()
        time.sleep(0.05)


# -- give-back and a lost lease ---------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])  # the shutdown script, `fleet down`; Ctrl-C
def test_sigterm_gives_the_item_back_and_stops_the_whole_process_group(sig, store_url, tmp_path):
    src = corpus(tmp_path, files=1)
    store = open_store(store_url)
    store.upload_file("in/shard-0.txt", str(src / "shard-0.txt"))
    pids = tmp_path / "pids"
    # The shell, a background grandchild, and a partial output: none may survive or be committed.
    cmd = f"echo partial > {{output}}/part.txt; sleep 300 & echo $$ $! > {pids}; wait # {{input}}"
    plan(
        store_url,
        PlanRequest(
            run="give",
            job="command",
            inputs=[f"{store_url}/in/"],
            output=f"{store_url}/out-give",
            code_version="test",
            settings={"command": cmd, "grace": "2"},
            lease_ttl=60,
            max_attempts=3,
        ),
    )
    w = start_worker(store_url, "give", "w", str(tmp_path / "logs"))
    _wait_for(pids, w)
    shell, child = map(int, pids.read_text().split())
    pgid = os.getpgid(shell)
    assert pgid == shell != os.getpgid(w.pid)  # its own process group
    w.popen.send_signal(sig)
    wait_exit([w], 60)
    assert w.popen.returncode == 0, w.stderr_text()
    assert not _alive(shell) and not _alive(child) and not _group_alive(pgid)
    lease = Lease.from_json(store.read(lease_prefix("give") + "00000"))
    assert lease.state == LEASED and lease.expires == 0.0 and lease.attempt == 0  # given back, no attempt spent
    assert store.stat(released_prefix("give") + "00000") is not None
    assert listed_outputs(f"{store_url}/out-give") == {}
    assert "Traceback" not in w.stderr_text()
    scratch = [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"fleet-scratch-{w.pid}-")]
    assert scratch == []  # the output folder went with the worker's scratch


def test_a_lost_lease_stops_the_command_and_discards_its_output(tmp_path):
    src = corpus(tmp_path, files=1)
    pids = tmp_path / "pids"
    job = load_job("command")
    config = job.parse_config(
        {"command": f"echo x > {{output}}/x; sleep 300 & echo $! > {pids}; wait # {{input}}", "grace": "1"}
    )
    converter = job.converter(config, lambda url: b"")

    def checkpoint():
        if pids.exists() and pids.read_text().strip():
            raise Lost("item 00000: lease taken over")

    work = tmp_path / "work"
    work.mkdir()
    from fleet.job import ItemInput

    item = ItemInput(str(src), "shard-0.txt", 0, (src / "shard-0.txt").stat().st_size)
    sink = MemorySink()
    with pytest.raises(Lost):
        converter.convert(item, ItemContext("00000", 1, "x", str(work), {}, checkpoint), sink)
    assert not _alive(int(pids.read_text()))
    assert not (work / "output").exists() and sink.files == {}


def test_the_next_worker_stops_what_a_sigkilled_worker_left_running(tmp_path):
    src = corpus(tmp_path, files=1)
    bucket = str(tmp_path / "bucket")
    pids, again = tmp_path / "pids", tmp_path / "again"
    cmd = (
        f"if [ -e {again} ]; then echo ok > {{output}}/ok.txt; "
        f"else touch {again}; sleep 300 & echo $! > {pids}; wait; fi # {{input}}"
    )
    plan(
        bucket,
        PlanRequest(
            run="orphan",
            job="command",
            inputs=[str(src)],
            output=str(tmp_path / "out"),
            code_version="test",
            settings={"command": cmd},
            lease_ttl=2,
            max_attempts=3,
        ),
    )
    first = start_worker(bucket, "orphan", "first", str(tmp_path / "logs"))
    _wait_for(pids, first)
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait()
    orphan = int(pids.read_text())
    assert _alive(orphan)  # the shell died with the worker; what it started did not
    second = start_worker(bucket, "orphan", "second", str(tmp_path / "logs"))
    wait_exit([second], 120)
    assert second.popen.returncode == 0, second.stderr_text()
    assert not _alive(orphan)
    said = second.stderr_text() + "\n".join(second.log_lines())  # (said as the worker starts, before its log)
    assert "stopped 1 program(s) left running by workers of this machine" in said, said
    assert leases(bucket, "orphan")["00000"].state == DONE


# -- SIGKILL of workers --------------------------------------------------------------------------------
def test_sigkilled_workers_commit_each_item_once_with_the_bytes_of_a_clean_run(store_url, tmp_path):
    src = corpus(tmp_path, files=1, lines=600, seed=3)
    store = open_store(store_url)
    store.upload_file("in/c.txt", str(src / "shard-0.txt"))
    slow = script(
        tmp_path,
        "slow.py",
        "import hashlib, os, sys, time\ntime.sleep(float(os.environ.get('SLOW_SECONDS', '0.3')))\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "open(os.path.join(sys.argv[2], 'h.txt'), 'w').write("
        "hashlib.sha256(data).hexdigest() + sys.argv[3])\n",
    )
    options = {"command": f"{PY} {slow} {{input}} {{output}} {{seed}}", "split": "lines", "grace": "1"}
    logs = str(tmp_path / "logs")

    def plan_run(run: str, ttl: float) -> int:
        _, items, _ = plan(
            store_url,
            PlanRequest(
                run=run,
                job="command",
                inputs=[f"{store_url}/in/"],
                output=f"{store_url}/out-{run}",
                code_version="test",
                settings=options,
                lease_ttl=ttl,
                max_attempts=20,
                item_bytes=1000,
            ),
        )
        return len(items)

    n = plan_run("clean", 60)
    assert n >= 15
    solo = start_worker(store_url, "clean", "solo", logs, {"SLOW_SECONDS": "0"})  # (slow only to be killed mid-item)
    wait_exit([solo], 240)
    expected = committed(store_url, "clean")
    assert len(expected) == n

    plan_run("chaos", 1.5)
    rng = random.Random(7)
    workers = [start_worker(store_url, "chaos", f"w{i}", logs) for i in range(3)]
    live, serial, kills = list(workers), 3, 0
    deadline = time.time() + 240
    while kills < 6 and any(w.alive() for w in live):
        assert time.time() < deadline
        time.sleep(rng.uniform(0.2, 1.0))
        victims = [w for w in live if w.alive() and w.log_lines()]
        if not victims:
            continue
        victim = rng.choice(victims)
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait()
        kills += 1
        live.remove(victim)
        replacement = start_worker(store_url, "chaos", f"w{serial}", logs)
        serial += 1
        live.append(replacement)
        workers.append(replacement)
    wait_exit([w for w in live if w.alive()], 240)
    assert kills >= 2, kills
    for w in workers:
        assert "Traceback" not in w.stderr_text(), w.stderr_text()
    st = StatusReader(store, "chaos").collect()
    assert (st.done, st.failed) == (st.items, 0), st
    got = committed(store_url, "chaos")
    # The same names and bytes as the clean run (names differ only by nothing: both are part-<item>-h.txt).
    assert got == expected
    assert listed_outputs(f"{store_url}/out-chaos") == expected
    done_by = collections.defaultdict(set)
    for w in workers:
        for line in w.log_lines():
            m = DONE_LINE.search(line)
            if m:
                done_by[m.group(1)].add(w.name)
    assert all(len(names) == 1 for names in done_by.values()), done_by


# -- bad input: one line each --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, needle",
    [
        ("python3 conv.py {input}", "{output} is missing"),
        ("python3 conv.py {output}", "{input} is missing"),
        ("", "give the program to run per item"),
        ("no-such-program-here {input} {output}", "no-such-program-here: no such program on PATH"),
        ("python3 missing.py {input} {output}", "missing.py: no such file"),
        ("./notexec.sh {input} {output}", "./notexec.sh is not executable"),
        ("./absent.sh {input} {output}", "./absent.sh: no such program"),
        ("python3 'conv.py {input} {output}", "the shell cannot parse it"),
    ],
)
def test_fleet_local_refuses_a_bad_command_in_one_line(command, needle, tmp_path, monkeypatch):
    src = corpus(tmp_path, files=1)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conv.py").write_text("")
    (tmp_path / "notexec.sh").write_text("#!/bin/sh\n")
    result = invoke("local", src, tmp_path / "out", "--job", "command", "--set", f"command={command}")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: ") and needle in lines[0], result.stderr
    assert not (tmp_path / "out" / ".fleet" / "runs").exists()  # refused before planning


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["stdin=true"], "{input} with stdin=true"),
        (["split=words"], "option split"),
        (["timeout=-1"], "option timeout"),
    ],
)
def test_bad_options_are_refused_in_one_line(extra, needle, tmp_path):
    src = corpus(tmp_path, files=1)
    result = invoke(
        "local",
        src,
        tmp_path / "out",
        "--job",
        "command",
        "--set",
        "command=cat {input} > {output}/x",
        *[a for e in extra for a in ("--set", e)],
    )
    assert result.exit_code == 2 and needle in result.stderr.strip().splitlines()[-1], result.output


def test_split_lines_refuses_a_compressed_file(tmp_path):
    (tmp_path / "in.txt.gz").write_bytes(b"\x1f\x8b" + b"x" * 50)
    result = invoke(
        "local",
        tmp_path / "in.txt.gz",
        tmp_path / "out",
        "--job",
        "command",
        "--set",
        "command=cat {input} > {output}/x",
        "--set",
        "split=lines",
    )
    assert result.exit_code == 2 and "cannot be cut at newlines" in result.stderr, result.output


def test_fleet_plan_checks_the_placeholders_not_the_program(tmp_path):
    """A plan is for other machines (a VM's PATH, the code snapshot as the working folder): it
    refuses what is wrong anywhere; the program is looked for where it runs, by each worker."""
    src = corpus(tmp_path, files=1)
    bucket = tmp_path / "bucket"
    base = ["plan", "--bucket", bucket, "--job", "command", "--input", src, "--output", tmp_path / "o"]
    missing = invoke(*base, "--run", "a", "--set", "command=python3 conv.py {input}")
    assert missing.exit_code == 2 and "{output} is missing" in missing.stderr
    later = invoke(*base, "--run", "b", "--set", "command=tool-on-the-vm-image {input} {output}")
    assert later.exit_code == 0, later.output
    w = start_worker(str(bucket), "b", "w", str(tmp_path / "logs"))
    wait_exit([w], 60)
    assert w.popen.returncode == 2
    assert any(
        "cannot start: option command: tool-on-the-vm-image: no such program on PATH" in line for line in w.log_lines()
    ), w.log_lines()


# -- requirements_file -----------------------------------------------------------------------------------
def _wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, made by hand (no build tools, no network)."""
    name, version = "fleetcmdprobe", "1.0"
    files = {
        f"{name}/__init__.py": b"import os, sys\n"
        b"def main(src, out):\n"
        b"    open(os.path.join(out, 'probe.txt'), 'w').write('probe ' + str(os.path.getsize(src)))\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), data)
    return wheel


def test_requirements_are_installed_once_per_machine_pinned_by_hash(tmp_path, monkeypatch):
    envs = tmp_path / "envs"
    monkeypatch.setenv("FLEET_COMMAND_ENVS", str(envs))
    wheel = _wheel(tmp_path / "wheels")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    reqs = tmp_path / "requirements.txt"
    reqs.write_text(f"--no-index\n--find-links {wheel.parent}\nfleetcmdprobe==1.0 --hash=sha256:{sha}\n")
    src = corpus(tmp_path, files=3)
    cmd = "python3 -c 'import sys, fleetcmdprobe; fleetcmdprobe.main(sys.argv[1], sys.argv[2])' {input} {output}"
    result, shown = local([src], tmp_path / "out", {"command": cmd, "requirements_file": str(reqs)}, workers=2)
    assert result.exit_code == 0, shown
    assert (tmp_path / "out" / "part-00000-probe.txt").read_text().startswith("probe ")
    made = [p for p in envs.iterdir() if p.is_dir()]
    assert len(made) == 1  # two workers, one environment
    spec = json.loads((tmp_path / "out" / ".fleet" / "runs" / "local" / "run.json").read_text())
    assert spec["files"]["requirements_file"].startswith("sha256:")

    # A wrong hash: the workers refuse to start, in one line that says pip refused it.
    reqs2 = tmp_path / "bad-requirements.txt"
    reqs2.write_text(f"--no-index\n--find-links {wheel.parent}\nfleetcmdprobe==1.0 --hash=sha256:{'0' * 64}\n")
    result, shown = local([src], tmp_path / "out2", {"command": cmd, "requirements_file": str(reqs2)}, workers=1)
    assert result.exit_code == 1
    assert "pip could not install it (--require-hashes)" in shown and "Traceback" not in shown, shown


# -- pieces ------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(max_size=30))
def test_placeholders_reach_the_program_as_one_word_each(value, other):
    """Whatever a value holds (spaces, quotes, $), the shell sees it as one word, unchanged;
    text that is not a placeholder is left alone."""
    command = "prog {input} {output} {item} {seed} '{other}'"
    values = {"input": value, "output": value[::-1], "item": "00001", "seed": "7"}
    assert shlex.split(substitute(command, values)) == ["prog", value, value[::-1], "00001", "7", "{other}"]
    assert substitute(other, values) == re.sub(
        r"\{(input|output|item|seed)\}", lambda m: shlex.quote(values[m.group(1)]), other
    )


@given(st.text(min_size=1, max_size=60))
def test_input_names_are_safe_file_names(name):
    local_name = input_name(name)
    assert local_name and not local_name.startswith(".") and "/" not in local_name
    assert re.fullmatch(r"[A-Za-z0-9._-]+", local_name)


def test_a_program_failure_is_item_failed_not_a_crash(tmp_path):
    job = load_job("command")
    converter = job.converter(job.parse_config({"command": "echo oops >&2; exit 7 # {input} {output}"}), lambda u: b"")
    src = corpus(tmp_path, files=1)
    from fleet.job import ItemInput

    work = tmp_path / "w"
    work.mkdir()
    with pytest.raises(ItemFailed) as e:
        converter.convert(
            ItemInput(str(src), "shard-0.txt", 0, 10), ItemContext("00000", 1, "x", str(work)), MemorySink()
        )
    assert e.value.detail == {"exit_code": 7, "stderr_tail": ["oops"]}
    with pytest.raises(ConfigError):
        job.check(job.parse_config({"command": "x {input}"}), lambda u: b"")


def test_fleet_jobs_lists_command_with_its_options():
    result = invoke("jobs")
    assert result.exit_code == 0 and "command: Runs an existing program once per item" in result.output
    shown = invoke("jobs", "command").output
    for option in ("command", "split", "stdin", "timeout", "grace", "requirements_file", "seed"):
        assert re.search(rf"│ {option}\s", shown), (option, shown)
    assert "{input}" in shown and "--item-mb" in shown  # the help of each, from the config's comments


def test_a_failed_attempts_detail_stays_with_the_lease_until_a_commit(tmp_path):
    """The retry's lease still shows why the last attempt failed (for `fleet status`); a commit clears it."""
    from fleet.core.lease import Leases

    leases_ = Leases(open_store(str(tmp_path)), "leases/", "w", ttl=30, max_attempts=3)
    held = leases_.claim("00000")
    assert not leases_.fail(held, "exit code 3", detail={"exit_code": 3, "stderr_tail": ["boom"]})
    retry = leases_.claim("00000", leases_.read("00000"))
    assert retry.lease.attempt == 2 and retry.lease.detail == {"exit_code": 3, "stderr_tail": ["boom"]}
    # A lease written before leases had `detail` reads as none.
    assert Lease.parse(b'{"state": "leased", "worker": "w", "attempt": 1, "expires": 0}', "x").detail == {}
    leases_.commit(retry, [], {})
    assert leases_.read("00000")[0].detail == {} and leases_.read("00000")[0].error is None


_part = st.text(alphabet="abcXYZ019_-. ", min_size=1, max_size=8).filter(lambda p: p not in (".", ".."))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.lists(_part, min_size=1, max_size=3).map(tuple), st.binary(max_size=64), max_size=8))
def test_every_file_left_in_output_is_committed_once_under_its_path(tree):
    """Whatever tree of files a program leaves in {output}: each file not hidden becomes the output
    part-<item>-<its path>, with its bytes; hidden ones are counted, nothing else is added."""
    import tempfile as _tempfile

    from fleet_jobs.command.job import CommandConverter, CommandConfig

    with _tempfile.TemporaryDirectory() as out_dir:
        written = {}
        for parts, data in tree.items():
            path = os.path.join(out_dir, *parts)
            if any(os.path.isfile(os.path.join(out_dir, *parts[:i])) for i in range(1, len(parts))) or os.path.isdir(
                path
            ):
                continue  # a file where a folder would be, or the reverse: not a tree
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            written["/".join(parts)] = data
        sink = MemorySink()
        stats = CommandConverter(CommandConfig(command="x"), None)._commit(out_dir, sink, 0.0)
    visible = {rel: data for rel, data in written.items() if not any(p.startswith(".") for p in rel.split("/"))}
    assert sink.files == {f"-{rel}": data for rel, data in visible.items()}
    assert stats["output_files"] == len(visible) and stats["items_without_outputs"] == int(not visible)
    assert stats.get("hidden_files_left_out", 0) == len(written) - len(visible)

"""Off the tested path: nothing lost, nothing mixed, no traceback (issue 8).

Each test is a case a careful user found: a truncated .zst taken for done, a vocab
replaced between two runs of one OUT_DIR, an input truncated under a run, outputs
deleted after a run, the same corpus named twice, a symlinked folder skipped, a
negative item size that looped forever, a single-document file that took one worker
15 times its size, and a dozen ways to a traceback. Every one of them failed on the
code before the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from fleet.job import InputError
from fleet.core.lease import DONE, FAILED, LEASED, Lease
from fleet_jobs.text.inputs import find_corpus, read_all
from tests.helpers.cli import FLEET, fleet, one_line_error
from tests.helpers.procs import LINEJOB, ROOT, write_corpus

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def local(inputs, out, *extra, env=None, tmp=None) -> subprocess.CompletedProcess:
    inputs = [inputs] if isinstance(inputs, (str, Path)) else inputs
    return fleet("local", *inputs, out, "--job", LINEJOB, "--workers", "1", *extra, env=env, tmp=tmp)


def outputs(out) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(out).glob("part-*"))}


def summary(out) -> dict:
    return json.loads((Path(out) / "summary.json").read_text())


def leases(bucket, run="local") -> dict[str, Lease]:
    folder = Path(bucket) / "runs" / run / "leases"
    return {p.name: Lease.parse(p.read_bytes(), str(p)) for p in sorted(folder.iterdir())} if folder.exists() else {}


@pytest.fixture
def corpus(tmp_path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    write_corpus(str(folder / "a.txt"), 60)
    write_corpus(str(folder / "b.txt"), 40, seed=1)
    return folder


@pytest.fixture
def vocab(tmp_path) -> Path:
    path = tmp_path / "vocab.txt"
    tokens = (
        SPECIALS + list("abcdefghijklmnopqrstuvwxyz0123456789.,:") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    )
    path.write_text("\n".join(tokens + ["doc", "line", "alpha", "beta", "数", "据"]) + "\n", encoding="utf-8")
    return path


# -- 1. a truncated .zst is not "done" -----------------------------------------------------------
@pytest.mark.parametrize("keep", [0.02, 0.45, 0.97])
def test_a_truncated_zst_says_so_wherever_it_is_cut(keep):
    import random

    from fleet_jobs.text.inputs import Tally

    rng = random.Random(5)
    text = "".join(
        " ".join(rng.choice(["alpha", "beta", "数据", "模型", str(i)]) for _ in range(9)) + "\n\n" for i in range(6000)
    )  # 300 kB a frame: zstd blocks of 128 kB decode one by one
    data = b"".join(zstandard.ZstdCompressor().compress(text.encode()) for _ in range(2))
    whole = read_all(data, "x.txt.zst")
    assert len(whole) == 12000  # two frames, both read
    tally = Tally()
    try:
        docs = read_all(data[: int(len(data) * keep)], "x.txt.zst", tally=tally)
    except InputError as e:  # nothing good before the break: the item fails, saying why
        assert keep < 0.1 and "the zstd stream ends inside a frame (truncated)" in str(e)
        return
    # The documents before the break are kept, and the break is reported with its place.
    assert 0 < len(docs) < 12000 and docs == whole[: len(docs)]
    assert tally.bad == 1 and "x.txt.zst: decompressed byte" in tally.examples[0]
    assert "the zstd stream ends inside a frame (truncated)" in tally.examples[0]


def test_a_run_with_a_truncated_zst_reports_the_break_and_keeps_what_came_before(tmp_path, corpus):
    big = write_corpus(str(tmp_path / "big.txt"), 3000)  # 900 kB: several zstd blocks, decoded one by one
    data = zstandard.ZstdCompressor().compress(Path(big).read_bytes())
    (corpus / "x.txt.zst").write_bytes(data[: len(data) // 2])
    proc = local(corpus, tmp_path / "out", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path / "out")
    assert (s["done"], s["failed"], s["bad_records"]) == (s["items"], 0, 1)
    assert sorted(os.path.basename(f) for f in s["sources"]) == ["a.txt", "b.txt", "x.txt.zst"]
    [skipped] = s["skipped"]
    assert "x.txt.zst: decompressed byte" in skipped["where"] and "truncated" in skipped["where"]
    assert "skipped a bad record" in proc.stderr and "x.txt.zst" in proc.stderr
    status = json.loads(fleet("status", tmp_path / "out", "--json").stdout)
    assert status["bad_records"] == s["skipped"]


# -- 2. a run pins contents, not paths -----------------------------------------------------------
def test_a_vocab_replaced_between_runs_is_refused(tmp_path, corpus, vocab):
    out = tmp_path / "out"
    args = ["local", corpus, out, "--workers", "1", "--set", f"vocab_file={vocab}"]
    assert fleet(*args, tmp=tmp_path).returncode == 0
    vocab.write_text(vocab.read_text() + "gamma\n", encoding="utf-8")
    one_line_error(fleet(*args, tmp=tmp_path), f"vocab_file {vocab} has other contents", "another OUT_DIR")


def test_a_worker_refuses_a_vocab_changed_since_the_plan(tmp_path, corpus, vocab):
    bucket = tmp_path / "bucket"
    assert (
        fleet(
            "plan",
            "--bucket",
            bucket,
            "--run",
            "r",
            "--job",
            "electra_zh_en",
            "--input",
            corpus,
            "--output",
            tmp_path / "out",
            "--set",
            f"vocab_file={vocab}",
        ).returncode
        == 0
    )
    vocab.write_text(vocab.read_text() + "gamma\n", encoding="utf-8")
    proc = fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "cannot start:" in proc.stderr and f"vocab_file {vocab} changed since run 'r' was planned" in proc.stderr
    assert not list((tmp_path / "out").glob("part-*")) if (tmp_path / "out").exists() else True


def test_an_input_changed_between_runs_is_refused_naming_it(tmp_path, corpus):
    out = tmp_path / "out"
    assert local(corpus, out, tmp=tmp_path).returncode == 0
    with open(corpus / "b.txt", "a") as f:
        f.write("one more document\n")
    line = one_line_error(local(corpus, out, tmp=tmp_path), "b.txt changed (size=", "another OUT_DIR")
    assert "a.txt" not in line


# -- 3. an input that changes under a run ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_an_input_truncated_after_planning_fails_its_items_with_the_reason(tmp_path, kind, request):
    source = write_corpus(str(tmp_path / "big.txt"), 400)
    data = Path(source).read_bytes()
    if kind == "gcs":
        from fleet.core.store import open_store

        bucket = f"gs://{request.getfixturevalue('gcs_bucket')}"
        open_store(bucket).write("in/big.txt", data)
        source = f"{bucket}/in/big.txt"
    else:
        bucket = str(tmp_path / "bucket")
    out = f"{bucket}/out" if kind == "gcs" else str(tmp_path / "out")
    assert (
        fleet(
            "plan",
            "--bucket",
            bucket,
            "--run",
            "r",
            "--job",
            LINEJOB,
            "--input",
            source,
            "--output",
            out,
            "--item-mb",
            "0.01",
        ).returncode
        == 0
    )
    if kind == "gcs":
        open_store(bucket).write("in/big.txt", data[: len(data) // 2])
    else:
        with open(source, "r+b") as f:
            f.truncate(len(data) // 2)
    proc = fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(fleet("status", "--bucket", bucket, "--run", "r", "--json").stdout)
    assert status["done"] == 0 and status["failed"] == status["items"] > 3, status
    assert all("changed since it was planned" in f["error"] for f in status["failures"]), status["failures"]


# -- 4. lost outputs are noticed -----------------------------------------------------------------
def test_outputs_deleted_or_overwritten_after_a_run_are_converted_again(tmp_path, corpus):
    out = tmp_path / "out"
    assert local(corpus, out, "--item-mb", "0.004", tmp=tmp_path).returncode == 0
    clean = outputs(out)
    names = sorted(clean)
    assert len(names) >= 4
    (out / names[0]).unlink()
    data = (out / names[1]).read_bytes()
    (out / names[1]).write_bytes(data[:-2] + b"x\n")  # same size, other bytes
    (out / names[2]).write_bytes(data + b"more")
    proc = local(corpus, out, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 done item(s) whose outputs are gone or changed are converted again" in proc.stderr
    for name in names[:3]:
        assert name in proc.stderr
    assert outputs(out) == clean


def test_status_verify_checks_outputs_on_gcs_and_sends_lost_ones_back(tmp_path, corpus, gcs_bucket):
    from fleet.core.store import open_store

    bucket = f"gs://{gcs_bucket}"
    run = ["--bucket", bucket, "--run", "r"]
    assert (
        fleet(
            "plan", *run, "--job", LINEJOB, "--input", corpus, "--output", f"{bucket}/out", "--item-mb", "0.004"
        ).returncode
        == 0
    )
    assert fleet("work", *run, "--procs", "1", tmp=tmp_path).returncode == 0
    store = open_store(f"{bucket}/out")
    clean = {b.name: store.read(b.name) for b in store.list("part-")}
    names = sorted(clean)
    proc = fleet("status", *run, "--verify")
    assert proc.returncode == 0 and f"the outputs of all {len(names)} done items match" in proc.stderr, proc.stderr
    store.delete(names[0])
    store.write(names[1], clean[names[1]])  # rewritten with the same bytes: a new generation, nothing lost
    store.write(names[2], clean[names[2]][:-1] + b"!")
    proc = fleet("status", *run, "--verify")
    assert proc.returncode == 1, proc.stderr  # damage found: exit 1
    assert f"2 of {len(names)} done items sent back to pending" in proc.stderr, proc.stderr
    assert names[0] in proc.stderr and names[2] in proc.stderr and names[1] not in proc.stderr
    status = json.loads(fleet("status", *run, "--json").stdout)
    assert (status["done"], status["pending"]) == (len(names) - 2, 2)
    assert fleet("work", *run, "--procs", "1", tmp=tmp_path).returncode == 0
    assert {b.name: store.read(b.name) for b in store.list("part-")} == clean


# -- 5. and 6. what the inputs are -----------------------------------------------------------------
def test_the_same_input_named_twice_is_planned_once(tmp_path, corpus):
    once, twice = tmp_path / "once", tmp_path / "twice"
    assert local(corpus, once, tmp=tmp_path).returncode == 0
    proc = local([corpus, f"{corpus}/", corpus / "a.txt"], twice, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "planned once" in proc.stderr
    assert summary(twice)["items"] == summary(once)["items"] and outputs(twice) == outputs(once)


def test_symbolic_links_are_followed_once_and_bad_ones_named(tmp_path, corpus):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_corpus(str(elsewhere / "c.txt"), 10, seed=2)
    (corpus / "linked").symlink_to(elsewhere)  # a folder: read
    (corpus / "again").symlink_to(corpus)  # a loop: read once
    (corpus / "broken.txt").symlink_to(tmp_path / "nowhere.txt")
    (corpus / "file-link.txt").symlink_to(elsewhere / "c.txt")  # the same file twice: once
    names = [f.name for f in find_corpus([str(corpus)])]
    assert names == ["a.txt", "b.txt", "file-link.txt"] or names == ["a.txt", "b.txt", "linked/c.txt"], names
    proc = local(corpus, tmp_path / "out", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "broken.txt: a broken symbolic link" in proc.stderr
    assert "already read" in proc.stderr and "planned once" in proc.stderr
    assert len(summary(tmp_path / "out")["sources"]) == 3  # each file read once


def test_a_file_name_that_is_not_utf8_is_read_and_logged(tmp_path, corpus):
    name = os.fsdecode(b"caf\xe9.txt")
    (corpus / "a.txt").rename(corpus / name)
    out = tmp_path / "out"
    proc = local(corpus, out, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    logs = "".join(p.read_text(errors="replace") for p in (out / ".fleet" / "logs").iterdir())
    assert "caf\\xe9.txt" in logs and "Logging error" not in logs
    s = summary(out)
    assert s["done"] == s["items"] and len(s["sources"]) == 2


def test_an_unreadable_input_is_one_clear_error(tmp_path, corpus, monkeypatch):
    import builtins

    real_open = builtins.open

    def guarded(path, *args, **kwargs):
        if str(path).endswith("b.txt"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    with pytest.raises(InputError, match=r"in/b.txt: cannot read it \(Permission denied\)"):
        find_corpus([str(corpus)])


def test_a_gs_input_without_credentials_says_how_to_log_in(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(
        HOME=str(tmp_path),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        NO_GCE_CHECK="true",
        GCE_METADATA_HOST="127.0.0.1:9",
    )
    proc = subprocess.run(
        FLEET + ["local", "gs://some-bucket/corpus", str(tmp_path / "out"), "--job", LINEJOB],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "Traceback" not in proc.stderr
    one_line_error(proc, "gs://some-bucket: no Google credentials", "gcloud auth application-default login")


def test_an_unknown_url_scheme_is_an_error_not_a_folder(tmp_path):
    from fleet.core.store import StoreError, open_store

    with pytest.raises(StoreError, match="unsupported URL scheme s3://"):
        open_store("s3://bucket/path")
    one_line_error(local("s3://bucket/corpus", tmp_path / "out"), "s3://bucket/corpus: unsupported URL")


# -- 7. numbers ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command,option,value",
    [
        ("plan", "--item-mb", "-1"),
        ("local", "--item-mb", "-1"),
        ("local", "--item-mb", "0"),
        ("plan", "--lease-ttl", "0"),
        ("local", "--lease-ttl", "-5"),
        ("plan", "--max-attempts", "0"),
        ("local", "--max-attempts", "-1"),
        ("local", "--workers", "-1"),
        ("work", "--procs", "-2"),
    ],
)
def test_numeric_options_are_checked_before_anything_runs(tmp_path, corpus, command, option, value):
    if command == "plan":
        args = [
            "plan",
            "--bucket",
            tmp_path / "b",
            "--run",
            "r",
            "--job",
            LINEJOB,
            "--input",
            corpus,
            "--output",
            tmp_path / "o",
        ]
    elif command == "work":
        args = ["work", "--bucket", tmp_path / "b", "--run", "r"]
    else:
        args = ["local", corpus, tmp_path / "o", "--job", LINEJOB]
    one_line_error(fleet(*args, option, value, timeout=60), f"{option} {float(value):g}")


# -- 8. one document as big as the file ----------------------------------------------------------
def test_a_file_with_no_blank_line_is_cut_and_a_worker_stays_small(tmp_path, vocab):
    big = tmp_path / "in" / "one.txt"
    big.parent.mkdir()
    line = "alpha beta doc line 数据 " * 4 + "\n"
    with open(big, "w", encoding="utf-8") as f:
        for _ in range(24_000_000 // len(line.encode())):
            f.write(line)
    out = tmp_path / "out"
    probe = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            *FLEET,
            "local",
            str(big),
            str(out),
            "--workers",
            "1",
            "--item-mb",
            "64",
            "--set",
            f"vocab_file={vocab}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr
    peak_mib = int(proc.stdout.strip().splitlines()[-1]) / 1024
    s = summary(out)
    assert s["documents_cut"] == 1 and s["lines"] == 24_000_000 // len(line.encode())
    assert peak_mib < 300, f"peak RSS of a worker {peak_mib:.0f} MiB for a 24 MB document"
    # Cut between items too when the item size is smaller than the document.
    proc = fleet(
        "plan",
        "--bucket",
        tmp_path / "b",
        "--run",
        "r",
        "--job",
        LINEJOB,
        "--input",
        big,
        "--output",
        tmp_path / "o",
        "--item-mb",
        "4",
    )
    assert proc.returncode == 0 and "cut between items" in proc.stderr, proc.stderr
    items = [json.loads(x) for x in (tmp_path / "b" / "runs" / "r" / "items.jsonl").read_text().splitlines()]
    # 24 MB in items of about 4 MB, each cut at a line end; the look for a blank line past the
    # fifth reaches the end of the file, which ends the document: the last item runs to it (8 MB).
    cuts = [i["meta"].get("cuts_document", False) for i in items]
    assert len(items) == 5 and all(cuts[:-1]) and not cuts[-1]
    assert items[-1]["end"] == big.stat().st_size


# -- no tracebacks; transient trouble is not permanent ---------------------------------------------
def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _held(bucket) -> list[str]:
    return [i for i, lease in leases(bucket).items() if lease.live(time.time())]


def test_ctrl_c_gives_the_items_back_and_exits_130_with_one_line(tmp_path, corpus):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        FLEET
        + [
            "local",
            str(corpus),
            str(out),
            "--job",
            LINEJOB,
            "--workers",
            "2",
            "--item-mb",
            "0.004",
            "--set",
            "delay=0.2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        _wait(lambda: len(_held(out / ".fleet")) == 2, 90, "two items in hand")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("interrupted:"), stderr
    logs = "".join(p.read_text() for p in (out / ".fleet" / "logs").iterdir())
    assert "Traceback" not in logs and "given back" in logs
    assert _held(out / ".fleet") == []  # nothing for a rerun to wait out
    assert all(lease.state == DONE or lease.expires == 0 for lease in leases(out / ".fleet").values())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the swallowing, on purpose)
def test_a_ctrl_c_that_python_swallows_in_a_finalizer_still_ends_the_run_as_interrupted(tmp_path, corpus, monkeypatch):
    """Seen once in ten loaded xdist runs of the test above: `fleet local` exited 1 ("workers
    stopped with items unfinished") after a Ctrl-C. A KeyboardInterrupt raised while the collector
    runs a finalizer is printed as "Exception ignored" and lost; the Ctrl-C must still count."""
    import io

    from rich.console import Console

    import fleet.cli.local as local
    from fleet.cli.local import Interrupted, run_local

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, inside the finalizer
            for _ in range(10000):
                pass

    real, fired = local.wait_for_exit, []

    def wait(children, timeout):
        if not fired:
            fired.append(1)
            Finalized()  # (dropped at once: its __del__ runs now)
        real(children, timeout)

    monkeypatch.setattr(local, "wait_for_exit", wait)
    with pytest.raises(Interrupted):
        run_local(
            [str(corpus)], str(tmp_path / "out"), LINEJOB, 1, {}, console=Console(file=io.StringIO()), item_bytes=4000
        )
    assert fired


def _interrupted_at_line(n: int, tmp: Path) -> tuple[int, str, dict[str, str]]:
    """run_local (two forked workers) traced line by line in fleet/cli/local.py, with a Ctrl-C at its
    n-th line, then the same run again: (the lines it ran, how the first ended, the outputs' hashes)."""
    import io

    from rich.console import Console

    import fleet.cli.local as local
    from fleet.cli.local import Interrupted, run_local

    (tmp / "in").mkdir()
    write_corpus(str(tmp / "in" / "a.txt"), 60)
    write_corpus(str(tmp / "in" / "b.txt"), 40, seed=1)
    seen = [0]

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != local.__file__:
            return None
        if event == "line":
            seen[0] += 1
            if seen[0] == n:
                os.kill(os.getpid(), signal.SIGINT)
        return tracer

    def run() -> int:
        console = Console(file=io.StringIO())
        return run_local(
            [str(tmp / "in")], str(tmp / "out"), LINEJOB, 2, {}, console=console, item_bytes=1500
        ).exit_code

    before = signal.getsignal(signal.SIGINT)
    ended = "finished"
    sys.settrace(tracer)
    try:
        run()
    except Interrupted:
        ended = "interrupted"
    except KeyboardInterrupt:  # before the workers started or after they left: the CLI says "interrupted", 130
        ended = "interrupted before or after the workers"
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, before)
    assert run() == 0  # resumed
    out = tmp / "out"
    return seen[0], ended, {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("part-*"))}


def test_a_ctrl_c_at_any_line_of_fleet_local_stops_it_and_the_rerun_gives_a_clean_runs_bytes(tmp_path_factory):
    """Interrupt `fleet local` (in this process, its workers forked) at a generated line of its
    run: it ends as interrupted or finished, never with another error, and the same command again
    finishes with the outputs of a run never interrupted. It found a worker's SIGTERM swallowed by a
    finalizer (tests/test_run_state.py)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    lines, ended, clean = _interrupted_at_line(10**9, tmp_path_factory.mktemp("clean"))
    assert ended == "finished" and lines > 100 and clean

    @settings(max_examples=8, deadline=None, database=None)
    @given(at=st.integers(min_value=1, max_value=lines))
    def interrupted(at):
        _, _, outputs = _interrupted_at_line(at, tmp_path_factory.mktemp("at"))
        assert outputs == clean

    interrupted()


def test_a_killed_run_shows_no_live_worker_and_its_scratch_is_swept(tmp_path, corpus):
    out = tmp_path / "out"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), FLEET_TEST_PAUSE="converting=60")
    one_each = ["--item-mb", "0.015"]  # a.txt and b.txt are an item each (not grouped): two workers hold one
    proc = subprocess.Popen(
        FLEET + ["local", str(corpus), str(out), "--job", LINEJOB, "--workers", "2", *one_each],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        _wait(
            lambda: len(_held(out / ".fleet")) == 2 and len(list(scratch.glob("fleet-*/item-*"))) == 2,
            90,
            "two workers inside their items",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = list(scratch.iterdir())
    assert left  # what a SIGKILL leaves behind
    status = json.loads(fleet("status", out, "--json").stdout)
    assert status["live_workers"] == 0 and status["leased"] == 2, status
    table = fleet("status", out).stdout
    assert "no live worker" in table
    proc = fleet("local", corpus, out, "--job", LINEJOB, "--workers", "1", *one_each, tmp=scratch, timeout=120)
    assert (
        proc.returncode == 0 and "2 item(s) held by workers of an earlier run that died are given back" in proc.stderr
    ), proc.stderr
    assert summary(out)["done"] == 2
    assert list(scratch.iterdir()) == [], "scratch of killed workers left in TMPDIR"


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a few hundred kB: a disk that fills up (the tests run as root, as CI does)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_gives_items_back_and_a_rerun_after_freeing_space_finishes(tmp_path, small_disk):
    corpus = tmp_path / "in"
    corpus.mkdir()
    write_corpus(str(corpus / "a.txt"), 6000, lines_per_doc=1)  # outputs of about 450 kB
    clean = tmp_path / "clean"
    assert local(corpus, clean, "--item-mb", "0.05", tmp=tmp_path).returncode == 0
    out = small_disk / "out"
    proc = local(corpus, out, "--item-mb", "0.05", tmp=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "No space left on device" in proc.stderr, proc.stderr
    state = leases(out / ".fleet")
    assert not any(lease.state == FAILED for lease in state.values()), state
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    proc = local(corpus, out, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert outputs(out) == outputs(clean)


def test_a_disk_full_at_plan_time_is_one_line(tmp_path, small_disk, corpus):
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    one_line_error(local(corpus, small_disk / "out", tmp=tmp_path), "No space left on device")


def test_a_read_only_bucket_stops_workers_in_one_line_and_fails_nothing(tmp_path, small_disk, corpus):
    bucket = small_disk / "bucket"
    assert (
        fleet(
            "plan", "--bucket", bucket, "--run", "r", "--job", LINEJOB, "--input", corpus, "--output", tmp_path / "out"
        ).returncode
        == 0
    )
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    proc = fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path)
    assert proc.returncode == 2 and "Read-only file system" in proc.stderr, proc.stderr
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert fleet("work", "--bucket", bucket, "--run", "r", "--procs", "1", tmp=tmp_path).returncode == 0
    status = json.loads(fleet("status", "--bucket", bucket, "--run", "r", "--json").stdout)
    assert status["done"] == status["items"], status


def test_a_403_on_the_outputs_gives_items_back_and_retry_failed_retries(tmp_path, corpus, gcs_bucket, fake_gcs):
    import uuid

    from fleet.core.store.gcs import make_client
    from tests.standins.faultproxy import FaultProxy

    bucket = f"gs://{gcs_bucket}"
    other = f"t-{uuid.uuid4().hex[:20]}"  # outputs in a bucket of their own, so that a rule can forbid just them
    make_client().create_bucket(other)
    run = ["--bucket", bucket, "--run", "r"]
    from fleet.core.store import open_store

    for name in ("a.txt", "b.txt"):
        open_store(bucket).write(f"in/{name}", (corpus / name).read_bytes())
    assert (
        fleet(
            "plan",
            *run,
            "--job",
            LINEJOB,
            "--input",
            f"{bucket}/in",
            "--output",
            f"gs://{other}/out",
            "--max-attempts",
            "1",
            "--item-mb",
            "0.015",
        ).returncode
        == 0
    )  # an item each, not grouped
    outputs_forbidden = FaultProxy(fake_gcs.url, forbid=lambda m, p: m == "POST" and f"/b/{other}/" in p).start()
    input_forbidden = FaultProxy(fake_gcs.url, forbid=lambda m, p: m == "GET" and "b.txt" in p).start()
    try:
        proc = fleet("work", *run, "--procs", "1", env={"STORAGE_EMULATOR_HOST": outputs_forbidden.url}, tmp=tmp_path)
        assert proc.returncode == 2 and "writing outputs" in proc.stderr and "403" in proc.stderr, proc.stderr
        status = json.loads(fleet("status", *run, "--json").stdout)
        assert (status["failed"], status["leased"], status["done"]) == (0, 0, 0), status
        # A 403 on one input is that item's: it fails (here at once, max attempts 1)...
        proc = fleet("work", *run, "--procs", "1", env={"STORAGE_EMULATOR_HOST": input_forbidden.url}, tmp=tmp_path)
        assert proc.returncode == 0, proc.stderr
    finally:
        outputs_forbidden.stop()
        input_forbidden.stop()
    status = json.loads(fleet("status", *run, "--json").stdout)
    assert (status["done"], status["failed"]) == (1, 1), status
    # ...and stays failed when work resumes, until asked: then it is done.
    assert fleet("work", *run, "--procs", "1", tmp=tmp_path).returncode == 0
    assert json.loads(fleet("status", *run, "--json").stdout)["failed"] == 1
    proc = fleet("work", *run, "--procs", "1", "--retry-failed", tmp=tmp_path)
    assert proc.returncode == 0 and "retrying 1 failed item(s)" in proc.stderr, proc.stderr
    status = json.loads(fleet("status", *run, "--json").stdout)
    assert (status["done"], status["failed"]) == (2, 0), status


def test_fleet_local_keeps_failed_items_until_retry_failed(tmp_path, corpus):
    out = tmp_path / "out"
    env = {"LINEJOB_CRASH": "doc 55 line"}  # a retryable crash in a.txt (60 docs; b.txt has 40) while set
    proc = local(corpus, out, "--max-attempts", "1", env=env, tmp=tmp_path)
    assert proc.returncode == 1 and "--retry-failed" in proc.stderr, proc.stderr
    proc = local(corpus, out, "--max-attempts", "1", tmp=tmp_path)
    assert proc.returncode == 1 and "1 failed (--retry-failed retries them)" in proc.stderr, proc.stderr
    proc = local(corpus, out, "--max-attempts", "1", "--retry-failed", tmp=tmp_path)
    assert proc.returncode == 0 and "retrying 1 failed item(s)" in proc.stderr, proc.stderr
    assert outputs(out) == outputs_of_clean_run(tmp_path, corpus)


def outputs_of_clean_run(tmp_path, corpus) -> dict[str, str]:
    clean = tmp_path / "clean"
    assert local(corpus, clean, tmp=tmp_path).returncode == 0
    return outputs(clean)


def test_a_damaged_lease_is_named_and_its_item_converted_again(tmp_path, corpus):
    out = tmp_path / "out"
    assert local(corpus, out, tmp=tmp_path).returncode == 0
    clean = outputs(out)
    lease = out / ".fleet" / "runs" / "local" / "leases" / "00000"
    lease.write_bytes(b"{not json")
    proc = fleet("status", out)
    assert proc.returncode == 0 and "damaged lease object" in proc.stdout and "leases/00000" in proc.stdout, proc
    proc = local(corpus, out, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert outputs(out) == clean and Lease.parse(lease.read_bytes(), "").state == DONE


def test_a_damaged_run_spec_is_one_line(tmp_path, corpus):
    out = tmp_path / "out"
    assert local(corpus, out, tmp=tmp_path).returncode == 0
    (out / ".fleet" / "runs" / "local" / "run.json").write_text("[]")
    one_line_error(fleet("status", out), "runs/local/run.json: not a run spec")


def test_an_out_dir_that_is_a_file_is_one_line(tmp_path, corpus):
    (tmp_path / "out").write_text("x")
    one_line_error(local(corpus, tmp_path / "out"), "the output folder is an existing file")


def test_an_out_dir_inside_the_input_folder_is_not_read_as_input(tmp_path, corpus):
    out = corpus / "out"
    assert local(corpus, out, tmp=tmp_path).returncode == 0
    items = summary(out)["items"]
    proc = local(corpus, out, tmp=tmp_path)
    assert proc.returncode == 0 and f"{items} of {items} items already done" in proc.stderr, proc.stderr
    assert len(summary(out)["sources"]) == 2


def test_a_new_run_refuses_an_out_dir_holding_another_runs_outputs(tmp_path, corpus):
    out = tmp_path / "out"
    assert local(corpus, out, "--item-mb", "0.004", tmp=tmp_path).returncode == 0
    import shutil

    shutil.rmtree(out / ".fleet")  # "start over" by hand: stale part files would mix with new ones
    one_line_error(local(corpus, out, tmp=tmp_path), "part-00000.txt", "already holds outputs of another run")


def _stopped_at(tmp_path, corpus, pause: str) -> dict:
    """The leases after SIGTERM reached `fleet local --workers 1` while its worker was paused at
    ``pause`` (FLEET_TEST_PAUSE) with a lease written."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        FLEET + ["local", str(corpus), str(out), "--job", LINEJOB, "--workers", "1", "--lease-ttl", "300"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(tmp_path), FLEET_TEST_PAUSE=pause),
    )
    try:
        _wait(lambda: _held(out / ".fleet"), 90, "a lease written")
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return leases(out / ".fleet")


def given_back(state: dict) -> bool:
    return bool(state) and all(
        lease.state == LEASED and lease.expires == 0 and lease.attempt == 0 for lease in state.values()
    )


def test_a_lease_whose_claim_was_in_flight_when_the_signal_came_is_given_back(tmp_path, corpus):
    """SIGTERM after the store wrote the claim's lease, before the worker knew it held the item
    (`fleet down` while a worker takes its next item): the lease is given back at once, not left
    to stand until its TTL. The `leased` pause holds the worker in that gap."""
    state = _stopped_at(tmp_path, corpus, "leased=4")
    assert given_back(state), state


@pytest.mark.parametrize("point", ["claimed=4", "converting=60", "uploaded=4"])
def test_a_held_lease_is_released_at_once_wherever_a_worker_is_stopped_in_its_item(tmp_path, corpus, point):
    """(The worker's own SIGTERM path, used by `fleet down` and Ctrl-C: leases given back, no
    attempt spent, at every named point of an item: with `leased` above, the whole of it.)"""
    state = _stopped_at(tmp_path, corpus, point)
    assert given_back(state), state


def test_a_signal_while_a_leaving_worker_quiets_its_handlers_is_no_traceback(monkeypatch):
    """A loaded suite run: `fleet local` SIGTERMed its worker just as the worker, done, replaced its
    handlers to leave; the old handler ran inside that call, raised Shutdown, and the worker printed
    a traceback. Invariant: a worker that holds nothing lets no Shutdown out while it leaves."""
    import signal as signals

    from fleet.core import processes
    from fleet.core.attempt import Shutdown

    calls: list[int] = []
    real = signals.signal

    def signal_once_interrupted(signum, handler):
        calls.append(signum)
        if len(calls) == 1:  # the old handler ran inside the first replacement
            raise Shutdown()
        return real(signum, handler)

    previous = real(signals.SIGTERM, signals.getsignal(signals.SIGTERM)), signals.getsignal(signals.SIGINT)
    monkeypatch.setattr(processes.signal, "signal", signal_once_interrupted)
    try:
        processes._quiet_signals()  # no Shutdown out of it
        assert signals.getsignal(signals.SIGTERM) is processes._ignore
        assert signals.getsignal(signals.SIGINT) is processes._ignore
    finally:
        monkeypatch.undo()
        real(signals.SIGTERM, previous[0])
        real(signals.SIGINT, previous[1])

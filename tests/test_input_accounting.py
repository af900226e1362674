"""Every file under a run's inputs is accounted for (issue 30): read, or skipped with a reason, and
the bytes add up: the bytes found = the bytes read + the bytes skipped. A skipped file is named on
the terminal (a line a reason), in summary.json, manifest.json and `fleet status`."""

from __future__ import annotations

import json
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.core import accounting
from fleet.core.accounting import HIDDEN, NAMES, OTHER, REASONS, InputAccount
from fleet.core.run import PlanRequest, plan
from fleet.core.sources import survey
from fleet.core.store import open_store
from fleet.job import InputError
from fleet_jobs.text.inputs.names import skip_reason
from tests.helpers.cli import fleet, one_line_error

LINEJOB = "tests.helpers.linejob:JOB"


def write(path, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def found(folder) -> tuple[int, int]:
    """(files, bytes) of every regular file under a folder, hidden ones and all (no links here)."""
    files = size = 0
    for where, _, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(where, name))
    return files, size


@pytest.mark.parametrize(
    "name,reason",
    [
        ("a.txt", None),
        ("wiki_00", None),
        ("0001", None),
        ("b.jsonl.gz", None),
        ("c.txt.xz", None),
        ("d.parquet", None),
        ("e.txt.zst", None),
        ("b.lz4", "an unsupported compression (.lz4)"),
        ("b.txt.lz4", "an unsupported compression (.lz4)"),
        ("c.csv", "not a corpus extension (.csv)"),
        ("c.csv.gz", "not a corpus extension (.csv)"),
        ("shard.0001", "a numbered extension (.0001)"),
        ("wiki.tar", "an archive (.tar)"),
        ("README", "a README-like name"),
        ("LICENSE.txt", "a README-like name"),
        ("sub/.keep", "a hidden name"),
    ],
)
def test_a_text_job_says_why_it_skips_a_file(name, reason):
    got = skip_reason(name)
    assert got is None if reason is None else got.startswith(reason), got


def test_a_run_names_each_skipped_file_with_its_reason_and_the_bytes_add_up(tmp_path):
    inputs = tmp_path / "in"
    files = {
        "a.txt": b"hello world\n\nsecond doc\n",
        "b.lz4": b"\x04\x22\x4d\x18not read",
        "c.csv": b"a,b\n1,2\n",
        "README": b"about this corpus\n",
        "0001": b"a numbered shard\n",
        ".hidden": b"h\n",
        "sub/part.0002": b"a piece\n",
        "sub/empty.txt": b"",
    }
    for name, data in files.items():
        write(inputs / name, data)
    out = tmp_path / "out"
    proc = fleet("local", inputs, out, "--job", LINEJOB, "--workers", "1", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # On the terminal, at plan time and in the summary after: each reason in one line, its files named.
    for name, reason in [
        ("b.lz4", "an unsupported compression (.lz4)"),
        ("c.csv", "not a corpus extension (.csv)"),
        ("README", "a README-like name"),
        (".hidden", "a hidden name"),
        ("sub/part.0002", "a numbered extension (.0002)"),
        ("sub/empty.txt", "an empty file"),
    ]:
        lines = [line for line in proc.stderr.splitlines() if f"{inputs / name}: {reason}" in line]
        assert len(lines) == 2 and lines[0].startswith("warning: skipped 1 file ("), (name, proc.stderr)
    total_files, total_bytes = found(inputs)
    read = len(files["a.txt"]) + len(files["0001"])
    assert (
        f"input files: 2 read ({read} bytes), 6 skipped ({total_bytes - read} bytes) of 8 files found "
        f"({total_bytes} bytes)"
    ) in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    status = json.loads(fleet("status", out, "--json").stdout)
    for account in (summary["input_files"], manifest["input_files"], status["input_files"]):
        assert account["files"] == total_files == 8 and account["bytes"] == total_bytes
        assert account["read"] == {"files": 2, "bytes": len(files["a.txt"]) + len(files["0001"])}
        assert account["read"]["bytes"] + account["skipped"]["bytes"] == total_bytes
        reasons = account["skipped"]["reasons"]
        lz4 = next(r for why, r in reasons.items() if why.startswith("an unsupported compression (.lz4)"))
        assert lz4 == {"files": 1, "bytes": len(files["b.lz4"]), "names": [str(inputs / "b.lz4")]}
    # What was read became documents: the per-file rows hold the bytes the account says were read.
    assert sum(row["input_bytes"] for row in summary["sources"].values()) == summary["input_files"]["read"]["bytes"]
    shown = fleet("status", out).stdout
    assert (
        f"6 skipped ({total_bytes - read} bytes)" in shown
        and f"{inputs / 'b.lz4'}: an unsupported compression" in shown
    )


def test_a_folder_with_nothing_to_read_is_one_line_naming_what_was_skipped(tmp_path):
    write(tmp_path / "in" / "a.lz4", b"x" * 10)
    write(tmp_path / "in" / "notes.csv", b"y")
    proc = fleet("local", tmp_path / "in", tmp_path / "out", "--job", LINEJOB)
    one_line_error(
        proc,
        "no input files there",
        f"{tmp_path / 'in' / 'a.lz4'}: an unsupported compression (.lz4)",
        "notes.csv: not a corpus extension (.csv)",
    )


names = st.text(string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=8).filter(
    lambda n: n not in (".", "..")
)
extensions = st.sampled_from(["", ".txt", ".jsonl", ".json", ".csv", ".md", ".001", ".parquet", ".py"])
compressions = st.sampled_from(["", ".gz", ".xz", ".zst", ".lz4", ".zip", ".br"])
entry = st.tuples(st.lists(names, max_size=2), names, extensions, compressions, st.integers(0, 40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(entry, min_size=1, max_size=25))
def test_every_file_found_is_read_or_skipped_once_and_the_bytes_add_up(tmp_path_factory, monkeypatch, entries):
    monkeypatch.setattr(accounting, "NAMES", 10**6)  # every name kept, to check each file is in one class
    root = tmp_path_factory.mktemp("in")
    for folders, name, ext, comp, size in entries:
        path = os.path.join(root, *folders, name + ext + comp)
        if any(os.path.isfile(os.path.join(root, *folders[: i + 1])) for i in range(len(folders))) or os.path.isdir(
            path
        ):
            continue  # a file where a folder would be, or the reverse
        write(path, b"x" * size)
    total_files, total_bytes = found(root)
    try:
        result = survey([str(root)], skip=skip_reason)
    except InputError as e:  # nothing to read: the error names what was skipped
        assert "no input files there" in str(e)
        return
    account = result.account
    assert account.files_read + account.files_skipped == total_files
    assert account.bytes_read + account.bytes_skipped == total_bytes
    assert account.files_read == len(result.sources) and account.bytes_read == sum(s.size for s in result.sources)
    # Each file in exactly one class: read, or under one reason (a folder skipped whole, with all its files).
    classes: list[str] = [s.display for s in result.sources]
    for reason, row in account.skipped.items():
        assert row.names, reason  # no count without a name
        for name in row.names:
            if name.endswith("/"):
                assert reason == HIDDEN
                classes += [os.path.join(w, n) for w, _, ns in os.walk(name) for n in ns]
            else:
                classes.append(name)
    every = sorted(os.path.join(w, n) for w, _, ns in os.walk(root) for n in ns)
    assert sorted(classes) == every
    assert all(s.size > 0 and skip_reason(s.name) is None for s in result.sources)


def test_the_account_stays_bounded_however_many_files_and_reasons(tmp_path):
    for i in range(300):
        write(tmp_path / "in" / f".h{i}", b"h")
    for i in range(REASONS + 20):
        write(tmp_path / "in" / f"f.x{i}", b"xy")
    write(tmp_path / "in" / "a.txt", b"a\n")
    account = survey([str(tmp_path / "in")], skip=skip_reason).account
    assert account.files_skipped == 300 + REASONS + 20 and account.bytes_skipped == 300 + 2 * (REASONS + 20)
    assert len(account.skipped) == REASONS + 1 and all(len(r.names) <= NAMES for r in account.skipped.values())
    assert account.skipped[HIDDEN].files == 300
    other = account.skipped[OTHER]
    assert other.names and all("(not a corpus extension" in n for n in other.names)
    assert len(account.lines()) == REASONS + 1
    assert InputAccount.from_dict(json.loads(json.dumps(account.to_dict()))) == account


def test_links_fifos_and_files_named_twice_are_counted_skipped(tmp_path):
    inputs = tmp_path / "in"
    write(inputs / "a.txt", b"a\n")
    (inputs / "broken.txt").symlink_to(tmp_path / "nowhere")
    (inputs / "again").symlink_to(inputs)
    os.mkfifo(inputs / "pipe.txt")
    account = survey([str(inputs), str(inputs / "a.txt")], skip=skip_reason).account
    reasons = {why: (row.files, row.bytes, row.names) for why, row in account.skipped.items()}
    assert reasons == {
        "a broken symbolic link": (1, 0, [str(inputs / "broken.txt")]),
        accounting.FOLDER_AGAIN: (0, 0, [str(inputs / "again") + "/"]),
        accounting.NOT_REGULAR: (1, 0, [str(inputs / "pipe.txt")]),
        accounting.NAMED_TWICE: (1, 2, [str(inputs / "a.txt")]),
    }
    assert (account.files_read, account.bytes_read) == (1, 2)


def test_another_runs_outputs_and_this_runs_output_folder_are_counted_whole(tmp_path):
    inputs = tmp_path / "in"
    write(inputs / "a.txt", b"a\n")
    write(inputs / "old" / ".fleet" / "runs" / "x", b"12345")
    write(inputs / "old" / "part-00000.txt", b"123")
    write(inputs / "out" / "part-00000.txt", b"1234")
    account = survey([str(inputs)], [str(inputs / "out")], skip_reason).account
    rows = {why: (row.files, row.bytes, row.names) for why, row in account.skipped.items()}
    assert rows[accounting.OUTPUT_FOLDER] == (1, 4, [str(inputs / "out") + "/"])
    [(why, row)] = [(w, r) for w, r in rows.items() if "fleet local" in w]
    assert row == (2, 8, [str(inputs / "old") + "/"]) and why.endswith("(not corpus)")
    assert account.bytes_read + account.bytes_skipped == found(inputs)[1]


def test_a_gs_folder_accounts_for_every_object(gcs_bucket):
    store = open_store(f"gs://{gcs_bucket}")
    for name, data in {
        "data/a.txt": b"a\n",
        "data/_SUCCESS": b"",
        "data/.keep": b"k",
        "data/b.lz4": b"lz4",
        "data/e.txt": b"",
        "data/sub/": b"",
        "data/sub/c.txt": b"cc\n",
    }.items():
        store.write(name, data)
    account = survey([f"gs://{gcs_bucket}/data"], skip=skip_reason).account
    assert (account.files_read, account.bytes_read) == (2, 5)
    rows = {why.split(" (")[0]: (row.files, row.bytes) for why, row in account.skipped.items()}
    assert rows == {
        "a hidden name": (2, 1),
        "an unsupported compression": (1, 3),
        "an empty file, nothing to convert": (1, 0),
    }


def test_a_run_planned_before_accounts_were_kept_resumes_and_shows_none(tmp_path):
    write(tmp_path / "in" / "a.txt", b"a\n\nb\n")
    write(tmp_path / "in" / "README", b"r\n")
    bucket = str(tmp_path / "b")
    spec, _, created = plan(
        bucket,
        PlanRequest(run="r", job=LINEJOB, inputs=[str(tmp_path / "in")], output=str(tmp_path / "o"), code_version="v"),
    )
    assert created and spec.input_files["skipped"]["files"] == 1
    path = tmp_path / "b" / "runs" / "r" / "run.json"
    old = json.loads(path.read_text())
    del old["input_files"]
    path.write_text(json.dumps(old))
    write(tmp_path / "in" / "NOTICE", b"n\n")  # a file skipped now that was not there: no other outputs
    spec, _, created = plan(
        bucket,
        PlanRequest(run="r", job=LINEJOB, inputs=[str(tmp_path / "in")], output=str(tmp_path / "o"), code_version="v"),
    )
    assert not created and spec.input_files == {}


def test_fleet_plan_says_what_it_read_and_skipped_after_the_plan_is_accepted(tmp_path):
    write(tmp_path / "in" / "a.txt", b"a\n\nb\n")
    write(tmp_path / "in" / "b.lz4", b"lz4")
    args = [
        "plan",
        "--bucket",
        tmp_path / "b",
        "--run",
        "r",
        "--job",
        LINEJOB,
        "--input",
        tmp_path / "in",
        "--output",
        tmp_path / "o",
    ]
    proc = fleet(*args)
    assert proc.returncode == 0, proc.stderr
    warning, planned = proc.stderr.strip().splitlines()
    assert warning.startswith("warning: skipped 1 file (3 bytes): ") and "b.lz4: an unsupported compression" in warning
    assert planned.endswith("; input files: 1 read (5 bytes), 1 skipped (3 bytes) of 2 files found (8 bytes)")
    refused = fleet(*args, "--set", "seed=1")
    one_line_error(refused, "planned differently")  # a refusal is its one line, no warnings before it

"""Small files grouped into items (issue 28, part 2).

20,000 files of one line each took 384 s and wrote 40,002 files: each file was an item of its
own. Files smaller than an item are now packed into items of about --item-mb, in the order they
are found (fleet.core.run.group_pieces), and read file by file (fleet_jobs.text.parts): the same
documents as one file holding them, a file's counts and errors its own, a bad file alone lost.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from fleet.cli.local import RUN, run_local
from fleet.core.layout import counts_name, items_name, spec_name
from fleet.core.manifest import MANIFEST, CountsMissing, manifest_of
from fleet.core.run import MAX_GROUP_FILES, Item, PlanError, PlanRequest, group_pieces, load_items, make_items, plan
from fleet.core.status import StatusReader
from fleet.core.store import open_store
from fleet.core.verify import check_outputs
from fleet.job import Converter, InputError, Job, Piece, Source, StageOptions
from fleet.formats import tfrecord
from fleet_jobs.text.job import TextJob
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.procs import LINEJOB, committed, plan_lines, start_worker, wait_exit

WORDS = ["alpha", "beta", "gamma", "delta", "épsilon", "数据", "模型", "训练", "zeta", "eta", "theta", "iota"]


def one_line_files(folder: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` files of one line each (f00000.txt...), and their lines in file order."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        line = f"file {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
        (folder / f"f{i:05d}.txt").write_text(line + "\n", encoding="utf-8")
        lines.append(line)
    return lines


def local(inputs, out, job: str, settings_: dict | None = None, workers: int = 1, expect: int = 0, **kw):
    console = Console(file=io.StringIO(), width=250)
    result = run_local(
        [str(i) for i in inputs],
        str(out),
        job,
        workers,
        {k: str(v) for k, v in (settings_ or {}).items()},
        console=console,
        lease_ttl=20,
        **kw,
    )
    printed = console.file.getvalue()
    assert result.exit_code == expect, printed
    return result, printed


def outputs(out) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(out).glob("part-*"))}


def sorted_records(out) -> list[bytes]:
    return sorted(
        r
        for path in sorted(glob.glob(os.path.join(str(out), "part-*.tfrecord")))
        for r in tfrecord.iter_records(open(path, "rb").read())
    )


def manifest(out) -> dict:
    return json.loads((Path(out) / MANIFEST).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab([f"file {i}: " + " ".join(WORDS) for i in range(200)], 400), path)
    return path


@pytest.fixture
def ungrouped(monkeypatch):
    """Plans as the code before grouping did: every file its own items."""
    monkeypatch.setattr(TextJob, "group_small_files", False)


# -- 1. the grouping rule, over generated sizes ----------------------------------------------------


@dataclass
class _Sized(Job):
    """A job cutting each file into pieces of at most item_bytes (a text job's cut, without reading)."""

    name: str = "sized"
    config_type: type = dict

    def cut(self, source, item_bytes, config, read):
        return [Piece(s, min(source.size, s + item_bytes)) for s in range(0, source.size, item_bytes)]

    def converter(self, config, opener):
        raise AssertionError("not converted here")


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 400), max_size=60), item_bytes=st.integers(1, 300), max_files=st.integers(1, 8))
def test_every_byte_is_in_one_item_in_order_and_groups_stay_within_the_target(sizes, item_bytes, max_files):
    sources = [Source("/in", f"f{i:03d}", size, f"v{i}") for i, size in enumerate(sizes)]
    job = _Sized()
    items = make_items(job, None, sources, item_bytes, group=True, max_files=max_files)
    # Every byte of every (non-empty) input in exactly one item, in input order.
    read = [(p.name, p.start, p.end) for item in items for p in item.pieces]
    expected = [(s.name, a, b) for s in sources for a, b in ((p.start, p.end) for p in job.cut(s, item_bytes, 0, {}))]
    assert read == expected
    assert [i.id for i in items] == [f"{n:0{max(5, len(str(len(items) - 1)))}d}" for n in range(len(items))]
    for item in items:
        assert item.size == sum(p.end - p.start for p in item.pieces)
        if item.parts:  # packed: whole small files only, within the target and the cap
            assert 2 <= len(item.parts) <= max_files
            assert item.size <= item_bytes
            assert all(p.start == 0 and p.end == sizes[int(p.name[1:])] < item_bytes for p in item.parts)
            assert item.url == item.parts[0].url and not item.name
        # A file bigger than an item is never in a group, nor is any piece of one cut in several.
        elif sizes[int(item.name[1:])] >= item_bytes:
            assert not any(p.name == item.name for other in items if other.parts for p in other.parts)
    # As many groups as the greedy rule needs: a group closes only when the next small file
    # would not fit, the cap is reached, or a file that is not small comes.
    groups = group_pieces([(s, job.cut(s, item_bytes, 0, {})) for s in sources if s.size], item_bytes, max_files)
    for a, b in zip(groups, groups[1:]):
        if (
            len(b) == 1
            and b[0][1].end - b[0][1].start < item_bytes
            and b[0][0].size < item_bytes
            and all(p.end - p.start < item_bytes and s.size < item_bytes for s, p in a)
        ):
            assert sum(p.end - p.start for _, p in a) + b[0][1].end - b[0][1].start > item_bytes or len(a) >= max_files


def test_items_of_a_grouped_plan_round_trip_through_items_jsonl(tmp_path):
    one_line_files(tmp_path / "in", 30)
    _, items, _ = plan(
        str(tmp_path / "b"),
        PlanRequest(
            run="r",
            job=LINEJOB,
            inputs=[str(tmp_path / "in")],
            output=str(tmp_path / "out"),
            code_version="v",
            item_bytes=300,
        ),
    )
    store = open_store(str(tmp_path / "b"))
    assert load_items(store, "r") == items
    assert len(items) > 2 and all(len(i.parts) >= 2 for i in items)
    line = json.loads(store.read(items_name("r")).splitlines()[0])
    assert "url" not in line["parts"][0] and "id" not in line["parts"][0]  # what the item says is not repeated
    assert json.loads(store.read(spec_name("r")))["group_files"] == 1


def test_fleet_plan_says_how_many_small_files_it_packed(tmp_path):
    from tests.helpers.cli import fleet

    one_line_files(tmp_path / "in", 30)
    proc = fleet(
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
        tmp_path / "out",
        "--item-mb",
        "0.001",
    )
    assert proc.returncode == 0, proc.stderr
    items = load_items(open_store(str(tmp_path / "b")), "r")
    assert len(items) >= 2 and all(len(i.parts) >= 2 for i in items)
    assert f"run r planned: {len(items)} items (30 small files packed into {len(items)} of them)," in proc.stderr


# -- 2. the case: many one-line files, few outputs, the same documents -----------------------


@pytest.mark.parametrize("job,options", [("causal_lm", {"max_seq_length": 16}), ("electra_zh_en", {})])
def test_5000_one_line_files_convert_into_few_outputs_with_the_documents_of_one_file(tmp_path, vocab, job, options):
    lines = one_line_files(tmp_path / "in", 5000)
    whole = tmp_path / "whole.txt"  # the same documents in one file: a blank line after each
    whole.write_text("".join(line + "\n\n" for line in lines), encoding="utf-8")
    settings_ = {"vocab_file": vocab, **options}
    grouped, _ = local([tmp_path / "in"], tmp_path / "out", job, settings_, workers=2)
    one, _ = local([whole], tmp_path / "one", job, settings_)
    assert grouped.status.totals["documents"] == 5000 == one.status.totals["documents"]
    assert len(outputs(tmp_path / "out")) == len(outputs(tmp_path / "one")) <= 4  # was 5,000 (and their sidecars)
    assert grouped.status.items <= 4
    assert sorted_records(tmp_path / "out") == sorted_records(tmp_path / "one")  # the same examples


# -- 3. outputs: a pure function of inputs and config --------------------------------------------------


def test_grouped_outputs_are_the_same_bytes_whatever_the_workers(tmp_path):
    one_line_files(tmp_path / "in", 1200)
    one, _ = local([tmp_path / "in"], tmp_path / "w1", LINEJOB, item_bytes=8000)
    three, _ = local([tmp_path / "in"], tmp_path / "w3", LINEJOB, workers=3, item_bytes=8000)
    assert one.status.items == three.status.items >= 4
    assert outputs(tmp_path / "w1") == outputs(tmp_path / "w3")
    assert (tmp_path / "w1" / MANIFEST).read_bytes() == (tmp_path / "w3" / MANIFEST).read_bytes()
    # A follower hands on the outputs, not the per-file counts kept beside the leases.
    from fleet.core.follow import follow

    followed = [os.path.basename(o.url) for o in follow(str(tmp_path / "w3" / ".fleet"), RUN, poll=0.1)]
    assert sorted(followed) == sorted(outputs(tmp_path / "w3"))


def test_a_grouped_item_killed_while_converting_is_converted_again_into_the_same_bytes(tmp_path):
    corpus = tmp_path / "in"
    one_line_files(corpus, 400)
    bucket, logs = str(tmp_path / "bucket"), str(tmp_path / "logs")
    plan_lines(bucket, "clean", str(corpus), 4000, ttl=30)
    w = start_worker(bucket, "clean", "solo", logs)
    wait_exit([w], 120)
    clean = committed(bucket, "clean")
    items = plan_lines(bucket, "kill", str(corpus), 4000, ttl=1.5, delay=0.002)
    assert all(i.parts for i in items)
    victim = start_worker(bucket, "kill", "victim", logs, {"FLEET_TEST_PAUSE": "converting=30"})
    deadline = time.time() + 60
    while victim.at() is None:
        assert time.time() < deadline and victim.alive(), victim.stderr_text()
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.popen.wait()
    survivor = start_worker(bucket, "kill", "survivor", logs)
    wait_exit([survivor], 120)
    got = committed(bucket, "kill")  # outputs and per-file counts, by name: the run's name taken out of the names
    assert {k.replace("kill", "R"): v for k, v in got.items()} == {k.replace("clean", "R"): v for k, v in clean.items()}
    assert any("/counts/" in k for k in got)


def test_a_retried_grouped_item_rewrites_the_same_bytes(tmp_path, monkeypatch):
    one_line_files(tmp_path / "in", 300)
    clean, _ = local([tmp_path / "in"], tmp_path / "clean", LINEJOB, item_bytes=5000)
    monkeypatch.setenv("LINEJOB_CRASH", "file 250:")  # a crash that goes away with the variable
    crashed, _ = local([tmp_path / "in"], tmp_path / "out", LINEJOB, item_bytes=5000, expect=1, max_attempts=1)
    assert crashed.status.failed == 1 and "simulated crash" in crashed.status.failures[0]["error"]
    monkeypatch.delenv("LINEJOB_CRASH")
    local([tmp_path / "in"], tmp_path / "out", LINEJOB, item_bytes=5000, retry_failed=True, max_attempts=1)
    assert outputs(tmp_path / "out") == outputs(tmp_path / "clean")
    assert manifest(tmp_path / "out")["sources"] == manifest(tmp_path / "clean")["sources"]


# -- 4. counts per input file, exactly -----------------------------------------------------------------


def test_per_file_counts_in_manifest_and_status_equal_an_ungrouped_runs(tmp_path, vocab, monkeypatch):
    lines = one_line_files(tmp_path / "in", 60)
    # A file of several documents, one with a bad line (counted as a bad record, in that file's row).
    (tmp_path / "in" / "f00007.txt").write_bytes(b"first doc\nline two\n\nsecond \xff\xfe doc\n\nthird doc\n")
    (tmp_path / "in" / "f00011.txt").write_text("", encoding="utf-8")  # empty: skipped by both
    settings_ = {"vocab_file": vocab}
    grouped, _ = local([tmp_path / "in"], tmp_path / "grouped", "electra_zh_en", settings_, item_bytes=600)
    monkeypatch.setattr(TextJob, "group_small_files", False)
    alone, _ = local([tmp_path / "in"], tmp_path / "alone", "electra_zh_en", settings_, item_bytes=600)
    assert alone.status.items == 59 and grouped.status.items < 10
    rows, before = manifest(tmp_path / "grouped")["sources"], manifest(tmp_path / "alone")["sources"]
    assert sorted(rows) == sorted(before) and len(rows) == 59
    read_counts = {"input_bytes", "documents", "bad_records"}
    for name, row in rows.items():
        assert set(row) <= read_counts and {"input_bytes", "documents"} <= set(row), row
        assert row == {k: v for k, v in before[name].items() if k in read_counts}, name
    # (the bad line was its document's only one: two documents are left)
    assert rows[str(tmp_path / "in" / "f00007.txt")] == {"input_bytes": 45, "documents": 2, "bad_records": 1}
    # Status says the same as the manifest, and the rows sum to the run's totals of what was read.
    assert grouped.status.sources == rows == grouped.summary["sources"]
    for key in read_counts:
        assert sum(r.get(key, 0) for r in rows.values()) == grouped.status.totals[key], key
    assert len(lines) == 60


def test_a_grouped_items_lease_stays_small_whatever_its_files(tmp_path):
    sizes = {}
    for n in (300, 1200):
        corpus = tmp_path / f"in{n}"
        one_line_files(corpus, n)
        local([corpus], tmp_path / f"out{n}", LINEJOB, item_bytes=10 << 20)  # one item holds every file
        state = tmp_path / f"out{n}" / ".fleet" / "runs" / RUN
        [lease] = list((state / "leases").iterdir())
        sizes[n] = (lease.stat().st_size, (state / "counts" / "00000.json").stat().st_size)
        assert len(manifest(tmp_path / f"out{n}")["sources"]) == n
    assert sizes[1200][0] <= 1.1 * sizes[300][0]  # the lease: the same size at four times the files
    assert sizes[1200][1] >= 3.5 * sizes[300][1]  # the counts grow with the files, beside it


# -- 5. bad input inside a group ---------------------------------------------------------------------


def test_a_bad_file_in_a_group_is_one_line_naming_it_and_nothing_else_is_lost(tmp_path):
    from fleet.cli.render import print_status

    lines = one_line_files(tmp_path / "in", 40)
    rng = random.Random(1)
    junk = tmp_path / "in" / "f00017.txt"  # not text: every line invalid UTF-8
    junk.write_bytes(b"\n".join(bytes(rng.randrange(128, 256) for _ in range(30)) for _ in range(20)) + b"\n")
    gone = tmp_path / "in" / "f00030.txt"
    bucket, out = str(tmp_path / "bucket"), tmp_path / "out"
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run="r", job=LINEJOB, inputs=[str(tmp_path / "in")], output=str(out), code_version="v", item_bytes=100_000
        ),
    )
    assert len(items) == 1 and len(items[0].parts) == 40
    gone.unlink()  # after the plan: gone when its turn comes
    worker = start_worker(bucket, "r", "w", str(tmp_path / "logs"))
    wait_exit([worker], 120)
    st = StatusReader(open_store(bucket), "r").collect()
    assert st.done == 1 and st.failed == 0
    errors = [f["error"] for f in st.failed_files]
    assert len(errors) == 2 and all("\n" not in e for e in errors)
    assert errors[0].startswith(f"{junk}: 20 of 20 records are bad"), errors[0]
    assert errors[1] == f"{gone}: input file is gone", errors[1]
    console = Console(file=io.StringIO(), width=300)
    print_status(console, st)
    assert f"failed file {junk}: 20 of 20 records are bad" in console.file.getvalue()
    good = [line for i, line in enumerate(lines) if i not in (17, 30)]
    assert st.totals["documents"] == len(good) and st.totals["files_failed"] == 2
    rows = manifest(out)["sources"]  # written by the worker: every item is done
    assert rows[str(junk)] == {"files_failed": 1, "documents": 0, "input_bytes": junk.stat().st_size}
    assert not st.bad_records and "bad_records" not in st.totals  # its bad records are in its one line
    assert rows[str(gone)] == {"files_failed": 1, "documents": 0, "input_bytes": items[0].parts[30].size}
    assert sum(r["documents"] for r in rows.values()) == len(good)
    out_lines = (out / "part-00000.txt").read_text().splitlines()
    assert [line.split()[1] for line in out_lines] == [hashlib.sha256(x.encode()).hexdigest() for x in good]


def test_fleet_local_exits_1_on_a_failed_file_and_says_so(tmp_path):
    one_line_files(tmp_path / "in", 10)
    (tmp_path / "in" / "f00004.txt").write_bytes(b"\xff\xff\n" * 5)  # (FF FE first would be UTF-16's mark)
    result, printed = local([tmp_path / "in"], tmp_path / "out", LINEJOB, expect=1)
    assert result.status.done == result.status.items == 1
    flat = " ".join(printed.split())
    assert f"failed file {tmp_path / 'in' / 'f00004.txt'}: 5 of 5 records are bad" in flat
    assert result.summary["failed_files"] == result.status.failed_files and "plan a new run" in result.summary["hint"]
    assert (tmp_path / "out" / MANIFEST).exists()  # the run is finished: the file is counted in its row


def test_grouped_files_in_a_bucket_are_read_ahead_and_one_gone_fails_alone(tmp_path, gcs_bucket):
    lines = one_line_files(tmp_path / "in", 60)
    bucket = f"gs://{gcs_bucket}"
    store = open_store(bucket)
    for path in sorted((tmp_path / "in").iterdir()):
        store.write(f"in/{path.name}", path.read_bytes())
    _, items, _ = plan(
        bucket,
        PlanRequest(
            run="r", job=LINEJOB, inputs=[f"{bucket}/in"], output=f"{bucket}/out", code_version="v", item_bytes=100_000
        ),
    )
    assert len(items) == 1 and len(items[0].parts) == 60
    store.delete("in/f00042.txt")
    worker = start_worker(bucket, "r", "w", str(tmp_path / "logs"))
    wait_exit([worker], 120)
    st = StatusReader(store, "r").collect()
    assert st.done == 1 and [f["error"] for f in st.failed_files] == [f"{bucket}/in/f00042.txt: input file is gone"]
    written = store.read("out/part-00000.txt").decode().splitlines()
    assert [line.split()[1] for line in written] == [
        hashlib.sha256(x.encode()).hexdigest() for i, x in enumerate(lines) if i != 42
    ]
    assert json.loads(store.read(f"out/{MANIFEST}"))["sources"][f"{bucket}/in/f00042.txt"]["files_failed"] == 1


def test_a_bad_record_in_the_3000th_file_of_a_group_names_that_file(tmp_path):
    one_line_files(tmp_path / "in", 3001)
    bad = tmp_path / "in" / "f02999.txt"
    bad.write_bytes(b"good line\n\xff bad line\n")
    result, printed = local([tmp_path / "in"], tmp_path / "out", LINEJOB, item_bytes=1 << 20)
    assert result.status.items == 1
    [skipped] = result.status.bad_records
    assert skipped["where"].startswith(f"{bad}: byte 10: invalid UTF-8"), skipped
    assert manifest(tmp_path / "out")["sources"][str(bad)]["bad_records"] == 1


# -- 6. resuming a run planned before grouping -------------------------------------------------------


def test_a_run_planned_before_grouping_resumes_as_planned(tmp_path, monkeypatch):
    one_line_files(tmp_path / "in", 12)
    out = tmp_path / "out"
    monkeypatch.setattr(TextJob, "group_small_files", False)  # the plan the code before grouping made...
    local([tmp_path / "in"], out, LINEJOB)
    monkeypatch.undo()
    state = out / ".fleet" / "runs" / RUN
    spec = json.loads((state / "run.json").read_text())
    del spec["group_files"]  # ...and its run.json, which had no such field
    (state / "run.json").write_text(json.dumps(spec, indent=1, sort_keys=True))
    before = outputs(out)
    assert len(before) == 12
    for name in ("leases", "final"):  # three items lost: resumed, they are converted again
        for item in ("00002", "00005", "00011"):
            (state / name / item).unlink(missing_ok=True)
    for item in ("00002", "00005", "00011"):
        (out / f"part-{item}.txt").unlink()
    result, printed = local([tmp_path / "in"], out, LINEJOB)
    assert "9 of 12 items already done" in printed and result.status.items == 12
    assert not any(i.parts for i in load_items(open_store(str(out / ".fleet")), RUN))
    assert outputs(out) == before
    # A new run of the same files is grouped.
    new, _ = local([tmp_path / "in"], tmp_path / "new", LINEJOB)
    assert new.status.items == 1


def test_a_run_the_code_before_grouping_planned_resumes_with_an_item_per_file(tmp_path):
    """run.json and items.jsonl as the code before grouping wrote them (tests/helpers/
    old_small_files_run, from e5df450, for the six files one_line_files makes): planned again, the
    run keeps its six items, and its worker converts them as planned."""
    from fleet.core.spawner import Worker

    base = tmp_path / "base"
    one_line_files(base / "in", 6)
    bucket = str(base / "bucket")
    old = os.path.join(os.path.dirname(__file__), "helpers", "old_small_files_run")
    os.makedirs(os.path.join(bucket, "runs", "old"))
    for name in ("run.json", "items.jsonl"):
        text = open(os.path.join(old, name), encoding="utf-8").read().replace("{BASE}", str(base))
        for i in range(6):
            version = open_store(str(base / "in")).stat(f"f{i:05d}.txt").version
            text = text.replace(f"{{VERSION:f{i:05d}.txt}}", version)
        (Path(bucket) / "runs" / "old" / name).write_text(text, encoding="utf-8")
    planned = (Path(bucket) / "runs" / "old" / "items.jsonl").read_bytes()
    spec, items, created = plan(
        bucket,
        PlanRequest(
            run="old",
            job=LINEJOB,
            inputs=[str(base / "in")],
            output=str(base / "out"),
            code_version="test",
            lease_ttl=30,
            item_bytes=262144,
        ),
    )
    assert not created and spec.group_files == 0 and len(items) == 6 and not any(i.parts for i in items)
    assert (Path(bucket) / "runs" / "old" / "items.jsonl").read_bytes() == planned
    Worker(bucket, "old", "w").run_until_drained()
    assert sorted(outputs(base / "out")) == [f"part-{i:05d}.txt" for i in range(6)]
    assert len(manifest(base / "out")["sources"]) == 6


def test_a_changed_file_of_a_group_is_named_when_the_run_is_planned_again(tmp_path):
    one_line_files(tmp_path / "in", 20)
    out = tmp_path / "out"
    local([tmp_path / "in"], out, LINEJOB)
    (tmp_path / "in" / "f00013.txt").write_text("other text, other size\n", encoding="utf-8")
    with pytest.raises(PlanError) as e:
        local([tmp_path / "in"], out, LINEJOB)
    message = str(e.value)
    assert "f00013.txt changed (size=" in message and "f00012" not in message and "\n" not in message


# -- 7. what keys on "the item's file" -----------------------------------------------------------------


def test_provenance_names_each_documents_own_file_in_a_grouped_item(tmp_path, vocab):
    from tests.test_provenance import document_at, sidecar
    from fleet_jobs.text.provenance import PROVENANCE_SUFFIX
    from fleet.formats.token_files import read_sequences

    folder = tmp_path / "in"
    folder.mkdir()
    docs = []
    for i in range(30):  # text files of one to three documents, and JSON Lines files
        rng = random.Random(i)
        file_docs = [
            [
                f"doc {i}.{k} " + " ".join(rng.choice(WORDS[:8]) for _ in range(rng.randint(1, 6)))
                for _ in range(rng.randint(1, 2))
            ]
            for k in range(rng.randint(1, 3))
        ]
        if i % 3:
            (folder / f"t{i:02d}.txt").write_text("".join("\n".join(d) + "\n\n" for d in file_docs), encoding="utf-8")
        else:
            (folder / f"t{i:02d}.jsonl").write_text(
                "".join(json.dumps({"text": "\n".join(d)}) + "\n" for d in file_docs), encoding="utf-8"
            )
        docs += file_docs
    result, _ = local(
        [folder],
        tmp_path / "out",
        "causal_lm",
        {"vocab_file": vocab, "output": "megatron", "provenance": "true"},
        item_bytes=100_000,
    )
    assert result.status.items == 1
    [bin_path] = glob.glob(str(tmp_path / "out" / "part-*.bin"))
    with open(bin_path[:-4] + ".idx", "rb") as f:
        sequences = read_sequences(bin_path, f.read(), "megatron", 400)
    lines = sidecar(bin_path[:-4] + PROVENANCE_SUFFIX)
    assert len(lines) == len(sequences) == len(docs)
    assert [line["document"] for line in lines] == list(range(len(docs)))  # ordinals run on across the files
    assert [document_at(line) for line in lines] == docs  # each place is in the document's own file
    assert len({line["file"] for line in lines}) == 30


def test_exact_dedup_of_grouped_files_keeps_the_first_copy_by_file_and_offset(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(40):  # copies of a few texts, differing in spaces only: which copy is kept shows
        text = f"text {i % 7}"
        (folder / f"d{i:02d}.txt").write_text(
            f"{text}\n\n{' ' * (i % 3)}{text} again\n\nunique {i}\n", encoding="utf-8"
        )
    grouped, _ = local(
        [folder], tmp_path / "grouped", LINEJOB, item_bytes=300, stage_options=StageOptions(dedup="exact")
    )
    monkeypatch.setattr(TextJob, "group_small_files", False)
    alone, _ = local([folder], tmp_path / "alone", LINEJOB, item_bytes=300, stage_options=StageOptions(dedup="exact"))
    assert alone.status.totals["dedup_documents_dropped"] == grouped.status.totals["dedup_documents_dropped"] > 0

    def kept(out) -> list[str]:  # linejob writes each document's digest: the kept copies, whitespace and all
        return sorted(line.split()[1] for p in Path(out).glob("part-*.txt") for line in p.read_text().splitlines())

    assert kept(tmp_path / "grouped") == kept(tmp_path / "alone")
    first = {hashlib.sha256(f"{' ' * (i % 3)}text {i % 7} again".encode()).hexdigest() for i in range(7)}
    assert first <= set(kept(tmp_path / "grouped"))  # the copies of the first files, not later ones


def test_verify_finds_a_lost_counts_object_and_a_rerun_writes_it_again(tmp_path):
    one_line_files(tmp_path / "in", 50)
    out = tmp_path / "out"
    local([tmp_path / "in"], out, LINEJOB, item_bytes=600)
    store = open_store(str(out / ".fleet"))
    before = (out / MANIFEST).read_bytes()
    store.delete(counts_name(RUN, "00001"))
    reader = StatusReader(store, RUN)
    leases = reader.leases()
    damage = check_outputs(reader.spec, leases, state=store)
    assert [(d.item, d.output, d.why) for d in damage] == [("00001", counts_name(RUN, "00001"), "is missing")]
    with pytest.raises(CountsMissing, match="item 00001"):
        manifest_of(reader.items, leases)
    (out / MANIFEST).unlink()
    _, printed = local([tmp_path / "in"], out, LINEJOB, item_bytes=600)
    assert "1 done item(s) whose outputs are gone or changed are converted again" in printed
    assert (out / MANIFEST).read_bytes() == before


# -- 8. jobs that leave grouping -----------------------------------------------------------------------


class _Count(Converter):
    def convert(self, item, ctx, sink):
        lines = item.read(item.start, item.end).count(b"\n")
        with sink.open(".txt") as out:
            out.write(f"{item.name}\t{lines}\n".encode())
        return {"lines": 1}


@dataclass
class _CountConfig:
    seed: int = 0


class _CountJob(Job):
    """The docs' linecount: a job written against the API before grouping (it reads item.name)."""

    name = "linecount"
    config_type = _CountConfig

    def converter(self, config, opener):
        return _Count()


COUNT_JOB = _CountJob()


@pytest.mark.parametrize(
    "job,settings_", [("tests.test_small_files:COUNT_JOB", {}), ("command", {"command": "cp {input} {output}/copy"})]
)
def test_a_job_that_leaves_grouping_gets_one_item_per_file(tmp_path, job, settings_):
    one_line_files(tmp_path / "in", 6)
    result, _ = local([tmp_path / "in"], tmp_path / "out", job, settings_)
    assert result.status.items == 6
    assert not any(i.parts for i in load_items(open_store(str(tmp_path / "out" / ".fleet")), RUN))
    assert json.loads((tmp_path / "out" / ".fleet" / "runs" / RUN / "run.json").read_text())["group_files"] == 0


def test_a_grouped_item_input_reads_only_through_its_parts(tmp_path):
    one_line_files(tmp_path / "in", 3)
    source = [
        Source(str(tmp_path / "in"), f"f{i:05d}.txt", (tmp_path / "in" / f"f{i:05d}.txt").stat().st_size)
        for i in range(3)
    ]
    [item] = make_items(_Sized(), None, source, 1000, group=True)
    given_ = item.input()
    assert given_.grouped and [p.name for p in given_.parts] == ["f00000.txt", "f00001.txt", "f00002.txt"]
    assert given_.parts[1].read_all() == (tmp_path / "in" / "f00001.txt").read_bytes()
    with pytest.raises(TypeError, match="read its parts"):
        given_.read(0, 1)
    assert "3 files" in item.display and "f00000.txt" in item.display and "f00002.txt" in item.display
    single = Item(str(tmp_path / "in"), "f00000.txt", 0, 5).input()
    assert not single.grouped and single.parts == [single]
    (tmp_path / "in" / "f00001.txt").write_text("x\n")
    with pytest.raises(InputError, match="f00001.txt: changed since it was planned"):
        given_.parts[1].read_all()
    assert MAX_GROUP_FILES >= 1000

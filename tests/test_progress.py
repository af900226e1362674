"""Progress without a terminal (issue 33, item 4): `fleet local` writing to a file says how far the
run is, one plain line at a steady interval (fleet.cli.progress)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from fleet.core.progress import DEFAULT_EVERY, ProgressLines, every_from_env, worker_line
from fleet.core.status import covered_seconds


def test_a_line_comes_once_the_interval_has_passed_then_once_per_interval():
    p = ProgressLines(total_bytes=40_000_000, started=100.0, start_bytes=0, every=30)
    assert p.line("items 0/10", 0, 100.0) is None  # a run shorter than the interval prints no line
    assert p.line("items 1/10", 4_000_000, 129.9) is None
    assert p.line("items 3/10 (1 failed)", 12_300_000, 130.0) == (
        "progress: items 3/10 (1 failed) · 12.3 of 40.0 MB (31%) · 410 kB/s · ETA 1 min 8 s"
    )
    assert p.line("items 4/10", 16_000_000, 159.0) is None
    assert p.line("items 5/10", 20_000_000, 160.0) is not None


def test_a_resumed_run_counts_its_rate_from_what_this_command_converted():
    p = ProgressLines(total_bytes=100_000_000, started=0.0, start_bytes=90_000_000, every=10)
    # 90 MB were done before: 5 MB in 10 s is 0.5 MB/s, and 5 MB are left
    assert p.line("items 95/100", 95_000_000, 10.0).endswith("95.0 of 100.0 MB (95%) · 500 kB/s · ETA 10 s")


def test_sizes_read_in_the_unit_of_the_total():
    p = ProgressLines(total_bytes=3_400, started=0.0, every=1)
    assert p.text("items 1/2", 1_700, 2.0) == "progress: items 1/2 · 1.7 of 3.4 kB (50%) · 0.85 kB/s · ETA 2 s"
    p = ProgressLines(total_bytes=2_500_000_000_000, started=0.0, every=1)
    assert p.text("items 1/9", 1_250_000_000_000, 1e4).startswith(
        "progress: items 1/9 · 1.2 of 2.5 TB (50%) · 125 MB/s"
    )


def test_no_rate_before_a_byte_moves_and_no_eta_without_a_live_worker_or_when_done():
    p = ProgressLines(total_bytes=10_000_000, started=0.0, every=1)
    assert p.text("items 0/2", 0, 5.0) == "progress: items 0/2 · 0.0 of 10.0 MB (0%)"
    assert "ETA" not in p.text("items 1/2", 5_000_000, 5.0, live=False)
    assert "ETA" not in p.text("items 2/2", 10_000_000, 5.0)
    assert p.text("map 1/1 · shards 0/2", 10_000_000, 5.0).startswith(
        "progress: map 1/1 · shards 0/2 · 10.0 of 10.0 MB"
    )


@given(
    every=st.floats(0.5, 100),
    steps=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=200),
)
def test_lines_are_never_closer_than_the_interval_and_never_late_by_more_than_a_tick(every, steps):
    """Whatever the loop's pace: two lines at least ``every`` apart, and at a tick past the due
    time there is a line (so the gap is at most ``every`` plus the loop's own step)."""
    p = ProgressLines(total_bytes=1000, started=0.0, every=every)
    now, last = 0.0, 0.0
    for step in steps:
        now += step
        printed = p.line("items 0/1", 0, now) is not None
        assert printed == (now >= last + every)
        if printed:
            last = now


def test_a_workers_line_says_what_it_did_since_it_started_and_what_it_holds():
    assert worker_line(5, 1, 320_000_000, 100.0, "00012") == (
        "progress: 5 items done here (1 failed) · 320.0 MB · 3.2 MB/s · on item 00012"
    )
    assert worker_line(1, 0, 0, 3.0, None) == "progress: 1 item done here · 0.0 kB · idle"


def test_the_interval_comes_from_the_environment_and_a_bad_value_keeps_the_default():
    assert every_from_env({"FLEET_PROGRESS_SECONDS": "2.5"}) == 2.5
    for bad in ("", "soon", "0", "-3", "nan"):
        assert every_from_env({"FLEET_PROGRESS_SECONDS": bad}) == DEFAULT_EVERY
    assert every_from_env({}) == DEFAULT_EVERY


def test_fleet_local_into_a_file_prints_progress_lines_and_the_workers_logs_say_what_they_do(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"f{i}.txt").write_text("".join(f"line {i} {n} " + "x" * 40 + "\n" for n in range(20)))
    log = tmp_path / "log.txt"
    env = dict(os.environ, FLEET_PROGRESS_SECONDS="0.5")
    with open(log, "wb") as out:  # stdout and stderr a file, as under nohup
        code = subprocess.run(
            [sys.executable, "-m", "fleet.cli", "local", str(corpus), str(tmp_path / "out"), "--job"]
            + ["tests.helpers.linejob:JOB", "--workers", "2", "--item-mb", "0.001", "--set", "delay=1.5"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=300,
        ).returncode
    text = log.read_text()
    assert code == 0, text
    lines = [line for line in text.splitlines() if line.startswith("progress: items ")]
    assert len(lines) >= 2, text  # 4 documents at 1.5 s on 2 workers: about 3 s of work
    assert all(re.match(r"progress: items \d+/\d+ · [\d.]+ of [\d.]+ kB \(\d+%\)", line) for line in lines), lines
    assert "\r" not in text and "\x1b" not in text  # no bar's redraws, no colour codes in a log
    # The workers' logs say what each one does: an item's start (attempt, stage, source) and its end.
    worker_logs = [p.read_text() for p in (tmp_path / "out" / ".fleet" / "logs").glob("*.log")]
    logs = "".join(worker_logs)
    line = r"progress: \d+ items? done here · [\d.]+ kB( · [\d.]+ kB/s)? · (on item \d+|idle)"
    assert all(re.search(line, one) for one in worker_logs), logs  # and at the same pace, each its own work
    for n in range(4):
        started = re.findall(rf"item (\d+) started \(attempt 1, map\): .*f{n}\.txt", logs)
        assert len(started) == 1, logs
        assert re.search(rf"item {started[0]} done in [\d.]+s, [\d.]+ MB at [\d.]+ MB/s \(.*f{n}\.txt", logs), logs


# -- `fleet status`: the rate over the time items were being converted ---------------------------------
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=30), st.randoms())
def test_covered_seconds_is_the_length_of_the_union_of_the_spans(pairs, rng):
    """Measured against the unit steps the spans cover, in any order; a span that ends before it
    starts (a clock stepped back) covers nothing."""
    spans = [(float(s), float(s + n)) for s, n in pairs] + [(50.0, 40.0)]
    rng.shuffle(spans)
    cells = {t for s, e in spans for t in range(int(s), int(e))}
    assert covered_seconds(spans) == len(cells)


def test_status_rates_a_run_resumed_after_a_pause_by_the_time_it_worked(tmp_path):
    """A run stopped and resumed a day later (or a fleet brought down and launched again): its MB/s
    is over the seconds items were being converted. Over first start to last finish, it counted
    the day as work and said 0.00 MB/s."""
    import io
    import json

    from rich.console import Console

    import fleet
    from fleet.cli.render import print_status
    from fleet.core.status import StatusReader
    from fleet.core.store import open_store

    inputs = tmp_path / "corpus"
    inputs.mkdir()
    for i in range(2):  # 2 items of 0.2 MB
        (inputs / f"f{i}.txt").write_text("".join(f"doc {i} line {n:06d} {'x' * 180}\n" for n in range(1000)))
    out = tmp_path / "out"
    run = fleet.local(inputs, out, job="tests.helpers.linejob:JOB", workers=1, item_mb=0.2)
    assert run.status.done == 2
    lease = next((out / ".fleet" / "runs" / "local" / "leases").iterdir())
    body = json.loads(lease.read_text())
    worked = body["finished"] - body["started"]
    body.update(started=body["started"] - 86_400, finished=body["finished"] - 86_400)  # a day earlier
    lease.write_text(json.dumps(body))
    st = StatusReader(open_store(str(out / ".fleet")), "local").collect()
    assert st.last_finish - st.first_start > 86_000
    assert 0 < st.busy_seconds < 60 and st.busy_seconds >= worked
    console = Console(file=io.StringIO(), width=200)
    print_status(console, st)
    rate = re.search(r"MB/s\s+│?\s*([\d.,]+)", console.file.getvalue())
    assert rate and float(rate.group(1)) == round(st.bytes_done / st.busy_seconds / 1e6, 2) > 0.0, (
        console.file.getvalue()
    )

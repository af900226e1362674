"""``fleet.local`` (fleet.cli.api): the Python API under `fleet local` (issue 33, item 5). It returns
what the run did, prints nothing unless asked, raises typed errors, and writes what the command
writes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fleet
from fleet import PlanError
from fleet.core.errors import ConfigError, JobNotFound

ROOT = Path(__file__).resolve().parent.parent
JOB = "tests.helpers.linejob:JOB"


def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.txt").write_text("".join(f"doc {i} line {n}\n" for n in range(50)))
    return folder


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("part-*"))}


def test_local_returns_the_run_prints_nothing_and_writes_what_the_command_writes(tmp_path, capfd):
    inputs = corpus(tmp_path)
    run = fleet.local(inputs, tmp_path / "api", job=JOB, options={"seed": 11}, workers=2, item_mb=0.001)
    assert capfd.readouterr() == ("", "")  # nothing printed, not even by the workers
    assert run.ok and run.exit_code == 0 and run.status.done == run.status.items == 3
    assert run.summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    assert run.outputs == [str(p) for p in sorted((tmp_path / "api").glob("part-*"))] and len(run.outputs) == 3
    cli = [sys.executable, "-m", "fleet.cli", "local", str(inputs), str(tmp_path / "cli"), "--job", JOB]
    cli += ["--set", "seed=11", "--workers", "2", "--item-mb", "0.001"]
    subprocess.run(cli, check=True, capture_output=True, cwd=ROOT, timeout=300)
    assert digests(tmp_path / "api") == digests(tmp_path / "cli")
    again = fleet.local([str(inputs)], str(tmp_path / "api"), job=JOB, options={"seed": 11}, workers=1)
    assert again.ok and again.status.done == 3  # resumed: done items stay done
    assert digests(tmp_path / "api") == digests(tmp_path / "cli")


def test_progress_true_prints_what_the_command_prints(tmp_path, capfd):
    fleet.local(corpus(tmp_path), tmp_path / "out", job=JOB, workers=1, progress=True)
    err = capfd.readouterr().err
    assert "fleet local: 1/1 items done" in err and "│ all " in err  # one item by default: 2 kB


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"workers": -1}, PlanError, "--workers -1: give 0 to"),
        ({"item_mb": 0.0}, PlanError, "--item-mb 0: give 0.001 to 1e+06 MB"),
        ({"lease_ttl": float("nan")}, PlanError, "--lease-ttl nan: give 1 to 86400 seconds"),
        ({"shards": 0}, PlanError, "--shards 0: give 1 to 100000 output files"),
        ({"dedup": " "}, PlanError, "--dedup '': give a mode"),
        ({"options": {"delay": -1}}, ConfigError, "delay must be >= 0"),
        ({"job": "no_such_job"}, JobNotFound, "no_such_job"),
    ],
)
def test_a_bad_argument_raises_a_typed_error_with_the_commands_message(tmp_path, kwargs, error, message):
    kwargs.setdefault("job", JOB)
    with pytest.raises(error, match=message.replace("(", r"\(").replace("+", r"\+")):
        fleet.local(corpus(tmp_path), tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "summary.json").exists()


def test_no_input_and_an_empty_input_are_refused(tmp_path):
    with pytest.raises(PlanError, match="give at least one input"):
        fleet.local([], tmp_path / "out", job=JOB)
    with pytest.raises(PlanError, match="INPUT '': empty"):
        fleet.local([""], tmp_path / "out", job=JOB)


def test_import_fleet_stays_light():
    """Each worker process imports fleet: the API and its console come only when asked for."""
    code = "import sys, fleet; print(sorted(m for m in ('fleet.cli.api', 'rich', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch):
    """docs/python-api.md's example, on a slice of the sample corpus and a vocab trained on it."""
    from tests.helpers.trained import wordpiece_vocab

    text = (ROOT / "docs" / "python-api.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    lines = (ROOT / "corpus" / "sample_en.txt").read_text().splitlines()[:400]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "sample.txt").write_text("\n".join(lines) + "\n")
    wordpiece_vocab([lines], str(tmp_path), 2000)
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(example, "docs/python-api.md", "exec"), names)
    run = names["run"]
    assert run.ok and run.summary["examples"] > 0 and run.outputs[0].endswith("out/part-00000.tfrecord")
    assert run.status.failures == []


def test_the_speed_in_the_summary_is_of_what_this_call_converted(tmp_path):
    """``mb_per_s`` is the MB this call converted over its ``wall_seconds``. A resumed run's done
    items were converted by an earlier call: counting their MB over this call's seconds made a run
    resumed with one item left, or none, seem many times faster than it is."""
    inputs = tmp_path / "corpus"
    inputs.mkdir()
    for i in range(3):  # 3 items of 0.2 MB
        (inputs / f"f{i}.txt").write_text("".join(f"doc {i} line {n:06d} {'x' * 180}\n" for n in range(1000)))
    out = tmp_path / "out"
    first = fleet.local(inputs, out, job=JOB, workers=1, item_mb=0.2)
    assert first.status.done == 3 and first.summary["mb_per_s"] > 0
    again = fleet.local(inputs, out, job=JOB, workers=1)  # finished: nothing left to convert
    assert again.ok and again.summary["mb_per_s"] == 0.0, again.summary
    (out / "part-00001.txt").unlink()  # that item's output is gone: the next call converts it again
    resumed = fleet.local(inputs, out, job=JOB, workers=1)
    one_item = (inputs / "f1.txt").stat().st_size / 1e6
    converted = resumed.summary["mb_per_s"] * resumed.summary["wall_seconds"]
    assert resumed.status.done == 3 and resumed.summary["input_mb"] > 2.5 * one_item
    assert 0 < converted <= one_item * 1.1 + 0.001, (converted, one_item, resumed.summary)


@given(
    before=st.integers(0, 10**12), gained=st.integers(0, 10**12), wall=st.floats(1e-3, 1e6), seconds=st.floats(0, 1e6)
)
def test_the_summarys_speed_counts_only_the_bytes_its_wall_converted(before, gained, wall, seconds):
    """The invariant the resumed run broke: ``mb_per_s`` over ``wall_seconds`` is the MB this call
    converted (within the 3 decimals it is rounded to), whatever was done before it."""
    from fleet.cli.local import summarize
    from fleet.core.status import RunStatus
    from tests.helpers.linejob import JOB as LINE

    status = RunStatus(
        "local", "line", 3, before + gained, done=3, bytes_done=before + gained, totals={"seconds": seconds}
    )
    summary = summarize(status, LINE, wall, 1, bytes_before=before)
    assert abs(summary["mb_per_s"] - gained / 1e6 / wall) <= 0.0005 + 1e-9 * gained / 1e6 / wall
    assert summary["input_mb"] == round((before + gained) / 1e6, 3)

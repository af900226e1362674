"""Every user error of every `fleet` command is one line on stderr and exit 2; never a traceback.

The cases issue 17 named first (a URL or empty OUT_DIR, rich markup in a message, inf and NaN
options, malformed job names, --workers 100000, launch without Google credentials), then a
hypothesis sweep of malformed arguments over every command.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.cli.commands import app
from tests.test_gcp_e2e import cloud_fixture  # noqa: F401 (the `cloud` fixture: bucket, Compute and IAM stand-ins)
from tests.test_launch_checks import _planned  # (at the top: imported inside a @given test, its own @given tests nest)

LINEJOB = "tests.helpers.linejob:JOB"


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def one_line_error(result, *needles: str) -> str:
    """Exit 2, stderr one line starting "fleet: error:", no traceback, nothing raised past the CLI."""
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, result.output
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("one document here.\nits second line.\n\nanother document.\n")
    return path


# -- item 9: an OUT_DIR `fleet local` cannot write ---------------------------------------------
@pytest.mark.parametrize("out", ["gs://b/out", "s3://b/out", "https://example.com/out", "hdfs://x/y", "gs://b"])
def test_local_refuses_a_url_out_dir_and_writes_nothing(out, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    one_line_error(invoke("local", corpus, out, "--job", LINEJOB), out, "OUT_DIR")
    assert sorted(os.listdir(tmp_path)) == before  # no ./gs:/b/out


@pytest.mark.parametrize("out", ["", "   "])
def test_local_refuses_an_empty_out_dir(out, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    one_line_error(invoke("local", corpus, out, "--job", LINEJOB), "OUT_DIR")
    assert sorted(os.listdir(tmp_path)) == before  # nothing written into the current folder


def test_local_takes_a_file_url_out_dir_as_the_folder_it_names(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o u t"
    result = invoke("local", corpus, f"file://{str(out).replace(' ', '%20')}", "--job", LINEJOB, "--workers", "1")
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").exists() and not (tmp_path / "file:").exists()


@pytest.mark.parametrize("inp", ["", " ", "file://"])
def test_an_empty_input_is_refused_not_read_as_the_current_folder(inp, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stray.txt").write_text("not meant as input\n")
    one_line_error(invoke("local", inp, tmp_path / "out", "--job", LINEJOB), "INPUT", "empty")
    one_line_error(
        invoke(
            "plan",
            "--bucket",
            tmp_path / "b",
            "--run",
            "r",
            "--job",
            LINEJOB,
            "--input",
            inp,
            "--output",
            tmp_path / "o",
        ),
        "--input",
        "empty",
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "b").exists()


# -- item 10: tracebacks instead of one line ---------------------------------------------------
@pytest.mark.parametrize("vocab", ["s3://bucket/vocab.txt", "https://example.com/vocab.txt"])
def test_a_message_with_rich_markup_in_it_is_printed_as_it_is(vocab, corpus, tmp_path):
    """The electra job's hint names `gs://BUCKET/...[/PATH]`: rich read it as a closing tag and crashed."""
    one_line_error(invoke("local", corpus, tmp_path / "out", "--set", f"vocab_file={vocab}"), vocab)


def test_any_message_containing_a_closing_tag_is_one_line(tmp_path):
    missing = tmp_path / "[/red]x[/]" / "in[bold].txt"
    line = one_line_error(invoke("local", missing, tmp_path / "out", "--job", LINEJOB))
    assert "[/red]x[/]" in line and "in[bold].txt" in line


@pytest.mark.parametrize(
    "option,value",
    [
        ("--item-mb", "inf"),
        ("--item-mb", "nan"),
        ("--item-mb", "-inf"),
        ("--item-mb", "1e300"),
        ("--item-mb", "-1"),
        ("--item-mb", "1e-12"),
        ("--lease-ttl", "inf"),
        ("--lease-ttl", "nan"),
        ("--lease-ttl", "1e12"),
        ("--lease-ttl", "0"),
        ("--max-attempts", "-1"),
        ("--max-attempts", "100000000000000000000"),
        ("--max-bad-share", "nan"),
        ("--max-bad-share", "-0.5"),
        ("--max-bad-share", "inf"),
        ("--workers", "1" + "0" * 400),
        ("--max-attempts", "-" + "9" * 400),
    ],
)
def test_local_refuses_a_number_out_of_range_naming_the_option_and_the_range(option, value, corpus, tmp_path):
    line = one_line_error(invoke("local", corpus, tmp_path / "out", "--job", LINEJOB, option, value), option)
    assert " to " in line or "or more" in line  # the accepted range
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "option,value", [("--item-mb", "inf"), ("--lease-ttl", "inf"), ("--item-mb", "nan"), ("--lease-ttl", "1e12")]
)
def test_plan_refuses_a_number_out_of_range(option, value, corpus, tmp_path):
    one_line_error(
        invoke(
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
            tmp_path / "out",
            option,
            value,
        ),
        option,
    )


@pytest.mark.parametrize("seed", ["-1", str(1 << 63), "-" + "9" * 30])
def test_a_seed_out_of_range_is_refused_at_plan_time(seed, corpus, tmp_path):
    """Issue 30: ``--set seed=-1`` was planned and run. Now one line names the option and its
    range, exit 2, and nothing is written."""
    line = one_line_error(
        invoke("local", corpus, tmp_path / "out", "--job", LINEJOB, "--set", f"seed={seed}"),
        "option seed",
        "out of range",
        "give 0 to ",
    )
    assert seed in line
    assert not (tmp_path / "out").exists()
    one_line_error(
        invoke(
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
            tmp_path / "out",
            "--set",
            f"seed={seed}",
        ),
        "option seed",
        "give 0 to ",
    )


@pytest.mark.parametrize(
    "job",
    [
        ":",
        "a:",
        ":b",
        "..x:y",
        ".:JOB",
        "a..b:c",
        "tests.helpers.linejob:",
        "x y:z",
        "-:-",
        "\x00:x",
        "fleet_jobs/electra",
        "",
        "..",
        "a\udcffb",
    ],
)
def test_a_malformed_job_name_is_one_line(job, corpus, tmp_path):
    one_line_error(invoke("local", corpus, tmp_path / "out", "--job", job), "job")


# -- item 11: --workers ------------------------------------------------------------------------
@pytest.mark.parametrize("workers", ["100000", "-1", str(4 * (os.cpu_count() or 1) + 1)])
def test_local_refuses_an_absurd_worker_count_before_starting_any(workers, corpus, tmp_path):
    one_line_error(invoke("local", corpus, tmp_path / "out", "--job", LINEJOB, "--workers", workers), "--workers")
    assert not (tmp_path / "out").exists()


def test_local_starts_no_more_workers_than_there_are_items(corpus, tmp_path):
    import json

    workers = min(4, 4 * (os.cpu_count() or 1))
    result = invoke("local", corpus, tmp_path / "out", "--job", LINEJOB, "--workers", str(workers))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["items"] == 1 and summary["workers"] == 1
    assert f"1 item to convert: 1 worker instead of {workers}" in result.stderr


@pytest.mark.parametrize("procs", ["100000", "-1"])
def test_work_refuses_an_absurd_process_count(procs, tmp_path):
    one_line_error(invoke("work", "--bucket", tmp_path, "--run", "r", "--procs", procs), "--procs")


# -- item 10: `fleet launch` before the user has logged in to Google ------------------------------
@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """Google's Compute and IAM APIs for real (no stand-in endpoints), with no credentials to find."""
    from fleet.gce import compute_requests, iam

    monkeypatch.delenv(compute_requests.ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(iam.ENDPOINT_ENV, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")


def test_a_dry_run_without_credentials_shows_the_requests_and_the_cost_and_says_what_it_skipped(cloud, no_credentials):

    _planned(cloud)
    dry = invoke("launch", "--run", "chk", "--workers", "2", "--dry-run")
    assert dry.exit_code == 0, (dry.output, dry.exception)
    assert "Traceback" not in dry.output
    assert "POST https://compute.googleapis.com/compute/v1/projects/" in dry.stdout
    assert "expected: about" in dry.stdout and "price range: ≈ $" in dry.stdout
    skipped = [line for line in dry.output.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and "quota and service-account checks" in skipped[0]
    assert "no Google credentials" in skipped[0] and "gcloud auth application-default login" in skipped[0]
    assert not cloud.standin.calls  # nothing reached the API


def test_a_launch_without_credentials_is_one_line_and_creates_nothing(cloud, no_credentials):

    _planned(cloud)
    one_line_error(
        invoke("launch", "--run", "chk", "--workers", "2"),
        "no Google credentials",
        "gcloud auth application-default login",
    )
    assert not cloud.standin.calls and not cloud.standin.templates


def test_down_without_credentials_is_one_line(cloud, no_credentials):
    init_path = cloud.tmp / "fleet.toml"
    from tests.test_gcp_e2e import init

    init(cloud)
    assert init_path.exists()
    one_line_error(invoke("down", "--run", "chk"), "no Google credentials")


# -- (e): a sweep of malformed arguments over every command -------------------------------------
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

BAD = [
    "",
    " ",
    "inf",
    "-inf",
    "nan",
    "-1",
    "0",
    "1e308",
    "1e-300",
    "99999999999999999999",
    "1.5",
    "abc",
    ":",
    "a:",
    ":b",
    "..",
    "/",
    "[/]",
    "[/PATH]",
    "[red]x[/red]",
    "[bold",
    "gs://",
    "s3://bucket/key",
    "hdfs://x/y",
    "ftp://x/y",
    "file://",
    "file:///nonexistent/[/x]",
    "/nonexistent/x",
    "x\udcffy",
    "\udcff",
    "é",
    "a\nb",
    "-",
    "=",
    "k=v",
    "vocab_file=s3://x/v.txt",
    "--",
    "-x",
]
# What argv can hold: any text but NUL, and undecodable bytes as surrogate escapes (no other surrogates).
ARGV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
BAD_VALUE = st.one_of(st.sampled_from(BAD), ARGV_TEXT, st.integers(-(10**600), 10**600).map(str), st.floats().map(repr))


def _commands(corpus: Path, done: Path) -> dict[str, list[tuple[str, str]]]:
    """Each command's arguments as (option, good value) slots; "" as option: a positional argument."""
    bucket = str(done / ".fleet")
    return {
        "local": [
            ("", str(corpus)),
            ("", "out"),
            ("--job", LINEJOB),
            ("--workers", "1"),
            ("--item-mb", "1"),
            ("--lease-ttl", "60"),
            ("--max-attempts", "3"),
            ("--max-bad-share", "0.5"),
            ("--set", "seed=3"),
            ("--text-column", "text"),
        ],
        "plan": [
            ("--bucket", "b"),
            ("--run", "r"),
            ("--job", LINEJOB),
            ("--input", str(corpus)),
            ("--output", "o"),
            ("--item-mb", "1"),
            ("--lease-ttl", "60"),
            ("--max-attempts", "3"),
            ("--set", "seed=3"),
        ],
        "work": [("--bucket", bucket), ("--run", "nosuchrun"), ("--procs", "1"), ("--standby", "0")],
        "status": [("", str(done)), ("--run", "local")],
        "follow": [("--bucket", str(done)), ("--run", "local"), ("--poll", "0.1")],
        "jobs": [("", LINEJOB)],
        "init": [
            ("--project", "proj-123"),
            ("--bucket", "gs://b-1"),
            ("--zone", "us-central1-a"),
            ("--disk-gb", "20"),
            ("--workers-per-vm", "0"),
            ("--standby", "2"),
            ("--max-run-hours", "1"),
            ("--service-account", "w@proj-123.iam.gserviceaccount.com"),
        ],
        "sync": [("--bucket", "nosuchfolder/b"), ("--root", "/nonexistent")],
        "launch": [("--run", "r"), ("--workers", "1"), ("--max-run-hours", "1"), ("--template", "fleet-t")],
        "iam": [("--role", "fleetWorkerStorage")],
        "logs": [("", "vm-1"), ("--run", "r"), ("--bucket", bucket)],
        "down": [("--run", "r"), ("--bucket", bucket)],
    }


@pytest.fixture(scope="module")
def sweep_dirs(tmp_path_factory):
    """A corpus and a finished `fleet local` run, for the commands that read one."""
    root = tmp_path_factory.mktemp("sweep")
    corpus = root / "in.txt"
    corpus.write_text("one document here.\nits second line.\n\nanother document.\n")
    result = invoke("local", corpus, root / "done", "--job", LINEJOB, "--workers", "1")
    assert result.exit_code == 0, result.output
    return corpus, root / "done"


def _run_sweep(command: str, slots: list[tuple[str, str]], data, tmp: Path, extra: list[str] = ()) -> None:
    chosen = data.draw(st.lists(st.integers(0, len(slots) - 1), min_size=1, max_size=3, unique=True), label="bad slots")
    args = [command]
    for i, (option, good) in enumerate(slots):
        value = data.draw(BAD_VALUE, label=option or "argument") if i in chosen else good
        args += [option, value] if option else [value]
    args += extra
    if data.draw(st.booleans(), label="an unknown option too"):
        args.append("--no-such-option")
    cwd, handlers = os.getcwd(), list(logging.root.handlers)
    os.chdir(tmp)  # relative paths land here
    try:
        result = CliRunner().invoke(app, args, env={"FLEET_CONFIG": str(tmp / "fleet.toml")})
    finally:
        os.chdir(cwd)
        logging.root.handlers[:] = handlers  # `work` logs to the stderr CliRunner gave it, closed now
    shown = f"fleet {args!r} -> {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (shown, result.exception)
    assert "Traceback" not in result.output, shown
    assert result.exit_code in (0, 2), shown
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        if command == "work" and " ERROR cannot start: " in result.stderr:
            return  # each worker process logs why it cannot start, as on a VM (tests/test_bad_input.py)
        if command == "work" and not result.stderr and args[args.index("--procs") + 1] != "1":
            return  # the same, from worker processes whose stderr is the real one, not CliRunner's
        assert len(lines) == 1 and lines[0].startswith("fleet: error: "), shown


@pytest.mark.parametrize(
    "command", ["local", "plan", "work", "status", "follow", "jobs", "init", "sync", "launch", "iam", "logs", "down"]
)
@settings(
    max_examples=int(os.environ.get("FLEET_SWEEP_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_command_answers_malformed_arguments_in_one_line(
    command, data, sweep_dirs, tmp_path_factory, no_credentials
):
    corpus, done = sweep_dirs
    _run_sweep(command, _commands(corpus, done)[command], data, tmp_path_factory.mktemp(command))


@settings(
    max_examples=int(os.environ.get("FLEET_SWEEP_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_launch_answers_malformed_arguments_in_one_line(cloud, data, tmp_path_factory):
    """Past fleet.toml, against a planned run (the bucket and Compute stand-ins); always --dry-run."""

    if not getattr(cloud, "planned", False):  # once per test, not per example
        _planned(cloud)
        cloud.planned = True
    slots = [("--run", "chk"), ("--workers", "1"), ("--max-run-hours", "1"), ("--template", "fleet-t")]
    tmp = tmp_path_factory.mktemp("launch")
    (tmp / "fleet.toml").write_text((cloud.tmp / "fleet.toml").read_text())
    _run_sweep("launch", slots, data, tmp, extra=["--dry-run"])


def test_an_undecodable_path_with_a_closing_tag_is_one_line_from_a_real_process(tmp_path):
    """As a user's shell passes it: raw bytes in argv, stderr a real stream (not CliRunner's)."""
    from tests.helpers.cli import fleet
    from tests.helpers.cli import one_line_error as one_line_from_process

    bad = os.fsdecode(b"in\xff[/red].txt")
    line = one_line_from_process(fleet("local", str(tmp_path / bad), str(tmp_path / "out"), "--job", LINEJOB))
    assert line.startswith("fleet: error: ") and "in\\xff[/red].txt" in line
    line = one_line_from_process(fleet("local", str(tmp_path / "in.txt"), "gs://b/out", "--workers", "100000"))
    assert "--workers 100000" in line


def test_launch_refuses_more_worker_processes_per_vm_than_its_work_command_takes(cloud):
    """Each VM runs `fleet work --procs workers_per_vm`, which takes at most 4 per vCPU: a VM
    would fail at every boot, so the launch says so first."""

    _planned(cloud)
    cfg_path = cloud.tmp / "fleet.toml"
    cfg_path.write_text(cfg_path.read_text().replace("workers_per_vm = 1\n", "workers_per_vm = 17\n"))
    one_line_error(
        invoke("launch", "--run", "chk", "--workers", "1", "--dry-run"),
        "workers_per_vm = 17",
        "give 0 (one per vCPU) to 16",
    )
    assert not cloud.standin.templates
    cfg_path.write_text(cfg_path.read_text().replace("workers_per_vm = 17\n", "workers_per_vm = 16\n"))
    assert invoke("launch", "--run", "chk", "--workers", "1", "--dry-run").exit_code == 0

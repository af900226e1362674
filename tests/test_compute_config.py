"""fleet.toml: `fleet init` writes it, commands read it, bad values get one line naming the field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fleet.cli.commands import app
from fleet.gce.config import ConfigError, FleetConfig, load


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "fleet.toml"
    monkeypatch.setenv("FLEET_CONFIG", str(path))
    return path


def test_init_writes_a_config_that_reads_back(config_file):
    result = CliRunner().invoke(
        app,
        [
            "init",
            "--project",
            "my-proj-1",
            "--region",
            "europe-west4",
            "--bucket",
            "gs://my-bucket",
            "--service-account",
            "w@my-proj-1.iam.gserviceaccount.com",
            "--no-spot",
            "--workers-per-vm",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    cfg = load()
    assert cfg == FleetConfig(
        project="my-proj-1",
        bucket="gs://my-bucket",
        region="europe-west4",
        service_account="w@my-proj-1.iam.gserviceaccount.com",
        spot=False,
        workers_per_vm=4,
    )
    assert "secret" not in config_file.read_text().lower().replace("no secrets", "")
    assert 'disk_type = ""' in config_file.read_text()  # the series' default, said in the file with its comment
    again = CliRunner().invoke(
        app, ["init", "--project", "my-proj-1", "--zone", "europe-west4-a", "--bucket", "gs://bkt2"]
    )
    assert again.exit_code == 2 and "exists; use --force" in again.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--zone", "us-central1-a", "--region", "us-central1"], "set exactly one of zone"),
        (["--zone", "us-central1"], "zone = 'us-central1': not a zone name"),
        (["--zone", "us-central1-a", "--disk-gb", "5"], "disk_gb = 5: must be between 10"),
        (
            ["--zone", "us-central1-a", "--machine-type", "n4-standard-8", "--disk-type", "pd-balanced"],
            "disk_type = 'pd-balanced': n4 machines boot only from Hyperdisk",
        ),
        (["--zone", "us-central1-a", "--disk-type", "Hyperdisk"], "disk_type = 'Hyperdisk': give a disk type name"),
    ],
)
def test_init_refuses_bad_values_in_one_line(config_file, args, message):
    result = CliRunner().invoke(app, ["init", "--project", "my-proj-1", "--bucket", "gs://bkt", *args])
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and not config_file.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'project = "p-123456"\nbucket = "gs://bkt"\nzone = "us-central1-a"\nmachine = "x"\n',
            "unknown key(s) machine",
        ),
        (
            'project = "p-123456"\nbucket = "gs://bkt"\nzone = "us-central1-a"\ndisk_gb = "20"\n',
            "disk_gb: expected int",
        ),
        ('project = "p-123456"\nbucket = "b"\nzone = "us-central1-a"\n', "bucket = 'b': expected gs://NAME"),
        ('project = "p-123456"\nzone = "us-central1-a"\n', "missing bucket"),
        ('project = "p-123456\n', "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_named_in_the_error(config_file, text, message):
    config_file.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load()


def test_commands_take_the_bucket_from_the_config(config_file, tmp_path):
    result = CliRunner().invoke(app, ["status", "--run", "nope"])
    assert result.exit_code == 2 and "give an output folder" in result.output  # no config: asks for a bucket
    store = tmp_path / "state"
    store.mkdir()
    config_file.write_text('project = "p-123456"\nbucket = "gs://nobucket"\nzone = "us-central1-a"\n')
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--run",
            "r",
            "--job",
            "tests.helpers.linejob:JOB",
            "--input",
            "corpus/sample_en.txt",
            "--output",
            str(tmp_path / "out"),
            "--bucket",
            str(store),
        ],
    )
    assert result.exit_code == 0, result.output  # --bucket still wins over the config
    assert (store / "runs" / "r" / "run.json").exists()


def test_a_fleet_toml_from_before_the_rename_still_syncs_the_jobs():
    """fleet.toml files written by `fleet init` before issue 21 list "jobs" in code_paths: the
    package is fleet_jobs now, and a sync without it would leave the VMs with no job to run."""
    from fleet.gce.config import DEFAULT_CODE_PATHS, FleetConfig

    old = FleetConfig(
        project="my-project-1",
        zone="us-central1-a",
        bucket="gs://my-bucket",
        code_paths=["fleet", "jobs", "startup", "pyproject.toml"],
    )
    assert old.code_paths == ["fleet", "fleet_jobs", "startup", "pyproject.toml"]
    assert "fleet_jobs" in DEFAULT_CODE_PATHS and "jobs" not in DEFAULT_CODE_PATHS

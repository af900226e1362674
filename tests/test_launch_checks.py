"""`fleet launch` checks quota and the service account before it creates anything, and
`--dry-run` states what the run should cost beside the run deadline it derives."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleet.gce import estimate, prelaunch
from fleet.cli.commands import app
from fleet.gce.config import FleetConfig
from tests.test_gcp_e2e import ACCOUNT, _bodies, cloud_fixture, init, ship_test_jobs  # noqa: F401 (the `cloud` fixture)

RATES = estimate.Rates(mb_per_vcpu_s=5.0, boot_minutes=3.0, vcpu_hour_usd=0.0335, spot_vcpu_hour_usd=0.01)


def test_the_estimate_follows_the_plan_size():
    e = estimate.estimate(
        [64_000_000] * 100, workers=5, vcpus=4, workers_per_vm=0, spot=True, rates=RATES, max_run_hours=None
    )
    # 6,400 MB over 20 processes at 5 MB/s and 0.8 efficiency: 80 s of work after a 180 s boot.
    assert e.work_s == pytest.approx(80.0) and e.wall_s == pytest.approx(260.0)
    assert e.vm_hours == pytest.approx(5 * 260 / 3600) and e.vcpu_hours == pytest.approx(4 * 5 * 260 / 3600)
    assert e.expected_usd == pytest.approx(e.vcpu_hours * 0.01)
    assert e.bound_hours == 1 and e.bound_derived  # 3 × 260 s is under the 1 h floor
    assert e.bound_usd == pytest.approx(5 * 1 * 4 * 0.01)
    text = "\n".join(e.lines())
    assert "expected: about 4 min wall time" in text and "price range: ≈ $0.01 to $0.20" in text


def test_the_bound_is_three_times_the_expected_time_in_whole_hours_within_gces_range():
    big = estimate.estimate([100_000_000] * 1000, 2, 4, 0, False, RATES, None)  # 100 GB on 8 processes
    assert big.wall_s == pytest.approx(180 + 100_000 / (5 * 8 * 0.8))
    assert big.bound_hours == -(-3 * big.wall_s // 3600) and big.vcpu_hour_usd == 0.0335
    huge = estimate.estimate([10**13] * 10, 1, 1, 0, True, RATES, None)
    assert huge.bound_hours == 120 * 24
    # One item bounds the work time however many VMs there are.
    one = estimate.estimate([50_000_000, 1_000_000], 100, 4, 0, True, RATES, None)
    assert one.work_s == pytest.approx(10.0)
    assert estimate.estimate([1], 1, 1, 0, True, RATES, 2.5).bound_hours == 2.5  # an override is kept
    assert "deadline: none" in estimate.estimate([1], 1, 1, 0, True, RATES, 0).lines()[-1]


def _cfg(**kw) -> FleetConfig:
    return FleetConfig(
        project="proj-123",
        bucket="gs://b-1",
        region="us-central1",
        service_account="w@proj-123.iam.gserviceaccount.com",
        **kw,
    )


def test_quota_metrics_follow_gces_rules():
    granted = {"CPUS": (24.0, 0.0), "PREEMPTIBLE_CPUS": (100.0, 0.0), "N2D_CPUS": (24.0, 0.0)}
    none = dict(granted, PREEMPTIBLE_CPUS=(0.0, 0.0))
    assert prelaunch.cpu_metric("e2-standard-4", True, granted) == "PREEMPTIBLE_CPUS"
    assert prelaunch.cpu_metric("e2-standard-4", True, none) == "CPUS"  # Spot without preemptible quota
    assert prelaunch.cpu_metric("n2d-standard-8", True, none) == "N2D_CPUS"
    assert prelaunch.cpu_metric("n2d-standard-8", False, granted) == "N2D_CPUS"
    assert (
        prelaunch.disk_metric("pd-balanced") == "SSD_TOTAL_GB"
        and prelaunch.disk_metric("pd-standard") == "DISKS_TOTAL_GB"
    )
    assert prelaunch.vcpus_from_name("n2d-standard-8") == 8 and prelaunch.vcpus_from_name("e2-micro") == 2


def test_a_shortfall_is_one_line_with_the_fix():
    facts = prelaunch.Facts(
        ["us-central1-a"], {"CPUS": (24.0, 8.0), "IN_USE_ADDRESSES": (8.0, 0.0), "SSD_TOTAL_GB": (500.0, 0.0)}, vcpus=4
    )
    lines = prelaunch.shortfalls(_cfg(), 10, True, "pd-balanced", 20, facts, None)
    assert lines == [
        "quota CPUS in us-central1: 10 VMs need 40 (4 vCPUs (e2-standard-4) each) but 16 of 24 are free; request "
        "more (console: IAM & Admin > Quotas, metric CPUS) or launch --workers 4",
        "quota IN_USE_ADDRESSES in us-central1: 10 VMs need 10 (1 external IP each) but 8 of 8 are free; request "
        "more (console: IAM & Admin > Quotas, metric IN_USE_ADDRESSES) or launch --workers 8",
    ]
    assert prelaunch.shortfalls(_cfg(external_ip=False), 4, True, "pd-balanced", 20, facts, None) == []


def _planned(cloud) -> None:
    init(cloud)
    ship_test_jobs()
    cloud.fleet("sync")
    cloud.fleet(
        "plan",
        "--run",
        "chk",
        "--job",
        "tests.helpers.linejob:JOB",
        "--input",
        f"{cloud.bucket}/corpus/sample_en.txt",
        "--output",
        f"{cloud.bucket}/out-chk/",
        "--item-mb",
        "0.2",
    )


def test_launch_refuses_before_creating_anything_and_dry_run_states_the_cost(cloud):
    _planned(cloud)
    # Unset max_run_hours: the bound is derived from the plan.
    cfg_path = cloud.tmp / "fleet.toml"
    cfg_path.write_text(cfg_path.read_text().replace("max_run_hours = 1.0\n", ""))
    cloud.catalog.set_quota("us-central1", "CPUS", 24, usage=20)
    result = CliRunner().invoke(app, ["launch", "--run", "chk", "--workers", "3"])
    assert result.exit_code == 2
    error = result.output.strip().splitlines()[-1]
    assert error.startswith(
        "fleet: error: quota CPUS in us-central1: 3 VMs need 12 (4 vCPUs (e2-standard-4) each) but 4 of 24 are free"
    ) and error.endswith("or launch --workers 1; or --force to launch anyway")
    assert {c.method for c in cloud.standin.calls} == {"GET"} and not cloud.standin.templates  # nothing created
    dry = CliRunner().invoke(app, ["launch", "--run", "chk", "--workers", "3", "--dry-run", "--force"])
    assert dry.exit_code == 0, dry.output
    assert "expected: about" in dry.output and "price range: ≈ $" in dry.output
    assert "bucket operations: ≈ " in dry.output and " of bucket operations" in dry.output
    assert "60 min after launch (derived" in dry.output and "checks: quota CPUS" in dry.output
    body = _bodies(dry.output)[0]
    # The run's deadline, an hour (the floor) from now in whole minutes: every VM's terminationTime.
    end = datetime.fromisoformat(body["properties"]["scheduling"]["terminationTime"].replace("Z", "+00:00")).timestamp()
    assert (
        3600 <= end - time.time() <= 3660 and end % 60 == 0 and "maxRunDuration" not in body["properties"]["scheduling"]
    )
    override = CliRunner().invoke(
        app, ["launch", "--run", "chk", "--workers", "1", "--dry-run", "--max-run-hours", "5"]
    )
    assert override.exit_code == 0 and "5.0 h after launch (set by --max-run-hours)" in override.output


def test_launch_refuses_when_the_service_account_does_not_exist(cloud):
    _planned(cloud)
    cfg_path = cloud.tmp / "fleet.toml"
    cfg_path.write_text(cfg_path.read_text().replace(ACCOUNT, "nobody@fleet-test-1.iam.gserviceaccount.com"))
    result = CliRunner().invoke(app, ["launch", "--run", "chk", "--workers", "1"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "fleet: error: service account nobody@fleet-test-1.iam.gserviceaccount.com does not exist: create it "
        "(`fleet iam` prints the commands) or fix service_account in fleet.toml; or --force to launch anyway"
    )
    assert not cloud.standin.templates and not cloud.standin.migs


def test_a_template_name_outside_the_iam_condition_is_refused(cloud):
    _planned(cloud)
    result = CliRunner().invoke(app, ["launch", "--run", "chk", "--workers", "1", "--template", "my-tpl"])
    assert result.exit_code == 2 and "--template my-tpl: must start with 'fleet-'" in result.output
    assert not cloud.standin.calls


def test_max_run_hours_unset_round_trips_through_fleet_toml(tmp_path, monkeypatch):
    import tomllib

    from fleet.gce.config import dumps, from_dict

    cfg = _cfg()
    assert cfg.max_run_hours is None
    text = dumps(cfg)
    assert "# max_run_hours = ..." in text and from_dict(tomllib.loads(text)) == cfg
    assert from_dict(tomllib.loads(text + "max_run_hours = 6\n")).max_run_hours == 6.0


def test_no_credentials_is_a_check_that_cannot_tell_not_a_traceback(monkeypatch, tmp_path):
    from fleet.gce import iam

    monkeypatch.delenv(iam.ENDPOINT_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    check = iam.check_service_account("w@proj-123.iam.gserviceaccount.com")
    assert check.exists is None and "gcloud auth application-default login" in check.detail


def _text(t: float, zone: str) -> str:
    """``t`` as --deadline takes it, with fractions of a second and in ``zone`` ("Z", "+02:00", or none)."""
    from datetime import timedelta, timezone

    tz = timezone.utc if zone in ("Z", "") else timezone(timedelta(hours=int(zone[:3]), minutes=int(zone[4:])))
    text = datetime.fromtimestamp(t, tz).isoformat()
    return text.replace("+00:00", "Z") if zone == "Z" else text[:-6] if zone == "" else text


@settings(max_examples=400, deadline=None)
@given(
    now=st.floats(1.6e9, 2.2e9),
    boot_minutes=st.floats(0.01, 600),
    toml_hours=st.one_of(st.none(), st.just(0.0), st.floats(1 / 120, 24 * 120)),
    flag_hours=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    offset=st.one_of(st.none(), st.floats(-1e6, 2e7)),
    zone=st.sampled_from(["Z", "+02:00", "-05:30", ""]),
    junk=st.one_of(st.none(), st.text(max_size=30)),
)
# A deadline half a second more than a boot away, given with a fraction of a second: the whole second GCE
# gets (terminationTime) is within the boot.
@example(now=1.7e9 + 0.5, boot_minutes=1.0, toml_hours=None, flag_hours=None, offset=60.2, zone="Z", junk=None)
def test_no_launch_gets_a_deadline_that_is_none_past_or_within_a_boot(
    now, boot_minutes, toml_hours, flag_hours, offset, zone, junk
):
    """The invariant behind the refusals (issue 29, part 1): whatever --deadline, --max-run-hours and
    fleet.toml say (any text for --deadline), a launch either gets a deadline at least one boot away (or one derived from the
    plan, which is never shorter than the boot it counts in: fleet.gce.estimate), or is refused in
    one line that names the option to change. Never a run without a limit, never a traceback."""
    from fleet.core.run import PlanError
    from fleet.gce import gcp

    cfg = _cfg(boot_minutes=boot_minutes, max_run_hours=toml_hours)
    text = junk if junk is not None else None if offset is None else _text(now + offset, zone)
    try:
        d = gcp.run_deadline(cfg, flag_hours, text, now)
    except PlanError as e:
        # (`fleet launch` prints it on one line whatever the text given holds: fleet.cli.commands.fail)
        message = " ".join(str(e).splitlines())
        assert message.startswith(("--deadline ", "--max-run-hours ", "fleet.toml: max_run_hours")), message
        return
    if d.hours is None:  # nothing set: derived from the plan's estimate, at least an hour and 3 boots
        assert d.at == 0 and text is None and flag_hours is None and toml_hours is None
        assert estimate.derived_bound_hours(boot_minutes * 60) * 3600 >= boot_minutes * 60
        return
    assert d.at >= now + boot_minutes * 60, (d, now)  # never past, never within one boot
    assert d.at - now <= estimate.MAX_BOUND_S + 60 and d.how in (
        "--deadline",
        "--max-run-hours",
        "max_run_hours in fleet.toml",
    )

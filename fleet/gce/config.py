"""fleet.toml: where and on what the fleet runs, written once by `fleet init`.

The file holds no secret (VMs authenticate through their service account), so
it can be committed beside the code. Commands that need a bucket or a project
take them from here unless given on the command line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

CONFIG_FILE = "fleet.toml"
CONFIG_ENV = "FLEET_CONFIG"  # another path for the file (tests, several projects)

# Worker processes are CPU-bound: more than this many per core only adds memory and switches
# (`fleet local --workers`, `fleet work --procs`, workers_per_vm against the VM's vCPUs).
PROCS_PER_CORE = 4

DEFAULT_CODE_PATHS = ("fleet", "fleet_jobs", "startup", "pyproject.toml", "requirements.lock")

_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_BUCKET = re.compile(r"^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]+$")
_DISK_TYPE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")  # a template takes the name, not a URL
# Machine series that boot only from Hyperdisk (Compute Engine's machine series pages); pd-* fails there.
HYPERDISK_ONLY_SERIES = ("c4", "c4a", "c4d", "n4", "n4a", "n4d")


class ConfigError(Exception):
    """fleet.toml is missing, unreadable or has a bad value; the message names the field."""


@dataclass
class FleetConfig:
    project: str
    bucket: str  # gs://NAME: code, run state and logs live here
    zone: str = ""  # a zonal MIG here...
    region: str = ""  # ...or a regional MIG spread over this region's zones (exactly one of the two)
    service_account: str = ""  # email of the workers' service account
    machine_type: str = "e2-standard-4"
    image: str = "projects/debian-cloud/global/images/family/debian-12"  # or the Packer image family
    spot: bool = True
    disk_gb: int = 20
    disk_type: str = ""  # boot disk type; "" = the machine series' default (hyperdisk-balanced on C4/N4)
    workers_per_vm: int = 0  # worker processes per VM; 0 = one per core
    standby: int = 2  # idle workers kept in the tail to take over expired leases
    # A run's time limit from its launch (its VMs' terminationTime): unset = derived from the plan
    # (fleet.gce.estimate); 0 (no limit) still loads from an old file, and `fleet launch` refuses it
    max_run_hours: float | None = None
    network: str = "global/networks/default"
    subnetwork: str = ""
    external_ip: bool = True  # False needs Private Google Access (and a baked image: no PyPI)
    code_paths: list[str] = field(default_factory=lambda: list(DEFAULT_CODE_PATHS))
    # The cost estimate of `fleet launch --dry-run` (docs/costs.md): planning figures, not measurements.
    mb_per_vcpu_s: float = 5.0  # text per second per worker process on one vCPU (bench: electra 8.4, bert 4.6 per core)
    boot_minutes: float = 3.0  # VM creation to first item (1-2 min with the Packer image, more without)
    vcpu_hour_usd: float = 0.0335  # on-demand e2-standard-4, us-central1: $0.134/h over 4 vCPUs
    spot_vcpu_hour_usd: float = 0.0100  # Spot e2-standard-4, us-central1: about $0.040/h over 4 vCPUs

    def __post_init__(self) -> None:
        self.validate()

    @property
    def bucket_name(self) -> str:
        return self.bucket[len("gs://") :]

    @property
    def location(self) -> str:
        return self.zone or self.region

    def validate(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"{CONFIG_FILE}: {name} = {getattr(self, name)!r}: {why}")

        if not _PROJECT.match(self.project):
            raise bad("project", "not a project id (6-30 lowercase letters, digits, '-')")
        if not _BUCKET.match(self.bucket):
            raise bad("bucket", "expected gs://NAME (a bucket, no folder)")
        if bool(self.zone) == bool(self.region):
            raise ConfigError(f"{CONFIG_FILE}: set exactly one of zone (zonal MIG) or region (regional MIG)")
        if self.zone and not _ZONE.match(self.zone):
            raise bad("zone", "not a zone name like us-central1-a")
        if self.region and not _REGION.match(self.region):
            raise bad("region", "not a region name like us-central1")
        if self.service_account and not _EMAIL.match(self.service_account):
            raise bad("service_account", "not an email address")
        if not self.machine_type or "/" in self.machine_type:
            raise bad("machine_type", "give a machine type name like e2-standard-4")
        if not self.image:
            raise bad("image", "give an image or image family URL")
        if not 10 <= self.disk_gb <= 65536:
            raise bad("disk_gb", "must be between 10 and 65536")
        if self.disk_type and not _DISK_TYPE.match(self.disk_type):
            raise bad(
                "disk_type",
                'give a disk type name like pd-balanced or hyperdisk-balanced, or "" for the machine series\' default',
            )
        series = self.machine_type.split("-")[0]
        if self.disk_type.startswith("pd-") and series in HYPERDISK_ONLY_SERIES:
            raise bad(
                "disk_type",
                f'{series} machines boot only from Hyperdisk: use hyperdisk-balanced, or "" for the series\' default',
            )
        if self.workers_per_vm < 0:
            raise bad("workers_per_vm", "must be 0 (one per core) or more")
        if self.standby < 0:
            raise bad("standby", "must be 0 or more")
        if self.max_run_hours is not None and not (
            self.max_run_hours == 0 or 1 / 120 <= self.max_run_hours <= 24 * 120
        ):
            raise bad(
                "max_run_hours",
                "must be between 0.0083 (30 s) and 2880 (120 days); leave it out to derive it from the plan",
            )
        for name in ("mb_per_vcpu_s", "boot_minutes", "vcpu_hour_usd", "spot_vcpu_hour_usd"):
            if not getattr(self, name) > 0:  # NaN too
                raise bad(name, "must be a positive number")
        if not self.code_paths or any(p.startswith(("/", "..")) or not p for p in self.code_paths):
            raise bad("code_paths", "give paths relative to the project root")
        # A fleet.toml written before the jobs package became fleet_jobs (no top-level `jobs` in
        # site-packages) names "jobs": it means the package the code has now.
        self.code_paths = ["fleet_jobs" if p.rstrip("/") == "jobs" else p for p in self.code_paths]


def config_path(path: str | None = None) -> str:
    return path or os.environ.get(CONFIG_ENV) or CONFIG_FILE


def _coerce(name: str, tp: typing.Any, value: typing.Any) -> typing.Any:
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        tp = next(t for t in typing.get_args(tp) if t is not type(None))  # Optional: absent in the file = None
    kinds: dict[type, type | tuple[type, ...]] = {int: int, float: (int, float), bool: bool, str: str}
    want = kinds.get(tp)
    if typing.get_origin(tp) is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{CONFIG_FILE}: {name}: expected a list of strings, got {value!r}")
        return list(value)
    if want is None or not isinstance(value, want) or (tp in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{CONFIG_FILE}: {name}: expected {tp.__name__}, got {value!r}")
    return float(typing.cast(float, value)) if tp is float else value


def from_dict(values: dict[str, typing.Any]) -> FleetConfig:
    hints = typing.get_type_hints(FleetConfig)
    known = {f.name for f in dataclasses.fields(FleetConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{CONFIG_FILE}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    missing = [k for k in ("project", "bucket") if k not in values]
    if missing:
        raise ConfigError(f"{CONFIG_FILE}: missing {', '.join(missing)}")
    return FleetConfig(**{k: _coerce(k, hints[k], v) for k, v in values.items()})


def load(path: str | None = None) -> FleetConfig:
    path = config_path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (write one with `fleet init`)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return from_dict(data)


def load_optional(path: str | None = None) -> FleetConfig | None:
    """The config if there is one, for commands where it only supplies defaults."""
    return load(path) if os.path.exists(config_path(path)) else None


def _toml_value(value: typing.Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


_COMMENTS = {
    "zone": "a zonal MIG here, or set region instead for a regional one",
    "service_account": "the workers' identity: needs the two custom roles `fleet iam` prints "
    "(bucket objects; its own MIG and template only)",
    "image": "a Packer-built family (images/packer/) skips the pip install at boot",
    "workers_per_vm": "0 = one worker process per core",
    "standby": "idle workers kept alive in the tail to take over expired leases",
    "disk_type": "boot disk type; empty = the machine series' default (pd-standard on E2/N2, "
    "hyperdisk-balanced on C4/N4); e.g. pd-balanced for faster boots on E2",
    "max_run_hours": "a run's time limit from its launch: every VM, recreated ones included, is deleted by "
    "then whatever it is doing; unset = 3 x the run's expected time, shown by `fleet launch --dry-run`",
    "mb_per_vcpu_s": "cost estimate (planning figures; docs/costs.md): MB/s per vCPU, boot, price per vCPU-hour",
    "code_paths": "what `fleet sync` uploads, relative to the project root",
}


def dumps(config: FleetConfig) -> str:
    lines = ["# fleet.toml: written by `fleet init`; holds no secrets.", ""]
    for f in dataclasses.fields(FleetConfig):
        value = getattr(config, f.name)
        if f.name in ("zone", "region") and not value:
            continue
        if f.name in _COMMENTS:
            lines.append(f"# {_COMMENTS[f.name]}")
        if value is None:
            lines.append(f"# {f.name} = ...")  # unset: the default applies
            continue
        lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def write(config: FleetConfig, path: str | None = None, force: bool = False) -> str:
    path = config_path(path)
    if os.path.exists(path) and not force:
        raise ConfigError(f"{path} exists; use --force to overwrite it")
    text = dumps(config)
    assert from_dict(tomllib.loads(text)) == config  # what we write reads back the same
    with open(path, "w") as f:
        f.write(text)
    return path

"""What the Compute stand-in knows about regions and machine types: ``regions.get`` (zones and
quotas, configurable per test) and ``machineTypes.get``, installed through its ``extra_routes``.

Quota metrics and their shape are GCE's (``{"metric": "CPUS", "limit": 24.0, "usage": 0.0}``);
zone names are the real ones of each region, not invented ``-a/-b/-c``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.standins import compute
from tests.standins.compute import API, ApiError, ComputeStandin

# The real zones of each region: one table, the one the stand-in checks every zone against.
ZONES = {region: [f"{region}-{z}" for z in letters] for region, letters in compute.ZONES.items()}
MACHINE_TYPES = {  # name: (vCPUs, memory MB)
    "e2-standard-2": (2, 8192),
    "e2-standard-4": (4, 16384),
    "e2-standard-8": (8, 32768),
    "e2-highcpu-8": (8, 8192),
    "n2d-standard-8": (8, 32768),
    "n2-standard-4": (4, 16384),
    "c4-standard-4": (4, 15360),
}
# Generous defaults: a test that is not about quota never hits one.
DEFAULT_QUOTAS = {
    "CPUS": 1000.0,
    "PREEMPTIBLE_CPUS": 0.0,
    "N2D_CPUS": 1000.0,
    "N2_CPUS": 1000.0,
    "C4_CPUS": 1000.0,
    "IN_USE_ADDRESSES": 1000.0,
    "DISKS_TOTAL_GB": 100000.0,
    "SSD_TOTAL_GB": 100000.0,
}


@dataclass
class Catalog:
    project: str
    quotas: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # region -> metric -> [limit, usage]
    gets: list[str] = field(default_factory=list)

    def install(self, standin: ComputeStandin) -> "Catalog":
        standin.extra_routes += [
            ("GET", r"regions/([a-z0-9-]+)", lambda region, body: self.region(region)),
            ("GET", r"zones/([a-z0-9-]+)/machineTypes/([^/]+)", lambda zone, name, body: self.machine_type(zone, name)),
        ]
        return self

    def set_quota(self, region: str, metric: str, limit: float, usage: float = 0.0) -> None:
        self._region_quotas(region)[metric] = [float(limit), float(usage)]

    def _region_quotas(self, region: str) -> dict[str, list[float]]:
        return self.quotas.setdefault(region, {k: [v, 0.0] for k, v in DEFAULT_QUOTAS.items()})

    def region(self, name: str) -> dict:
        self.gets.append(f"regions/{name}")
        if name not in ZONES:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/regions/{name}' was not found")
        return {
            "kind": "compute#region",
            "id": "1000",
            "name": name,
            "status": "UP",
            "description": name,
            "selfLink": f"{API}/projects/{self.project}/regions/{name}",
            "zones": [f"{API}/projects/{self.project}/zones/{z}" for z in ZONES[name]],
            "quotas": [
                {"metric": m, "limit": lim, "usage": use} for m, (lim, use) in sorted(self._region_quotas(name).items())
            ],
        }

    def machine_type(self, zone: str, name: str) -> dict:
        self.gets.append(f"zones/{zone}/machineTypes/{name}")
        if not any(zone in zones for zones in ZONES.values()):
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}' was not found")
        if name not in MACHINE_TYPES:
            raise ApiError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/zones/{zone}/machineTypes/{name}' was not found",
            )
        cpus, memory = MACHINE_TYPES[name]
        return {
            "kind": "compute#machineType",
            "id": "2000",
            "name": name,
            "guestCpus": cpus,
            "memoryMb": memory,
            "zone": zone,
            "isSharedCpu": False,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "description": f"{cpus} vCPUs, {memory // 1024} GB RAM",
            "selfLink": f"{API}/projects/{self.project}/zones/{zone}/machineTypes/{name}",
        }

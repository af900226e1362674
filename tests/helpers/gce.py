"""What the Compute tests share: the stand-in's project and a fleet's request spec."""

from __future__ import annotations

from fleet.gce import compute_requests

PROJECT = "fleet-test-1"


def spec(**changes) -> compute_requests.FleetSpec:
    """A fleet's spec as `fleet launch` makes it, with ``changes``."""
    base = dict(
        run="r1",
        bucket="gs://bkt",
        code_version="0123456789abcdef",
        template="t-r1",
        machine_type="e2-standard-4",
        image="projects/debian-cloud/global/images/family/debian-12",
        service_account=f"w@{PROJECT}.iam.gserviceaccount.com",
        startup_script="#!/bin/bash\ntrue\n",
    )
    return compute_requests.FleetSpec(**{**base, **changes})

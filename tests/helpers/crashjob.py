"""A job whose workers crash as they start (a bug in the converter's set-up, met only on a VM):
for the tests of a fleet that must stop itself instead of booting VMs forever."""

from __future__ import annotations

from tests.helpers.linejob import LineJob


class CrashAtStart(LineJob):
    name = "crashjob"

    def converter(self, config, opener):
        raise RuntimeError("simulated crash as the worker starts")


JOB = CrashAtStart()

"""A job whose output names the heavy modules its worker process has loaded: for the test
that a worker started by the ``fleet`` command does not import the CLI it never uses."""

from __future__ import annotations

import sys

from tests.helpers.linejob import LineJob

WATCHED = ("fleet.cli.commands", "typer", "rich", "pydantic")


class ModulesConverter:
    def convert(self, documents, ctx, sink):
        for _ in documents:
            pass
        with sink.open(".txt") as out:
            out.write(" ".join(m for m in WATCHED if m in sys.modules).encode() or b"-")
        return {}


class ModulesJob(LineJob):
    name = "modulesjob"

    def document_converter(self, config, opener):
        return ModulesConverter()


JOB = ModulesJob()

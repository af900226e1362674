"""A job whose one output names the modules of ``LOADED_WATCH`` its worker process has loaded
(with ``LOADED_THREADS`` set: its threads once numpy is imported, and its OPENBLAS_NUM_THREADS):
for the tests that a worker of `fleet local` pays for no start-up it does not need."""

from __future__ import annotations

import os
import sys

from tests.helpers.linejob import LineJob


class LoadedConverter:
    def convert(self, documents, ctx, sink):
        for _ in documents:
            pass
        watched = os.environ.get("LOADED_WATCH", "").split(",")
        with sink.open(".txt") as out:
            out.write(" ".join(m for m in watched if m in sys.modules).encode() or b"-")
            if os.environ.get("LOADED_THREADS"):
                import numpy  # noqa: F401  (its BLAS pool starts with it)

                threads = len(os.listdir("/proc/self/task"))
                out.write(f" threads={threads} blas={os.environ.get('OPENBLAS_NUM_THREADS')}".encode())
        return {}


class LoadedJob(LineJob):
    name = "loadedjob"

    def document_converter(self, config, opener):
        return LoadedConverter()


JOB = LoadedJob()

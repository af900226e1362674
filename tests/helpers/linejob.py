"""A tiny job for testing the fleet itself: copies lines, optionally slowly.

Its output is a pure function of the documents and the seed, like a real
job's, so digests of a run with crashes can be compared with a clean run.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass

from fleet.job import ConfigError, InputError

from fleet_jobs.text.job import DocumentConverter, TextJob


@dataclass
class LineConfig:
    delay: float = 0.0  # seconds per document, to make items slow enough to kill
    poison: str = ""  # a document containing this is bad input
    crash: str = ""  # a document containing this raises a (retryable) RuntimeError
    seed: int = 7


class LineConverter(DocumentConverter):
    def __init__(self, config: LineConfig):
        self.config = config

    def convert(self, documents, ctx, sink):
        rng = random.Random(ctx.seed)
        out = sink.open(".txt")
        docs = lines = 0
        crash_now = os.environ.get("LINEJOB_CRASH", "")  # a crash that goes away when the variable does
        for doc in documents:
            if crash_now and any(crash_now in line for line in doc):
                raise RuntimeError("simulated crash (LINEJOB_CRASH)")
            if self.config.poison and any(self.config.poison in line for line in doc):
                raise InputError(f"{ctx.source}: poisoned document")
            if self.config.crash and any(self.config.crash in line for line in doc):
                raise RuntimeError("simulated crash")
            docs += 1
            lines += len(doc)
            out.write(f"{rng.random():.6f} {hashlib.sha256(chr(10).join(doc).encode()).hexdigest()}\n".encode())
            if self.config.delay:
                time.sleep(self.config.delay)
        out.close()
        return {"documents": docs, "lines": lines}


class LineJob(TextJob):
    name = "linejob"
    config_type = LineConfig

    def check(self, config, opener):
        if config.delay < 0:
            raise ConfigError("delay must be >= 0")

    def document_converter(self, config, opener):
        return LineConverter(config)


JOB = LineJob()

"""A job whose conversion is a sleep: for simulating many workers without the CPU cost.

Each item sleeps ``seconds`` times a factor in [1 - jitter, 1 + jitter] drawn
from the item's seed (so a retried item sleeps as long), reads all its
documents as a real converter would, and writes one small output derived
from them, so runs can still be checked by digest.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

from fleet.job import ConfigError

from jobs.text.job import DocumentConverter, TextJob


@dataclass
class SleepConfig:
    seconds: float = 1.0
    jitter: float = 0.2
    seed: int = 1


class SleepConverter(DocumentConverter):
    def __init__(self, config: SleepConfig):
        self.config = config

    def convert(self, documents, ctx, sink):
        h = hashlib.sha256()
        docs = 0
        for doc in documents:
            docs += 1
            h.update("\n".join(doc).encode())
        factor = 1 + self.config.jitter * (2 * random.Random(ctx.seed).random() - 1)
        time.sleep(self.config.seconds * factor)
        with sink.open(".txt") as out:
            out.write(f"{ctx.item_id} {docs} {h.hexdigest()}\n".encode())
        return {"documents": docs, "slept": self.config.seconds * factor}


class SleepJob(TextJob):
    name = "sleepjob"
    config_type = SleepConfig

    def check(self, config, opener):
        if config.seconds < 0 or not 0 <= config.jitter < 1:
            raise ConfigError("seconds must be >= 0 and jitter in [0, 1)")

    def document_converter(self, config, opener):
        return SleepConverter(config)


JOB = SleepJob()

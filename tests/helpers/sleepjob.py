"""A job whose conversion is a sleep: for simulating many workers without the CPU cost.

Each item sleeps ``seconds`` times a factor in [1 - jitter, 1 + jitter] drawn
from the item's seed (so a retried item sleeps as long), reads all its
documents as a real converter would, and writes one small output derived
from them, so runs can still be checked by digest.

``--shards N`` adds a balanced stage "shards" (for bench/scale_sim.py's stages): the map then
emits ``records`` keyed records of ``record_bytes`` bytes per item instead of its output, and
each shard item reads its records, sleeps ``reduce_seconds`` (jittered alike) and writes one
small output: its item id, record count and their digest.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

from fleet.job import ConfigError, Reducer, Stage, shuffle_key

from fleet_jobs.text.job import DocumentConverter, TextJob


@dataclass
class SleepConfig:
    seconds: float = 1.0
    jitter: float = 0.2
    seed: int = 1
    records: int = 4  # keyed records per map item, when the map feeds the shards stage
    record_bytes: int = 64
    reduce_seconds: float = 0.2


def _factor(config: SleepConfig, seed: int) -> float:
    return 1 + config.jitter * (2 * random.Random(seed).random() - 1)


class SleepConverter(DocumentConverter):
    def __init__(self, config: SleepConfig):
        self.config = config

    def convert(self, documents, ctx, sink):
        h = hashlib.sha256()
        docs = 0
        for doc in documents:
            docs += 1
            h.update("\n".join(doc).encode())
        factor = _factor(self.config, ctx.seed)
        time.sleep(self.config.seconds * factor)
        if ctx.feeds:
            for i in range(self.config.records):
                value = f"{ctx.item_id} {i} {h.hexdigest()}".encode().ljust(self.config.record_bytes, b".")
                sink.emit(shuffle_key(ctx.run_seed, value), value)
            return {"documents": docs, "slept": self.config.seconds * factor}
        with sink.open(".txt") as out:
            out.write(f"{ctx.item_id} {docs} {h.hexdigest()}\n".encode())
        return {"documents": docs, "slept": self.config.seconds * factor}


class SleepShards(Reducer):
    def __init__(self, config: SleepConfig):
        self.config = config

    def reduce(self, records, ctx, sink):
        h = hashlib.sha256()
        n = 0
        for _key, value in records:
            h.update(value)
            n += 1
        factor = _factor(self.config, ctx.seed)
        time.sleep(self.config.reduce_seconds * factor)
        with sink.open(".txt") as out:
            out.write(f"{ctx.item_id} {n} {h.hexdigest()}\n".encode())
        return {"shard_records": n, "slept": self.config.reduce_seconds * factor}


class SleepJob(TextJob):
    name = "sleepjob"
    config_type = SleepConfig

    def check(self, config, opener):
        if config.seconds < 0 or config.reduce_seconds < 0 or not 0 <= config.jitter < 1:
            raise ConfigError("seconds and reduce_seconds must be >= 0 and jitter in [0, 1)")
        if config.records < 0 or config.record_bytes < 0:
            raise ConfigError("records and record_bytes must be >= 0")

    def stages(self, config, options, map_items):
        if options.dedup:
            raise ConfigError(f"--dedup {options.dedup!r}: the sleep job has no dedup stage")
        return [Stage("shards", options.shards, balanced=True)] if options.shards else []

    def reducer(self, config, opener, stage):
        if stage != "shards":
            raise ConfigError(f"the sleep job has no stage {stage!r}")
        return SleepShards(config)

    def document_converter(self, config, opener):
        return SleepConverter(config)


JOB = SleepJob()

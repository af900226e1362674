"""A tiny job with stages, for testing the fleet's stages apart from any real job's.

Map: every line of the item becomes a record (keyed by ``shuffle_key(run seed, line)`` when
the item feeds a stage, else written as it is). ``--dedup lines`` adds a stage ``uniq``
that drops repeated lines; ``--shards N`` a balanced stage ``shards`` that writes the lines
in key order to N files. Outputs are a pure function of the lines and the seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.job import ConfigError, InputError, Reducer, Stage, shuffle_key

from fleet_jobs.text.job import DocumentConverter, TextJob


@dataclass
class StageConfig:
    delay: float = 0.0  # seconds per document in the map, to make items slow enough to kill
    reduce_delay: float = 0.0  # seconds per 100 records in a stage after the map
    poison: str = ""  # a document containing this is bad input
    seed: int = 7


class Lines(DocumentConverter):
    def __init__(self, config: StageConfig):
        self.config = config

    def convert(self, documents, ctx, sink):
        out = None if ctx.feeds else sink.open(".txt")
        lines = 0
        for doc in documents:
            if self.config.poison and any(self.config.poison in line for line in doc):
                raise InputError(f"{ctx.source}: poisoned document")
            for line in doc:
                data = line.encode()
                if out is None:
                    sink.emit(shuffle_key(ctx.run_seed, data), data)
                else:
                    out.write(data + b"\n")
                lines += 1
            if self.config.delay:
                time.sleep(self.config.delay)
        if out is not None:
            out.close()
        return {"lines": lines}


class _Slow:
    def __init__(self, config: StageConfig):
        self.config = config

    def pace(self, n: int) -> None:
        if self.config.reduce_delay and not n % 100:
            time.sleep(self.config.reduce_delay)


class Uniq(Reducer, _Slow):
    def reduce(self, records, ctx, sink):
        previous, kept, dropped = None, 0, 0
        out = None if ctx.feeds else sink.open(".txt")
        for n, (key, value) in enumerate(records):
            self.pace(n)
            if value == previous:
                dropped += 1
                continue
            previous = value
            kept += 1
            if out is None:
                sink.emit(key, value)
            else:
                out.write(value + b"\n")
        if out is not None:
            out.close()
        return {"lines_kept": kept, "lines_dropped": dropped}


class Shards(Reducer, _Slow):
    def reduce(self, records, ctx, sink):
        n = 0
        with sink.open(".txt") as out:
            for n, (_key, value) in enumerate(records, 1):
                self.pace(n)
                out.write(value + b"\n")
        return {"shard_lines": n}


class StageJob(TextJob):
    name = "stagejob"
    config_type = StageConfig

    def stages(self, config, options, map_items):
        if options.dedup not in ("", "lines"):
            raise ConfigError(f"--dedup {options.dedup!r}: unknown mode; known: lines")
        out = [Stage("uniq", max(1, map_items))] if options.dedup else []
        if options.shards:
            out.append(Stage("shards", options.shards, balanced=True))
        return out

    def document_converter(self, config, opener):
        return Lines(config)

    def reducer(self, config, opener, stage):
        return {"uniq": Uniq, "shards": Shards}[stage](config)


JOB = StageJob()

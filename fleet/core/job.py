"""What a job is to the fleet: a ``Job`` (its options, checks, how an input object is cut into
items, its stages, features and summary) and the ``Converter`` it hands each worker process.

The base classes with their defaults: the planner, the worker and the readers call these
methods, so they live in the core; a job subclasses them as ``fleet.job.Job`` and
``fleet.job.Converter`` (the same classes).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping

from fleet.core.errors import ConfigError
from fleet.core.item import ItemContext, ItemInput, Opener, Piece, Source
from fleet.core.options import parse_dataclass
from fleet.core.sink import Feature, KeyedSink, RunManifest, Sink
from fleet.core.stage import Reducer, Stage, StageOptions


class Converter(abc.ABC):
    @abc.abstractmethod
    def convert(self, item: ItemInput, ctx: ItemContext, sink: Sink | KeyedSink) -> dict[str, float]:
        """Turn one item's input into outputs; return counters (summed over the run). ``sink`` is a
        KeyedSink where the item feeds a stage (``ctx.feeds``), else a Sink."""


class Job(abc.ABC):
    name: str
    config_type: type  # a dataclass whose fields are the job's options

    def parse_config(self, values: Mapping[str, Any]) -> Any:
        """Build the config from ``--set k=v`` strings or a run.json dict."""
        return parse_dataclass(self.config_type, values)

    def check(self, config: Any, opener: Opener) -> None:
        """Fail early, at plan time, on a config that cannot work (e.g. a missing vocab)."""

    def check_here(self, config: Any) -> None:
        """Fail early on what this machine lacks to convert (a program the job runs is not
        installed): `fleet local` calls it before planning, since its workers run here. A plan
        for other machines cannot see theirs; a job checks there in ``converter()``."""

    def seed(self, config: Any) -> int:
        """The run's seed, from which each item's seed (``ItemContext.seed``) is derived. By
        default the option ``seed`` if the job has one, else 0; a job names its own here."""
        return int(getattr(config, "seed", 0) or 0)

    def files(self, config: Any) -> dict[str, str]:
        """The files the outputs depend on, by option name: a run pins their digests at plan
        time and refuses to go on with other contents. By default every non-empty option
        whose name ends in ``_file`` (``vocab_file``); a job with others says so here."""
        return {
            f.name: value
            for f in dataclasses.fields(config)
            if f.name.endswith("_file") and isinstance(value := getattr(config, f.name), str) and value
        }

    def accepts(self, name: str) -> bool:
        """Inside a folder named as input, whether the file ``name`` is input (by default every
        file; a text job skips READMEs and licences). A file named on its own is always taken."""
        return True

    def skip_reason(self, name: str) -> str | None:
        """Inside a folder named as input, why the file ``name`` is not input, in a few words the
        run's account shows ("a README-like name", "an unsupported compression (.lz4)"), or None
        if it is. By default ``accepts`` without a why: a job that skips files says why here."""
        return None if self.accepts(name) else f"not input to job {self.name}"

    def check_read(self, read: Mapping[str, Any]) -> dict[str, Any]:
        """At plan time: the run's read options (``fleet plan --text-column``... : the fleet passes them
        on unread) checked, with a one-line ConfigError naming the flag, and completed with their
        defaults; the result is kept in the run (RunSpec.read) and reaches ``cut`` and ``ItemContext.read``."""
        return dict(read)

    def cut(self, source: Source, item_bytes: int, config: Any, read: Mapping[str, Any]) -> list[Piece]:
        """How one input object becomes items: by default one item per object.
        :func:`cut_at_newlines` gives byte ranges of about ``item_bytes`` ending at newlines."""
        return [Piece(0, source.size)]

    # Whether files smaller than an item may share one: the planner packs whole files that ``cut``
    # left in one piece smaller than ``item_bytes`` into items of about ``item_bytes``, in the order
    # it found them (ItemInput.parts). Off by default: a converter that reads ``item.name`` or
    # ``item.read`` as one file would read none. The text jobs take it (fleet_jobs.text.job.TextJob).
    group_small_files: bool = False

    @abc.abstractmethod
    def converter(self, config: Any, opener: Opener) -> Converter:
        """Per worker process: load what every item needs (a vocab) once. In a run with stages
        the map's sink is a KeyedSink (``ctx.feeds`` names the stage it feeds)."""

    def stages(self, config: Any, options: StageOptions, map_items: int) -> list[Stage]:
        """The stages after the map that ``--shards`` / ``--dedup`` ask of this job, at plan time
        (``map_items``: how many items the inputs were cut into). By default a job has none and
        refuses both in one line; raise ConfigError naming the option for a value it cannot do."""
        if options.shards:
            raise ConfigError(f"--shards: job {self.name} cannot shard its outputs (it has no stages)")
        if options.dedup:
            raise ConfigError(f"--dedup: job {self.name} cannot deduplicate its inputs (it has no stages)")
        return []

    def reducer(self, config: Any, opener: Opener, stage: str) -> Reducer:
        """Per worker process: the Reducer of a stage this job asked for (Job.stages), by name."""
        raise ConfigError(f"job {self.name} has no stage {stage!r}")

    def features(self, config: Any) -> dict[str, Feature]:
        """The features every example of a run with this config holds, by name: the run's
        readers (``fleet.core.follow.follow_examples``, ``follow_dataset``) parse and check the
        outputs with it and need no code of the job's. Empty (the default): the outputs are
        not examples of fixed-length features, and only ``fleet.core.follow.follow`` reads them."""
        return {}

    def run_files(self, config: Any, manifest: RunManifest) -> dict[str, bytes]:
        """Files the fleet writes into the output place once the run is finished, by name: what
        only the whole run can say (Megatron's --data-path list of every dataset and its weight).
        A pure function of the manifest, so whoever writes them writes the same bytes."""
        return {}

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Derived figures for the run summary (ratios of summed counters)."""
        return {}

    def report(self, output_url: str, config: Any) -> str | None:
        """Optional: a human-readable look at a finished run's outputs (``fleet local`` prints it)."""
        return None

"""The small API between the fleet and a job: the one module a job imports of the fleet.

A job is a module ``fleet_jobs.<name>`` (or a ``fleet.jobs`` entry point) exposing
``JOB``, an instance of :class:`Job`. The fleet knows input objects and byte
ranges, never what is in them: at plan time the job says how each input object
is cut into items (:meth:`Job.cut`: whole objects by default, byte ranges at
newlines with :func:`cut_at_newlines`, or its own boundaries); at work time a
converter gets one item's input (:class:`ItemInput`: ranged reads of the
object version the plan saw), its context (seed, scratch folder) and a
:class:`Sink` for its outputs. Outputs must be a pure function of (input bytes,
config, item seed) so that a retried item rewrites the same bytes.

This module is a facade: each name lives in the core module of its idea (``fleet.core.errors``,
``item``, ``sink``, ``stage``, ``job``, ``options``, ``discovery``), which the fleet itself
imports; here they are re-exported, the same objects, so a job imports ``fleet.job`` alone and
the core can change behind it. Nothing in fleet/ imports this module.
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Sequence

from fleet.core.discovery import available_jobs, load_job
from fleet.core.errors import Cancelled, ConfigError, InputError, ItemFailed, JobNotFound
from fleet.core.item import ItemContext, ItemInput, Opener, Piece, Source, cut_at_newlines, item_seed, printable
from fleet.core.job import Converter, Job
from fleet.core.options import SEED_RANGE, OptionHelp, describe_options, option_range, parse_dataclass
from fleet.core.sink import Feature, KeyedSink, RunManifest, Sink, shuffle_key
from fleet.core.stage import Reducer, Stage, StageOptions, item_key

# What a job may use of the store, through this module only (a job imports nothing else of the
# fleet): ranged reads of pinned object versions, their errors, and a seekable file over one.
from fleet.core.store import Changed, NotFound, Store, StoreError, StoreFile, open_store, read_url

__all__ = [
    # errors
    "InputError",
    "ConfigError",
    "JobNotFound",
    "ItemFailed",
    "Cancelled",
    # an item, its input and context
    "Source",
    "Piece",
    "ItemInput",
    "ItemContext",
    "Opener",
    "printable",
    "cut_at_newlines",
    "item_seed",
    # where its work goes
    "Sink",
    "KeyedSink",
    "shuffle_key",
    "Feature",
    "RunManifest",
    # stages after the map
    "Stage",
    "StageOptions",
    "Reducer",
    "item_key",
    # the job
    "Job",
    "Converter",
    # options
    "parse_dataclass",
    "SEED_RANGE",
    "option_range",
    "OptionHelp",
    "describe_options",
    # discovery
    "available_jobs",
    "load_job",
    # a job's tools: inputs as the planner finds them, TFRecords read back
    "find_sources",
    "tfrecord_records",
    "parse_example",
    # the store
    "Changed",
    "NotFound",
    "Store",
    "StoreError",
    "StoreFile",
    "open_store",
    "read_url",
]


def find_sources(
    paths: list[str],
    exclude: Sequence[str] = (),
    accept: Callable[[str], bool] | None = None,
    skip: Callable[[str], str | None] | None = None,
) -> list[Source]:
    """The input objects under some files, folders or ``gs://`` prefixes, as ``fleet plan`` finds
    them (for a job's own tools: a vocab trained over a corpus, a pre-flight look). Inside a
    folder, ``skip(name)`` says why a file is not input (``Job.skip_reason``), or ``accept(name)``
    only whether; the files skipped are named in warnings, a line a reason."""
    from fleet.core.sources import find_sources as find, survey  # loaded by a job's tool that finds inputs only

    if skip is not None:
        return survey(paths, exclude, skip).sources
    return find(paths, exclude, accept) if accept is not None else find(paths, exclude)


def tfrecord_records(f: BinaryIO):
    """The records of a TFRecord stream, both checksums checked (``fleet.formats.tfrecord``: the one
    reader of the format, which the run's readers use too)."""
    from fleet.formats.tfrecord import records

    return records(f)


def parse_example(data: bytes) -> dict:
    """A serialized ``tf.train.Example`` -> {name: int64 or float32 array, or list of bytes}."""
    from fleet.formats.tfrecord import parse_example as parse

    return parse(data)

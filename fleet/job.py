"""The small API between the fleet and a job.

A job is a module ``fleet_jobs.<name>`` (or a ``fleet.jobs`` entry point) exposing
``JOB``, an instance of :class:`Job`. The fleet knows input objects and byte
ranges, never what is in them: at plan time the job says how each input object
is cut into items (:meth:`Job.cut`: whole objects by default, byte ranges at
newlines with :func:`cut_at_newlines`, or its own boundaries); at work time a
converter gets one item's input (:class:`ItemInput`: ranged reads of the
object version the plan saw), its context (seed, scratch folder) and a
:class:`Sink` for its outputs. Outputs must be a pure function of (input bytes,
config, item seed) so that a retried item rewrites the same bytes.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import hashlib
import importlib
import os
import sys
import typing
from dataclasses import dataclass
from dataclasses import field
from typing import Any, BinaryIO, Callable, Iterator, Mapping


# What a job may use of the store, through this module only (a job imports nothing else of the
# fleet): ranged reads of pinned object versions, their errors, and a seekable file over one.
from fleet.core.store import Changed, NotFound, Store, StoreError, StoreFile, open_store, read_url  # noqa: E402,F401


class InputError(Exception):
    """The item's data is bad: retrying will not help. The message names the file."""


class ConfigError(Exception):
    """A job option is missing or invalid."""


class JobNotFound(Exception):
    pass


class ItemFailed(Exception):
    """This attempt at the item failed, and another may not (a program that exited non-zero):
    the message and ``detail`` (e.g. exit code, last lines of stderr) are kept in the lease."""

    def __init__(self, message: str, detail: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.detail = dict(detail or {})


class Cancelled(Exception):
    """The item's lease was taken over: stop, the work is discarded (raised by ``ctx.checkpoint``)."""


@dataclass(frozen=True)
class Source:
    """An input object as the planner found it, pinned to that version."""

    url: str  # store URL (a local folder or gs://bucket[/prefix])
    name: str  # object name inside that store
    size: int
    version: str = ""  # Blob.version when found: what a worker checks before reading

    @property
    def display(self) -> str:
        return printable(f"{self.url.rstrip('/')}/{self.name}")


@dataclass(frozen=True)
class Piece:
    """One item as a job's planner cuts it from a source: ``start``-``end`` in bytes, or in a
    unit the job names in ``meta["unit"]`` (Parquet row groups); ``size`` is the bytes of work
    it holds (by default end - start), ``meta`` what the job's converter needs to know of it."""

    start: int
    end: int
    size: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class ItemInput:
    """An item's input, as a converter reads it: ranged reads of the object version the plan
    pinned. A file rewritten, truncated or removed since fails the item (InputError)
    instead of feeding it other bytes.

    An item of a job that takes grouping (``Job.group_small_files``) may hold several whole
    small files: then ``parts`` are their inputs, in the order the planner found them, each
    an ItemInput of its own (url, name, range, meta, display naming that file), and the item
    itself reads nothing (``read``/``fetch`` refuse: read the parts). Any item's ``parts`` is
    the list to read, so a job that takes grouping reads every item the same way."""

    def __init__(self, url: str, name: str, start: int, end: int, version: str = "",
                 meta: Mapping[str, Any] | None = None, display: str = "", parts: list["ItemInput"] | None = None):
        self.url, self.name, self.start, self.end, self.version = url, name, start, end, version
        self.meta = dict(meta or {})
        self.display = display or printable(f"{url.rstrip('/')}/{name}")
        self._store = None
        self._parts = list(parts or ())
        # Exact counts of what this part gave (``count``): the manifest's row of its file.
        self.counts: dict[str, int] = {}

    @property
    def grouped(self) -> bool:
        """Whether this item holds several files (read its ``parts``)."""
        return bool(self._parts)

    @property
    def parts(self) -> list["ItemInput"]:
        """What to read, in order: the files of a grouped item, else the item itself."""
        return self._parts or [self]

    def count(self, counts: Mapping[str, int]) -> None:
        """Exact counts of what this part of a grouped item gave (documents read, bad records...):
        the fleet keeps them as its file's row of the run's manifest (RunManifest.sources), where
        an item of one file has its stats. Counts of what the item made of several files together
        (examples that span them) belong to no file: they stay in the item's stats only."""
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(value)

    @property
    def file(self) -> str:
        return printable(f"{self.url.rstrip('/')}/{self.name}")

    @property
    def store(self):
        """The store holding the input (fleet.core.store.Store): ``read(name, start, end, version)``."""
        self._one_file()
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def _one_file(self) -> None:
        if self._parts:
            raise TypeError(f"{self.display}: a grouped item reads nothing itself; read its parts (ItemInput.parts)")

    def stat_size(self) -> int:
        """The object's size now (it must still be there)."""
        blob = self.store.stat(self.name)
        if blob is None:
            raise InputError(f"{self.display}: input file is gone")
        return blob.size

    @contextlib.contextmanager
    def _pinned(self):
        """A read of the pinned version: the object gone or rewritten since the plan is bad input."""
        try:
            yield
        except NotFound:
            raise InputError(f"{self.display}: input file is gone") from None
        except Changed as e:
            raise InputError(f"{printable(str(e))}; plan a new run for the new contents") from None

    def read(self, start: int, end: int) -> bytes:
        """Bytes start-end of the pinned version of the object."""
        with self._pinned():
            return self.store.read(self.name, start, end, version=self.version or None)

    def read_all(self) -> bytes:
        """The item's byte range (start-end) in memory, checked to be all of it: for a small part."""
        data = self.read(self.start, self.end)
        if len(data) != self.end - self.start:
            raise InputError(f"{self.file}: changed since it was planned (bytes {self.start}-{self.end} planned, "
                             f"{len(data)} there now); plan a new run for the new contents")
        return data

    def fetch(self, path: str) -> str:
        """Download the item's byte range (start-end) to a local file, checked to be all of it."""
        with self._pinned():
            self.store.download_file(self.name, path, self.start, self.end, version=self.version or None)
        got = os.path.getsize(path)
        if got != self.end - self.start:
            raise InputError(f"{self.file}: changed since it was planned (bytes {self.start}-{self.end} planned, "
                             f"{got} there now); plan a new run for the new contents")
        return path


@dataclass(frozen=True)
class ItemContext:
    item_id: str
    seed: int  # derived from the run's seed and the item id, never from time or worker
    source: str  # human-readable origin of the item, for error messages
    workdir: str = ""  # an empty scratch folder of this attempt, removed after it
    read: Mapping[str, Any] = field(default_factory=dict)  # the run's input options (``fleet plan --text-column``...)
    checkpoint: Callable[[], None] = lambda: None  # call often: raises Cancelled once the lease is lost
    stage: str = "map"  # the stage this item belongs to: "map" (the inputs), or a Stage.name the job asked for
    # The stage this item's outputs feed, or "" when they are the run's outputs. When set, the sink
    # is a KeyedSink: the item emits (key, value) records, and that stage's items get them by key.
    feeds: str = ""
    run_seed: int = 0  # the run's seed (Job.seed): what a key that must not depend on the item is seeded by


class Sink(abc.ABC):
    """Where a converter writes an item's outputs; the fleet commits them."""

    @abc.abstractmethod
    def open(self, suffix: str) -> BinaryIO:
        """A new binary file that becomes the output ``<item_id><suffix>``."""

    def add(self, suffix: str, path: str) -> None:
        """A finished local file (a program wrote it) becomes the output ``<item_id><suffix>``;
        ``suffix`` may name a subfolder (``-logs/a.txt``). The sink may take the file over
        instead of copying it (the fleet's does): leave it alone afterwards."""
        import shutil

        with open(path, "rb") as src, self.open(suffix) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    def count(self, suffix: str, counts: Mapping[str, int]) -> None:
        """Exact counts of what the output ``<item_id><suffix>`` holds (tokens, documents,
        examples...): the fleet keeps them with the output in its lease, and the run's manifest
        (RunManifest) sums them, so a trainer's token budget comes from what was written."""
        totals = self.__dict__.setdefault("output_counts", {}).setdefault(suffix, {})
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + int(value)


@dataclass(frozen=True)
class RunManifest:
    """A finished run's exact counts: per input file (summed over its items' counters; a file of a
    grouped item: what ``ItemInput.count`` gave it, and its bytes) and per output (what
    ``Sink.count`` recorded), by counter name; ``outputs`` maps output names (relative to the
    output place) to their counts, in output-name order."""

    sources: dict[str, dict[str, int]]
    outputs: dict[str, dict[str, int]]


class KeyedSink(abc.ABC):
    """The sink of an item whose outputs feed a later stage (``ctx.feeds``): records keyed for
    the shuffle between stages. The fleet cuts the key space [0, 2**64) into equal ranges,
    one per partition, so the reduce items get every record of their range, from every item
    of this stage, sorted by (key, value): a global order that does not depend on how the
    work was cut into items or which worker did it."""

    partitions: int

    @abc.abstractmethod
    def emit(self, key: int, value: bytes) -> None:
        """One record: ``key`` an unsigned 64-bit integer (see :func:`shuffle_key`)."""


def shuffle_key(seed: int, value: bytes) -> int:
    """A key that puts records in a pseudo-random order seeded by ``seed`` (the run's seed): a
    keyed 64-bit BLAKE2b of the record. Equal records get equal keys, so the order depends on
    nothing but the records and the seed."""
    return int.from_bytes(hashlib.blake2b(value, digest_size=8, key=_seed_bytes(seed)).digest(), "big")


def _seed_bytes(seed: int) -> bytes:
    return (seed % (1 << 128)).to_bytes(16, "big")


@dataclass(frozen=True)
class Stage:
    """A stage a job asks for after its map over the inputs (``Job.stages``): MapReduce through
    the bucket. Each stage's items read the records the stage before emitted (KeyedSink), once
    every item of that stage is done; the same leases, retries and workers run them.

    ``items`` reduce items each get one key range (a partition) of the records, sorted by
    (key, value); ``balanced``: instead, the records in (key, value) order are cut into
    ``items`` runs of equal counts (differing by at most one), e.g. shards of a global shuffle.
    The last stage writes the run's outputs: item i of n names them ``part-<i>-of-<n>...``."""

    name: str
    items: int
    balanced: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name == "map":
            raise ValueError(f"stage name {self.name!r}: an identifier other than 'map'")
        if self.items < 1:
            raise ValueError(f"stage {self.name}: {self.items} items; give 1 or more")


@dataclass(frozen=True)
class StageOptions:
    """The run's stage options as ``fleet plan`` / ``fleet local`` take them (``--shards``,
    ``--dedup``), checked by the fleet for form only; a job says what they mean (Job.stages)."""

    shards: int = 0  # 0: no sharding, the map's items write the outputs
    dedup: str = ""  # "": none; a mode the job knows ("exact")

    def __bool__(self) -> bool:
        return bool(self.shards or self.dedup)


class Reducer(abc.ABC):
    """One stage's work on one item after the map: records in, outputs (or records for the
    next stage) out."""

    @abc.abstractmethod
    def reduce(self, records: Iterator[tuple[int, bytes]], ctx: ItemContext, sink: Sink | KeyedSink
               ) -> dict[str, float]:
        """The item's records, sorted by (key, value), to outputs; return counters. ``sink`` is
        a KeyedSink when ``ctx.feeds`` names a next stage."""


Opener = Callable[[str], bytes]  # reads a small object by URL or local path


@dataclass(frozen=True)
class Feature:
    """One feature of every example a job writes: ``length`` values of ``dtype``, in its
    TFRecords (an int64 or float list) and in its Parquet rows (a list column) alike."""

    length: int
    dtype: str = "int64"  # int64 | float32

    def __post_init__(self) -> None:
        if self.dtype not in ("int64", "float32") or self.length < 0:
            raise ValueError(f"Feature({self.length}, {self.dtype!r}): a length >= 0 of int64 or float32")


class Converter(abc.ABC):
    @abc.abstractmethod
    def convert(self, item: ItemInput, ctx: ItemContext, sink: Sink) -> dict[str, float]:
        """Turn one item's input into outputs; return counters (summed over the run)."""


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
        return {f.name: value for f in dataclasses.fields(config)
                if f.name.endswith("_file") and isinstance(value := getattr(config, f.name), str) and value}

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


def printable(text: str) -> str:
    """A file name fit for a log line or a terminal: bytes that are not UTF-8 (kept by
    the OS as surrogate escapes) shown as \\xNN instead of crashing the writer."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def cut_at_newlines(source: Source, item_bytes: int, scan: int = 1 << 20) -> list[Piece]:
    """Byte ranges of about ``item_bytes`` that each end just after a newline (or at the end of
    the object), so no line is split; a line longer than an item makes its item longer."""

    store = open_store(source.url)
    pieces, start = [], 0
    while start < source.size:
        cut = start + item_bytes
        if cut >= source.size:
            pieces.append(Piece(start, source.size))
            break
        at = cut - 1  # the range ends after the first newline at or past byte cut - 1
        while True:
            chunk = store.read(source.name, at, min(source.size, at + scan), version=source.version or None)
            nl = chunk.find(b"\n")
            if nl >= 0:
                end = at + nl + 1
                break
            at += len(chunk)
            if at >= source.size or not chunk:
                end = source.size
                break
        pieces.append(Piece(start, end))
        start = end
    return pieces


def find_sources(paths: list[str], exclude: list[str] = (), accept: Callable[[str], bool] | None = None,
                 skip: Callable[[str], str | None] | None = None) -> list[Source]:
    """The input objects under some files, folders or ``gs://`` prefixes, as ``fleet plan`` finds
    them (for a job's own tools: a vocab trained over a corpus, a pre-flight look). Inside a
    folder, ``skip(name)`` says why a file is not input (``Job.skip_reason``), or ``accept(name)``
    only whether; the files skipped are named in warnings, a line a reason."""
    from fleet.core.sources import find_sources as find, survey

    if skip is not None:
        return survey(paths, exclude, skip).sources
    return find(paths, exclude, accept) if accept is not None else find(paths, exclude)


def tfrecord_records(f: BinaryIO):
    """The records of a TFRecord stream, both checksums checked (``fleet.core.tfexample``: the one
    reader of the format, which the run's readers use too)."""
    from fleet.core.tfexample import records

    return records(f)


def parse_example(data: bytes) -> dict:
    """A serialized ``tf.train.Example`` -> {name: int64 or float32 array, or list of bytes}."""
    from fleet.core.tfexample import parse_example as parse

    return parse(data)


def item_seed(run_seed: int, item_id: str) -> int:
    digest = hashlib.sha256(f"{run_seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _coerce(name: str, tp: Any, value: Any) -> Any:
    if isinstance(tp, str):
        tp = {"int": int, "float": float, "bool": bool, "str": str}.get(tp.split("|")[0].strip(), str)
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or value == "":
            return None
        tp = args[0]
    if tp is bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"option {name}: expected true or false, got {value!r}")
    if tp in (int, float):
        try:
            return tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"option {name}: expected a number, got {value!r}") from None
    return str(value) if value is not None else None


# The run's seed goes to every item's seed and RNG: a signed 64-bit integer that is not negative is
# what numpy (no negative seeds), TensorFlow (int64) and a JSON reader of run.json all take as it is.
SEED_RANGE = (0, (1 << 63) - 1)


def option_range(f: dataclasses.Field) -> tuple[float, float] | None:
    """The (low, high) an option declares with ``field(metadata={"range": (low, high)})``, both
    included; the option ``seed`` has SEED_RANGE unless it declares its own (Job.seed reads it)."""
    declared = f.metadata.get("range")
    if declared is not None:
        return declared
    return SEED_RANGE if f.name == "seed" else None


def _in_range(name: str, value: Any, bounds: tuple[float, float] | None) -> Any:
    if bounds is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    low, high = bounds
    if not low <= value <= high:  # NaN too
        raise ConfigError(f"option {name}: {value!r} is out of range: give {low} to {high}")
    return value


def parse_dataclass(cls: type, values: Mapping[str, Any]) -> Any:
    """The config from option values, each coerced to its field's type and checked against the
    range it declares (``option_range``): one line naming the option, never a traceback."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    kwargs = {k: _in_range(k, _coerce(k, hints.get(k, str), v), option_range(fields[k])) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e)) from None


def available_jobs() -> list[str]:
    """Jobs by discovery: the packages under fleet_jobs/ that define JOB (a shared library there,
    which defines none, is not a job), and ``fleet.jobs`` entry points."""
    import fleet_jobs as _jobs_pkg  # the jobs package is found by discovery, not by name

    names = []
    for path in _jobs_pkg.__path__:
        for entry in sorted(os.listdir(path)):
            init = os.path.join(path, entry, "__init__.py")
            if os.path.isfile(init) and not entry.startswith(("_", ".")) and _defines_job(init):
                names.append(entry)
    try:
        from importlib.metadata import entry_points

        names += [ep.name for ep in entry_points(group="fleet.jobs")]
    except Exception:
        pass
    return sorted(set(names))


def _defines_job(init: str) -> bool:
    """Whether a package's ``__init__.py`` binds the name ``JOB`` at top level (an assignment or
    an import), read without importing it: a word in a docstring or comment does not count."""
    import ast

    try:
        with open(init, encoding="utf-8") as f:
            tree = ast.parse(f.read(), init)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "JOB" for t in targets):
                return True
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "JOB" for a in node.names):
            return True
    return False


def _may_declare_entry_points(group: str) -> bool:
    """Whether an installed distribution may declare entry points in ``group``: a look for the
    group's name in each ``entry_points.txt`` on sys.path (1 ms), where importlib.metadata costs
    0.04 s of CPU in every process that loads a job (its import, then every distribution's
    metadata read and parsed). Where it cannot tell (a zip or an egg file on sys.path, a finder
    of distributions other than the path's), it says yes and importlib.metadata decides."""
    from importlib.machinery import PathFinder

    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return True
    needle = group.encode()
    for entry in sys.path:
        root = entry or "."
        try:
            names = os.listdir(root)
        except NotADirectoryError:
            return True
        except OSError:  # gone, or not a folder that can be listed: importlib.metadata finds nothing there
            continue
        egg = root.lower().endswith(".egg")
        for child in names:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")) or (egg and low == "egg-info"):
                try:
                    with open(os.path.join(root, child, "entry_points.txt"), "rb") as f:
                        if needle in f.read():
                            return True
                except OSError:  # none (or a PKG-INFO file): no entry points
                    continue
    return False


def load_job(name: str) -> Job:
    """Discovery: a ``fleet.jobs`` entry point, else the module ``fleet_jobs.<name>``."""
    if _may_declare_entry_points("fleet.jobs"):
        from importlib.metadata import entry_points

        for ep in entry_points(group="fleet.jobs"):
            if ep.name == name:
                return ep.load()
    if ":" in name:  # an out-of-tree job: "package.module:ATTR"
        module_name, _, attr = name.partition(":")
        if not (all(part.isidentifier() for part in module_name.split(".")) and attr.isidentifier()):
            raise JobNotFound(f"job {name!r}: expected package.module:NAME (an out-of-tree job) or the name of "
                              "a job under fleet_jobs/ (`fleet jobs` lists them)")
        try:
            job = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise JobNotFound(f"job {name!r}: {e}") from None
        if not isinstance(job, Job):
            raise JobNotFound(f"job {name!r} is not a fleet.job.Job")
        return job
    if not name.isidentifier():
        raise JobNotFound(f"unknown job {name!r} (available: {', '.join(available_jobs()) or 'none'})")
    try:
        module = importlib.import_module(f"fleet_jobs.{name}")
    except ModuleNotFoundError as e:
        if e.name in (f"fleet_jobs.{name}", "fleet_jobs"):
            known = ", ".join(available_jobs()) or "none"
            raise JobNotFound(f"unknown job {name!r} (available: {known})") from None
        raise
    job = getattr(module, "JOB", None)
    if not isinstance(job, Job):
        raise JobNotFound(f"fleet_jobs.{name} does not define JOB, a fleet.job.Job")
    return job


@dataclass(frozen=True)
class OptionHelp:
    name: str
    type: str
    default: Any
    help: str


def describe_options(config_type: type) -> list[OptionHelp]:
    """A job's options from its config dataclass: name, type, default and one line of help,
    from ``field(metadata={"help": ...})`` or else the comment at the end of the field's line,
    then the range the option takes (``option_range``), if any."""
    import inspect
    import io
    import textwrap
    import tokenize

    comments: dict[str, str] = {}
    try:
        source = textwrap.dedent(inspect.getsource(config_type))
        pending = None
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and pending is None:
                pending = (tok.string, tok.start[0])
            elif tok.type == tokenize.COMMENT and pending and tok.start[0] == pending[1]:
                comments[pending[0]] = tok.string[1:].strip()
            if tok.type == tokenize.NEWLINE:
                pending = None
    except (OSError, TypeError, tokenize.TokenError, IndentationError):
        pass
    hints = typing.get_type_hints(config_type)
    out = []
    for f in dataclasses.fields(config_type):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        kind = hints.get(f.name, str)
        name = getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
        text = f.metadata.get("help") or comments.get(f.name, "")
        bounds = option_range(f)
        if bounds is not None:  # what parse_dataclass takes, where `fleet jobs` shows it
            text = f"{text} ({bounds[0]} to {bounds[1]})".strip()
        out.append(OptionHelp(f.name, name, default, text))
    return out

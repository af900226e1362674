"""A run: its spec (run.json) and its immutable list of work items.

Both are written once, create-only, by ``fleet plan``; every worker reads
them, so a worker never needs anything but the bucket URL and the run name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from fleet.core.discovery import load_job, resolve_job
from fleet.core.errors import ConfigError
from fleet.core.item import ItemInput, Opener, Piece, Source, printable
from fleet.core.job import Job
from fleet.core.stage import Stage, StageOptions
from fleet.core.layout import LOCAL_RUN, OUTPUT_PREFIX, RUNS, STATE_DIR, items_name, run_of_spec, spec_name
from fleet.core.records import JsonRecord
from fleet.core import shuffle
from fleet.core.shuffle import Combine, CombineRule, combine_groups, partitions_for, plan_combine
from fleet.core.sources import survey, warn_skipped
from fleet.core.store import BucketNotFound, NotFound, PreconditionFailed, Store, open_store, read_url

log = logging.getLogger("fleet.plan")


class PlanError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Item:
    """A work item: a piece of one input object (see fleet.job.Piece), pinned to the object's
    version, with the id its lease and outputs are named by. ``meta`` is the job's own.

    A grouped item (a job that takes grouping: Job.group_small_files) holds several whole small
    files instead: ``parts``, each an Item without id of one file, in the order they were found;
    its own ``url`` is the first part's, ``name`` is empty and ``size`` their sum."""

    url: str
    name: str
    start: int
    end: int
    version: str = ""
    id: str = ""
    size: int = 0  # bytes of work: what progress and the run's input_bytes count
    meta: dict[str, Any] = field(default_factory=dict)
    # Its step in the run's chain (see StepPlan): 0 the map over the inputs; then per stage its
    # combine step (if planned), its barrier and its items. A step opens when all before are done.
    step: int = 0
    parts: tuple["Item", ...] = ()

    @property
    def pieces(self) -> tuple["Item", ...]:
        """The pieces of input files this item reads: its parts, or itself (a map item of one file)."""
        return self.parts or (self,)

    @property
    def file(self) -> str:
        """The input file (a grouped item's first: see ``pieces`` for all)."""
        if self.parts:
            return self.parts[0].file
        return printable(f"{self.url.rstrip('/')}/{self.name}")

    @property
    def display(self) -> str:
        """Where the item's input is, for log lines and errors."""
        if self.step:
            stage = self.meta.get("stage", "")
            if self.meta.get("barrier"):
                return f"the index of stage {stage}"
            if self.meta.get("combine"):
                (lo, hi), (p1, p2) = self.meta.get("items", (0, 0)), self.meta.get("partitions", (0, 0))
                return (
                    f"stage {stage}, combine {self.meta.get('part', 0) + 1} of {self.meta.get('of', 0)} "
                    f"(the step before's items {lo + 1}-{hi}, partitions {p1}-{p2 - 1})"
                )
            return f"stage {stage}, item {self.meta.get('part', 0) + 1} of {self.meta.get('of', 0)}"
        if self.parts:
            return f"{len(self.parts):,} files, {self.parts[0].file} to {self.parts[-1].file}"
        unit = self.meta.get("unit")
        if unit:
            return f"{self.file} ({unit} {self.start}-{self.end - 1})"
        return f"{self.file} (from byte {self.start})" if self.start else self.file

    def input(self) -> ItemInput:
        parts = [p.input() for p in self.parts]
        return ItemInput(self.url, self.name, self.start, self.end, self.version, self.meta, self.display, parts)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Item":
        known = {f.name for f in dataclasses.fields(cls)}
        if "size" not in d:  # planned before items said their size: the text job's own keys were top-level
            meta = {k: v for k, v in d.items() if k not in known}
            size = meta.pop("text_bytes", 0) or d["end"] - d["start"]
            if meta.get("format") == "parquet":
                meta["unit"] = "row groups"
            d = {**{k: v for k, v in d.items() if k in known}, "size": size, "meta": meta}
        if "parts" in d:  # a part's url is its item's unless it says otherwise (_item_dict)
            d = {**d, "parts": tuple(cls(**{"url": d["url"], "start": 0, **p}) for p in d["parts"])}
        return cls(**d)


def group_pieces(
    cuts: list[tuple[Source, list[Piece]]], item_bytes: int, max_files: int = 0
) -> list[list[tuple[Source, Piece]]]:
    """The items' pieces, in order, from each input's pieces (Job.cut): a file the job left in one
    piece smaller than ``item_bytes`` is packed with the small files next to it, in the order
    found, into items of at most ``item_bytes`` (and ``max_files``, 0: MAX_GROUP_FILES). A file
    of several pieces, or one as big as an item, is never packed with others, its tail piece
    included: it breaks the run of small files, so every item's files stay in input order."""
    max_files = max_files or MAX_GROUP_FILES
    out: list[list[tuple[Source, Piece]]] = []
    group: list[tuple[Source, Piece]] = []
    total = 0
    for source, pieces in cuts:
        small = len(pieces) == 1 and _work(pieces[0]) < item_bytes
        if group and (not small or total + _work(pieces[0]) > item_bytes or len(group) >= max_files):
            out.append(group)
            group, total = [], 0
        if small:
            group.append((source, pieces[0]))
            total += _work(pieces[0])
        else:
            out += [[(source, p)] for p in pieces]
    if group:
        out.append(group)
    return out


def _work(piece: Piece) -> int:
    return piece.size or piece.end - piece.start


# Files an item holds at most: what a worker reads one request each, and what the item's line in
# items.jsonl and its per-file counts (fleet.core.manifest) hold, stay bounded whatever --item-mb.
MAX_GROUP_FILES = 10_000
# How a run's small files became items (RunSpec.group_files): 0 each file its own items, as every run
# planned before grouping was (resumed as planned); 1 packed by group_pieces.
GROUPED = 1


@dataclass(frozen=True)
class RunSpec(JsonRecord):
    run: str
    job: str
    config: dict[str, Any]
    output: str
    code_version: str
    lease_ttl: float = 300.0
    max_attempts: int = 3
    items: int = 0
    input_bytes: int = 0
    # What the outputs depend on besides the inputs (pinned in the items): the sha256 of
    # every file a job option names, by option. A run refuses to go on with other contents.
    files: dict[str, str] = field(default_factory=dict)
    read: dict[str, Any] = field(default_factory=dict)  # the job's read options (Job.check_read), opaque here
    shards: int = 0  # --shards, as given (0: none)
    dedup: str = ""  # --dedup, as given
    stages: list[dict[str, Any]] = field(default_factory=list)  # the job's stages after the map (fleet.job.Stage)
    # Per stage, its combine step as planned (fleet.core.shuffle.Combine); [] for none at all, as
    # every run planned before combine steps existed: a run keeps the structure it was planned with.
    combine: list[dict[str, int]] = field(default_factory=list)
    # Memory a stage's sort holds before it spills to local disk: it changes no output byte.
    shuffle_budget: int = field(default=256 << 20, compare=False)
    item_bytes: int = field(default=0, compare=False)  # the target the items were cut to
    # How files smaller than an item became items: 0 (each its own, as in every run planned before
    # grouping, which resumes as planned), GROUPED (packed: group_pieces). What the items say, kept
    # so that a run is planned again by its own rule.
    group_files: int = 0
    # What became of every file found under the inputs: read, or skipped with a reason, files and
    # bytes (fleet.core.accounting.InputAccount.to_dict). Not compared: a README added since
    # changes no output; {} in a run planned before accounts were kept.
    input_files: dict[str, Any] = field(default_factory=dict, compare=False)
    created: float = field(default=0.0, compare=False)


def output_place(spec: RunSpec, state: Store) -> str:
    """Where the run's outputs are, for a run whose state is ``state``. A `fleet local` run keeps its
    state in its output folder (OUT_DIR/.fleet, run ``local``): its outputs are in the folder that
    holds that state now, wherever the run was planned (``spec.output`` names the place then), so a
    copied or moved OUT_DIR is read, checked and resumed in itself, never in the folder it came from.
    Any other run's outputs are where it was planned to write them."""
    root = state.url
    if spec.run != LOCAL_RUN or "://" in root or "://" in spec.output or os.path.basename(root) != STATE_DIR:
        return spec.output
    return os.path.dirname(root)


MAP, COMBINE, BARRIER, ITEMS = "map", "combine", "barrier", "items"  # the kinds of step (StepPlan)


@dataclass(frozen=True)
class Step:
    kind: str  # MAP, COMBINE, BARRIER or ITEMS
    stage: Stage | None = None  # the stage it belongs to (None: the map)


class StepPlan:
    """The run's chain of steps, from its spec (never from this code's defaults, so a run planned
    by older code keeps its own): step 0 the map over the inputs, then per stage the job asked
    for (Job.stages) its combine step if the plan gave it one (items that each merge a fixed group
    of the files of the step before: fleet.core.shuffle), its barrier (one item: checks that every
    item before is done and indexes their records) and its items. Without combine steps, stage g
    is step 2g-1 (its barrier) and 2g (its items), as before combine steps existed."""

    def __init__(self, spec: "RunSpec"):
        self.stages = [Stage(**s) for s in spec.stages]
        combines = self.combines = [Combine(**c) for c in spec.combine]
        self.steps = [Step(MAP)]
        for g, stage in enumerate(self.stages):
            combine = combines[g] if g < len(combines) else Combine()
            if combine:
                self.steps.append(Step(COMBINE, stage))
            self.steps += [Step(BARRIER, stage), Step(ITEMS, stage)]

    @property
    def last(self) -> int:
        return len(self.steps) - 1

    def kind(self, step: int) -> str:
        return self.steps[step].kind

    def name(self, step: int) -> str:
        """The step's name for status rows and ``ItemContext.stage``: "map", a stage's name (its
        barrier and items), or "<stage> combine"."""
        s = self.steps[step]
        if s.stage is None:
            return "map"
        return f"{s.stage.name} combine" if s.kind == COMBINE else s.stage.name

    def stage(self, step: int) -> Stage | None:
        """The stage whose items this step is, else None."""
        s = self.steps[step]
        return s.stage if s.kind == ITEMS else None

    def feeds(self, step: int) -> str:
        """The stage whose combine step or barrier reads this step's items' records; "" for the
        run's outputs (and for a barrier, which writes an index)."""
        s = self.steps[step]
        if s.kind == COMBINE:
            return self.stage_of(step).name
        if s.kind == BARRIER or step == self.last:
            return ""
        return self.stage_of(step + 1).name

    def stage_of(self, step: int) -> Stage:
        """The stage a step after the map belongs to (only the map's step has none)."""
        stage = self.steps[step].stage
        if stage is None:
            raise PlanError(f"step {step} of the run belongs to no stage: its plan is damaged")
        return stage

    def combine_of(self, step: int) -> Combine:
        """The combine step the stage of ``step`` reads through (``Combine()``: none)."""
        stage = self.steps[step].stage
        g = next((i for i, s in enumerate(self.stages) if s is stage), None)
        return self.combines[g] if g is not None and g < len(self.combines) else Combine()

    def partitions(self, step: int) -> int:
        """How many key ranges the records of a step feeding a stage are cut into."""
        nxt = self.stage_of(step if self.steps[step].kind == COMBINE else step + 1)
        return partitions_for(nxt.items, nxt.balanced)


def plan_combines(rule: CombineRule, stages: list[Stage], map_items: int, input_bytes: int) -> list[Combine]:
    """Each stage's combine step by ``rule`` (fleet.core.shuffle.plan_combine); [] when none gets one.
    The items of the step before a stage: the map's, or the stage before's; their records'
    bytes estimated as the input's bytes spread over them."""
    out, producers = [], map_items
    for stage in stages:
        out.append(
            plan_combine(
                rule,
                producers,
                partitions_for(stage.items, stage.balanced),
                stage.items,
                input_bytes / max(1, producers),
            )
        )
        producers = stage.items
    return out if any(out) else []


def stage_items(stages: list[Stage], map_items: int, combines: Sequence[Combine] = ()) -> list[Item]:
    """The items of the steps after the map: per stage its combine items (if ``combines`` gives it
    a step: meta ``items`` the positions of the files each merges among the step before's items,
    ``partitions`` its key block), a barrier, then the stage's items. The last stage's items name
    the run's outputs, ``part-00003-of-00016...``. Without combine steps, the items of before."""
    out: list[Item] = []
    step, producers = 0, map_items
    for g, stage in enumerate(stages):
        if stage.rereads and stage.items != map_items:
            raise PlanError(
                f"stage {stage.name} rereads the map's inputs: it needs {map_items} items, not {stage.items}"
            )
        combine = combines[g] if g < len(combines) else Combine()
        if combine:
            step += 1
            groups = combine_groups(producers, combine, partitions_for(stage.items, stage.balanced))
            width = max(5, len(str(len(groups) - 1)))
            for k, ((lo, hi), (p1, p2)) in enumerate(groups):
                out.append(
                    Item(
                        "",
                        "",
                        lo,
                        hi,
                        id=f"{stage.name}-combine-{k:0{width}d}",
                        step=step,
                        meta={
                            "stage": stage.name,
                            "combine": True,
                            "part": k,
                            "of": len(groups),
                            "items": [lo, hi],
                            "partitions": [p1, p2],
                        },
                    )
                )
        step += 1
        out.append(Item("", "", 0, 0, id=f"{stage.name}-index", step=step, meta={"stage": stage.name, "barrier": True}))
        step += 1
        width = max(5, len(str(stage.items - 1)))
        last = g == len(stages) - 1
        for k in range(stage.items):
            item_id = f"{k:0{width}d}-of-{stage.items:0{width}d}" if last else f"{stage.name}-{k:0{width}d}"
            out.append(
                Item("", "", k, k + 1, id=item_id, step=step, meta={"stage": stage.name, "part": k, "of": stage.items})
            )
        producers = stage.items
    return out


def check_stage_options(options: StageOptions) -> None:
    """The form of --shards and --dedup (what they mean is the job's: Job.stages)."""
    if isinstance(options.shards, bool) or not isinstance(options.shards, int) or options.shards < 0:
        raise PlanError(f"--shards {options.shards}: give a number of output files, 1 or more")
    if options.shards > MAX_SHARDS:
        raise PlanError(f"--shards {options.shards}: give at most {MAX_SHARDS:,}")
    if not isinstance(options.dedup, str):
        raise PlanError(f"--dedup {options.dedup!r}: give a mode (exact, near or exact,near)")


MAX_SHARDS = 100_000


def check_run_name(run: str) -> None:
    if not run or not all(c.isalnum() or c in "-_." for c in run) or run.startswith("."):
        raise PlanError(f"run name {run!r}: use letters, digits, '-', '_' and '.' only")


def make_items(
    job: Job,
    config: Any,
    inputs: list[Source],
    item_bytes: int,
    read: Mapping[str, Any] | None = None,
    group: bool = False,
    max_files: int = 0,
) -> list[Item]:
    """Cut every input into items of about item_bytes, as the job says (Job.cut); with ``group``,
    whole files smaller than an item packed together (group_pieces, ``max_files`` at most).

    Files in a bucket are looked at in parallel: a job's cut may read a file's first bytes, and on
    gs:// a corpus of thousands of shards would otherwise plan at one request at a time. Local
    files are looked at in turn: threads only contend for the interpreter there (20,000 one-line
    files: 2.0 s of CPU with 16 threads, 1.0 s without)."""
    from concurrent.futures import ThreadPoolExecutor

    nonempty = []
    for inp in inputs:
        if inp.size == 0:  # shown on stderr even where logging is not set up (logging.lastResort)
            log.warning("warning: %s: empty file, nothing to convert; skipped", inp.display)
        else:
            nonempty.append(inp)
    options = dict(read or {})

    def cut(inp: Source) -> tuple[Source, list[Piece]]:
        return inp, list(job.cut(inp, item_bytes, config, options))

    if any("://" in inp.url for inp in nonempty):
        with ThreadPoolExecutor(max(1, min(16, len(nonempty)))) as pool:
            cuts = list(pool.map(cut, nonempty))
    else:
        cuts = [cut(inp) for inp in nonempty]
    units = group_pieces(cuts, item_bytes, max_files) if group else [[(inp, p)] for inp, ps in cuts for p in ps]
    width = max(5, len(str(len(units) - 1)))
    items = []
    for i, unit in enumerate(units):
        pieces = [Item(inp.url, inp.name, p.start, p.end, inp.version, "", _work(p), dict(p.meta)) for inp, p in unit]
        if len(pieces) == 1:
            items.append(dataclasses.replace(pieces[0], id=f"{i:0{width}d}"))
        else:
            items.append(
                Item(pieces[0].url, "", 0, 0, "", f"{i:0{width}d}", sum(p.size for p in pieces), parts=tuple(pieces))
            )
    return items


def check_numbers(lease_ttl: float, max_attempts: int, item_bytes: int) -> None:
    """The numbers a plan is made of, checked before they can loop, starve or fail workers."""
    if not lease_ttl >= 1:  # (also catches NaN)
        raise PlanError(f"lease TTL {lease_ttl} s: give at least 1 second (the default is 300 on GCP, 60 locally)")
    if max_attempts < 1:
        raise PlanError(f"max attempts {max_attempts}: give 1 or more")
    if not item_bytes >= 1:
        raise PlanError(f"item size {item_bytes / 1e6:g} MB: give a positive size (a few MB to 64 MB is usual)")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pin_files(job: Job, config: Any, opener: Opener = read_url) -> dict[str, str]:
    """The digest of every file the job's options name (a vocab), by option."""
    pins = {}
    for option, url in job.files(config).items():
        try:
            pins[option] = digest(opener(url))
        except Exception as e:  # the opener's errors differ by store; all mean "cannot read it"
            raise ConfigError(f"cannot read {option} {url}: {e}") from None
    return pins


def pinned_opener(spec: RunSpec, job: Job, config: Any, opener: Opener = read_url) -> Opener:
    """An opener for workers that refuses a file whose contents differ from what the run pinned:
    a vocab replaced mid-run would otherwise mix records of two vocabularies in one run."""
    pins = {url: (option, spec.files[option]) for option, url in job.files(config).items() if option in spec.files}

    def open_pinned(url: str) -> bytes:
        data = opener(url)
        if url in pins:
            option, want = pins[url]
            got = digest(data)
            if got != want:
                raise ConfigError(
                    f"{option} {url} changed since run {spec.run!r} was planned "
                    f"({want[:19]}... then, {got[:19]}... now); restore it, or plan a new run"
                )
        return data

    return open_pinned


def _short(version: str) -> str:
    return version.replace(",", ", ") if version else "unknown"


def _item_differences(old: list[Item], new: list[Item]) -> list[str]:
    """What differs between two item lists, by input file, in words. The items of later stages
    read no input file: they follow from the spec's stages, whose differences say it."""

    def by_file(items: list[Item]) -> dict[str, list[tuple[str, Item]]]:
        out: dict[str, list[tuple[str, Item]]] = {}
        for item in items:
            if not item.step:
                for piece in item.pieces:
                    out.setdefault(piece.file, []).append((item.id, piece))
        return out

    before, after = by_file(old), by_file(new)
    out = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None:
            out.append(f"{name} is a new input")
        elif b is None:
            out.append(f"{name} is no longer an input")
        elif a[0][1].version != b[0][1].version:
            out.append(f"{name} changed ({_short(a[0][1].version)} then; {_short(b[0][1].version)} now)")
        elif [(p.start, p.end, i) for i, p in a] != [(p.start, p.end, i) for i, p in b]:
            out.append(f"{name} is cut into other items ({_items_of(a)} then, {_items_of(b)} now: another item size?)")
    return out or ["the item list differs"]


def _items_of(pieces: list[tuple[str, Item]]) -> str:
    ids = list(dict.fromkeys(i for i, _ in pieces))
    return f"item {ids[0]}" if len(ids) == 1 else f"{len(ids)} items"


def _spec_differences(old: RunSpec, new: RunSpec) -> list[str]:
    out = []
    for option in sorted(set(old.config) | set(new.config)):
        a, b = old.config.get(option), new.config.get(option)
        if a != b:
            out.append(f"option {option} is {b!r}, was {a!r}")
    for option in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(option), new.files.get(option)
        if a != b and old.config.get(option) == new.config.get(option):
            out.append(
                f"{option} {new.config.get(option)} has other contents ({(a or 'none')[:19]}... then, "
                f"{(b or 'none')[:19]}... now)"
            )
    for key in sorted(set(old.read) | set(new.read)):
        if old.read.get(key) != new.read.get(key):
            out.append(f"{key.replace('_', ' ')} is {new.read.get(key)!r}, was {old.read.get(key)!r}")
    for f in dataclasses.fields(RunSpec):
        if f.compare and f.name not in ("config", "files", "items", "input_bytes", "run", "read", "stages", "combine"):
            a, b = getattr(old, f.name), getattr(new, f.name)
            if a != b:
                out.append(f"{f.name.replace('_', ' ')} is {b!r}, was {a!r}")
    return out


@dataclass(frozen=True)
class PlanRequest:
    """What a run is planned from: what `fleet plan` and `fleet local` ask of plan(). The bucket
    that holds the run's state is plan()'s other argument: where the run is kept, not what it is.
    Its checks are plan()'s (check_run_name, check_numbers, Job.check_read...), so that a request
    built anywhere, by the CLI or a test, is refused for the same reasons."""

    run: str  # the run's name: its folder runs/<run>/ in the bucket (check_run_name)
    job: str  # the job: a folder under fleet_jobs/, or module:ATTR (fleet.core.discovery.load_job)
    inputs: Sequence[str]  # files or folders, local or gs://, as given (--input, fleet local's INPUT...)
    output: str  # where the outputs go: gs://BUCKET/prefix or a local folder
    # The code snapshot the run is pinned to (fleet.core.codesync.code_version): no default, a
    # worker of other code must not touch the run (check_pinned).
    code_version: str
    settings: Mapping[str, str] = field(default_factory=dict)  # the job's options as --set gives them, unparsed
    lease_ttl: float = 300.0  # seconds a lease lives without renewal (fleet local: 60)
    max_attempts: int = 3  # attempts per item before it is marked failed
    # Target bytes of input per item; or a function of the inputs' total size, to pick it once
    # they are found (fleet local: a few items per worker, auto_item_bytes).
    item_bytes: int | Callable[[int], int] = 64 << 20
    # Files or folders under the inputs that are not inputs (fleet local: OUT_DIR, which may lie
    # inside an input folder and must not be read as one).
    exclude: Sequence[str] = ()
    # What to do instead when the run was planned differently: the end of the refusal's message.
    again: str = "plan it under another run name"
    # The job's read options (--text-column, --keep-titles...): the job checks them (Job.check_read).
    read: Mapping[str, Any] = field(default_factory=dict)
    stage_options: StageOptions = StageOptions()  # --shards, --dedup: the stages after the map (Job.stages)
    shuffle_budget: int = 256 << 20  # memory a stage's sort holds before it spills: it changes no output byte
    # When a stage gets a combine step; None: fleet.core.shuffle.COMBINE_RULE, looked up when it
    # plans. A run planned already keeps the steps it was planned with (none, if older code planned it).
    combine: CombineRule | None = None


def plan(bucket: str, request: PlanRequest) -> tuple[RunSpec, list[Item], bool]:
    """Write run.json and the items of ``request`` to ``bucket``; returns (spec, items, created_now).

    Planning the same run again with the same inputs, file contents and options is a
    no-op, so `fleet local` can resume; anything else is refused, naming what differs
    (``request.again`` says what to do instead), rather than mixed into one run.
    """
    r = request
    item_bytes = r.item_bytes  # (a function of the inputs' size: called once they are found)
    check_run_name(r.run)
    check_numbers(r.lease_ttl, r.max_attempts, item_bytes if isinstance(item_bytes, int) else 1)
    check_stage_options(r.stage_options)
    chosen = resolve_job(r.job, r.settings)  # a former name (format=bert) as the job it became
    job_name = chosen.job
    job = load_job(job_name)
    config = job.parse_config(chosen.settings)
    read = job.check_read(r.read)
    job.check(config, read_url)
    files = pin_files(job, config)
    surveyed = survey(list(r.inputs), list(r.exclude), job.skip_reason, warn=False)
    found, account = surveyed.sources, surveyed.account
    if not isinstance(item_bytes, int):  # chosen from the corpus size (fleet local: a few items per worker)
        item_bytes = item_bytes(sum(f.size for f in found))
    if r.output.startswith("gs://"):
        # A missing or unreadable output bucket would otherwise show only at each item's upload.
        next(iter(open_store(r.output).list("")), None)
    store = open_store(bucket)
    old_spec = _with_new_defaults(job, _read_spec(store, r.run))
    old_items = store.read(items_name(r.run)) if old_spec is not None or store.stat(items_name(r.run)) else None
    # A run planned before is planned again by its own rule: one planned before grouping (no
    # group_files in its run.json) keeps its items, and resumes, instead of being grouped. (A plan
    # cut short after its items: what they show.)
    if old_spec is not None:
        group_files = old_spec.group_files
    elif old_items is not None:
        group_files = GROUPED if any(i.parts for i in _parse_items(store, r.run, old_items)) else 0
    else:
        group_files = GROUPED if job.group_small_files else 0
    items = make_items(job, config, found, item_bytes, read, group=group_files == GROUPED)
    if not items:
        raise PlanError(f"{', '.join(map(printable, r.inputs))}: the inputs hold no data")
    # Asked without stage options too: a job may refuse an option that needs them.
    stages = job.stages(config, r.stage_options, len(items))
    combines: list[Combine] = []
    if stages:
        stage_dicts = [s.as_dict() for s in stages]
        if old_spec is not None and old_spec.stages == stage_dicts:  # its own structure, not today's rule
            combines = [Combine(**c) for c in old_spec.combine]
        else:
            combines = plan_combines(r.combine or shuffle.COMBINE_RULE, stages, len(items), sum(i.size for i in items))
        items += stage_items(stages, len(items), combines)
    spec = RunSpec(
        run=r.run,
        job=job_name,
        config=dataclasses.asdict(config),
        output=r.output,
        code_version=r.code_version,
        lease_ttl=r.lease_ttl,
        max_attempts=r.max_attempts,
        items=len(items),
        input_bytes=sum(i.size for i in items),
        files=files,
        read=read,
        shards=r.stage_options.shards,
        dedup=r.stage_options.dedup,
        stages=[s.as_dict() for s in stages],
        combine=[dataclasses.asdict(c) for c in combines],
        shuffle_budget=r.shuffle_budget,
        item_bytes=item_bytes,
        group_files=group_files,
        input_files=account.to_dict(),
        created=time.time(),
    )
    items_blob = b"".join(json.dumps(_item_dict(i), sort_keys=True).encode() + b"\n" for i in items)
    differences = []
    if old_spec is not None and old_spec != spec:
        differences += _spec_differences(old_spec, spec)
    if old_items is not None and old_items != items_blob:
        differences += _item_differences(_parse_items(store, r.run, old_items), items)
    if differences:
        shown = differences[:6] + ([f"and {len(differences) - 6} more"] if len(differences) > 6 else [])
        raise PlanError(
            f"run {r.run!r} in {store.url} was planned differently: {'; '.join(shown)}. "
            f"Its outputs must not mix with these: {r.again}"
        )
    if old_spec is None and old_items is None:
        _check_output_is_free(r.output)
    created = old_items is None
    if old_items is None:
        try:
            store.write(items_name(r.run), items_blob, if_generation_match=0)
        except PreconditionFailed:  # another planner got there first: theirs must be ours
            created = False
            if store.read(items_name(r.run)) != items_blob:
                raise PlanError(f"run {r.run!r} in {store.url} was just planned with other inputs; {r.again}") from None
    if old_spec is None:
        try:
            store.write(spec_name(r.run), spec.to_json(), if_generation_match=0)
        except PreconditionFailed:
            old_spec = _read_spec(store, r.run)
            if old_spec != spec:
                raise PlanError(
                    f"run {r.run!r} in {store.url} was just planned with other options; {r.again}"
                ) from None
    warn_skipped(account)  # (only now: a plan refused is its one line)
    return (old_spec or spec), items, created


def _with_new_defaults(job: Job, spec: RunSpec | None) -> RunSpec | None:
    """A run planned before the job had some option holds no value for it: it ran with what is
    now the option's default (a new option must keep the old behaviour by default), so it resumes
    as planned instead of being refused as "planned differently"."""
    if spec is None:
        return None
    try:
        full = dataclasses.asdict(job.parse_config(spec.config))
    except (ConfigError, TypeError, ValueError):  # an option since removed: a real difference, named below
        return spec
    known = {k: v for k, v in full.items() if k not in spec.config}
    return dataclasses.replace(spec, config={**spec.config, **known}) if known else spec


def _item_dict(item: Item) -> dict[str, Any]:
    """An item as its line in items.jsonl; a map item's as before steps and groups existed, so that
    a run planned then plans the same bytes now and resumes. A grouped item's parts leave out what
    Item.from_dict fills in: the url when it is the item's, a start of 0, and the fields of items.
    (Built field by field: dataclasses.asdict's deep copy of 10,000 parts cost a second.)"""
    d = {f.name: getattr(item, f.name) for f in _ITEM_FIELDS}
    if item.step:
        d["step"] = item.step
    if item.parts:
        d["parts"] = [_part_dict(part, item.url) for part in item.parts]
    return d


def _part_dict(part: Item, url: str) -> dict[str, Any]:
    d = {f.name: getattr(part, f.name) for f in _ITEM_FIELDS if f.name != "id"}
    if part.url == url:
        del d["url"]
    if not part.start:
        del d["start"]
    return d


_ITEM_FIELDS = [f for f in dataclasses.fields(Item) if f.name not in ("step", "parts")]


def _check_output_is_free(output: str) -> None:
    """A new run must not write among another run's outputs: names repeat (part-00000...),
    and leftovers of a bigger run would be read as this one's."""
    try:
        store = open_store(output)
        taken = next((b.name for b in store.list(OUTPUT_PREFIX)), None)
    except NotFound:
        return
    if taken is not None:
        raise PlanError(
            f"{printable(output.rstrip('/'))}/{taken}: the output place already holds outputs of another "
            "run; give an empty or new output folder or prefix"
        )


def _read_spec(store: Store, run: str) -> RunSpec | None:
    try:
        data = store.read(spec_name(run))
    except BucketNotFound:
        raise
    except NotFound:
        return None
    try:
        spec = RunSpec.from_json(data)
    except (ValueError, TypeError) as e:
        raise PlanError(
            f"{store.url}/{spec_name(run)}: not a run spec ({e}); the bucket's run state is damaged"
        ) from None
    # A run planned under a job's former name (electra_zh_en with format=bert) is read as the job it
    # became, by every reader of its spec: the planner, the workers, status and the readers.
    if not isinstance(spec.config, dict):  # (damaged: the job's parse_config names it)
        return spec
    try:
        chosen = resolve_job(spec.job, spec.config)
    except ConfigError as e:
        raise PlanError(f"{store.url}/{spec_name(run)}: {e}") from None
    if chosen.job == spec.job and chosen.settings == spec.config:
        return spec
    return dataclasses.replace(spec, job=chosen.job, config=chosen.settings)


def load_spec(store: Store, run: str) -> RunSpec:
    spec = _read_spec(store, run)
    if spec is None:
        raise PlanError(f"no run {run!r} in {store.url} (plan it first with `fleet plan`)")
    return spec


def load_items(store: Store, run: str) -> list[Item]:
    return _parse_items(store, run, store.read(items_name(run)))


def _parse_items(store: Store, run: str, data: bytes) -> list[Item]:
    """The item list; what repeats from item to item (a file's URL, name and version, the job's
    meta) is held once, so a worker holds a million items in a few hundred MB, not 1.5 GB."""
    strings: dict[str, str] = {}
    metas: dict[tuple, dict] = {}

    def shared(d: dict) -> dict:
        for key in ("url", "name", "version"):
            if isinstance(d.get(key), str):
                d[key] = strings.setdefault(d[key], d[key])
        meta = d.get("meta")
        if isinstance(meta, dict):
            try:
                d["meta"] = metas.setdefault(tuple(sorted(meta.items())), meta)
            except TypeError:  # a value that is a list or a dict: kept as it is
                pass
        return d

    try:
        return [Item.from_dict(shared(json.loads(line))) for line in data.splitlines() if line.strip()]
    except (ValueError, TypeError) as e:
        raise PlanError(
            f"{store.url}/{items_name(run)}: not an item list ({e}); the bucket's run state is damaged"
        ) from None


def list_runs(store: Store) -> list[str]:
    return sorted({run for run in map(run_of_spec, (b.name for b in store.list(RUNS))) if run})

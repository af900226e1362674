"""The data path of MapReduce through the bucket: keyed records from map items to reduce items.

A map item's KeyedSink is a :class:`PartitionWriter`: it writes ONE partition file, uploaded as
the item's output. Once every map item of a stage is done, a barrier item reads each file's
header and writes an index (:func:`build_index`); each reduce item then reads its byte ranges of
the files and merges them (:func:`reduce_records`). Nothing here knows what a record means.

Partition file (one per map item), all integers big-endian::

    b"FLEETKV1"  u64 P  (P+1) x u64 offsets  P x u64 counts  partition 0 ... partition P-1

``offsets[k]`` is where partition k starts in the file (``offsets[0] == header_size(P)``,
``offsets[P]`` the file's end); ``counts[k]`` its number of records. A record is u64 key, u32
value length, value; a key belongs to partition ``(key * P) >> 64`` (equal key ranges), and each
partition's records are sorted by (key, value), so the whole file is sorted too. The bytes depend
only on the multiset of records emitted: not on their order, the memory budget or where the
writer spilled, so a retried map item rewrites the same file.

Index (one per stage boundary)::

    b"FLEETIX1"  u64 n  n bytes of JSON {partitions, pieces: [{item, name, version}], totals}
    (P+1) rows x (pieces) u64: row k holds, for each piece in order, where partition k starts in it

A reduce item needing partitions k1..k2 reads rows k1..k2+1 in ONE ranged read, rather than a
header per piece.

Requests to the store: the barrier does 1 ranged read per piece (its header, pinned to the
version the map item committed). A reduce item does 1 read of the index head (2 when the head
passes 64 KiB; a worker may keep the :class:`Index` for its next items), 1 read of its rows (none
when the whole index came with the head), then 1 download per piece whose range holds data: a
piece with nothing in the range costs no request.

The combine step: reads that grow with the data. Read straight from the map's M files, a stage
of S items makes about M x S ranged reads of D / (M x S) bytes each (D the records' bytes): at
1 TB in 64 MB items and ``--shards 1024``, 16 million reads of ~190 kB, which a new bucket serves
at ~5,000 a second. So a big stage gets a combine step before its barrier, planned once
(:func:`plan_combine`) and kept in the run's spec: combine item (j, b) merges a fixed group j of
G consecutive files of the step before, in key block b of NB equal blocks of partitions, into ONE
file of the same format (:func:`combine`; its partitions outside the block are empty). A stage
item then finds its range in the M/G files of its block. Reads: M (NB = 1: whole files) or
2 x M x NB (a header and the block's range) for the combine step, then S x M/G for the stage.
G makes a stage item's ranges ``read_min`` (4 MB) or more (G = S x read_min / (D/M), at most FANIN,
one merge pass, and M); NB keeps a combined file, and so a combine item's disk, under
``file_max`` (1 GB; NB = G x (D/M) / file_max, at most (D/M) / read_min so that each file's range
is read_min too). Every read is then a few MB, and reads come to at most ~3 x D / read_min + M:
they grow with the bytes, not with M x S. No step below ``min_reads`` (250,000 reads, ~50 s of a
new bucket's reads: about what a step costs) or when G comes out under 2. D/M is estimated as the
input bytes per item of the step before (records are ~1x the text for dedup, ~3x for electra's
examples: reads and files are then bigger than planned). docs/coordination.md models it at 1 TB.
Why this design: the combined file is exactly the partition file a PartitionWriter writes of the
same records, so the global (key, value) order, and every output byte, is the same with the step
or without; groups fixed at plan time make a retried combine item merge the same files (per-worker
combining would not); bigger map items make a retry costlier and hold more memory; blocks keep a
file bounded whatever S (one block would need S x read_min bytes a file).

Memory is bounded whatever the sizes: the writer buffers about ``budget`` bytes of records, then
sorts and spills them to a run file and merges the runs at the end; a reduce item downloads its
ranges to local files and merges them from disk. A merge reads each file through a buffer of at
most 1 MiB (about 16 MiB over all files), and merges at most ``FANIN`` files at once (more go
through intermediate merge passes, so open files stay bounded too). A combine item holds no
records in memory either: it merges its downloads from disk into its file, so its disk is the
bytes of its group in its block twice (downloads, then the file: at most ~2 x ``file_max`` as
planned).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
import json
import math
import os
import struct
import tempfile
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from fleet.core.store import Changed, NotFound, Store
from fleet.core.sink import KeyedSink

MAGIC = b"FLEETKV1"
INDEX_MAGIC = b"FLEETIX1"
SPLIT = 4  # partitions per reduce item of a balanced stage (see partitions_for)
FANIN = 128  # files merged at once; more go through intermediate passes
OVERHEAD = 128  # bytes a buffered record costs beyond its value (tuple, int key, bytes header, list slot)
KEYS = 1 << 64

_RECORD = struct.Struct(">QI")  # key, value length
_U64 = struct.Struct(">Q")
_BATCH = 4096  # records serialised, or merged between checkpoints, at a time
_MERGE_BUFFER = 16 << 20  # read buffers over all the files of one merge
_READ_MIN = 64 << 10  # read buffer of one file, at least
_INDEX_HEAD_READ = 64 << 10
_INDEX_HEAD_MAX = 1 << 30  # a head's length beyond this is damage, not pieces


class ShuffleError(Exception):
    """A partition file or index is bad, gone or changed: one line naming it."""


# -- records on disk ------------------------------------------------------------------------------


def _encode(records: list[tuple[int, bytes]]) -> bytes:
    pack = _RECORD.pack
    return b"".join([x for k, v in records for x in (pack(k, len(v)), v)])


def _batches(records: Iterable[tuple[int, bytes]]) -> Iterator[list[tuple[int, bytes]]]:
    if isinstance(records, list):
        for i in range(0, len(records), _BATCH):
            yield records[i : i + _BATCH]
        return
    it = iter(records)
    while batch := list(itertools.islice(it, _BATCH)):
        yield batch


def _read_chunks(path: str, chunk: int, where: str, start: int = 0) -> Iterator[list[tuple[int, bytes]]]:
    """The records of a file of records (from byte ``start``: past a partition file's header), a
    buffer's worth at a time; the file is removed once read (or abandoned): every file merged
    here is a scratch file of the merge's."""
    unpack = _RECORD.unpack_from
    with open(path, "rb", buffering=0) as f:
        os.unlink(path)
        left = os.fstat(f.fileno()).st_size - start
        f.seek(start)
        rest = b""
        need = chunk
        while True:
            data = f.read(min(max(chunk, need), left))  # a damaged length asks no more than the file holds
            left -= len(data)
            if not data:
                if rest:
                    raise ShuffleError(f"{where}: truncated record ({len(rest)} bytes left over at the end)")
                return
            buf = rest + data if rest else data
            n = len(buf)
            out = []
            pos = 0
            while pos + 12 <= n:
                k, ln = unpack(buf, pos)
                end = pos + 12 + ln
                if end > n:
                    break
                out.append((k, buf[pos + 12 : end]))
                pos = end
            rest = buf[pos:]
            need = (_RECORD.unpack_from(rest)[1] + 12 - len(rest)) if len(rest) >= 12 else chunk
            del buf, data
            yield out


def _reader(path: str, files: int, where: str, start: int = 0) -> Iterator[tuple[int, bytes]]:
    chunk = max(_READ_MIN, min(1 << 20, _MERGE_BUFFER // max(1, files)))
    return itertools.chain.from_iterable(_read_chunks(path, chunk, where, start))


def _merge_files(
    paths: list[str],
    names: list[str],
    workdir: str,
    checkpoint: Callable[[], None],
    extra: list[tuple[int, bytes]] | None = None,
    starts: list[int] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """All records of the files (each sorted, from byte ``starts[i]`` on: 0 by default), merged in
    (key, value) order; ``extra`` a sorted list merged in as well. More than FANIN files are first
    merged FANIN at a time into new files in ``workdir`` (removed once read), so open files and
    buffers stay bounded."""
    paths, names = list(paths), list(names)
    starts = list(starts) if starts is not None else [0] * len(paths)
    while len(paths) + (extra is not None) > FANIN:
        merged_paths, merged_names, merged_starts = [], [], []
        for i in range(0, len(paths), FANIN):
            group, group_names, group_starts = paths[i : i + FANIN], names[i : i + FANIN], starts[i : i + FANIN]
            if len(group) == 1:
                merged_paths += group
                merged_names += group_names
                merged_starts += group_starts
                continue
            fd, out = tempfile.mkstemp(dir=workdir, prefix="merge-", suffix=".kv")
            try:
                with os.fdopen(fd, "wb") as f:
                    merged = heapq.merge(
                        *(_reader(p, len(group), n, a) for p, n, a in zip(group, group_names, group_starts))
                    )
                    for batch in _batches(merged):
                        f.write(_encode(batch))
                        checkpoint()
            except BaseException:
                for p in [out, *merged_paths, *paths[i:]]:
                    if os.path.exists(p):
                        os.unlink(p)
                raise
            merged_paths.append(out)
            merged_names.append(out)
            merged_starts.append(0)
        paths, names, starts = merged_paths, merged_names, merged_starts
    streams = [_reader(p, len(paths), n, a) for p, n, a in zip(paths, names, starts)]
    if extra:
        streams.append(iter(extra))
    return heapq.merge(*streams)


# -- the map side ---------------------------------------------------------------------------------


def header_size(partitions: int) -> int:
    """Bytes of a partition file's header: what a reader fetches in one ranged read."""
    return 16 + (2 * partitions + 1) * 8


@dataclass(frozen=True)
class Header:
    partitions: int
    offsets: tuple[int, ...]  # P+1: start of each partition, then the file's end
    counts: tuple[int, ...]  # P: records per partition


def parse_header(data: bytes, where: str) -> Header:
    """A partition file's header from its first bytes (at least ``header_size(P)`` of them)."""
    if len(data) < 16 or data[:8] != MAGIC:
        raise ShuffleError(f"{where}: not a partition file (no {MAGIC.decode()} header)")
    partitions = _U64.unpack_from(data, 8)[0]
    if partitions < 1 or partitions > 1 << 32:
        raise ShuffleError(f"{where}: damaged partition file header ({partitions} partitions)")
    size = header_size(partitions)
    if len(data) < size:
        raise ShuffleError(f"{where}: partition file header cut short ({len(data)} of {size} bytes)")
    numbers = struct.unpack_from(f">{2 * partitions + 1}Q", data, 16)
    offsets, counts = numbers[: partitions + 1], numbers[partitions + 1 :]
    if (
        offsets[0] != size
        or any(a > b for a, b in zip(offsets, offsets[1:]))
        or any(c * 12 > b - a for c, a, b in zip(counts, offsets, offsets[1:]))
    ):
        raise ShuffleError(f"{where}: damaged partition file header (offsets and counts disagree)")
    return Header(partitions, offsets, counts)


def _partition_starts(partitions: int) -> list[int]:
    """The first key of partitions 1..P-1, then 2**64: key k is in partition (k * P) >> 64."""
    return [-(-(p << 64) // partitions) for p in range(1, partitions)] + [KEYS]


def _write_partitioned(
    f, records: Iterable[tuple[int, bytes]], partitions: int, checkpoint: Callable[[], None] = lambda: None
) -> tuple[list[int], list[int]]:
    """Records sorted by (key, value) into ``f`` after its header; their offsets and counts."""
    starts = _partition_starts(partitions)
    pos = header_size(partitions)
    offsets, counts = [pos], []
    part, nxt, n = 0, starts[0], 0
    for batch in _batches(records):
        i, size, last = 0, len(batch), batch[-1][0]
        while True:
            j = bisect.bisect_left(batch, (nxt,), i) if last >= nxt else size
            if j > i:
                data = _encode(batch[i:j])
                f.write(data)
                pos += len(data)
                n += j - i
            if j == size:
                break
            offsets.append(pos)  # partition `part` ends here: the next one starts
            counts.append(n)
            part, nxt, n, i = part + 1, starts[part + 1], 0, j
        checkpoint()
    while len(counts) < partitions:
        offsets.append(pos)
        counts.append(n)
        n = 0
    return offsets, counts


class PartitionWriter(KeyedSink):
    """A map item's KeyedSink: one partition file in ``folder``, in about ``budget`` bytes of
    memory (beyond it, sorted runs are spilled to ``folder`` and merged at :meth:`finish`)."""

    def __init__(self, folder: str, partitions: int, budget: int = 256 << 20):
        if partitions < 1:
            raise ValueError(f"PartitionWriter: {partitions} partitions; give 1 or more")
        self.folder, self.partitions, self.budget = folder, partitions, budget
        self.counts: list[int] = []
        self.records = 0
        self.spills = 0  # run files written
        self._buffer: list[tuple[int, bytes]] = []
        self._buffered = 0
        self._runs: list[str] = []
        self._done = False

    def emit(self, key: int, value: bytes) -> None:
        if not 0 <= key < KEYS:
            raise ValueError(f"shuffle key {key}: not an unsigned 64-bit integer")
        if type(value) is not bytes:
            value = bytes(value)
        self._buffer.append((key, value))
        self.records += 1
        self._buffered += len(value) + OVERHEAD
        if self._buffered > self.budget:
            self._spill()

    def _spill(self) -> None:
        self._buffer.sort()
        fd, path = tempfile.mkstemp(dir=self.folder, prefix="run-", suffix=".kv")
        self._runs.append(path)
        with os.fdopen(fd, "wb") as f:
            for batch in _batches(self._buffer):
                f.write(_encode(batch))
        self._buffer = []
        self._buffered = 0
        self.spills += 1

    def finish(self, checkpoint: Callable[[], None] = lambda: None) -> str:
        """Write the partition file; its path (in ``folder``). Call once."""
        if self._done:
            raise RuntimeError("PartitionWriter.finish called twice")
        self._done = True
        buffer, self._buffer = self._buffer, []
        buffer.sort()
        records: Iterable[tuple[int, bytes]]
        if self._runs:
            records = _merge_files(self._runs, self._runs, self.folder, checkpoint, buffer)
        else:
            records = buffer
        fd, path = tempfile.mkstemp(dir=self.folder, prefix="partitions-", suffix=".kv")
        try:
            with os.fdopen(fd, "wb") as f:
                f.seek(header_size(self.partitions))
                offsets, counts = _write_partitioned(f, records, self.partitions, checkpoint)
                f.seek(0)
                f.write(
                    MAGIC + _U64.pack(self.partitions) + struct.pack(f">{2 * self.partitions + 1}Q", *offsets, *counts)
                )
        except BaseException:
            os.unlink(path)
            raise
        finally:
            del buffer, records
            for run in self._runs:
                if os.path.exists(run):
                    os.unlink(run)
        self.counts = counts
        return path


# -- the barrier: the index -----------------------------------------------------------------------


@dataclass(frozen=True)
class ShufflePiece:
    """One map item's partition file in the bucket, pinned to the version it committed."""

    item: str
    name: str
    version: str


@contextlib.contextmanager
def _pinned(piece: ShufflePiece) -> Iterator[None]:
    """A store error about a piece, as a one-line ShuffleError naming it."""
    try:
        yield
    except NotFound:
        raise ShuffleError(f"{piece.name} (item {piece.item}): partition file is gone") from None
    except Changed:
        raise ShuffleError(
            f"{piece.name} (item {piece.item}): partition file was rewritten since its map item committed it"
        ) from None


def partitions_for(items: int, balanced: bool) -> int:
    """The map side's P for a reduce stage of ``items`` items. Balanced: SPLIT partitions per
    item, so an item, whose rank range rarely starts or ends on a partition boundary, reads
    about 1 + 1/SPLIT of its share (the partial partitions at its two ends)."""
    return items * SPLIT if balanced else items


def build_index(store: Store, pieces: list[ShufflePiece], partitions: int, threads: int = 16) -> bytes:
    """The index object's bytes for a stage's pieces: their headers read (one ranged read each,
    pinned), checked to have ``partitions`` partitions, and summed."""
    size = header_size(partitions)

    def header(piece: ShufflePiece) -> Header:
        where = f"{piece.name} (item {piece.item})"
        with _pinned(piece):
            data = store.read(piece.name, 0, size, version=piece.version or None)
        if len(data) >= 16 and data[:8] == MAGIC and (got := _U64.unpack_from(data, 8)[0]) != partitions:
            raise ShuffleError(f"{where}: has {got} partitions, the stage expects {partitions}")
        return parse_header(data, where)

    with ThreadPoolExecutor(max(1, min(threads, len(pieces)))) as pool:
        headers = list(pool.map(header, pieces))
    totals = [sum(c) for c in zip(*(h.counts for h in headers))] if headers else [0] * partitions
    head = json.dumps(
        {
            "partitions": partitions,
            "pieces": [{"item": p.item, "name": p.name, "version": p.version} for p in pieces],
            "totals": totals,
        },
        separators=(",", ":"),
    ).encode()
    row = struct.Struct(f">{len(pieces)}Q")
    rows = [row.pack(*(h.offsets[k] for h in headers)) for k in range(partitions + 1)]
    return INDEX_MAGIC + _U64.pack(len(head)) + head + b"".join(rows)


def index_totals(data: bytes) -> list[int]:
    """Records per partition of an index object's bytes (what its barrier checks before writing it)."""
    length = _U64.unpack_from(data, len(INDEX_MAGIC))[0]
    start = len(INDEX_MAGIC) + 8
    return list(json.loads(data[start : start + length])["totals"])


@dataclass
class Index:
    """A stage's index as a reduce item reads it: the head (pieces, totals) loaded once; the
    offset rows read per item, pinned to the same version."""

    store: Store
    name: str
    version: str
    pieces: list[ShufflePiece]
    partitions: int
    totals: list[int]
    _rows_start: int = 0
    _cached: bytes = field(default=b"", repr=False)  # the object's first bytes, read with the head

    def ranges(self, k1: int, k2: int) -> list[tuple[int, int]]:
        """Per piece, the byte range covering partitions k1..k2 (inclusive): one ranged read."""
        if not 0 <= k1 <= k2 < self.partitions:
            raise ValueError(f"partitions {k1}..{k2} of {self.partitions}")
        width = 8 * len(self.pieces)
        start, end = self._rows_start + k1 * width, self._rows_start + (k2 + 2) * width
        if end <= len(self._cached):
            data = self._cached[start:end]
        else:
            try:
                data = self.store.read(self.name, start, end, version=self.version or None)
            except (NotFound, Changed) as e:
                raise ShuffleError(f"shuffle index {self.name}: gone or rewritten since it was loaded ({e})") from None
        if len(data) != end - start:
            raise ShuffleError(f"shuffle index {self.name}: cut short ({len(data)} of {end - start} bytes of rows)")
        first = struct.unpack_from(f">{len(self.pieces)}Q", data, 0)
        last = struct.unpack_from(f">{len(self.pieces)}Q", data, len(data) - width)
        for piece, a, b in zip(self.pieces, first, last):
            if a > b:
                raise ShuffleError(f"shuffle index {self.name}: damaged (piece {piece.name} ends before it starts)")
        return list(zip(first, last))


def load_index(store: Store, name: str, version: str | None = None) -> Index:
    """The index head: one read (two when the head passes 64 KiB; a small index comes whole, so
    its rows need no more reads). Without ``version``, pinned to the version there now."""
    where = f"shuffle index {name}"
    try:
        if version is None:
            blob = store.stat(name)
            if blob is None:
                raise NotFound(name)
            version = blob.version
        data = store.read(name, 0, _INDEX_HEAD_READ, version=version or None)
        if len(data) < 16 or data[:8] != INDEX_MAGIC:
            raise ShuffleError(f"{where}: not a shuffle index (no {INDEX_MAGIC.decode()} header)")
        length = _U64.unpack_from(data, 8)[0]
        if length > _INDEX_HEAD_MAX:
            raise ShuffleError(f"{where}: damaged head (claims {length} bytes)")
        if 16 + length > len(data):
            data += store.read(name, len(data), 16 + length, version=version or None)
    except (NotFound, Changed) as e:
        raise ShuffleError(f"{where}: gone or rewritten ({e})") from None
    try:
        head = json.loads(data[16 : 16 + length])
        pieces = [ShufflePiece(p["item"], p["name"], p["version"]) for p in head["pieces"]]
        partitions, totals = int(head["partitions"]), [int(t) for t in head["totals"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ShuffleError(f"{where}: damaged head ({e})") from None
    if len(totals) != partitions:
        raise ShuffleError(f"{where}: damaged head ({len(totals)} totals for {partitions} partitions)")
    return Index(store, name, version or "", pieces, partitions, totals, 16 + length, data)


# -- the combine step ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Combine:
    """A stage's combine step, as planned (kept in the run's spec, so a run keeps its own):
    ``group`` files of the step before merged by each combine item, in ``blocks`` key blocks.
    ``group`` 0: no combine step."""

    group: int = 0
    blocks: int = 0

    def __bool__(self) -> bool:
        return self.group >= 2


@dataclass(frozen=True)
class CombineRule:
    """When a stage gets a combine step, and its shape (see the module docstring). Sizes are of
    records, estimated at plan time by the input bytes per item of the step before."""

    read_min: int = 4_000_000  # bytes a stage item's ranged read should hold at least
    file_max: int = 1_000_000_000  # bytes of a combined file at most: a combine item's disk is twice this
    min_reads: int = 250_000  # a stage making fewer ranged reads without it gets no combine step
    group: int = 0  # a fixed group (tests, benchmarks); 0: from the sizes
    blocks: int = 1  # with a fixed group: key blocks


COMBINE_RULE = CombineRule()  # fleet.core.run.PlanRequest.combine's default, looked up when it plans


def plan_combine(rule: CombineRule, producers: int, partitions: int, readers: int, producer_bytes: float) -> Combine:
    """The combine step of a stage of ``readers`` items (``partitions`` key ranges) reading the
    files of ``producers`` items of ``producer_bytes`` each, or none (``Combine()``)."""
    if rule.group:
        group = min(rule.group, producers)
        return Combine(group, max(1, min(rule.blocks, partitions))) if group >= 2 else Combine()
    if producers * readers < rule.min_reads:
        return Combine()
    size = max(1.0, float(producer_bytes))
    group = min(producers, FANIN, math.ceil(readers * rule.read_min / size))
    blocks = max(1, math.ceil(group * size / rule.file_max))
    most = max(1, int(size // rule.read_min))  # so that the block's range of each file is read_min or more
    if blocks > most:
        blocks = most
        group = min(group, int(rule.file_max * blocks // size))
    if group < 2:
        return Combine()
    return Combine(group, min(blocks, partitions))


def combine_groups(producers: int, combine: Combine, partitions: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per combine item, in order: ((lo, hi) the positions of the files it merges among the
    items of the step before, (p1, p2) the partitions of its key block). Groups of at most
    ``combine.group`` consecutive items, as even as can be; blocks of equal partition counts."""
    n = math.ceil(producers / combine.group)
    groups = [(j * producers // n, (j + 1) * producers // n) for j in range(n)]
    blocks = [(b * partitions // combine.blocks, (b + 1) * partitions // combine.blocks) for b in range(combine.blocks)]
    return [(g, b) for g in groups for b in blocks]


@dataclass
class Combined:
    """What :func:`combine` made: the file (in its workdir), records per partition, requests."""

    path: str
    counts: list[int]
    reads: int
    bytes_read: int

    @property
    def records(self) -> int:
        return sum(self.counts)


def _checked_header(data: bytes, partitions: int, where: str) -> Header:
    if len(data) >= 16 and data[:8] == MAGIC and (got := _U64.unpack_from(data, 8)[0]) != partitions:
        raise ShuffleError(f"{where}: has {got} partitions, the stage expects {partitions}")
    return parse_header(data, where)


def combine(
    store: Store,
    pieces: list[ShufflePiece],
    partitions: int,
    block: tuple[int, int],
    workdir: str,
    checkpoint: Callable[[], None] = lambda: None,
    threads: int = 16,
) -> Combined:
    """A combine item: the records of partitions ``block`` = (p1, p2) of the pieces, merged into one
    partition file in ``workdir`` (its other partitions empty): the bytes a PartitionWriter writes
    of the same records. The whole block: each piece downloaded whole, one request; a part: its
    header read, then its block's range downloaded (none when the range is empty). Each piece is
    pinned to the version its item committed; a header, a length or a count that disagrees fails
    in one line naming the piece."""
    p1, p2 = block
    if not 0 <= p1 < p2 <= partitions:
        raise ValueError(f"partitions {p1}..{p2} of {partitions}")
    whole = (p1, p2) == (0, partitions)
    size = header_size(partitions)
    reads = [0] * len(pieces)

    def fetch(j: int) -> tuple[str | None, int, array]:
        """The piece's block on local disk (None: nothing in it), where its records start in that
        file, and its header's counts of the block's partitions (8 bytes each, not a tuple of ints)."""
        piece = pieces[j]
        where = f"{piece.name} (item {piece.item})"
        path = os.path.join(workdir, f"combine-{j}.kv")
        version = piece.version or None
        with _pinned(piece):
            if whole:
                store.download_file(piece.name, path, version=version)
                reads[j] = 1
                with open(path, "rb") as f:
                    header = _checked_header(f.read(size), partitions, where)
                if os.path.getsize(path) != header.offsets[-1]:
                    raise ShuffleError(
                        f"{where}: partition file damaged ({os.path.getsize(path)} bytes, its header "
                        f"says {header.offsets[-1]})"
                    )
                return path, header.offsets[0], array("Q", header.counts)
            header = _checked_header(store.read(piece.name, 0, size, version=version), partitions, where)
            reads[j] = 1
            a, b = header.offsets[p1], header.offsets[p2]
            if b == a:
                return None, 0, array("Q", header.counts[p1:p2])
            store.download_file(piece.name, path, a, b, version=version)
            reads[j] = 2
        if os.path.getsize(path) != b - a:
            raise ShuffleError(
                f"{where}: partition file changed or damaged (bytes {a}-{b} asked, {os.path.getsize(path)} there)"
            )
        return path, 0, array("Q", header.counts[p1:p2])

    wanted: list[tuple[int, str, int]] = []  # (piece, local path, where its records start)
    expected = [0] * partitions  # records per partition, by the pieces' headers
    out = None
    try:
        with ThreadPoolExecutor(max(1, min(threads, len(pieces)))) as pool:
            for j, (path, start, block_counts) in enumerate(pool.map(fetch, range(len(pieces)))):
                if path is not None:
                    wanted.append((j, path, start))
                for k, n in enumerate(block_counts, p1):
                    expected[k] += n
        checkpoint()
        bytes_read = sum(os.path.getsize(path) for _, path, _ in wanted)
        names = [f"{pieces[j].name} (item {pieces[j].item})" for j, _, _ in wanted]
        merged = _merge_files([p for _, p, _ in wanted], names, workdir, checkpoint, starts=[a for _, _, a in wanted])
        fd, out = tempfile.mkstemp(dir=workdir, prefix="combined-", suffix=".kv")
        with os.fdopen(fd, "wb") as f:
            f.seek(size)
            offsets, counts = _write_partitioned(f, merged, partitions, checkpoint)
            f.seek(0)
            f.write(MAGIC + _U64.pack(partitions) + struct.pack(f">{2 * partitions + 1}Q", *offsets, *counts))
        if counts != expected:
            k = next(k for k in range(partitions) if counts[k] != expected[k])
            raise ShuffleError(
                f"combining {len(pieces)} partition files from {pieces[0].name}: partition {k} holds "
                f"{counts[k]} records, their headers say {expected[k]} (a file is damaged)"
            )
    except BaseException:
        if out is not None and os.path.exists(out):
            os.unlink(out)
        raise
    finally:
        for j in range(len(pieces)):
            path = os.path.join(workdir, f"combine-{j}.kv")
            if os.path.exists(path):
                os.unlink(path)
    return Combined(out, counts, sum(reads), bytes_read)


# -- the reduce side ------------------------------------------------------------------------------


def balanced_range(total: int, items: int, i: int) -> tuple[int, int]:
    """Ranks [lo, hi) of the global order that balanced item i of ``items`` gets."""
    return i * total // items, (i + 1) * total // items


def reduce_records(
    store: Store,
    index: Index,
    item: int,
    items: int,
    balanced: bool,
    workdir: str,
    checkpoint: Callable[[], None] = lambda: None,
) -> Iterator[tuple[int, bytes]]:
    """Reduce item ``item`` of ``items``: its records in (key, value) order. Not balanced: all
    of partition ``item``. Balanced: ranks ``balanced_range(sum(totals), items, item)`` of the
    global order (partition 0's records, then partition 1's...). Streams from local copies of
    the pieces' ranges in ``workdir``; calls ``checkpoint`` every few thousand records."""
    if not 0 <= item < items:
        raise ValueError(f"reduce item {item} of {items}")
    if balanced:
        cumulative = list(itertools.accumulate(index.totals, initial=0))
        lo, hi = balanced_range(cumulative[-1], items, item)
        if lo == hi:
            return
        k1 = bisect.bisect_right(cumulative, lo) - 1
        k2 = bisect.bisect_right(cumulative, hi - 1) - 1
        skip = lo - cumulative[k1]
    else:
        if index.partitions != items:
            raise ShuffleError(f"shuffle index {index.name}: {index.partitions} partitions for {items} reduce items")
        k1 = k2 = item
        skip, hi, lo = 0, 0, 0
        if index.totals[item] == 0:
            return
    wanted = [(j, piece, a, b) for j, (piece, (a, b)) in enumerate(zip(index.pieces, index.ranges(k1, k2))) if b > a]
    paths = [os.path.join(workdir, f"shuffle-{item}-{j}.kv") for j, *_ in wanted]

    def download(job: tuple[int, ShufflePiece, int, int], path: str) -> None:
        _, piece, a, b = job
        with _pinned(piece):
            store.download_file(piece.name, path, a, b, version=piece.version or None)
        got = os.path.getsize(path)
        if got != b - a:
            raise ShuffleError(
                f"{piece.name} (item {piece.item}): partition file changed or damaged "
                f"(bytes {a}-{b} asked, {got} there)"
            )

    try:
        with ThreadPoolExecutor(max(1, min(16, len(wanted)))) as pool:
            list(pool.map(download, wanted, paths))
        checkpoint()
        merged = _merge_files(paths, [f"{p.name} (item {p.item})" for _, p, _, _ in wanted], workdir, checkpoint)
        if not balanced:
            for batch in _batches(merged):
                checkpoint()
                yield from batch
            return
        seen, stop = 0, skip + hi - lo  # ranks in the merged partitions k1..k2: ours are [skip, stop)
        for batch in _batches(merged):
            checkpoint()
            a, b = max(skip - seen, 0), min(stop - seen, len(batch))
            seen += len(batch)
            if b > a:
                yield from batch[a:b]
            if seen >= stop:
                return
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)

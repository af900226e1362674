"""The shuffle's data path (fleet.core.shuffle), on local-folder stores: partition files whose
bytes depend only on the records, an index, and reduce items that together get every record
exactly once, in (key, value) order, in bounded memory."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import tempfile
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.core import shuffle
from fleet.core.shuffle import (
    Combine,
    CombineRule,
    Index,
    PartitionWriter,
    ShuffleError,
    ShufflePiece,
    balanced_range,
    build_index,
    combine,
    combine_groups,
    header_size,
    load_index,
    parse_header,
    partitions_for,
    plan_combine,
    reduce_records,
)
from fleet.core.store import open_store

# Keys at the edges of the partitions' key ranges (P up to 28: 7 balanced items) too.
EDGES = sorted(
    {e for n in range(1, 29) for p in range(n + 1) for d in (-1, 0, 1) if 0 <= (e := -(-(p << 64) // n) + d) < 2**64}
)
KEYS = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from(EDGES))
RECORDS = st.lists(st.tuples(KEYS, st.binary(max_size=24)), max_size=120)
BUDGETS = st.one_of(st.integers(0, 400), st.just(1 << 30))
SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def write(folder: str, records, partitions: int, budget: int) -> tuple[bytes, PartitionWriter]:
    writer = PartitionWriter(folder, partitions, budget=budget)
    for key, value in records:
        writer.emit(key, value)
    path = writer.finish()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data, writer


def decode(data: bytes) -> list[list[tuple[int, bytes]]]:
    """A partition file's records, partition by partition (an independent reader of the format)."""
    header = parse_header(data, "test")
    parts = []
    for k in range(header.partitions):
        pos, end, records = header.offsets[k], header.offsets[k + 1], []
        while pos < end:
            key, n = struct.unpack_from(">QI", data, pos)
            records.append((key, data[pos + 12 : pos + 12 + n]))
            pos += 12 + n
        assert pos == end and len(records) == header.counts[k]
        parts.append(records)
    assert header.offsets[-1] == len(data)
    return parts


def partition(key: int, partitions: int) -> int:
    return (key * partitions) >> 64


@SLOW
@given(RECORDS, st.integers(1, 9), BUDGETS, BUDGETS, st.randoms(use_true_random=False))
def test_file_depends_only_on_the_records(records, partitions, budget_a, budget_b, rnd):
    """Emission order, budget and spill points change nothing in the file's bytes: a retried map
    item rewrites the same file. And the file holds each partition's records, sorted."""
    shuffled = list(records)
    rnd.shuffle(shuffled)
    with tempfile.TemporaryDirectory() as folder:
        a, writer = write(folder, records, partitions, budget_a)
        b, _ = write(folder, shuffled, partitions, budget_b)
        assert os.listdir(folder) == []  # runs and merge files are gone
    assert a == b
    parts = decode(a)
    assert parts == [sorted(r for r in records if partition(r[0], partitions) == k) for k in range(partitions)]
    assert writer.counts == [len(p) for p in parts] and writer.records == len(records)


@pytest.mark.parametrize("batch", [1, 2, shuffle._BATCH])
def test_keys_at_the_edges_of_the_ranges_go_to_their_partition(tmp_path, monkeypatch, batch):
    """Key k is in partition (k * P) >> 64: the first and last keys of every range, exactly
    (also where a partition starts at the first or last record of a batch written at once)."""
    monkeypatch.setattr(shuffle, "_BATCH", batch)
    for partitions in range(1, 30):
        keys = {
            e for p in range(partitions + 1) for d in (-1, 0, 1) if 0 <= (e := -(-(p << 64) // partitions) + d) < 2**64
        }
        data, _ = write(str(tmp_path), [(k, b"") for k in keys], partitions, 1 << 30)
        assert decode(data) == [
            [(k, b"") for k in sorted(keys) if partition(k, partitions) == p] for p in range(partitions)
        ]


def test_spilling_writes_the_same_file_and_bounds_open_files(tmp_path):
    """A budget far below the data spills a run every couple of records (more runs than one
    merge opens at once, so merge passes run), and still writes the bytes of an in-memory sort."""
    rng = random.Random(7)
    records = [
        (rng.getrandbits(64) >> rng.choice([0, 60]), rng.randbytes(rng.randrange(40))) for _ in range(3 * shuffle.FANIN)
    ]
    records += records[:50]  # equal records are all kept
    tiny = PartitionWriter(str(tmp_path), 5, budget=200)
    for key, value in records:
        tiny.emit(key, value)
    assert tiny.spills > shuffle.FANIN
    assert len([n for n in os.listdir(tmp_path) if n.startswith("run-")]) == tiny.spills  # on disk, not in memory
    spilled = open(tiny.finish(), "rb").read()
    assert sorted(os.listdir(tmp_path)) == [n for n in os.listdir(tmp_path) if n.startswith("partitions-")]
    huge = tmp_path / "huge"
    huge.mkdir()
    in_memory, writer = write(str(huge), records, 5, 1 << 30)
    assert writer.spills == 0
    assert spilled == in_memory
    assert sum(map(len, decode(spilled))) == len(records)


def test_bad_keys_are_refused(tmp_path):
    writer = PartitionWriter(str(tmp_path), 2)
    for key in (-1, 2**64):
        with pytest.raises(ValueError, match="64-bit"):
            writer.emit(key, b"x")


def publish(
    store, folder: str, records, writers: int, partitions: int, budgets, rnd, first: int = 0
) -> list[ShufflePiece]:
    """Records dealt at random to ``writers`` map items, whose files go into the store."""
    dealt = [[] for _ in range(writers)]
    for record in records:
        dealt[rnd.randrange(writers)].append(record)
    pieces = []
    for i, (mine, budget) in enumerate(zip(dealt, budgets), first):
        writer = PartitionWriter(folder, partitions, budget=budget)
        for key, value in mine:
            writer.emit(key, value)
        name = f"stage/map-{i}.kv"
        path = writer.finish()
        store.upload_file(name, path)
        os.unlink(path)
        pieces.append(ShufflePiece(f"map-{i}", name, store.stat(name).version))
    return pieces


def index_of(store, pieces, partitions) -> Index:
    store.write("stage/index", build_index(store, pieces, partitions, threads=3))
    return load_index(store, "stage/index")


@SLOW
@given(
    RECORDS,
    st.integers(1, 5),
    st.integers(1, 7),
    st.booleans(),
    st.lists(BUDGETS, min_size=5, max_size=5),
    st.randoms(use_true_random=False),
    st.sampled_from([2, 3, shuffle.FANIN]),
    st.sampled_from([1, 13, 0]),
    st.sampled_from([1, 5, shuffle._BATCH]),
)
def test_reduce_items_get_every_record_once_in_order(
    records, writers, items, balanced, budgets, rnd, fanin, chunk, batch
):
    """Whatever the budgets or how the records were dealt to map items: not balanced, item k
    gets exactly partition k's records, sorted; balanced, the items' counts differ by at most
    one and their concatenation in item order is all the records, sorted. (A small ``fanin``
    makes the merges of runs and pieces go through intermediate passes, a small ``chunk`` of
    read buffer cuts records across reads, a small ``batch`` an item's range across batches.)"""
    partitions = partitions_for(items, balanced)
    knobs = {"FANIN": fanin, "_BATCH": batch} | ({"_READ_MIN": chunk, "_MERGE_BUFFER": chunk} if chunk else {})
    saved = {name: getattr(shuffle, name) for name in knobs}
    try:
        for name, value in knobs.items():
            setattr(shuffle, name, value)
        got = reduce_all(records, writers, items, balanced, budgets, rnd, partitions)
    finally:
        for name, value in saved.items():
            setattr(shuffle, name, value)
    if balanced:
        assert max(map(len, got)) - min(map(len, got)) <= 1
        assert [r for g in got for r in g] == sorted(records)
    else:
        assert got == [sorted(r for r in records if partition(r[0], items) == k) for k in range(items)]


def reduce_all(records, writers, items, balanced, budgets, rnd, partitions) -> list[list[tuple[int, bytes]]]:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        os.makedirs(os.path.join(tmp, "work"))
        work = os.path.join(tmp, "work")
        pieces = publish(store, work, records, writers, partitions, budgets, rnd)
        index = index_of(store, pieces, partitions)
        assert index.pieces == pieces and index.partitions == partitions
        assert sum(index.totals) == len(records)
        got = [list(reduce_records(store, index, i, items, balanced, work)) for i in range(items)]
        assert os.listdir(work) == []
        return got


def test_balanced_range_cuts_evenly():
    for total in (0, 1, 7, 100):
        for items in (1, 3, 8):
            cuts = [balanced_range(total, items, i) for i in range(items)]
            assert cuts[0][0] == 0 and cuts[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
            assert max(h - lo for lo, h in cuts) - min(h - lo for lo, h in cuts) <= 1


class CountingStore:
    """A store that counts reads and downloads (the requests a reduce item makes)."""

    def __init__(self, store):
        self.store, self.reads, self.downloads = store, 0, 0

    def read(self, *args, **kwargs):
        self.reads += 1
        return self.store.read(*args, **kwargs)

    def download_file(self, *args, **kwargs):
        self.downloads += 1
        return self.store.download_file(*args, **kwargs)

    def stat(self, name):
        return self.store.stat(name)


def test_requests_and_checkpoints(tmp_path):
    """The barrier reads one header per piece; a reduce item reads the index head once, its rows
    once, and downloads only the pieces with data in its range; it checkpoints as it goes, and a
    checkpoint that raises (the lease was lost) stops it."""
    store = open_store(str(tmp_path))
    (tmp_path / "work").mkdir()
    rng = random.Random(3)
    # Piece 0 holds keys of partition 0 only, pieces 1 and 2 of every partition.
    low = [(rng.randrange(2**62), rng.randbytes(8)) for _ in range(100)]
    spread = [(rng.getrandbits(64), rng.randbytes(8)) for _ in range(20000)]
    pieces = [
        publish(store, str(tmp_path / "work"), recs, 1, 4, [1 << 30], rng, i)[0]
        for i, recs in enumerate((low, spread[:10000], spread[10000:]))
    ]
    counting = CountingStore(store)
    data = build_index(counting, pieces, 4)
    assert counting.reads == 3
    store.write("stage/index", data)
    counting.reads = 0
    index = load_index(counting, "stage/index")
    assert counting.reads == 1 and index.totals[0] > 100
    calls = []
    out = list(reduce_records(counting, index, 3, 4, False, str(tmp_path / "work"), lambda: calls.append(1)))
    assert counting.reads == 1 and counting.downloads == 2  # piece 0 has nothing in partition 3
    assert out == sorted(r for r in spread if r[0] >= 3 << 62)
    assert len(calls) >= len(out) // 4096

    class Lost(Exception):
        pass

    def lost():
        raise Lost

    with pytest.raises(Lost):
        list(reduce_records(store, index, 1, 4, False, str(tmp_path / "work"), lost))
    assert os.listdir(tmp_path / "work") == []


def one_piece(tmp_path, partitions=3):
    store = open_store(str(tmp_path))
    (tmp_path / "work").mkdir(exist_ok=True)
    records = [(random.Random(i).getrandbits(64), b"v%d" % i) for i in range(50)]
    return store, publish(store, str(tmp_path / "work"), records, 1, partitions, [1 << 30], random.Random(0))


def test_bad_headers_name_the_piece(tmp_path):
    store, [piece] = one_piece(tmp_path)
    good = store.read(piece.name)
    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): has 3 partitions, the stage expects 4$"):
        build_index(store, [piece], 4)
    for bad, why in (
        (b"NOTAFILE" + good[8:], "not a partition file"),
        (good[:20], "cut short"),
        (good[:16] + b"\xff" * 8 + good[24:], "damaged"),
    ):
        store.write(piece.name, bad)
        piece = ShufflePiece(piece.item, piece.name, store.stat(piece.name).version)
        with pytest.raises(ShuffleError, match=f"^stage/map-0.kv \\(item map-0\\): .*{why}") as e:
            build_index(store, [piece], 3)
        assert "\n" not in str(e.value)
    with pytest.raises(ShuffleError, match="^here: .*cut short"):
        parse_header(good[: header_size(3) - 1], "here")


def test_a_piece_changed_or_gone_after_indexing_names_it(tmp_path):
    store, [piece] = one_piece(tmp_path)
    index = index_of(store, [piece], 3)
    work = str(tmp_path / "work")
    good = store.read(piece.name)
    store.write(piece.name, good)  # same bytes, but another version: not the file the index describes
    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): partition file was rewritten"):
        list(reduce_records(store, index, 0, 3, False, work))
    store.delete(piece.name)
    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): partition file is gone$"):
        list(reduce_records(store, index, 0, 3, False, work))


def test_a_damaged_record_names_the_piece(tmp_path):
    """A record length that runs past its partition (a header that lies about the body) fails
    the reduce item in one line, without reading (or allocating) what the length claims."""
    store, [piece] = one_piece(tmp_path)
    data = bytearray(store.read(piece.name))
    data[header_size(3) + 8 : header_size(3) + 12] = b"\xff" * 4
    store.write(piece.name, bytes(data))
    piece = ShufflePiece(piece.item, piece.name, store.stat(piece.name).version)
    index = index_of(store, [piece], 3)
    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): truncated record"):
        list(reduce_records(store, index, 0, 3, False, str(tmp_path / "work")))


def test_a_short_download_is_changed_or_damaged(tmp_path):
    """A store that hands back fewer bytes than the range (a file truncated in place behind an
    unchanged version) fails the reduce item rather than feeding it a partial partition."""
    store, [piece] = one_piece(tmp_path)
    index = index_of(store, [piece], 3)

    class Short(CountingStore):
        def download_file(self, name, path, start, end, version=None):
            self.store.download_file(name, path, start, end - 1, version)

    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): partition file changed or damaged"):
        list(reduce_records(Short(store), index, 1, 3, False, str(tmp_path / "work")))


def test_bad_index_names_it(tmp_path):
    store, [piece] = one_piece(tmp_path)
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: gone"):
        load_index(store, "stage/index")
    data = build_index(store, [piece], 3)
    store.write("stage/index", b"garbage!" + data[8:])
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: not a shuffle index"):
        load_index(store, "stage/index")
    store.write("stage/index", data[:8] + b"\x7f" * 8 + data[16:])
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: damaged head \\(claims"):
        load_index(store, "stage/index")
    store.write("stage/index", data[:20])
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: damaged head"):
        load_index(store, "stage/index")
    store.write("stage/index", data[:-8])  # the last row cut short
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: cut short"):
        load_index(store, "stage/index").ranges(2, 2)
    with pytest.raises(ShuffleError, match="^shuffle index stage/index: 3 partitions for 2 reduce items"):
        list(reduce_records(store, load_index(store, "stage/index"), 0, 2, False, str(tmp_path)))


def test_a_large_index_reads_its_rows_separately(tmp_path):
    """An index longer than its first read gets its head in two reads and each item's rows in one."""
    store, [piece] = one_piece(tmp_path, partitions=5000)
    pieces = [ShufflePiece(f"m{i}", piece.name, piece.version) for i in range(3)]
    store.write("stage/index", build_index(store, pieces, 5000))
    counting = CountingStore(store)
    index = load_index(counting, "stage/index")
    assert counting.reads == 1
    assert index.ranges(4000, 4999) == [(index.ranges(4000, 4000)[0][0], os.path.getsize(tmp_path / piece.name))] * 3
    assert counting.reads == 3


MEMORY = textwrap.dedent("""
    import os, random, sys
    from fleet.core.shuffle import PartitionWriter, ShufflePiece, build_index, combine, load_index, reduce_records
    from fleet.core.store import open_store

    root, mb, combined = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "combine"
    store = open_store(root)
    work = os.path.join(root, "work")
    os.makedirs(work)
    rng = random.Random(0)
    blob = rng.randbytes(1 << 20)
    writer = PartitionWriter(work, 2, budget=32 << 20)
    for _ in range(mb * 1_000_000 // 600):
        o = rng.randrange(len(blob) - 600)
        writer.emit(rng.getrandbits(64), blob[o:o + 600])
    store.upload_file("map.kv", writer.finish())
    piece = ShufflePiece("m", "map.kv", store.stat("map.kv").version)
    if combined:  # a combine item merging it (with an empty second file) into one file: from disk
        empty = PartitionWriter(work, 2)
        store.upload_file("empty.kv", empty.finish())
        made = combine(store, [piece, ShufflePiece("e", "empty.kv", store.stat("empty.kv").version)], 2, (0, 2),
                       work)
        assert made.records == mb * 1_000_000 // 600
        store.upload_file("combined.kv", made.path)
        os.unlink(made.path)
        piece = ShufflePiece("c", "combined.kv", store.stat("combined.kv").version)
    store.write("index", build_index(store, [piece], 2))
    n, last = 0, (0, b"")
    for i in range(2):
        for record in reduce_records(store, load_index(store, "index"), i, 2, False, work):
            assert record >= last and len(record[1]) == 600
            n, last = n + 1, record
    assert n == mb * 1_000_000 // 600 and writer.spills >= mb // 32
    # VmHWM, not ru_maxrss: Linux carries a parent's peak RSS over exec into ru_maxrss (a pytest that
    # has loaded TensorFlow would read as 1.3 GB here); VmHWM is this process's own memory's peak.
    hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    print(int(hwm.split()[1]) // 1024)
""")


@pytest.mark.parametrize("step", ["", "combine"])
def test_memory_stays_near_the_budget(tmp_path, step):
    """~200 MB of records through a writer with a 32 MB budget, then (through a combine item) reduced:
    peak memory is the budget plus buffers, not the data."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY, str(tmp_path), "200", step or "-"], capture_output=True, text=True, check=True
    )
    peak_mb = int(out.stdout.split()[-1])
    assert peak_mb < 32 + 80, peak_mb  # here ~60 MB, of which ~20 MB is Python and the fleet


# -- the combine step --------------------------------------------------------------------------


def combine_all(store, work, pieces, partitions, combine_plan) -> list[ShufflePiece]:
    """Every combine item of a plan over ``pieces``: their files, in the store, as pieces."""
    out = []
    for k, ((lo, hi), block) in enumerate(combine_groups(len(pieces), combine_plan, partitions)):
        made = combine(store, pieces[lo:hi], partitions, block, work)
        name = f"stage/combine-{k}.kv"
        store.upload_file(name, made.path)
        os.unlink(made.path)
        out.append(ShufflePiece(f"combine-{k}", name, store.stat(name).version))
    return out


@SLOW
@given(
    RECORDS,
    st.integers(1, 6),
    st.integers(1, 6),
    st.booleans(),
    st.integers(2, 7),
    st.integers(1, 5),
    st.lists(BUDGETS, min_size=6, max_size=6),
    st.randoms(use_true_random=False),
    st.sampled_from([2, 3, shuffle.FANIN]),
)
def test_combined_files_are_the_files_of_their_records_and_the_stage_reads_the_same(
    records, writers, items, balanced, group, blocks, budgets, rnd, fanin
):
    """A combined file is byte for byte the partition file a PartitionWriter writes of the records
    of its group in its key block (so nothing of the global (key, value) order can change), and
    the stage's items get exactly the records they get from the map's own files, whatever the
    group, the blocks or how the records were dealt. (A small ``fanin`` sends a combine through
    intermediate merge passes.)"""
    partitions = partitions_for(items, balanced)
    plan_of = Combine(group, min(blocks, partitions))
    saved = shuffle.FANIN
    shuffle.FANIN = fanin
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(tmp)
            work = os.path.join(tmp, "work")
            os.makedirs(work)
            pieces = publish(store, work, records, writers, partitions, budgets, rnd)
            combined = combine_all(store, work, pieces, partitions, plan_of)
            assert os.listdir(work) == []
            starts = [0, *shuffle._partition_starts(partitions)]
            for k, ((lo, hi), (p1, p2)) in enumerate(combine_groups(len(pieces), plan_of, partitions)):
                mine = [r for p in pieces[lo:hi] for part in decode(store.read(p.name))[p1:p2] for r in part]
                assert all(starts[p1] <= key < starts[p2] for key, _ in mine)
                expected, _ = write(work, mine, partitions, 1 << 30)
                assert store.read(combined[k].name) == expected
            direct, through = index_of(store, pieces, partitions), index_of(store, combined, partitions)
            assert through.totals == direct.totals
            for i in range(items):
                assert list(reduce_records(store, through, i, items, balanced, work)) == list(
                    reduce_records(store, direct, i, items, balanced, work)
                )
    finally:
        shuffle.FANIN = saved


def test_a_combine_reads_each_file_once_or_its_block_and_header(tmp_path):
    """The whole key space: one download per file. A block: a header read per file and a download
    of the block's range, none where the range is empty."""
    store = open_store(str(tmp_path))
    (tmp_path / "work").mkdir()
    work = str(tmp_path / "work")
    rng = random.Random(5)
    low = [(rng.randrange(2**62), rng.randbytes(8)) for _ in range(50)]  # partition 0 of 4 only
    spread = [(rng.getrandbits(64), rng.randbytes(8)) for _ in range(400)]
    pieces = [
        publish(store, work, recs, 1, 4, [1 << 30], rng, i)[0]
        for i, recs in enumerate((low, spread[:200], spread[200:]))
    ]
    counting = CountingStore(store)
    made = combine(counting, pieces, 4, (0, 4), work)
    assert (counting.reads, counting.downloads, made.reads) == (0, 3, 3)
    assert made.records == 450 and made.bytes_read == sum(os.path.getsize(tmp_path / p.name) for p in pieces)
    os.unlink(made.path)
    counting.reads = counting.downloads = 0
    made = combine(counting, pieces, 4, (2, 4), work)
    assert (counting.reads, counting.downloads, made.reads) == (3, 2, 5)  # the first file has nothing there
    assert made.counts[:2] == [0, 0] and made.records == sum(1 for k, _ in spread if k >= 1 << 63)
    os.unlink(made.path)
    assert os.listdir(work) == []


def test_a_bad_file_fails_its_combine_in_one_line_naming_it(tmp_path):
    store, [piece] = one_piece(tmp_path)
    work = str(tmp_path / "work")
    with pytest.raises(ShuffleError, match="^stage/map-0.kv \\(item map-0\\): has 3 partitions, the stage expects 4$"):
        combine(store, [piece], 4, (0, 4), work)
    good = store.read(piece.name)
    for bad, why in (
        (good[:-3], "partition file damaged \\(.* bytes, its header says"),
        (b"NOTAFILE" + good[8:], "not a partition file"),
    ):
        store.write(piece.name, bad)
        piece = ShufflePiece(piece.item, piece.name, store.stat(piece.name).version)
        for block in ((0, 3), (1, 3)):
            with pytest.raises(ShuffleError, match=f"^stage/map-0.kv \\(item map-0\\): ({why}|partition file changed)"):
                combine(store, [piece], 3, block, work)
    header = parse_header(good, "x")
    lying = bytearray(good)  # one more record in partition 0 than the file holds
    struct.pack_into(">Q", lying, 16 + 8 * (3 + 1), header.counts[0] + 1)
    store.write(piece.name, bytes(lying))
    piece = ShufflePiece(piece.item, piece.name, store.stat(piece.name).version)
    with pytest.raises(ShuffleError, match="partition 0 holds .* records, their headers say"):
        combine(store, [piece], 3, (0, 3), work)
    store.write(piece.name, good)  # rewritten after its item committed it: not the version pinned
    with pytest.raises(ShuffleError, match="partition file was rewritten"):
        combine(store, [piece], 3, (0, 3), work)
    assert os.listdir(work) == []


def test_groups_and_blocks_cover_every_file_and_partition_once():
    for producers in (1, 2, 7, 100, 1563):
        for group in (2, 3, 16, 128):
            for blocks in (1, 2, 5):
                got = combine_groups(producers, Combine(group, blocks), 20)
                groups = sorted({g for g, _ in got})
                assert [i for lo, hi in groups for i in range(lo, hi)] == list(range(producers))
                assert max(hi - lo for lo, hi in groups) <= group
                assert max(hi - lo for lo, hi in groups) - min(hi - lo for lo, hi in groups) <= 1
                assert len(got) == len(groups) * blocks
                assert [k for p1, p2 in sorted({b for _, b in got}) for k in range(p1, p2)] == list(range(20))


MB = 1 << 20


@given(st.integers(1, 200_000), st.integers(1, 100_000), st.booleans(), st.floats(1e3, 4e9))
def test_the_rule_keeps_reads_big_and_files_bounded(producers, readers, balanced, size):
    """No combine step where the stage makes few reads; otherwise groups of at most FANIN and M
    files, a combined file within file_max, and each range a stage item reads at least read_min
    unless a bound stops it (the group's cap) or the files are too small to be worth it."""
    rule = CombineRule()
    partitions = partitions_for(readers, balanced)
    got = plan_combine(rule, producers, partitions, readers, size)
    if producers * readers < rule.min_reads:
        assert got == Combine()
        return
    if not got:
        return
    assert 2 <= got.group <= min(producers, shuffle.FANIN) and 1 <= got.blocks <= partitions
    if got.blocks > 1:
        assert size / got.blocks >= rule.read_min  # the block's range of each file is read_min or more
    assert got.group * size / got.blocks <= max(rule.file_max, size)  # the combined file
    wanted = -(-readers * rule.read_min // size)
    if got.group < min(producers, shuffle.FANIN, wanted):
        assert got.group * size / got.blocks > rule.file_max - size / got.blocks  # stopped by the file bound


def test_the_rule_at_the_sizes_of_the_issue():
    """1 TB in 64 MB items, --shards 1024 (4,096 partitions): groups of 64 files in 5 key blocks,
    1,225 combine items writing ~820 MB each, a stage item's ranges ~4 MB (64 x 64 MB / 1,024)."""
    rule = CombineRule()
    got = plan_combine(rule, 15625, 4096, 1024, 64e6)
    assert got == Combine(64, 5)
    assert len(combine_groups(15625, got, 4096)) == 245 * 5
    assert plan_combine(rule, 157, 4096, 1024, 64e6) == Combine()  # 10 GB: 160,000 reads, no step
    assert plan_combine(rule, 1563, 1563, 1563, 64e6) == Combine(98, 7)  # --dedup exact of 100 GB

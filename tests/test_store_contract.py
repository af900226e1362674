"""One contract for every store: the local folder and Cloud Storage (fake-gcs-server).

The lease protocol relies on exactly these properties, so both implementations
must pass every test in the first part unchanged, and so must each of them inside the
MeteredStore that counts a worker's requests (fleet.core.store.metered): counting changes nothing.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleet.core.store import Blob, Forbidden, NotFound, PreconditionFailed, StoreError, open_store

RACERS = 32


@pytest.fixture(params=["local", "gcs", "memory", "metered-local", "metered-gcs"])
def store(request):
    """Each store as it is, inside a MeteredStore (the contract's tests run through both), and the
    simulation's bucket in memory (tests/standins/memstore.py: the scale simulation's figures are
    worth what its contract is)."""
    from fleet.core.store.metered import MeteredStore

    if request.param == "memory":
        from tests.standins.memstore import MemoryStore

        return MemoryStore()
    kind = request.param.removeprefix("metered-")
    inner = request.getfixturevalue(f"{kind}_store")
    return MeteredStore(inner) if request.param.startswith("metered-") else inner


def _race(n, fn):
    """Run fn(i) for i < n in n threads released together; return results or exceptions."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        try:
            return fn(i)
        except Exception as e:  # the caller sorts outcomes
            return e

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


# -- reads and writes ------------------------------------------------------------------


def test_round_trip(store):
    data = bytes(range(256)) * 3
    gen = store.write("a/b/c.bin", data)
    assert isinstance(gen, int) and gen > 0
    assert store.read("a/b/c.bin") == data
    assert store.read_generation("a/b/c.bin") == (data, gen)
    assert store.stat("a/b/c.bin") == Blob("a/b/c.bin", gen, len(data))
    assert store.write("empty", b"") > 0
    assert store.read("empty") == b""
    assert store.read_generation("empty")[0] == b""


def test_range_reads_match_slicing(store):
    data = b"0123456789"
    store.write("r", data)
    for start in range(0, 13):
        for end in [None, *range(0, 13)]:
            assert store.read("r", start, end) == data[start:end], (start, end)
    store.write("e", b"")
    assert store.read("e", 0, 5) == b"" and store.read("e", 3) == b""


def test_reading_absent_is_not_found(store):
    for call in (
        lambda: store.read("nope"),
        lambda: store.read("nope", 2, 5),
        lambda: store.read("nope", 3, 3),
        lambda: store.read_generation("nope"),
    ):
        with pytest.raises(NotFound):
            call()


def test_read_generation_is_consistent_under_concurrent_writes(store):
    written = {store.write("obj", b"v-init"): b"v-init"}
    seen, done = [], threading.Event()

    def reader():
        while not done.is_set():
            seen.append(store.read_generation("obj"))

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        for i in range(30):
            data = f"v-{i}-".encode() * (i + 1)
            written[store.write("obj", data)] = data
    finally:
        done.set()
        for t in readers:
            t.join()
    assert len({gen for _, gen in seen}) > 1  # the readers did overlap the writes
    for data, gen in seen:
        assert written.get(gen) == data


def test_generation_changes_on_every_write(store):
    gens = [store.write("g", b"same bytes") for _ in range(10)]
    assert len(set(gens)) == len(gens)
    assert store.stat("g").generation == gens[-1]
    assert store.read_generation("g")[1] == gens[-1]


# -- preconditions ----------------------------------------------------------------------


def test_create_only_if_absent(store):
    gen = store.write("lease", b"first", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        store.write("lease", b"second", if_generation_match=0)
    assert store.read_generation("lease") == (b"first", gen)


def test_compare_and_swap(store):
    g1 = store.write("x", b"1")
    g2 = store.write("x", b"2", if_generation_match=g1)
    assert g2 != g1
    with pytest.raises(PreconditionFailed):
        store.write("x", b"stale", if_generation_match=g1)
    assert store.read_generation("x") == (b"2", g2)
    with pytest.raises(PreconditionFailed):
        store.write("absent", b"?", if_generation_match=g2)
    assert store.stat("absent") is None


def test_racing_creators_have_one_winner(store):
    results = _race(RACERS, lambda i: store.write("contested", f"w{i}".encode(), if_generation_match=0))
    winners = [i for i, r in enumerate(results) if isinstance(r, int)]
    assert len(winners) == 1, results
    assert all(isinstance(r, PreconditionFailed) for r in results if not isinstance(r, int))
    assert store.read_generation("contested") == (f"w{winners[0]}".encode(), results[winners[0]])


def test_racing_compare_and_swap_has_one_winner(store):
    base = store.write("cas", b"base")
    results = _race(RACERS, lambda i: store.write("cas", f"w{i}".encode(), if_generation_match=base))
    winners = [i for i, r in enumerate(results) if isinstance(r, int)]
    assert len(winners) == 1, results
    assert all(isinstance(r, PreconditionFailed) for r in results if not isinstance(r, int))
    assert store.read_generation("cas") == (f"w{winners[0]}".encode(), results[winners[0]])


# -- stat, list, delete -----------------------------------------------------------------


def test_stat_of_absent_is_none(store):
    assert store.stat("nothing/here") is None
    store.write("dir/obj", b"x")
    assert store.stat("dir") is None  # a "folder" is not an object


def test_list_by_prefix(store):
    names = ["runs/r1/leases/b", "runs/r1/leases/a", "runs/r1/run.json", "runs/r10/x", "runs/r2/y", "top"]
    gens = {n: store.write(n, n.encode()) for n in names}
    everything = list(store.list())
    assert [b.name for b in everything] == sorted(names)
    assert all(b.generation == gens[b.name] and b.size == len(b.name) for b in everything)
    assert [b.name for b in store.list("runs/r1/")] == ["runs/r1/leases/a", "runs/r1/leases/b", "runs/r1/run.json"]
    assert [b.name for b in store.list("runs/r1")] == [
        "runs/r1/leases/a",
        "runs/r1/leases/b",
        "runs/r1/run.json",
        "runs/r10/x",
    ]
    assert [b.name for b in store.list("runs/r1/leases/a")] == ["runs/r1/leases/a"]
    assert list(store.list("nothing/")) == []
    assert list(store.list("runs/r3")) == []


def test_list_pages_through_many_objects(store):
    if hasattr(store, "page_size"):
        store.page_size = 7
    names = [f"many/{i:03d}" for i in range(40)]
    for n in reversed(names):
        store.write(n, b"x")
    store.write("other", b"y")
    assert [b.name for b in store.list("many/")] == names


def test_list_a_range_of_names(store):
    """start and end bound the names as Cloud Storage's startOffset (inclusive) and endOffset
    (exclusive) do, on top of the prefix: how a worker lists one window of the leases."""
    names = ["l/00001", "l/00002", "l/00002-of-00004", "l/00003", "l/00004", "m/00002"]
    for n in names:
        store.write(n, b"x")
    assert [b.name for b in store.list("l/", start="l/00002", end="l/00004")] == [
        "l/00002",
        "l/00002-of-00004",
        "l/00003",
    ]
    assert [b.name for b in store.list("l/", start="l/00002", end="l/00002!")] == ["l/00002"]
    assert [b.name for b in store.list("l/", start="l/00003")] == ["l/00003", "l/00004"]
    assert [b.name for b in store.list("l/", end="l/00002")] == ["l/00001"]
    assert [b.name for b in store.list("", start="l/00004", end="m/00003")] == ["l/00004", "m/00002"]
    assert list(store.list("l/", start="l/00005")) == [] and list(store.list("l/", end="l/")) == []


def test_a_ranged_listing_pages_within_its_range(store):
    if hasattr(store, "page_size"):
        store.page_size = 3
    for i in range(20):
        store.write(f"r/{i:02d}", b"x")
    assert [b.name for b in store.list("r/", start="r/04", end="r/13")] == [f"r/{i:02d}" for i in range(4, 13)]


def test_delete(store):
    store.write("d/x", b"x")
    store.delete("d/x")
    assert store.stat("d/x") is None
    with pytest.raises(NotFound):
        store.read("d/x")
    store.delete("d/x")  # absent is fine
    store.delete("never/was/here")
    assert store.write("d/x", b"again", if_generation_match=0) > 0
    assert list(store.list()) == [Blob("d/x", store.stat("d/x").generation, 5)]


# -- files ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [300_000, 9 * 1024 * 1024 + 17])  # multipart and resumable on GCS
def test_upload_and_download_file(store, tmp_path, size):
    data = os.urandom(size)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    gen = store.upload_file("out/shard-0.bin", str(src))
    assert store.stat("out/shard-0.bin") == Blob("out/shard-0.bin", gen, size)
    dst = tmp_path / "dst.bin"
    store.download_file("out/shard-0.bin", str(dst))
    assert dst.read_bytes() == data
    for start, end in [(0, 1), (1000, 5000), (size - 10, None), (size - 10, size + 100), (size, None), (7, 7)]:
        store.download_file("out/shard-0.bin", str(dst), start, end)
        assert dst.read_bytes() == data[start:end], (start, end)
    assert store.upload_file("out/shard-0.bin", str(src)) != gen  # a rewrite is a new generation
    with pytest.raises(NotFound):
        store.download_file("out/absent", str(tmp_path / "absent.bin"))


# -- the local folder -----------------------------------------------------------------


BAD_NAMES = ["", "..", "../x", "a/../../x", "a/..", "/etc/passwd", "a//b", "a/", "./a", "a/./b", ".fleet-tmp-x"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_local_store_rejects_escaping_names(local_store, name):
    for call in (
        lambda: local_store.write(name, b"x"),
        lambda: local_store.read(name),
        lambda: local_store.stat(name),
        lambda: local_store.delete(name),
    ):
        with pytest.raises(StoreError):
            call()
    assert not os.path.exists(os.path.join(os.path.dirname(local_store.root), "x"))


def test_local_temp_files_never_listed(local_store):
    from fleet.core.store.local import _TMP_PREFIX

    local_store.write("a/b", b"x")
    # Leftovers of a crashed writer, at the root and in a folder.
    for folder in (local_store.root, os.path.join(local_store.root, "a")):
        with open(os.path.join(folder, _TMP_PREFIX + "crashed"), "wb") as f:
            f.write(b"partial")
    done = threading.Event()

    def writer():
        i = 0
        while not done.is_set():
            local_store.write(f"a/w{i % 3}", b"y" * 1000)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(200):
            assert not any(_TMP_PREFIX in b.name for b in local_store.list())
    finally:
        done.set()
        t.join()
    assert [b.name for b in local_store.list()] == ["a/b", "a/w0", "a/w1", "a/w2"]


def test_local_object_and_folder_of_one_name_is_a_store_error(local_store, tmp_path):
    local_store.write("a/b", b"x")
    local_store.write("f", b"y")
    (tmp_path / "src").write_bytes(b"z")
    for call in (
        lambda: local_store.write("a", b"x", if_generation_match=0),
        lambda: local_store.write("f/g", b"x"),
        lambda: local_store.write("f/g/h", b"x"),
        lambda: local_store.upload_file("a", str(tmp_path / "src")),
    ):
        with pytest.raises(StoreError, match="both an object and a folder"):
            call()
    assert [b.name for b in local_store.list()] == ["a/b", "f"]


def test_local_delete_of_absent_leaves_no_folders(local_store):
    local_store.write("keep", b"x")
    local_store.delete("no/such/folder/obj")
    local_store.delete("keep/under/a/file")
    assert sorted(os.listdir(local_store.root)) == ["keep"]


# -- Cloud Storage specifics ----------------------------------------------------------


def test_gcs_missing_bucket_is_not_found(fake_gcs):
    from fleet.core.store.gcs import GCSStore

    s = GCSStore("no-such-bucket-fleet")
    for call in (lambda: s.read("x"), lambda: s.write("x", b"1", if_generation_match=0), lambda: list(s.list())):
        with pytest.raises(NotFound) as info:
            call()
        message = str(info.value)
        assert "no-such-bucket-fleet" in message and "\n" not in message


def test_gcs_prefix_is_transparent(gcs_bucket):
    from fleet.core.store.gcs import GCSStore

    root = GCSStore(gcs_bucket)
    sub = open_store(f"gs://{gcs_bucket}/runs/r1/")
    assert isinstance(sub, GCSStore) and sub.url == f"gs://{gcs_bucket}/runs/r1"
    gen = sub.write("leases/a", b"lease", if_generation_match=0)
    root.write("runs/r10/x", b"not under the prefix")
    assert root.read_generation("runs/r1/leases/a") == (b"lease", gen)
    assert [b.name for b in sub.list()] == ["leases/a"]
    assert sub.stat("leases/a") == Blob("leases/a", gen, 5)


def test_gcs_list_really_pages(gcs_store):
    gcs_store.page_size = 7
    for i in range(25):
        gcs_store.write(f"p/{i:02d}", b"x")
    http = gcs_store.client._http
    requests_seen = []
    original = http.request

    def counting(method, url, *args, **kwargs):
        requests_seen.append(url)
        return original(method, url, *args, **kwargs)

    http.request = counting
    try:
        assert len(list(gcs_store.list("p/"))) == 25
    finally:
        del http.request
    assert len(requests_seen) == 4  # 7 + 7 + 7 + 4


def test_gcs_error_mapping(gcs_store):
    from google.api_core import exceptions as gexc

    with pytest.raises(Forbidden) as info:
        with gcs_store._errors("runs/x"):
            raise gexc.Forbidden("sa@p.iam does not have storage.objects.get access\nmore detail")
    assert str(info.value).startswith(f"gs://{gcs_store.bucket_name}/runs/x: ")
    assert "\n" not in str(info.value)
    with pytest.raises(StoreError) as info:
        with gcs_store._errors("y"):
            raise gexc.ServiceUnavailable("try later")
    assert "503" in str(info.value)


def test_open_store_kinds(tmp_path):
    from fleet.core.store.local import LocalStore

    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(f"file://{tmp_path}").root == str(tmp_path)


class _Interrupt(BaseException):
    """What a worker's SIGTERM handler raises (fleet.core.attempt.Shutdown), at any line."""


def _interrupted_at(n: int, call) -> bool:
    """Run ``call`` with an _Interrupt raised at the nth place below it where CPython runs a pending
    signal handler: on entering a Python function, and when a call into C returns (its effect done,
    its result dropped), in any frame (the store's, tempfile's, contextlib's); True when ``call`` ran
    to its end first. (Loops' back edges, the third such place, are left out.)"""
    import sys

    seen = 0

    def profile(frame, event, arg):
        nonlocal seen
        if event in ("call", "c_return"):
            seen += 1
            if seen == n:
                raise _Interrupt()

    sys.setprofile(profile)
    try:
        call()
    except _Interrupt:
        return False
    finally:
        sys.setprofile(None)
    return True


@pytest.mark.parametrize("how", ["write", "write_if_absent", "write_refused", "upload_file"])
def test_a_local_write_interrupted_at_any_line_leaves_no_temporary_file(local_store, tmp_path, how):
    """Invariant: wherever a signal interrupts a local write (a worker's SIGTERM raises
    Shutdown wherever it lands: `fleet local` stops its workers the moment the run is finished,
    one of them perhaps writing manifest.json), no ``.fleet-tmp-*`` file is left beside the
    object; the object is the old one or the new one, whole. (A temporary file was left in
    OUT_DIR after `fleet local` returned, under load: a SIGTERM between mkstemp and the try whose
    finally removes the file, or inside that finally before the unlink.)"""
    from fleet.core.store.local import _TMP_PREFIX

    src = tmp_path / "src"
    src.write_bytes(b"new" * 1000)

    def refused():  # the object is there: PreconditionFailed, on its way through the same cleanup
        try:  # (not pytest.raises: its own calls would be interrupted too, thousands of them)
            local_store.write("a/obj", b"new" * 1000, if_generation_match=0)
        except PreconditionFailed:
            return
        raise AssertionError("a create-only write over an object went through")

    calls = {
        "write": lambda: local_store.write("a/obj", b"new" * 1000),
        "write_if_absent": lambda: local_store.write("a/other", b"new" * 1000, if_generation_match=0),
        "write_refused": refused,
        "upload_file": lambda: local_store.upload_file("a/obj", str(src)),
    }
    n = 0
    while True:
        n += 1
        local_store.write("a/obj", b"old")
        local_store.delete("a/other")
        finished = _interrupted_at(n, calls[how])
        left = [name for name in os.listdir(os.path.join(local_store.root, "a")) if name.startswith(_TMP_PREFIX)]
        assert left == [], f"interrupted at the call or return {n}: {left}"
        name = "a/other" if how == "write_if_absent" else "a/obj"
        assert local_store.stat(name) is None or local_store.read(name) in (b"old", b"new" * 1000)
        if finished:
            break
    assert n > 10  # the profile saw the calls inside the write, not only the write

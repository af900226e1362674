"""A worker's store requests, counted as Cloud Storage bills them (fleet.core.store.metered).

Each store call against a hand count, on the local folder and on fake-gcs-server, where the
count must also be the HTTP requests the client really sent; list pages per 1,000 objects;
the library's upload thresholds; counts exact under threads; and a worker's final heartbeat
holding every request it made. That counting changes no behaviour is the store contract's
(tests/test_store_contract.py runs it through a MeteredStore too).
"""

from __future__ import annotations

import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests.adapters
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.store import NotFound
from fleet.core.store.metered import (
    LIST_PAGE,
    MULTIPART_MAX,
    RESUMABLE_CHUNK,
    MeteredStore,
    RequestCounts,
    list_pages,
    upload_requests,
)


class Wire:
    """The HTTP requests this process sends (the GCS client's), by URL, while ``on``."""

    def __init__(self, monkeypatch):
        self.urls: list[str] = []
        self.on = False
        original = requests.adapters.HTTPAdapter.send

        def send(adapter, request, *args, **kwargs):
            if self.on:
                self.urls.append(request.url)
            return original(adapter, request, *args, **kwargs)

        monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)


def _delta(metered: MeteredStore, call) -> tuple[dict[str, int], object]:
    before = metered.meter.snapshot()
    try:
        result = call()
    except Exception as e:  # the count is asserted whatever the call ends in
        result = e
    after = metered.meter.snapshot()
    return {k: v - before.to_dict()[k] for k, v in after.to_dict().items() if v != before.to_dict()[k]}, result


def _own_client(store):
    """A GCS store with a client of its own: the shared one created the test's bucket, which
    google-cloud-storage 3.x then keeps in a cache that makes every 404 check in the background
    that the bucket still exists (a worker never creates or reads a bucket, so its client never
    caches one)."""
    from fleet.core.store.gcs import GCSStore

    if not isinstance(store, GCSStore):
        return store
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return GCSStore(store.bucket_name, client=storage.Client(project="local", credentials=AnonymousCredentials()))


def test_each_call_counts_the_requests_cloud_storage_bills(store, tmp_path, monkeypatch):
    """Hand counts per call; on fake-gcs-server they are also the requests sent, one for one."""
    store = _own_client(store)
    wire = Wire(monkeypatch)
    metered = MeteredStore(store)
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(os.urandom(300_000))
    big.write_bytes(os.urandom(MULTIPART_MAX + 17))  # a resumable upload: its start and one chunk
    with pytest.raises(NotFound):  # GCSStore asks once, after its first 404, whether the bucket exists
        store.read("warm/absent")
    gen = store.write("obj", b"0123456789")
    cases = [
        ("write", lambda: metered.write("a/x", b"data"), {"writes": 1}),
        ("write, create-only, refused", lambda: metered.write("a/x", b"again", if_generation_match=0), {"writes": 1}),
        (
            "write, compare-and-swap",
            lambda: metered.write("obj", b"9876543210", if_generation_match=gen),
            {"writes": 1},
        ),
        ("read", lambda: metered.read("obj"), {"reads": 1}),
        ("ranged read", lambda: metered.read("obj", 2, 5), {"reads": 1}),
        ("read of an absent object", lambda: metered.read("a/absent"), {"reads": 1}),
        ("read_generation", lambda: metered.read_generation("obj"), {"reads": 1}),
        ("stat", lambda: metered.stat("obj"), {"stats": 1}),
        ("stat of an absent object", lambda: metered.stat("a/absent"), {"stats": 1}),
        ("upload_file, multipart", lambda: metered.upload_file("out/s", str(small)), {"writes": 1}),
        ("upload_file, resumable", lambda: metered.upload_file("out/b", str(big)), {"writes": 2}),
        ("download_file", lambda: metered.download_file("out/s", str(tmp_path / "d")), {"reads": 1}),
        ("ranged download_file", lambda: metered.download_file("out/b", str(tmp_path / "d"), 10, 5000), {"reads": 1}),
        ("list", lambda: list(metered.list("a/")), {"list_pages": 1}),
        ("empty list", lambda: list(metered.list("nothing/")), {"list_pages": 1}),
        ("delete", lambda: metered.delete("a/x"), {"deletes": 1}),
        ("delete of an absent object", lambda: metered.delete("a/x"), {"deletes": 1}),
    ]
    for what, call, expected in cases:
        wire.urls.clear()
        wire.on = True
        counted, result = _delta(metered, call)
        wire.on = False
        assert counted == expected, (what, result)
        if store.url.startswith("gs://"):
            assert len(wire.urls) == sum(expected.values()), (what, wire.urls)


def test_a_listing_is_billed_per_page_as_the_client_fetches_them(gcs_store, monkeypatch):
    gcs_store = _own_client(gcs_store)
    wire = Wire(monkeypatch)
    gcs_store.page_size = 7
    for i in range(25):
        gcs_store.write(f"p/{i:02d}", b"x")
    metered = MeteredStore(gcs_store, page=7)
    for prefix, consumed, pages in [
        ("p/", 25, 4),
        ("none/", 0, 1),
        ("p/", 7, 1),
        ("p/", 8, 2),
        ("p/", 14, 2),
        ("p/", 15, 3),
        ("p/1", 10, 2),
    ]:
        wire.urls.clear()
        wire.on = True

        def read(prefix=prefix, consumed=consumed):
            listing = metered.list(prefix)
            got = list(itertools.islice(listing, consumed))
            if prefix == "none/" or consumed == 25:
                assert next(listing, None) is None  # read to its end
            return got

        counted, got = _delta(metered, read)
        wire.on = False
        assert len(got) == consumed
        assert counted == {"list_pages": pages} and len(wire.urls) == pages, (prefix, consumed, wire.urls)
    assert _delta(metered, lambda: metered.list("p/"))[0] == {}  # a listing never read asks nothing


def test_a_listing_of_thousands_is_one_page_per_thousand(local_store):
    for i in range(2 * LIST_PAGE + 500):
        local_store.write(f"many/{i:04d}", b"")
    metered = MeteredStore(local_store)
    assert _delta(metered, lambda: list(metered.list("many/")))[0] == {"list_pages": 3}  # 2,500 objects
    assert _delta(metered, lambda: list(metered.list("many/0")))[0] == {"list_pages": 1}  # 1,000
    local_store.write("many/0x", b"")
    assert _delta(metered, lambda: list(metered.list("many/0")))[0] == {"list_pages": 2}  # 1,001


@settings(max_examples=60, deadline=None)
@given(objects=st.integers(0, 40), page=st.integers(1, 12), data=st.data())
def test_pages_counted_are_those_of_the_objects_consumed(objects, page, data):
    """Whatever the listing's length, the page size and how far it is read: the pages counted are
    the requests a client fetching ``page`` objects at a time has made."""
    consumed = data.draw(st.integers(0, objects))

    class Names:  # a store's listing of `objects` objects, and nothing else
        url = "mem"

        def list(self, prefix="", start=None, end=None):
            return iter(range(objects))

    metered = MeteredStore(Names(), page=page)
    to_end = data.draw(st.booleans()) if consumed == objects else False
    it = metered.list()
    for _ in range(consumed):
        next(it)
    if to_end:
        assert next(it, None) is None
    asked = consumed or to_end  # a listing no one reads from has asked for nothing yet
    assert metered.meter.snapshot().list_pages == (list_pages(consumed, page) if asked else 0)


def test_upload_requests_follow_the_librarys_thresholds():
    from google.cloud.storage import blob

    assert MULTIPART_MAX == blob._MAX_MULTIPART_SIZE and RESUMABLE_CHUNK == blob._DEFAULT_CHUNKSIZE
    assert [
        upload_requests(n)
        for n in (0, MULTIPART_MAX, MULTIPART_MAX + 1, RESUMABLE_CHUNK, RESUMABLE_CHUNK + 1, 5 * RESUMABLE_CHUNK)
    ] == [1, 1, 2, 2, 3, 6]


def test_counts_are_exact_under_threads(local_store):
    metered = MeteredStore(local_store)
    metered.write("shared", b"x")

    def work(i: int) -> None:
        for j in range(50):
            metered.write(f"t/{i}/{j}", b"x")
            metered.read("shared")
            metered.stat("shared")
            list(metered.list(f"t/{i}/0"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert metered.meter.snapshot() == RequestCounts(list_pages=400, writes=401, reads=400, stats=400)


def test_heartbeat_counts_parse_only_as_counts():
    assert RequestCounts.from_dict({"writes": 3, "reads": 1}) == RequestCounts(writes=3, reads=1)
    for bad in (None, {}, [], {"writes": -1}, {"writes": "3"}, {"writes": True}, {"other": 1}):
        assert RequestCounts.from_dict(bad) is None, bad
    counts = RequestCounts(1, 2, 3, 4, 5)
    assert (counts.class_a, counts.class_b, counts.free) == (3, 7, 5)
    assert RequestCounts.from_dict(counts.to_dict()) == counts and counts + counts == RequestCounts(2, 4, 6, 8, 10)


# -- a worker's heartbeat carries its counts ------------------------------------------------------------
def test_a_workers_final_heartbeat_holds_every_request_it_sent(tmp_path, gcs_bucket, monkeypatch):
    """A worker drains a run on fake-gcs-server: its last heartbeat's counts are every request of
    its run's bucket and outputs the client sent (its input is a local file here, read through
    the job's own store, which the worker does not count), but for the bucket lookups GCSStore
    makes after a 404, which are not counted."""
    from fleet.core.layout import worker_prefix
    from fleet.core.spawner import Worker
    from fleet.core.store import open_store
    from tests.test_run_state import RUN, _plan

    bucket = f"gs://{gcs_bucket}"
    _, items = _plan(tmp_path, docs=30, bucket=bucket)
    assert len(items) > 3
    wire = Wire(monkeypatch)
    wire.on = True
    worker = Worker(bucket, RUN, name="w", poll=0.01)
    try:
        worker.run_until_drained()
    finally:
        worker.close()
    wire.on = False
    beat = json.loads(open_store(bucket).read(worker_prefix(RUN) + "w"))
    assert beat["state"] == "exited"
    counts = RequestCounts.from_dict(beat["requests"])
    assert counts == worker.store.meter.snapshot()
    bucket_lookups = [u for u in wire.urls if u.split("?")[0].endswith(f"/b/{gcs_bucket}")]
    assert counts.class_a + counts.class_b + counts.free == len(wire.urls) - len(bucket_lookups)
    assert counts.writes >= 4 * len(items)  # at least a claim, a commit, a marker and an output each
    assert counts.list_pages >= 2 and counts.stats >= len(items)  # each output's stat after its upload

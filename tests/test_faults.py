"""Storage faults: 429, 500, 503, dropped connections and lost answers between the
workers and fake-gcs-server (tests/standins/faultproxy.py), on single calls and on
whole runs. Runs must end with the bytes of a clean run, and a worker whose claim
was applied but whose answer was lost must know the lease is its own.
"""

from __future__ import annotations

import math
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.core.lease import DONE, Held, Leases
from fleet.core.status import StatusReader
from fleet.core.store import PreconditionFailed, StoreError, Unavailable
from fleet.core.store.gcs import GCSStore
from tests.helpers.procs import clean_run, committed, listed_outputs, plan_lines, start_worker, wait_exit, write_corpus
from tests.standins.faultproxy import FaultProxy, is_conditional_create


def anything(method: str, path: str) -> bool:
    return True


@pytest.fixture
def proxy(fake_gcs, monkeypatch):
    """A fault proxy in front of the emulator; this process's store calls go through it."""
    p = FaultProxy(fake_gcs.url, seed=11).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", p.url)
    yield p
    p.stop()


@pytest.fixture
def direct(gcs_bucket, fake_gcs):
    """The same bucket without the proxy, to set things up and to check."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.api_core.client_options import ClientOptions

    client = storage.Client(
        project="local", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=fake_gcs.url)
    )
    return GCSStore(gcs_bucket, client=client)


# -- single calls --------------------------------------------------------------------


def test_every_store_call_is_retried_through_a_transient_fault(proxy, direct, gcs_bucket, tmp_path):
    direct.write("a/x", b"hello world")
    direct.write("a/y", b"second")
    src = tmp_path / "src.bin"
    src.write_bytes(b"upload me" * 100)
    store = GCSStore(gcs_bucket)
    calls = [
        ("create", lambda: store.write("a/new", b"n", if_generation_match=0)),
        ("cas", lambda: store.write("a/x", b"hello again", if_generation_match=direct.stat("a/x").generation)),
        ("heartbeat", lambda: store.write("w/me", b"beat", idempotent=True)),
        ("read", lambda: store.read("a/y")),
        ("range", lambda: store.read("a/y", 1, 3)),
        ("read_generation", lambda: store.read_generation("a/y")),
        ("download", lambda: store.download_file("a/y", str(tmp_path / "dl"), 0, 3)),
        ("upload", lambda: store.upload_file("o/part", str(src))),
        ("stat", lambda: store.stat("a/y")),
        ("list", lambda: [b.name for b in store.list("a/")]),
        ("delete", lambda: store.delete("a/new")),
    ]
    faults = ["429", "500", "503", "drop", "lost"]
    for i, (what, call) in enumerate(calls):
        fault = faults[i % len(faults)]
        if fault == "lost" and what == "create":
            fault = "503"  # a lost create answers 412 to the retry; the lease layer's case, tested below
        proxy.script = [[anything, fault, 1]]
        before = proxy.counts[fault]
        result = call()
        assert proxy.counts[fault] == before + 1, (what, fault)
        if what == "range":
            assert result == b"ec"
        elif what == "read_generation":
            assert result == (b"second", direct.stat("a/y").generation)
        elif what == "list":
            assert result == ["a/new", "a/x", "a/y"]
    assert direct.read("a/x") == b"hello again"
    assert direct.read("w/me") == b"beat"
    assert (tmp_path / "dl").read_bytes() == b"sec"
    assert direct.read("o/part") == src.read_bytes()
    assert direct.stat("a/new") is None


def test_an_unconditional_write_is_retried_only_when_declared_idempotent(proxy, direct, gcs_bucket):
    store = GCSStore(gcs_bucket)
    proxy.script = [[anything, "drop", 1]]
    with pytest.raises(StoreError, match=rf"gs://{gcs_bucket}/plain: ConnectionError"):
        store.write("plain", b"x")  # may not be replayed: it could overwrite someone's newer write
    assert direct.stat("plain") is None
    proxy.script = [[anything, "drop", 1]]
    store.write("mine", b"x", idempotent=True)
    assert direct.read("mine") == b"x"


def test_a_lost_answer_to_a_conditional_write_comes_back_as_412(proxy, direct, gcs_bucket):
    """What the lease layer relies on: the server applied the create, the client's retry sees 412."""
    proxy.script = [[is_conditional_create, "lost", 1]]
    with pytest.raises(PreconditionFailed):
        GCSStore(gcs_bucket).write("lease", b"mine", if_generation_match=0)
    assert direct.read("lease") == b"mine"
    assert [s for _, path, s in proxy.statuses if "/upload/" in path] == [200, 412]


def test_claim_renew_commit_with_lost_answers_keep_the_lease(proxy, direct, gcs_bucket):
    store = GCSStore(gcs_bucket)
    leases = Leases(store, "runs/r/leases/", "me", ttl=30, max_attempts=3)
    proxy.script = [[anything, "lost", 1]]
    held = leases.claim("00001")
    assert isinstance(held, Held) and held.lease.attempt == 1
    proxy.script = [[anything, "lost", 1]]
    leases.renew(held)
    proxy.script = [[anything, "lost", 1]]
    leases.commit(held, [{"name": "part-00001.txt"}], {"n": 1})
    assert proxy.counts["lost"] == 3
    assert [s for _, path, s in proxy.statuses if "/upload/" in path] == [200, 412, 200, 412, 200, 412]
    lease = Leases(direct, "runs/r/leases/", "check", 30, 3).read("00001")[0]
    assert lease.state == DONE and lease.worker == "me" and lease.attempt == 1


def test_a_fault_that_outlasts_the_retries_is_a_one_line_store_error(proxy, gcs_bucket):
    proxy.forbid = anything
    with pytest.raises(StoreError) as e:
        GCSStore(gcs_bucket).read("x")
    assert "access denied (403)" in str(e.value) and "\n" not in str(e.value)


# -- whole runs ------------------------------------------------------------------------


@pytest.fixture
def corpus_url(tmp_path, direct, gcs_bucket):
    path = write_corpus(str(tmp_path / "corpus.txt"), docs=120, seed=3)
    with open(path, "rb") as f:
        direct.write("in/corpus.txt", f.read())
    return f"gs://{gcs_bucket}/in/corpus.txt"


@pytest.mark.parametrize("rate", [0.05, 0.20])
def test_runs_through_faults_end_with_a_clean_runs_bytes(fake_gcs, gcs_bucket, corpus_url, tmp_path, rate):
    bucket = f"gs://{gcs_bucket}"
    logs = str(tmp_path / "logs")
    expected = clean_run(bucket, "clean", corpus_url, 2400, logs)
    assert len(expected) >= 10
    items = plan_lines(bucket, "faulty", corpus_url, 2400, ttl=30, attempts=3)
    # Random faults on every kind of request, and certainly a few lost claims.
    proxy = FaultProxy(
        fake_gcs.url, rate=rate, seed=int(rate * 100), script=[(is_conditional_create, "lost", 3)]
    ).start()
    try:
        workers = [
            start_worker(bucket, "faulty", f"w{i}", logs, {"STORAGE_EMULATOR_HOST": proxy.url}) for i in range(3)
        ]
        wait_exit(workers, 150)
    finally:
        proxy.stop()
    for w in workers:
        assert w.popen.returncode == 0 and "Traceback" not in w.stderr_text(), (w.name, w.stderr_text())
    assert proxy.counts["lost"] >= 3 and sum(proxy.counts[f] for f in ("429", "500", "503", "drop")) >= 1
    if rate >= 0.2:
        assert all(proxy.counts[f] >= 1 for f in ("429", "500", "503", "drop", "lost")), proxy.counts
    lost_claims = [p for p in proxy.lost_paths if "ifGenerationMatch=0" in p]
    assert len(lost_claims) >= 3
    assert committed(bucket, "faulty") == expected
    assert listed_outputs(f"{bucket}/out-faulty") == expected
    from fleet.core.status import StatusReader
    from fleet.core.store import open_store

    leases = StatusReader(open_store(bucket), "faulty").leases()
    assert len(leases) == len(items)
    # Attempt 1 everywhere: no worker mistook its own claim (lost answer, then 412) for
    # someone else's and left the item to expire; no lease was lost to a slow retry.
    assert all(lease.state == DONE and lease.attempt == 1 for lease in leases.values()), {
        k: (v.state, v.attempt, v.worker) for k, v in leases.items() if v.attempt != 1
    }


# -- an outage: the bucket answers nothing for longer than the client retries -----------------------


def test_an_outage_past_the_clients_retries_is_unavailable_not_a_refusal(proxy, gcs_bucket, monkeypatch):
    monkeypatch.setenv("FLEET_STORE_RETRY_SECONDS", "1")
    store = GCSStore(gcs_bucket)
    for fault in ("503", "drop", "429"):
        proxy.script = [[anything, fault, 10**6]]
        with pytest.raises(Unavailable) as e:
            store.read("x")
        assert "\n" not in str(e.value)
        with pytest.raises(Unavailable):
            store.write("plain", b"x")  # not retried at all: at once
    proxy.script = []
    proxy.forbid = anything
    with pytest.raises(StoreError) as refused:
        store.read("x")
    assert not isinstance(refused.value, Unavailable)  # a 403 is no outage: a worker stops on it


OUTAGE = 8  # seconds: eight times the client's retry deadline below


def test_workers_ride_out_an_outage_past_the_clients_retries(fake_gcs, gcs_bucket, corpus_url, tmp_path, capsys):
    """Before, a worker stopped (exit 2) once the storage client's retries (120 s) were spent, and
    on a VM its VM left the run for good. Scaled: the client's retry deadline is 2 s here and the
    outage 20 s (on GCS: 120 s, and an outage of minutes). Every worker rides it out, the items in
    hand are given back when the bucket answers again, and the run ends with a clean run's bytes.
    (Scaled further since: 1 s of client retries and an outage of 8 s, still eight times past them;
    what took the time was the outage and the backoff after it, not what is checked: the waits
    between tries are capped at 2 s here, not a minute.)"""
    bucket = f"gs://{gcs_bucket}"
    logs = str(tmp_path / "logs")
    expected = clean_run(bucket, "clean", corpus_url, 2400, logs)
    plan_lines(bucket, "out", corpus_url, 2400, ttl=30, attempts=3, delay=0.05)
    with FaultProxy(fake_gcs.url) as proxy:
        env = {
            "STORAGE_EMULATOR_HOST": proxy.url,
            "FLEET_STORE_RETRY_SECONDS": "1",
            "FLEET_OUTAGE_BACKOFF_SECONDS": "2",
        }
        workers = [start_worker(bucket, "out", f"w{i}", logs, env) for i in range(2)]
        reader = StatusReader(GCSStore(gcs_bucket, client=None), "out")
        deadline = time.time() + 60
        while not (reader.collect().done >= 2 and reader.collect().leased >= 1):
            assert time.time() < deadline, [w.log_lines()[-3:] for w in workers]
            time.sleep(0.05)
        proxy.script = [[anything, "503", 10**9]]  # the outage: nothing gets through
        t0 = time.time()
        time.sleep(OUTAGE)
        assert all(w.alive() for w in workers), [w.log_lines()[-3:] for w in workers]
        met = proxy.counts["503"]
        proxy.script = []
        wait_exit(workers, 150)
        back = time.time() - t0
    for w in workers:
        assert w.popen.returncode == 0 and "Traceback" not in w.stderr_text(), (w.name, w.stderr_text())
    text = "\n".join(line for w in workers for line in w.log_lines())
    assert "the bucket is unreachable" in text and "waiting for it" in text
    assert committed(bucket, "out") == expected
    assert listed_outputs(f"{bucket}/out-out") == expected
    with capsys.disabled():
        print(
            f"\noutage of {OUTAGE} s (client retries 1 s): {met} requests refused; both workers rode it out, "
            f"the run finished {back:.0f} s after the outage began"
        )


@settings(max_examples=80)
@given(
    value=st.one_of(
        st.floats(-1e6, 1e6),
        st.just(math.nan),
        st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=6),
    )
)
def test_the_outage_knobs_take_a_number_in_range_and_name_anything_else(value):
    """FLEET_OUTAGE_MINUTES (>= 0) and FLEET_OUTAGE_BACKOFF_SECONDS (> 0): a typo or NaN is refused in
    one line naming the variable, never taken as a default or a zero."""
    from fleet.core.processes import _backoff_max, outage_limit

    text = str(value)
    for name, read, ok in (
        ("FLEET_OUTAGE_MINUTES", lambda: outage_limit() / 60, lambda x: x >= 0),
        ("FLEET_OUTAGE_BACKOFF_SECONDS", _backoff_max, lambda x: x > 0),
    ):
        os.environ[name] = text
        try:
            number = float(text.strip()) if text.strip() else None
        except ValueError:
            number = math.nan
        if number is None:
            assert read() in (30.0, 60.0)  # unset: the default
        elif ok(number):
            assert read() == pytest.approx(number)
        else:
            with pytest.raises(ValueError, match=f"^{name}="):
                read()
        del os.environ[name]

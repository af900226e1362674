"""The lease protocol, on a local folder and on fake-gcs-server."""

from __future__ import annotations

import threading

import pytest

from fleet.core.lease import DONE, FAILED, LEASED, Held, Lease, Leases, Lost
from fleet.core.store import PreconditionFailed


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(store, worker, clock, ttl=10.0, attempts=3):
    return Leases(store, "runs/r/leases/", worker, ttl, attempts, clock=clock)


def test_first_claim_wins_and_others_see_a_live_lease(store):
    clock = Clock()
    a, b = make(store, "a", clock), make(store, "b", clock)
    held = a.claim("00001")
    assert isinstance(held, Held) and held.lease.attempt == 1 and held.lease.worker == "a"
    seen = b.claim("00001")
    assert isinstance(seen, Lease) and seen.state == LEASED and seen.worker == "a"


def test_expired_lease_is_taken_over_and_old_holder_cannot_commit(store):
    clock = Clock()
    a, b = make(store, "a", clock), make(store, "b", clock)
    held_a = a.claim("x")
    clock.t += 11  # a stopped renewing
    held_b = b.claim("x", b.read("x"))
    assert isinstance(held_b, Held) and held_b.lease.attempt == 2
    with pytest.raises(Lost):
        a.renew(held_a)
    with pytest.raises(Lost):
        a.commit(held_a, [], {})
    b.commit(held_b, [{"name": "part-x"}], {"n": 1})
    lease, _ = b.read("x")
    assert lease.state == DONE and lease.worker == "b" and lease.outputs == [{"name": "part-x"}]


def test_renewal_keeps_the_lease(store):
    clock = Clock()
    a, b = make(store, "a", clock), make(store, "b", clock)
    held = a.claim("x")
    for _ in range(3):
        clock.t += 6
        a.renew(held)
    assert isinstance(b.claim("x", b.read("x")), Lease)  # still live: 18 s after claim with a 10 s ttl
    a.commit(held, [], {})
    assert a.read("x")[0].state == DONE


def test_done_and_failed_are_final(store):
    clock = Clock()
    a, b = make(store, "a", clock), make(store, "b", clock)
    a.commit(a.claim("d"), [], {})
    held = a.claim("f")
    assert a.fail(held, "f.txt: invalid UTF-8 at byte 3", retry=False)
    clock.t += 1000
    assert b.claim("d", b.read("d")).state == DONE
    failed = b.claim("f", b.read("f"))
    assert failed.state == FAILED and failed.error == "f.txt: invalid UTF-8 at byte 3"


def test_retryable_failures_release_then_fail_after_max_attempts(store):
    clock = Clock()
    w = make(store, "w", clock, attempts=2)
    held = w.claim("x")
    assert not w.fail(held, "boom 1")
    again = w.claim("x", w.read("x"))  # released: no need to wait for expiry
    assert isinstance(again, Held) and again.lease.attempt == 2 and again.lease.error == "boom 1"
    assert w.fail(again, "boom 2")
    lease, _ = w.read("x")
    assert lease.state == FAILED and lease.error == "boom 2"


def test_a_lease_that_keeps_expiring_is_failed_after_max_attempts(store):
    clock = Clock()
    w = make(store, "w", clock, attempts=2)
    w.claim("x")
    clock.t += 11
    assert isinstance(w.claim("x", w.read("x")), Held)
    clock.t += 11
    seen = w.claim("x", w.read("x"))
    assert seen.state == FAILED and "gave up after 2 attempts" in seen.error


def test_release_gives_the_item_back_without_spending_an_attempt(store):
    clock = Clock()
    a, b = make(store, "a", clock), make(store, "b", clock)
    held = a.claim("x")
    a.release(held)
    got = b.claim("x", b.read("x"))
    assert isinstance(got, Held) and got.lease.attempt == 1


def test_racing_claimers_one_winner(store):
    clock = Clock()
    results = []
    barrier = threading.Barrier(12)

    def claim(i):
        w = make(store, f"w{i}", clock)
        barrier.wait()
        results.append(w.claim("hot"))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Held) for r in results) == 1


def test_racing_takeovers_one_winner(store):
    clock = Clock()
    make(store, "dead", clock).claim("x")
    clock.t += 100
    results = []
    barrier = threading.Barrier(8)

    def take(i):
        w = make(store, f"w{i}", clock)
        current = w.read("x")
        barrier.wait()
        results.append(w.claim("x", current))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Held) for r in results) == 1


class LostResponse:
    """A store whose next conditional write is applied but answered with 412,
    as when a create's response is lost and the client's retry hits its own object."""

    def __init__(self, inner):
        self.inner = inner
        self.armed = True

    def write(self, name, data, if_generation_match=None):
        gen = self.inner.write(name, data, if_generation_match)
        if self.armed and if_generation_match is not None:
            self.armed = False
            raise PreconditionFailed(f"{name}: retried write saw its own object")
        return gen

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def test_a_claim_whose_response_was_lost_is_recognised_as_ours(store):
    clock = Clock()
    w = Leases(LostResponse(store), "runs/r/leases/", "w", 10, 3, clock=clock)
    held = w.claim("x")
    assert isinstance(held, Held)
    other = make(store, "other", clock)
    assert isinstance(other.claim("x", other.read("x")), Lease)
    w.commit(held, [], {})
    assert other.read("x")[0].state == DONE


def test_a_renewal_whose_response_was_lost_keeps_the_lease(store):
    clock = Clock()
    flaky = LostResponse(store)
    flaky.armed = False
    w = Leases(flaky, "runs/r/leases/", "w", 10, 3, clock=clock)
    held = w.claim("x")
    flaky.armed = True
    clock.t += 5
    w.renew(held)
    w.commit(held, [], {})
    assert w.read("x")[0].state == DONE

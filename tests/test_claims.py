"""The claim policy alone: which items a worker tries, from listings, with no bucket."""

from __future__ import annotations

from fleet.core.claims import ClaimPolicy
from fleet.core.lease import DONE, LEASED, Lease

ITEMS = [f"{i:05d}" for i in range(6)]
TTL = 60.0


def lease(state=LEASED, expires=0.0) -> Lease:
    return Lease(state, "w", 1, expires)


def test_each_worker_has_its_own_order_of_all_items():
    a, b = ClaimPolicy(ITEMS, "vm-1-w0", TTL, False), ClaimPolicy(ITEMS, "vm-2-w0", TTL, False)
    assert sorted(a.order) == sorted(b.order) == ITEMS and a.order != b.order
    assert ClaimPolicy(ITEMS, "vm-1-w0", TTL, False).order == a.order  # the same worker, the same order


def test_unleased_items_first_and_live_leases_never_read():
    p = ClaimPolicy(ITEMS, "w", TTL, False)
    p.observe(finals=["00000"], listing={"00000": 3, "00001": 5, "00002": 7}, now=100.0)  # 00000 finished
    got = p.candidates(now=100.0, wall=1e9)
    assert [item for item, fresh in got if fresh] == [i for i in p.order if i in ("00003", "00004", "00005")]
    assert not [item for item, fresh in got if not fresh]  # leases just listed: not read
    p.observe(["00000"], {"00000": 3, "00001": 6, "00002": 7}, now=100.0 + TTL / 2)  # 00001 renewed, 00002 stood still
    stalled = [item for item, fresh in p.candidates(100.0 + TTL / 2, 1e9) if not fresh]
    assert stalled == ["00002"]


def test_a_lease_renewed_in_time_is_never_stalled_whatever_the_clocks():
    p = ClaimPolicy(ITEMS, "w", TTL, False)
    for step in range(20):  # renewed every TTL/3 by its holder, listed every TTL/6 here
        p.observe([], {"00001": 1 + step // 2}, now=step * TTL / 6)
        assert "00001" not in [item for item, fresh in p.candidates(step * TTL / 6, 0.0) if not fresh]


def test_an_idle_worker_reads_unseen_leases_at_once_and_a_standby_after_two_passes():
    for standby, passes in ((False, 1), (True, 2)):
        p = ClaimPolicy(ITEMS[:2], "w", TTL, standby)
        p.observe([], {"00000": 3, "00001": 4}, now=10.0)
        for _ in range(passes):
            assert p.candidates(10.0, 0.0) == []
            p.end_pass(worked=False)
        assert sorted(item for item, _ in p.candidates(10.0, 0.0)) == ["00000", "00001"]
        p.end_pass(worked=True)
        assert p.candidates(10.0, 0.0) == []  # busy again: back to waiting half a TTL


def test_a_lease_known_free_at_its_listed_generation_is_tried_at_once():
    p = ClaimPolicy(ITEMS[:1], "w", TTL, False)
    p.observe([], {"00000": 9}, now=0.0)
    p.remember("00000", lease(expires=0.0), 9)  # failed here for a retry: released
    assert p.candidates(0.0, 100.0) == [("00000", False)] and p.current("00000")[1] == 9
    p.observe([], {"00000": 10}, now=1.0)  # someone rewrote it since
    assert p.candidates(1.0, 100.0) == [] and p.current("00000") is None


def test_finished_items_are_never_candidates_and_drained_when_all_are():
    p = ClaimPolicy(ITEMS[:3], "w", TTL, False)
    p.observe(["00000"], {"00000": 1, "00001": 2}, now=0.0)  # a marker counts with its lease listed
    p.remember("00001", lease(DONE), 2)
    p.finished("00001")
    assert [item for item, _ in p.candidates(0.0, 0.0)] == ["00002"] and not p.drained()
    p.finished("00002")
    assert p.candidates(0.0, 0.0) == [] and p.drained()


def test_an_item_announced_as_given_back_is_read_at_once_by_a_busy_worker():
    p = ClaimPolicy(ITEMS[:2], "w", TTL, False)
    p.observe([], {"00000": 3, "00001": 4}, now=0.0)
    assert p.candidates(1.0, 0.0) == []  # busy, leases just seen: nothing is read
    p.observe([], {"00000": 5, "00001": 4}, now=1.0, released=["00000"])  # 00000 given back (preempted)
    assert p.candidates(1.0, 0.0) == [("00000", False)]

"""The claim policy alone: which items a worker tries, and what it lists, with no bucket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fleet.core.claims import STEAL, SWEEP, VISIT, ClaimPolicy
from fleet.core.lease import DONE, LEASED, Lease
from fleet.core.windows import RANGE_END, cut_windows

ITEMS = [f"{i:05d}" for i in range(6)]
TTL = 60.0


def lease(state=LEASED, expires=0.0) -> Lease:
    return Lease(state, "w", 1, expires)


def test_each_worker_has_its_own_order_within_a_window():
    a, b = ClaimPolicy(ITEMS, "vm-1-w0", TTL), ClaimPolicy(ITEMS, "vm-2-w0", TTL)
    for p in (a, b):
        p.observe([], {}, 0.0, window=0)
    got_a, got_b = [i for i, _ in a.candidates(0.0, 0.0, 0)], [i for i, _ in b.candidates(0.0, 0.0, 0)]
    assert sorted(got_a) == sorted(got_b) == ITEMS and got_a != got_b
    again = ClaimPolicy(ITEMS, "vm-1-w0", TTL)
    again.observe([], {}, 0.0, window=0)
    assert [i for i, _ in again.candidates(0.0, 0.0, 0)] == got_a  # the same worker, the same order


def test_unleased_items_first_and_live_leases_never_read():
    p = ClaimPolicy(ITEMS, "w", TTL)
    p.observe(finals=["00000"], listing={"00000": 3, "00001": 5, "00002": 7}, now=100.0)  # 00000 finished
    got = p.candidates(now=100.0, wall=1e9)
    assert sorted(item for item, fresh in got if fresh) == ["00003", "00004", "00005"]
    assert not [item for item, fresh in got if not fresh]  # leases just listed: not read
    p.observe(["00000"], {"00000": 3, "00001": 6, "00002": 7}, now=100.0 + TTL / 2)  # 00001 renewed, 00002 stood still
    stalled = [item for item, fresh in p.candidates(100.0 + TTL / 2, 1e9) if not fresh]
    assert stalled == ["00002"]


def test_a_lease_renewed_in_time_is_never_stalled_whatever_the_clocks():
    p = ClaimPolicy(ITEMS, "w", TTL)
    for step in range(20):  # renewed every TTL/3 by its holder, listed every TTL/6 here
        p.observe([], {"00001": 1 + step // 2}, now=step * TTL / 6, window=0)
        assert "00001" not in [item for item, fresh in p.candidates(step * TTL / 6, 0.0, 0) if not fresh]


def test_an_idle_worker_reads_a_lease_only_once_it_stood_still_for_half_a_ttl_as_a_busy_one_does():
    """However long it has been idle: before, a worker idle for a sweep or two read every lease it
    had not seen at its generation, each renewal of each item in flight in the tail of a run."""
    p = ClaimPolicy(ITEMS[:2], "w", TTL)
    p.observe([], {"00000": 3, "00001": 4}, now=10.0)
    for t in range(5):
        assert p.candidates(10.0 + t * TTL / 10, 0.0) == []
        assert p.end_pass(SWEEP, worked=False) == (SWEEP, None)
        p.observe([], {"00000": 3, "00001": 4}, now=10.0 + (t + 1) * TTL / 10)
    assert sorted(p.candidates(10.0 + TTL / 2, 0.0)) == [("00000", False), ("00001", False)]


def test_a_lease_known_free_at_its_listed_generation_is_tried_at_once():
    p = ClaimPolicy(ITEMS[:1], "w", TTL)
    p.observe([], {"00000": 9}, now=0.0)
    p.remember("00000", lease(expires=0.0), 9)  # failed here for a retry: released
    assert p.candidates(0.0, 100.0) == [("00000", False)] and p.current("00000")[1] == 9
    p.observe([], {"00000": 10}, now=1.0)  # someone rewrote it since
    assert p.candidates(1.0, 100.0) == [] and p.current("00000") is None


def test_finished_items_are_never_candidates_and_drained_when_all_are():
    p = ClaimPolicy(ITEMS[:3], "w", TTL)
    p.observe(["00000"], {"00000": 1, "00001": 2}, now=0.0)  # a marker counts with its lease listed
    p.remember("00001", lease(DONE), 2)
    p.finished("00001")
    assert [item for item, _ in p.candidates(0.0, 0.0)] == ["00002"] and not p.drained()
    p.finished("00002")
    assert p.candidates(0.0, 0.0) == [] and p.drained()


def test_an_item_announced_as_given_back_is_read_at_once_by_a_busy_worker():
    p = ClaimPolicy(ITEMS[:2], "w", TTL)
    p.observe([], {"00000": 3, "00001": 4}, now=0.0)
    assert p.candidates(1.0, 0.0) == []  # busy, leases just seen: nothing is read
    p.observe([], {"00000": 5, "00001": 4}, now=1.0, released=["00000"])  # 00000 given back (preempted)
    assert p.candidates(1.0, 0.0) == [("00000", False)]


# -- windows: what a pass lists ------------------------------------------------------------------
MANY = [f"{i:05d}" for i in range(10)]


def test_windows_are_ranges_of_one_step_whose_listing_holds_only_their_ids_and_interleaved_ones():
    steps = {"00000-of-00002": 2, "00001-of-00002": 2, "shards-index": 1}
    windows = cut_windows([(i, 0) for i in MANY] + [(i, s) for i, s in steps.items()], size=4)
    assert [(w.step, w.items) for w in windows] == [
        (0, ("00000", "00001", "00002", "00003")),
        (0, ("00004", "00005", "00006", "00007")),
        (0, ("00008", "00009")),
        (1, ("shards-index",)),
        (2, ("00000-of-00002", "00001-of-00002")),
    ]
    names = sorted(MANY + list(steps))
    for w in windows:
        start, end = w.bounds("p/")
        inside = [n for n in names if start <= "p/" + n < end]
        assert set(w.items) <= set(inside) and len(inside) <= 2 * len(w.items)
    with pytest.raises(ValueError):
        cut_windows([("a b", 0)])


def test_a_window_visit_sees_only_its_window_and_keeps_what_it_knew_of_others():
    p = ClaimPolicy(MANY, "w", TTL, window=4)
    p.observe(["00000", "00001", "00002", "00003"], {f"0000{i}": 1 for i in range(4)}, 0.0, window=0)
    assert 0 in p.done and p.to_mark() == []  # finished, but by others: their last committer marks it
    p.worked_in("00002")
    p.observe(["00000", "00001", "00002", "00003"], {f"0000{i}": 1 for i in range(4)}, 0.0, window=0)
    assert [w.key for w in p.to_mark()] == ["4-0-00000"]
    # a listing of window 1's range also hands back a lease of window 0 and an unknown name: ignored
    p.observe([], {"00003": 9, "00005": 1, "zzz": 1}, 0.0, window=1)
    assert 0 in p.done and p.listing.get("00003") == 1
    assert sorted(i for i, fresh in p.candidates(0.0, 0.0, 1) if fresh) == ["00004", "00006", "00007"]
    assert not p.drained()


def test_a_window_with_nothing_left_sends_the_worker_walking_then_stealing_then_sweeping():
    p = ClaimPolicy(MANY, "w", TTL, window=4)
    p.observe([], {"00000": 1, "00001": 1, "00002": 1, "00003": 1}, 0.0, window=0)  # all leased by others
    assert p.candidates(0.0, 0.0, 0) == []
    assert p.end_pass(VISIT, False, 0) == (VISIT, 1)  # the next window in id order
    assert p.end_pass(VISIT, False, 1) == (STEAL, None)
    assert p.end_pass(VISIT, False, 2) == (STEAL, None)
    assert p.end_pass(VISIT, False, 2) == (SWEEP, None)
    assert p.end_pass(VISIT, True, 2) == (VISIT, 2)  # work found: stay in that window


def test_a_steal_picks_among_unfinished_windows_of_the_open_step_and_workers_pick_apart():
    items = [f"{i:05d}" for i in range(64 * 40)]
    picks = set()
    for n in range(20):
        p = ClaimPolicy(items, f"w{n}", TTL, window=64)
        p.observe_marks([f"64-0-{i:05d}" for i in range(0, 64 * 20, 64)] + ["32-0-00000"])  # half done; another size
        w = p.steal()
        assert w is not None and w >= 20
        picks.add(w)
    assert len(picks) >= 10
    p = ClaimPolicy(items, "w", TTL, window=64)
    p.observe_marks([f"64-0-{i:05d}" for i in range(0, 64 * 40, 64)])
    assert p.steal() is None and p.drained()  # every window marked: sweep (which trusts no marker)


def test_a_sweep_trusts_no_done_marker():
    p = ClaimPolicy(MANY, "w", TTL, window=4)
    p.observe_marks(["4-0-00000", "4-0-00004", "4-0-00008"])
    assert p.drained()  # as far as markers say
    listing = {i: 1 for i in MANY if i != "00005"}  # 00005's lease deleted by hand
    p.observe([i for i in MANY if i != "00005"], listing, 0.0)
    assert not p.drained() and [w.key for w in p.stale_marks()] == ["4-0-00004"]
    assert p.candidates(0.0, 0.0) == [("00005", True)]


def test_a_reopened_item_announced_elsewhere_is_read_not_taken_for_finished():
    p = ClaimPolicy(MANY, "w", TTL, window=4)
    p.observe(MANY, {i: 1 for i in MANY}, 0.0)
    assert p.drained()
    p.observe([], {}, 1.0, released=["00009"], window=0)  # a visit of window 0; 00009 announced given back
    assert ("00009", False) in p.candidates(1.0, 0.0, 0) and p.current("00009") is None
    assert not p.drained()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(1, 70), st.data())
def test_every_item_is_in_exactly_one_window_of_its_step_and_its_range_holds_it(n, size, data):
    """The invariant windows rest on: the listing of a window's range finds each of its items, and
    the windows of a step cover the step's items once each, in id order."""
    steps = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    ids = [f"{i:05d}" for i in range(n)]
    windows = cut_windows(zip(ids, steps), size)
    seen = [item for w in windows for item in w.items]
    assert sorted(seen) == ids
    for w in windows:
        assert all(steps[int(i)] == w.step for i in w.items) and list(w.items) == sorted(w.items)
        start, end = w.bounds("leases/")
        assert all(start <= "leases/" + i < end for i in w.items) and end.endswith(RANGE_END)
        assert len(w.items) <= size


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_live_and_finished_leases_are_never_candidates_whatever_windows_were_listed(data):
    """Over any sequence of window visits and sweeps, a candidate is never a finished item, and a
    lease whose holder renews it is never read, not even by an idle worker's sweep (before, an idle
    worker read every lease in flight it had not seen at its generation: each renewal, in the tail)."""
    n = data.draw(st.integers(1, 40))
    ids = [f"{i:05d}" for i in range(n)]
    p = ClaimPolicy(ids, "w", TTL, window=data.draw(st.integers(1, 8)))
    finished = set(data.draw(st.lists(st.sampled_from(ids), max_size=n)))
    renewing = set(data.draw(st.lists(st.sampled_from(ids), max_size=n))) - finished
    for t in range(data.draw(st.integers(1, 8))):
        now = t * TTL / 6
        listing = {i: 1 for i in finished} | {i: 2 + t for i in renewing}  # renewed every listing
        window = data.draw(st.one_of(st.none(), st.integers(0, len(p.windows) - 1)))
        p.observe(sorted(finished), listing, now, window=window)
        got = p.candidates(now, 0.0, window)
        assert not {i for i, _ in got} & finished
        assert not {i for i, fresh in got if not fresh} & renewing
        p.end_pass(SWEEP if window is None else VISIT, bool(got), window)


def test_a_sweep_visits_the_few_unfinished_windows_and_lists_everything_only_to_confirm_a_drain():
    items = [f"{i:05d}" for i in range(64 * 40)]  # 40 windows of 64; a full listing is 3 pages a prefix
    p = ClaimPolicy(items, "w", TTL, window=64)
    assert p.sweep_targets() is None  # 40 unfinished windows: listing everything is cheaper
    p.observe_marks([f"64-0-{i:05d}" for i in range(0, 64 * 40, 64) if i not in (64 * 7, 64 * 30)])
    assert p.sweep_targets() == [7, 30]  # the tail: two windows hold what is left
    assert p.sweep_targets(full=True) is None  # the drain is confirmed by every lease and marker

"""Batch masking against BERT's create_masked_lm_predictions rules, on synthetic rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_jobs.bert.masking import MaskingOptions, _divmod, mask_batch, predictions_per_row
from fleet_jobs.text.tokenizers.tokenization import WORD_CONTINUES

CLS, SEP, MASK = 2, 3, 4
RANDOM_IDS = np.arange(100, 1100, dtype=np.int32)  # what a random replacement may be


def make_rows(seed: int, n_rows: int, width: int, p_continue: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[CLS] A [SEP] B [SEP] rows; ids = 2000 + position (so a change is visible), some flagged as continuing."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n_rows, width), np.int32)
    lengths = rng.integers(4, width + 1, n_rows)
    first = np.array([rng.integers(3, n) if n > 4 else n for n in lengths], np.int64)  # n == n0: A only
    for i, (n, n0) in enumerate(zip(lengths, first)):
        tokens[i, :n] = 2000 + np.arange(n)
        tokens[i, :n] |= np.where(rng.random(n) < p_continue, WORD_CONTINUES, 0).astype(np.int32)
        tokens[i, 0] = CLS
        tokens[i, n0 - 1] = SEP
        tokens[i, n - 1] = SEP
    return tokens, lengths, first


def words_of(row: np.ndarray, n: int, n0: int, whole_words: bool) -> list[list[int]]:
    """The candidate words of a row, spelled out: BERT's grouping of ## pieces with their word."""
    words: list[list[int]] = []
    previous_candidate = False
    for p in range(n):
        candidate = p not in (0, n0 - 1, n - 1)
        if candidate:
            if whole_words and previous_candidate and row[p] & WORD_CONTINUES:
                words[-1].append(p)
            else:
                words.append([p])
        previous_candidate = candidate
    return words


def check(tokens, lengths, first, masked, opts):
    budget = predictions_per_row(lengths, opts)
    for i in range(len(tokens)):
        n, n0, k = int(lengths[i]), int(first[i]), int(masked.counts[i])
        original = tokens[i] & (WORD_CONTINUES - 1)
        positions = masked.positions[i, :k].tolist()
        assert positions == sorted(set(positions)), "sorted, no repeats"
        assert (masked.positions[i, k:] == 0).all() and (masked.labels[i, k:] == 0).all()
        assert not {0, n0 - 1, n - 1} & set(positions), "never [CLS] or [SEP]"
        assert k <= budget[i] <= opts.max_predictions_per_seq
        assert masked.labels[i, :k].tolist() == original[positions].tolist()
        untouched = np.ones(tokens.shape[1], bool)
        untouched[positions] = False
        assert (masked.input_ids[i][untouched] == original[untouched]).all()
        chosen = set(positions)
        remaining = budget[i] - k
        for word in words_of(tokens[i], n, n0, opts.whole_word_masking):
            inside = [p in chosen for p in word]
            assert all(inside) or not any(inside), f"row {i}: word {word} partly masked"
            if not any(inside):  # BERT skips a word only when it did not fit
                assert len(word) > remaining


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(5, 80),
    st.floats(0.0, 0.9),
    st.sampled_from([0.05, 0.15, 0.5, 1.0]),
    st.integers(1, 30),
    st.booleans(),
)
def test_rules_hold_on_random_rows(seed, width, p_continue, prob, max_predictions, whole_words):
    tokens, lengths, first = make_rows(seed, 40, width, p_continue)
    opts = MaskingOptions(MASK, RANDOM_IDS, prob, max_predictions, whole_words)
    masked = mask_batch(tokens, lengths, first, opts, np.random.default_rng(seed))
    check(tokens, lengths, first, masked, opts)


def test_shares_and_replacements():
    tokens, lengths, first = make_rows(1, 4000, 128, 0.3)
    lengths[:] = 128  # full rows: budget round(128 * 0.15) = 19
    first[:] = 60
    tokens[:, 127] = SEP
    tokens[:, 59] = SEP
    tokens[:, 58] = 2058  # the position before the first [SEP] is a plain word
    opts = MaskingOptions(MASK, RANDOM_IDS, 0.15, 20, True)
    masked = mask_batch(tokens, lengths, first, opts, np.random.default_rng(2))
    check(tokens, lengths, first, masked, opts)
    assert predictions_per_row(np.array([128, 10, 3, 200]), opts).tolist() == [19, 2, 1, 20]  # round half to even
    assert 18 <= masked.counts.mean() <= 19  # a whole word that would overflow is skipped
    r = np.repeat(np.arange(len(tokens)), masked.counts)
    slot = np.concatenate([np.arange(k) for k in masked.counts])
    now = masked.input_ids[r, masked.positions[r, slot]]
    was = masked.labels[r, slot]
    total = len(now)
    assert abs((now == MASK).sum() / total - 0.8) < 0.01
    kept = (now == was).sum() / total
    assert abs(kept - 0.1) < 0.01
    replaced = now[(now != MASK) & (now != was)]
    assert abs(len(replaced) / total - 0.1) < 0.01
    assert np.isin(replaced, RANDOM_IDS).all()


def test_without_whole_words_each_token_is_a_word():
    tokens, lengths, first = make_rows(3, 500, 64, 0.9)
    opts = MaskingOptions(MASK, RANDOM_IDS, 0.15, 20, whole_word_masking=False)
    masked = mask_batch(tokens, lengths, first, opts, np.random.default_rng(3))
    check(tokens, lengths, first, masked, opts)
    n_candidates = lengths - 2 - (first != lengths)
    assert (masked.counts == np.minimum(predictions_per_row(lengths, opts), n_candidates)).all()


def test_same_generator_state_same_masks():
    tokens, lengths, first = make_rows(4, 50, 32, 0.4)
    opts = MaskingOptions(MASK, RANDOM_IDS)
    a = mask_batch(tokens, lengths, first, opts, np.random.default_rng(9))
    b = mask_batch(tokens, lengths, first, opts, np.random.default_rng(9))
    c = mask_batch(tokens, lengths, first, opts, np.random.default_rng(10))
    assert all((x == y).all() for x, y in zip(vars(a).values(), vars(b).values()))
    assert not (a.positions == c.positions).all()


@pytest.mark.parametrize("n_rows", [0, 1])
def test_tiny_batches(n_rows):
    tokens, lengths, first = make_rows(5, n_rows, 8, 0.5)
    masked = mask_batch(tokens, lengths, first, MaskingOptions(MASK, RANDOM_IDS), np.random.default_rng(0))
    assert masked.positions.shape == (n_rows, 20) and len(masked.counts) == n_rows


@pytest.mark.parametrize("p_continue", [0.3, 0.7])
def test_finishing_the_last_rows_one_by_one_changes_nothing(monkeypatch, p_continue):
    """mask_batch ends its numpy loop early and finishes the few rows left in Python: the
    masks are those of the numpy loop run to the end (long words leave rows short of budget)."""
    import fleet_jobs.bert.masking as masking

    tokens, lengths, first = make_rows(7, 300, 128, p_continue)
    opts = MaskingOptions(MASK, RANDOM_IDS, 0.15, 20, True)
    results = []
    for few_rows in (-1, masking._FEW_ROWS, 10**6):  # never, as shipped, from the 8th rank on for all rows
        monkeypatch.setattr(masking, "_FEW_ROWS", few_rows)
        results.append(mask_batch(tokens, lengths, first, opts, np.random.default_rng(5)))
    assert (results[0].counts < predictions_per_row(lengths, opts)).any()  # rows the finish had to walk
    for other in results[1:]:
        for name in ("input_ids", "positions", "labels", "counts"):
            assert np.array_equal(getattr(results[0], name), getattr(other, name)), name


def test_divmod_by_shifts_is_divmod():
    a = np.arange(0, 5000, 7)
    for d in (1, 2, 64, 128, 1024, 3, 100, 130):
        q, r = _divmod(a, d)
        assert q.tolist() == (a // d).tolist() and r.tolist() == (a % d).tolist()


@pytest.mark.parametrize("whole_words", [True, False])
def test_padding_width_does_not_change_the_masking(whole_words):
    """Rows padded to 64 positions (shifts) or 67 (division) are masked alike."""
    tokens, lengths, first = make_rows(4, 32, 64, 0.4)
    wider = np.zeros((32, 67), np.int32)
    wider[:, :64] = tokens
    opts = MaskingOptions(MASK, RANDOM_IDS, 0.15, 20, whole_words)
    a = mask_batch(tokens, lengths, first, opts, np.random.default_rng(8))
    b = mask_batch(wider, lengths, first, opts, np.random.default_rng(8))
    assert (a.input_ids == b.input_ids[:, :64]).all() and (b.input_ids[:, 64:] == 0).all()
    assert (a.positions == b.positions).all() and (a.labels == b.labels).all() and (a.counts == b.counts).all()

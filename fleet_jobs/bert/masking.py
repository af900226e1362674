"""BERT's masked-LM predictions, for a whole batch of examples at once.

Per example this is google-research/bert's ``create_masked_lm_predictions``
with ``do_whole_word_mask``: the candidates are all positions but [CLS] and
the [SEP]s, grouped into words; words are visited in random order and taken
while they fit in ``min(max_predictions_per_seq, max(1, round(length *
masked_lm_prob)))`` positions (a word that does not fit is skipped, a later
shorter one may still fit); each chosen position becomes [MASK] 80% of the
time, a random token 10%, and stays as it is 10%. Positions come out sorted.

A word is a token plus the tokens flagged ``WORD_CONTINUES`` after it (``##``
pieces; later characters of a Chinese word when the tokenizer was given a
segmenter), so Chinese whole-word masking masks every character of a word
while the input keeps one token per character, as Chinese BERT-wwm does.

Done with numpy over all rows: the only loop runs over word ranks (at most
``max_seq_length``), not over examples, so masking costs about a microsecond
per example where a per-example Python loop costs tens.

Random replacements are drawn from ``random_ids``: BERT draws from the whole
vocab, special tokens included; the job passes the vocab minus ``[...]``
tokens, so no [CLS], [SEP], [PAD] or [unused] token appears inside a text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleet_jobs.text.tokenizers.tokenization import WORD_CONTINUES

ID_BITS = WORD_CONTINUES - 1
_FEW_ROWS = 16  # rows left below this many after a rank: a Python loop over their words beats a numpy pass


@dataclass(frozen=True, eq=False)
class MaskingOptions:
    mask_id: int
    random_ids: np.ndarray  # ids a "random token" replacement is drawn from
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = True


@dataclass
class Masked:
    """The masked batch: what goes into the records besides the segment layout."""

    input_ids: np.ndarray  # int32 (N, L): ids after replacement, flags dropped
    positions: np.ndarray  # int32 (N, P): masked positions, ascending, zero padded
    labels: np.ndarray  # int32 (N, P): the original ids there, zero padded
    counts: np.ndarray  # int64 (N,): real predictions per row (masked_lm_weights 1.0)


def predictions_per_row(lengths: np.ndarray, opts: MaskingOptions) -> np.ndarray:
    """BERT's ``num_to_predict``; numpy rounds half to even, as Python's ``round``."""
    wanted = np.round(lengths * opts.masked_lm_prob).astype(np.int64)
    return np.minimum(opts.max_predictions_per_seq, np.maximum(1, wanted))


def mask_batch(
    tokens: np.ndarray, lengths: np.ndarray, first_lengths: np.ndarray, opts: MaskingOptions, gen: np.random.Generator
) -> Masked:
    """Mask rows laid out as ``[CLS] A [SEP] B [SEP]`` (``first_lengths`` = positions of ``[CLS] A [SEP]``)."""
    n_rows, width = tokens.shape
    ids = tokens & ID_BITS
    pos = np.arange(width)
    rows = np.arange(n_rows)
    candidate = pos < (lengths - 1)[:, None]
    candidate[:, 0] = False
    candidate[rows, first_lengths - 1] = False
    if opts.whole_word_masking:
        starts = candidate & ((tokens & WORD_CONTINUES) == 0)
        # A word never spans [CLS] or a [SEP]: the first candidate of each segment starts one.
        for segment_start in (np.ones(n_rows, np.int64), np.asarray(first_lengths)):
            inside = segment_start < width
            starts[rows[inside], segment_start[inside]] = candidate[rows[inside], segment_start[inside]]
    else:
        starts = candidate
    # Words, row-major: row, start position, length (up to the next start or the segment's [SEP]).
    word_row, word_start = _divmod(np.flatnonzero(starts), width)  # (np.nonzero of a 2-D array is slower)
    n = len(word_row)
    first_separator = (first_lengths - 1)[word_row]
    separator = np.where(word_start < first_separator, first_separator, (lengths - 1)[word_row])
    next_start = np.empty(n, np.int64)
    next_start[:-1] = np.where(word_row[1:] == word_row[:-1], word_start[1:], width)
    next_start[-1:] = width
    word_length = np.minimum(next_start, separator) - word_start
    per_row = np.bincount(word_row, minlength=n_rows)
    first_word = np.cumsum(per_row) - per_row
    word_index = np.arange(n) - np.repeat(first_word, per_row)  # the word's index in its row
    n_words = int(per_row.max()) if n_rows else 0

    # Visit each row's words in random order (sort random keys that carry the word's index and
    # length in their low bits); take a word while it fits in the row's budget.
    keys = np.full(n_rows * n_words, np.iinfo(np.uint64).max, np.uint64)  # empty slots sort last, length 0
    random_bits = gen.integers(0, 1 << 32, n, dtype=np.uint64)
    keys[word_row * n_words + word_index] = (
        random_bits << 32 | word_index.astype(np.uint64) << 16 | word_length.astype(np.uint64)
    )
    keys = keys.reshape(n_rows, n_words)
    keys.sort(axis=1)
    visit = keys.T  # (rank, row): a view (the loop reads a few ranks of every row, strided)
    budget = predictions_per_row(lengths, opts)
    taken = np.zeros((n_words, n_rows), bool)
    count = np.zeros(n_rows, np.int64)
    for rank in range(n_words):  # greedy, as BERT: a word that does not fit is skipped
        length = (visit[rank] & 0xFFFF).astype(np.int64)
        fits = (length > 0) & (count + length <= budget)
        taken[rank] = fits
        count += length * fits
        if rank % 8 == 7:  # nearly all rows fill their budget in a few ranks: finish the rest one by one
            open_rows = np.flatnonzero(count < budget)
            if len(open_rows) <= _FEW_ROWS:
                _finish_rows(visit, taken, count, budget, open_rows, rank + 1)
                break
    taken_rank, taken_row = _divmod(np.flatnonzero(taken), n_rows)
    chosen = np.zeros(n, bool)
    chosen[first_word[taken_row] + ((visit[taken_rank, taken_row] >> 16) & 0xFFFF).astype(np.int64)] = True

    # The chosen words' positions, ascending within each row, as flat indexes into the rows.
    chosen_words = np.flatnonzero(chosen)
    lengths_chosen = word_length[chosen_words]
    flat = word_row[chosen_words] * width + word_start[chosen_words]
    if len(flat) and lengths_chosen.max() > 1:
        before = np.cumsum(lengths_chosen) - lengths_chosen
        flat = np.repeat(flat - before, lengths_chosen) + np.arange(int(lengths_chosen.sum()))
    r, c = _divmod(flat, width)

    labels_flat = ids.ravel()[flat]
    out = ids.copy()
    out_flat = out.ravel()  # (a view: out is contiguous)
    u = gen.random(len(flat))
    to_mask = u < 0.8
    out_flat[flat[to_mask]] = opts.mask_id
    to_random = u >= 0.9  # [0.8, 0.9): left unchanged
    out_flat[flat[to_random]] = opts.random_ids[gen.integers(0, len(opts.random_ids), int(to_random.sum()))]

    counts = np.bincount(r, minlength=n_rows)
    p = opts.max_predictions_per_seq
    slot = r * p + np.arange(len(r)) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.zeros(n_rows * p, np.int32)
    labels = np.zeros(n_rows * p, np.int32)
    positions[slot] = c
    labels[slot] = labels_flat
    positions, labels = positions.reshape(n_rows, p), labels.reshape(n_rows, p)
    return Masked(out, positions, labels, counts)


def _divmod(a: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.divmod(a, d)`` for non-negative ``a``; by shifts when ``d`` is a power of two (rows
    of 128 or 512 positions, chunks of 1024 rows), which is several times faster."""
    if d > 0 and d & (d - 1) == 0:
        shift = d.bit_length() - 1
        return a >> shift, a & (d - 1)
    return np.divmod(a, d)


def _finish_rows(
    visit: np.ndarray, taken: np.ndarray, count: np.ndarray, budget: np.ndarray, rows: np.ndarray, first_rank: int
) -> None:
    """The greedy visit of ``mask_batch`` for a few rows, from ``first_rank`` on (the same
    choices the numpy loop would make; empty slots, length 0, come last in a row)."""
    for row in rows.tolist():
        used, limit = int(count[row]), int(budget[row])
        for rank, key in enumerate(visit[first_rank:, row].tolist(), first_rank):
            length = key & 0xFFFF
            if not length or used == limit:
                break
            if used + length <= limit:
                taken[rank, row] = True
                used += length
        count[row] = used

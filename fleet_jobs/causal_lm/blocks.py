"""The pure core: documents' token ids -> fixed-size blocks of causal-LM training data.

Each document's ids are followed by the end-of-document id and cut into blocks of
exactly ``block_size`` ids. Where a block boundary falls decides what the output
depends on:

- without ``pack_documents`` every document starts a new block, so a document's blocks
  depend on that document only: a run's multiset of examples is the same whatever the item
  size, the worker count or the input format. The last, partial block of each
  document is padded (``attention_mask`` 0 over the padding) or dropped;
- with ``pack_documents`` (the job's default since issue 33: on short documents a padded
  block per document made the output 13-19x the text) the documents of an item form one
  stream, as GPT-2 style ``group_texts`` does: no padding but at the item's end, but blocks then mix the
  neighbouring documents of an item, so they depend on how the corpus was cut into
  items (``--item-mb``; never on the worker count).

No I/O and no randomness: the same ids give the same blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

LAST_BLOCKS = ("pad", "drop")


@dataclass(frozen=True)
class BlockOptions:
    block_size: int  # ids per example: max_seq_length, or max_seq_length + 1 for shifted labels
    eod_id: int
    pad_id: int
    last_block: str = "pad"  # pad | drop: the partial block at a document's (or packed item's) end
    pack_documents: bool = False
    head: tuple[int, ...] = ()  # ids before each document's own (the tokenizer's framing: a BOS)
    tail: tuple[int, ...] | None = None  # ids after them; None: the end-of-document id alone

    @property
    def ends(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(head, tail): what frames each document with ids."""
        return self.head, (self.eod_id,) if self.tail is None else self.tail

    @property
    def framing(self) -> int:
        """Ids a document with ids gets around its own."""
        head, tail = self.ends
        return len(head) + len(tail)


@dataclass
class Blocks:
    """Examples as arrays: ``ids`` (rows, block_size) and each row's real length."""

    ids: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def attention_mask(self) -> np.ndarray:
        return (np.arange(self.ids.shape[1]) < self.lengths[:, None]).astype(np.int32)


class BlockCutter:
    """Cuts documents into blocks; feed documents with ``add``, then call ``finish`` once."""

    def __init__(self, opts: BlockOptions):
        if opts.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {opts.block_size}")
        if opts.last_block not in LAST_BLOCKS:
            raise ValueError(f"last_block must be one of {LAST_BLOCKS}, got {opts.last_block!r}")
        self.opts = opts
        self.carry = np.zeros(0, np.int32)  # pack_documents: the stream's ids not yet in a block
        self.dropped = 0  # ids in partial blocks that last_block=drop threw away

    def add(self, documents: Sequence[Sequence[int]]) -> Blocks:
        """The blocks these documents complete (a document with no ids adds nothing, not even
        an end-of-document id)."""
        return self.add_flat(*flatten(documents))

    def add_flat(self, ids: np.ndarray, counts: np.ndarray) -> Blocks:
        """``add`` of documents given end to end: ``ids`` (int32) and each document's count."""
        stream, lengths = framed(ids, counts, *self.opts.ends)
        if self.opts.pack_documents:
            stream = np.concatenate([self.carry, stream])
            n = len(stream) // self.opts.block_size * self.opts.block_size
            self.carry = stream[n:]
            return self._full(stream[:n])
        return self._documents(stream, lengths)

    def finish(self) -> Blocks:
        """What the item's stream left over (``pack_documents`` only; else nothing)."""
        tail, self.carry = self.carry, np.zeros(0, np.int32)
        return self._tail(tail)

    def _documents(self, stream: np.ndarray, lengths: np.ndarray) -> Blocks:
        """Each document's blocks, in order, from the documents' ids end to end (``lengths``
        each, end token included), in a few array operations whatever the number of documents
        (short documents are many): a block's real ids are a prefix of its row, so the real
        positions of the rows, in row order, are the stream's ids in order; one boolean
        assignment puts them there (no index per id)."""
        size = self.opts.block_size
        full, rest = np.divmod(lengths, size)
        rows = full + (rest > 0)
        row_lengths = np.full(int(rows.sum()), size, np.int32)
        row_lengths[(np.cumsum(rows) - 1)[rest > 0]] = rest[rest > 0]  # a partial block is its document's last
        ids = np.full((len(row_lengths), size), self.opts.pad_id, np.int32)
        ids[np.arange(size) < row_lengths[:, None]] = stream
        if self.opts.last_block == "drop":
            self.dropped += int(rest.sum())
            whole = row_lengths == size
            return Blocks(ids[whole], row_lengths[whole])
        return Blocks(ids, row_lengths)

    def _full(self, ids: np.ndarray) -> Blocks:
        size = self.opts.block_size
        return Blocks(ids.reshape(-1, size), np.full(len(ids) // size, size, np.int32))

    def _tail(self, ids: np.ndarray) -> Blocks:
        size = self.opts.block_size
        if not len(ids):
            return Blocks(np.zeros((0, size), np.int32), np.zeros(0, np.int32))
        if self.opts.last_block == "drop":
            self.dropped += len(ids)
            return Blocks(np.zeros((0, size), np.int32), np.zeros(0, np.int32))
        row = np.full((1, size), self.opts.pad_id, np.int32)
        row[0, : len(ids)] = ids
        return Blocks(row, np.array([len(ids)], np.int32))


def with_ends(ids: np.ndarray, counts: np.ndarray, eod_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``framed`` with the end-of-document id after each document, nothing before."""
    return framed(ids, counts, (), (eod_id,))


def framed(
    ids: np.ndarray, counts: np.ndarray, head: Sequence[int], tail: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The non-empty documents' ids end to end, each as ``head`` + its ids + ``tail``, and each
    one's length (framing included), from their ids end to end and every document's count. A
    document with no ids gets no framing either."""
    counts = np.asarray(counts, np.int64)
    keep = counts > 0
    ids = np.asarray(ids, np.int32)
    if not head and len(tail) == 1:  # the usual case: one insert
        return np.insert(ids, np.cumsum(counts)[keep], np.int32(tail[0])), counts[keep] + 1
    lengths = counts[keep] + len(head) + len(tail)
    stream = np.empty(int(lengths.sum()), np.int32)
    starts = np.cumsum(lengths) - lengths
    own = np.ones(len(stream), bool)
    if head:
        at = (starts[:, None] + np.arange(len(head))).ravel()
        stream[at] = np.tile(np.asarray(head, np.int32), len(starts))
        own[at] = False
    if tail:
        at = (starts[:, None] + len(head) + counts[keep][:, None] + np.arange(len(tail))).ravel()
        stream[at] = np.tile(np.asarray(tail, np.int32), len(starts))
        own[at] = False
    stream[own] = ids
    return stream, lengths


# A document's ids: a list of ints, or an int array (BERT's ``tokenize_flat``).
DocumentIds = Sequence[int] | np.ndarray


def flatten(documents: Sequence[DocumentIds]) -> tuple[np.ndarray, np.ndarray]:
    """Ids per document -> (end to end as int32, counts): lists of ints in one ``fromiter``."""
    counts = np.fromiter(map(len, documents), np.int64, len(documents))
    if all(isinstance(ids, list) for ids in documents):
        return np.fromiter(chain.from_iterable(documents), np.int32, int(counts.sum())), counts
    arrays = [np.asarray(ids, np.int32).reshape(-1) for ids in documents]
    return (np.concatenate(arrays) if arrays else np.zeros(0, np.int32)), counts

"""TFRecords of token examples (``input_ids``, ``input_mask``, ``segment_ids``: ELECTRA's
features, and the first three of BERT's), encoded many at a time.

A record is head + tail + crc. The mask and segment entries have the same length in every
record (one byte per position), so the head (frame header, example prefix, prefix of the
ids' entry) depends only on the length of the ids' varints; the tail (the ids' varints, the
padding's zeros, the mask and segment entries) on the ids and the two lengths; the record's
crc32c extends the head's, which is cached. The bytes are ``tfrecord.int64_example``'s.
"""

from __future__ import annotations

import functools
from itertools import chain
from typing import Protocol, Sequence

import numpy as np

from fleet.formats import tfrecord
from fleet.formats.tfrecord import VARINTS

from .output import mask_and_segments


class TokenExample(Protocol):
    input_ids: Sequence[int]  # the real ids, maybe followed by padding to max_seq_length
    length: int  # real ids
    first_length: int  # ids of the first segment ([CLS] A [SEP]); == length for one segment


class TokenRecordEncoder:
    def __init__(self, max_seq_length: int, max_id: int):
        self.width = max_seq_length
        self.small_ids = max_id < len(VARINTS)  # ids' varints from the table, the padding with the tail
        self._mask_entry = functools.lru_cache(maxsize=None)(self._mask_entry_uncached)
        self._segment_entry = functools.lru_cache(maxsize=4096)(self._segment_entry_uncached)
        self._ids_prefix = functools.lru_cache(maxsize=None)(
            functools.partial(tfrecord.int64_entry_prefix, "input_ids")
        )
        self._heads: dict[int, tuple[bytes, int]] = {}  # records_of(): by the length of the ids' varints
        self._tails: dict[int, bytes] = {}  # records_of(): by (first segment length << 17 | length)

    def record(self, ex: TokenExample) -> bytes:
        """One framed TFRecord of an example padded to ``max_seq_length``, as
        ``tfrecord.int64_example`` would make it, only faster: the mask and segment entries
        depend only on the lengths, so they are cached."""
        ids = b"".join(map(VARINTS.__getitem__, ex.input_ids)) if self.small_ids else tfrecord.varints(ex.input_ids)
        entries = (
            tfrecord.feature_entry("input_ids", tfrecord.packed_int64_feature(ids)),
            self._mask_entry(ex.length),
            self._segment_entry(ex.first_length, ex.length),
        )
        return tfrecord.frame(tfrecord.example_from_entries(entries))

    def records(self, examples: list[TokenExample]) -> bytes:
        """``record`` of every example, joined, in a few steps per record: the ids'
        varints of all rows in one numpy pass, then cached pieces (the module's docstring)."""
        if not examples:
            return b""
        lengths = [ex.length for ex in examples]
        ids = np.fromiter(chain.from_iterable([ex.input_ids for ex in examples]), np.int64)
        if len(ids) != sum(lengths):  # padded examples: their real ids
            ids = np.fromiter(chain.from_iterable([ex.input_ids[: ex.length] for ex in examples]), np.int64)
        return self.records_of(ids, lengths, [ex.first_length for ex in examples])

    def records_of(self, ids: np.ndarray, lengths: list[int], first_lengths: list[int]) -> bytes:
        """``records`` of examples given as all their ids (unpadded, end to end) and their two lengths."""
        if not lengths:
            return b""
        width = self.width
        if self.small_ids:  # the usual: ids below 2**16, the padding's zeros go with the tail
            data, at = tfrecord.varint_runs(ids, lengths)
            padded = 0
        else:
            rows = np.zeros((len(lengths), width), np.int64)  # [PAD] is 0
            rows[np.arange(width) < np.array(lengths)[:, None]] = ids
            data, at = tfrecord.varint_rows(rows)
            padded = 1
        heads, tails = self._heads, self._tails
        extend, pack, mask = tfrecord.extend_crc, tfrecord.pack_crc, tfrecord.mask_crc
        out: list[bytes] = []
        add = out.extend
        a = 0
        for n, n_first, b in zip(lengths, first_lengths, at[1:]):
            size = b - a + (width - n) * (1 - padded)  # bytes of the ids' varints, padding included
            head = heads.get(size) or self._head(size)
            tail = data[a:b] + (tails.get(n_first << 17 | n) or self._tail(n_first, n, padded))
            crc = extend(head[1], tail)
            add((head[0], tail, pack(mask(crc))))
            a = b
        return b"".join(out)

    def columns(self, examples: list[TokenExample]) -> dict[str, np.ndarray]:
        """The examples as one row per example of each feature (the values ``records`` encodes)."""
        ids = np.fromiter(chain.from_iterable([ex.input_ids[: ex.length] for ex in examples]), np.int64)
        return self.columns_of(ids, [ex.length for ex in examples], [ex.first_length for ex in examples])

    def columns_of(self, ids: np.ndarray, lengths: list[int], first_lengths: list[int]) -> dict[str, np.ndarray]:
        """``columns`` of examples given as ``records_of`` takes them."""
        input_mask, segment_ids = mask_and_segments(lengths, first_lengths, self.width)
        input_ids = np.zeros((len(lengths), self.width), np.int64)  # [PAD] is 0
        input_ids[input_mask.astype(bool)] = ids
        return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}

    def _head(self, ids_length: int) -> tuple[bytes, int]:
        """(frame header + example prefix + prefix of the ids' entry, crc32c of all but the frame
        header) of a record whose ids take ``ids_length`` bytes of varints."""
        width = self.width
        fixed = len(self._mask_entry(width)) + len(self._segment_entry(0, width))
        prefix = self._ids_prefix(ids_length)
        example = tfrecord.example_prefix(len(prefix) + ids_length + fixed) + prefix
        head = (tfrecord.frame_header(len(example) + ids_length + fixed) + example, tfrecord.crc32c(example))
        self._heads[ids_length] = head
        return head

    def _tail(self, n_first: int, n: int, padded: int) -> bytes:
        """What follows a record's ids: the padding's zeros (unless the ids came padded), the mask
        and segment entries. A bounded cache: with a long max_seq_length the pairs are many."""
        width = self.width
        if len(self._tails) * 3 * width > 64 << 20:
            self._tails.clear()
        tail = b"\x00" * ((width - n) * (1 - padded)) + self._mask_entry(n) + self._segment_entry(n_first, n)
        self._tails[n_first << 17 | n] = tail
        return tail

    def _mask_entry_uncached(self, n: int) -> bytes:
        payload = b"\x01" * n + b"\x00" * (self.width - n)  # varints of 0/1 are the bytes 0/1
        return tfrecord.feature_entry("input_mask", tfrecord.packed_int64_feature(payload))

    def _segment_entry_uncached(self, n_first: int, n: int) -> bytes:
        payload = b"\x00" * n_first + b"\x01" * (n - n_first) + b"\x00" * (self.width - n)
        return tfrecord.feature_entry("segment_ids", tfrecord.packed_int64_feature(payload))

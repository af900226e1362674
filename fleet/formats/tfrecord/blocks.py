"""TFRecords of blocks (causal_lm's examples), many at a time: the bytes ``writer.encode_rows``
gives, in a few steps a row, in Python (the reference) or in one C call (``records.c``, beside).

A block's record is head + the ids' varints + crc. The features go in name order:
``attention_mask`` (when partial blocks are padded: its entry depends only on the block's real
length) then ``input_ids`` (its entry's prefix only on the length of the ids' varints). So the
head (frame header, example prefix, mask entry, ids prefix) depends on those two lengths and is
cached with the crc32c of its part after the frame header; the record's crc extends it over the
varints. The writer's generic path built every piece of every row (bench_lm_tokenizers: ~5 µs a
block, the most of causal_lm's own time after the tokenizer).

With the C core a whole batch is framed in one call of ``records.c``'s ``rec_blocks``, which
does everything (varints, heads, frames, crc32c over each whole example: no cache needed). The
C core is built and loaded by the text jobs (``fleet_jobs.text.tokenizers.native``, one library with the
tokenizers), which hand ``rec_blocks`` in; the Python path below stays as the fallback and the
reference (tests/test_lm_speedups.py: the same bytes).
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import wire
from . import framing

HEAD_CACHE_BYTES = 32 << 20  # then the cache starts over (a long max_seq_length makes many pairs)


class BlockRecords:
    def __init__(self, width: int, padded: bool, rec_blocks=None):
        """``rec_blocks``: the C core's function (a ctypes function of the loaded library), or
        None for the Python path."""
        self.width, self.padded = width, padded
        self._heads: dict[int, tuple[bytes, int]] = {}
        self._bytes = 0
        self._rec_blocks = rec_blocks
        self._out = np.empty(0, np.uint8)  # the C path's output buffer, kept between batches
        self._bad_row = ctypes.c_int64(0)

    def records(self, ids: np.ndarray, lengths: np.ndarray) -> bytes:
        """Framed records of blocks: ``ids`` (rows, width), each row's real length (the mask's ones)."""
        if not len(ids):
            return b""
        if self._rec_blocks is not None:
            return self._native(ids, lengths)
        data, at = wire.varint_rows(ids)
        heads = self._heads
        extend, pack, mask = framing.extend_crc, framing.pack_crc, framing.mask_crc
        keys = lengths.tolist() if self.padded else [0] * len(ids)
        out: list[bytes] = []
        add = out.extend
        a = 0
        for n, b in zip(keys, at[1:]):
            key = n << 32 | (b - a)
            head = heads.get(key) or self._head(n, b - a, key)
            payload = data[a:b]
            add((head[0], payload, pack(mask(extend(head[1], payload)))))
            a = b
        return b"".join(out)

    def _native(self, ids: np.ndarray, lengths: np.ndarray) -> bytes:
        ids = np.asarray(ids)
        ids = np.ascontiguousarray(ids, np.int32 if ids.dtype == np.int32 else np.int64)
        rows, ids_width = ids.shape
        mask_lengths = np.ascontiguousarray(lengths, np.int64) if self.padded else None
        if mask_lengths is not None and len(mask_lengths) != rows:
            raise ValueError(f"block records: {rows} rows of ids but {len(mask_lengths)} lengths")
        cap = rows * (128 + self.width * self.padded + 5 * ids_width) + 256  # room enough for rec_blocks
        if len(self._out) < cap:
            self._out = np.empty(cap, np.uint8)
        n = self._rec_blocks(
            ids.ctypes.data,
            ids.itemsize,
            rows,
            ids_width,
            None if mask_lengths is None else mask_lengths.ctypes.data,
            int(self.padded),
            self.width,
            self._out.ctypes.data,
            cap,
            ctypes.byref(self._bad_row),
        )
        if n == -2:
            raise ValueError(f"varint_rows takes values in [0, 2**35) (block {self._bad_row.value})")
        if n == -3:
            assert mask_lengths is not None  # a length out of range: there are lengths (padded)
            raise ValueError(
                f"block records: block {self._bad_row.value}'s length "
                f"{mask_lengths[self._bad_row.value]} is not in [0, {self.width}]"
            )
        if n < 0:
            raise RuntimeError(f"rec_blocks: error {n}")
        return self._out[:n].tobytes()

    def _head(self, n: int, ids_bytes: int, key: int) -> tuple[bytes, int]:
        """(frame header + example prefix + mask entry + ids prefix, crc32c of all but the frame header)."""
        if self._bytes > HEAD_CACHE_BYTES:
            self._heads.clear()
            self._bytes = 0
        width = self.width
        mask = (
            wire.int64_entry_prefix("attention_mask", width) + b"\x01" * n + b"\x00" * (width - n)
            if self.padded
            else b""
        )
        body = mask + wire.int64_entry_prefix("input_ids", ids_bytes)  # (never empty: blocks hold 2 ids or more)
        example = wire.example_prefix(len(body) + ids_bytes) + body
        head = (framing.frame_header(len(example) + ids_bytes) + example, framing.crc32c(example))
        self._heads[key] = head
        self._bytes += len(head[0])
        return head

"""TFRecords of blocks, many at a time: the bytes ``output.encode_rows`` gives, in a few steps a row.

A block's record is head + the ids' varints + crc. The features go in name order:
``attention_mask`` (when partial blocks are padded: its entry depends only on the block's real
length) then ``input_ids`` (its entry's prefix only on the length of the ids' varints). So the
head (frame header, example prefix, mask entry, ids prefix) depends on those two lengths and is
cached with the crc32c of its part after the frame header; the record's crc extends it over the
varints. The writer's generic path built every piece of every row (bench_lm_tokenizers: ~5 µs a
block, the most of causal_lm's own time after the tokenizer).
"""

from __future__ import annotations

import numpy as np

from fleet_jobs.text import tfrecord

HEAD_CACHE_BYTES = 32 << 20  # then the cache starts over (a long max_seq_length makes many pairs)


class BlockRecords:
    def __init__(self, width: int, padded: bool):
        self.width, self.padded = width, padded
        self._heads: dict[int, tuple[bytes, int]] = {}
        self._bytes = 0

    def records(self, ids: np.ndarray, lengths: np.ndarray) -> bytes:
        """Framed records of blocks: ``ids`` (rows, width), each row's real length (the mask's ones)."""
        if not len(ids):
            return b""
        data, at = tfrecord.varint_rows(ids)
        heads = self._heads
        extend, pack, mask = tfrecord.extend_crc, tfrecord.pack_crc, tfrecord.mask_crc
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

    def _head(self, n: int, ids_bytes: int, key: int) -> tuple[bytes, int]:
        """(frame header + example prefix + mask entry + ids prefix, crc32c of all but the frame header)."""
        if self._bytes > HEAD_CACHE_BYTES:
            self._heads.clear()
            self._bytes = 0
        width = self.width
        mask = (tfrecord.int64_entry_prefix("attention_mask", width) + b"\x01" * n + b"\x00" * (width - n)
                if self.padded else b"")
        body = mask + tfrecord.int64_entry_prefix("input_ids", ids_bytes)  # (never empty: blocks hold 2 ids or more)
        example = tfrecord.example_prefix(len(body) + ids_bytes) + body
        head = (tfrecord.frame_header(len(example) + ids_bytes) + example, tfrecord.crc32c(example))
        self._heads[key] = head
        self._bytes += len(head[0])
        return head

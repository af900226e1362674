"""An item's token batches kept for the dupe_factor passes, spilled to disk beyond a limit."""

from __future__ import annotations

import os
from typing import BinaryIO, Iterator

import numpy as np

from .builder import DocBatch


class SpillingBatches:
    """An item's token batches for dupe_factor > 1: in memory up to ``limit`` bytes (a 64 MB
    item needs about 80 MB), then in a temporary file, so a worker's memory stays bounded
    whatever the item size (a compressed file is one item, however big). 64 MB, not more: a
    worker should stay under 300 MB in all (issue 17)."""

    def __init__(self, limit: int = 64 << 20):
        self.limit = limit
        self.in_memory: list[DocBatch] = []
        self.bytes = 0
        self.spilled = 0
        self.file: BinaryIO | None = None

    def __enter__(self) -> "SpillingBatches":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()

    def append(self, batch: DocBatch) -> None:
        arrays = (batch.ids, batch.sentence_starts, batch.doc_starts, batch.doc_numbers)
        size = sum(a.nbytes for a in arrays)
        if self.file is None and self.bytes + size <= self.limit:  # (once spilling, always: keep the order)
            self.in_memory.append(batch)
            self.bytes += size
            return
        if self.file is None:
            import tempfile

            self.file = tempfile.TemporaryFile(prefix="fleet-bert-")
        self.file.seek(0, os.SEEK_END)
        for a in arrays:
            np.save(self.file, a, allow_pickle=False)
        self.spilled += 1

    def __iter__(self) -> Iterator[DocBatch]:
        yield from self.in_memory
        if self.file is not None:
            self.file.seek(0)
            for _ in range(self.spilled):  # np.load leaves the file at the end of the array it read
                yield DocBatch(*(np.load(self.file, allow_pickle=False) for _ in range(4)))

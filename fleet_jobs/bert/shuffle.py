"""An item's examples in a seeded random order, as BERT writes them.

google-research/bert's ``create_pretraining_data.py`` builds every instance of its
input (all ``dupe_factor`` passes) and then ``rng.shuffle(instances)``, so consecutive
records do not come from one document. Here an item's examples are kept as packed
fixed-width rows (what the encoders need: masked ids, predictions, lengths, label;
ids as uint16 when the vocab allows: about 340 bytes at ``max_seq_length`` 128, half
the record they become) and come out in the order of
``random.Random(f"{item seed}:shuffle").shuffle`` over their indices: a pure function
of the examples and the item seed, so a retried item rewrites the same bytes (the
``":shuffle"`` keeps this stream apart from the passes' ``f"{seed}:{dupe}"``).

Rows stay in memory up to ``limit`` bytes; beyond it they all go to a scratch
file (in the item's work folder) and are read back a row at a time in the
permuted order, so memory stays bounded whatever the item size (a 64 MB item
with ``dupe_factor`` 10 is over a million examples). The rows come out in chunks
of ``ROWS_OUT``, the same chunks either way: the bytes do not depend on the limit.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from .masking import Masked

SHUFFLE_BYTES = 128 << 20  # example rows kept in memory, at most (with spill's 64 MB: a worker far under 1 GB)
ROWS_OUT = 1024  # examples handed back together (encoded or written as rows together)


@dataclass
class Chunk:
    """Examples as the encoders take them: masked rows and each row's layout and label."""

    masked: Masked
    lengths: np.ndarray  # int64 (N,): non-padding positions
    first_lengths: np.ndarray  # int64 (N,): positions of "[CLS] A [SEP]" (segment 0)
    random_next: np.ndarray  # int64 (N,): next_sentence_labels

    def __len__(self) -> int:
        return len(self.lengths)


def shuffle_rng(item_seed: int) -> random.Random:
    """The generator of an item's order (seeded by a string: stable across Python versions)."""
    return random.Random(f"{item_seed}:shuffle")


def permutation(n: int, item_seed: int) -> np.ndarray:
    """Where each output row comes from: ``random.Random.shuffle`` of ``0..n-1``."""
    order = list(range(n))
    shuffle_rng(item_seed).shuffle(order)
    return np.array(order, np.int64)


def _fields(chunk: Chunk) -> dict[str, np.ndarray]:
    m = chunk.masked
    return {
        "input_ids": m.input_ids,
        "positions": m.positions,
        "labels": m.labels,
        "counts": m.counts,
        "lengths": chunk.lengths,
        "first_lengths": chunk.first_lengths,
        "random_next": chunk.random_next,
    }


def _row_dtype(chunk: Chunk, id_bound: int) -> np.dtype:
    """Narrow types where the values allow: memory (and pages touched) is the shuffle's cost.
    Ids are below ``id_bound``; positions, counts and lengths at most the sequence length."""
    seq, preds = chunk.masked.input_ids.shape[1], chunk.masked.positions.shape[1]
    ids = np.uint16 if id_bound <= 1 << 16 else np.int32
    small = np.uint16 if seq < 1 << 16 else np.int64
    return np.dtype(
        [
            ("input_ids", ids, (seq,)),
            ("positions", small, (preds,)),
            ("labels", ids, (preds,)),
            ("counts", small),
            ("lengths", small),
            ("first_lengths", small),
            ("random_next", np.uint8),
        ]
    )


def _pack(chunk: Chunk, dtype: np.dtype, id_bound: int) -> np.ndarray:
    m = chunk.masked
    for ids in (m.input_ids, m.labels):  # (a wrong bound would wrap ids silently)
        if ids.size and (ids.min() < 0 or ids.max() >= id_bound):
            raise ValueError(f"an example holds id {ids.max()}, the vocab has {id_bound}")
    rows = np.empty(len(chunk), dtype)
    for name, values in _fields(chunk).items():
        rows[name] = values
    return rows


def _unpack(rows: np.ndarray, types: dict[str, np.dtype]) -> Chunk:
    """The rows as a chunk with the types the chunks came with."""

    def column(name: str) -> np.ndarray:
        return rows[name].astype(types[name])

    return Chunk(
        Masked(column("input_ids"), column("positions"), column("labels"), column("counts")),
        column("lengths"),
        column("first_lengths"),
        column("random_next"),
    )


class ShuffledExamples:
    """Takes an item's example chunks, gives them back in the item's seeded order (see above)."""

    def __init__(self, item_seed: int, workdir: str = "", limit: int = SHUFFLE_BYTES, id_bound: int = 1 << 31):
        self.item_seed = item_seed
        self.workdir = workdir  # where the scratch file goes ("": the system's temporary folder)
        self.limit = limit
        self.id_bound = id_bound  # every token id is below it (the vocab's size)
        self.file: BinaryIO | None = None

    def __enter__(self) -> "ShuffledExamples":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    @property
    def spilled(self) -> bool:
        return self.file is not None

    def shuffled(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        """Every row of ``chunks`` (all read first), in the permuted order, ``ROWS_OUT`` at a time."""
        buffer = bytearray()
        dtype: np.dtype | None = None
        types: dict[str, np.dtype] = {}
        n = 0
        for chunk in chunks:
            if not len(chunk):
                continue
            if dtype is None:
                dtype = _row_dtype(chunk, self.id_bound)
                types = {name: values.dtype for name, values in _fields(chunk).items()}
            data = _pack(chunk, dtype, self.id_bound).view(np.uint8).data  # (bytearray += ndarray: numpy's add)
            n += len(chunk)
            if self.file is None and len(buffer) + len(data) > self.limit:  # once spilling, always
                self.file = tempfile.TemporaryFile(prefix="fleet-bert-shuffle-", dir=self.workdir or None)
                self.file.write(buffer)
                buffer = bytearray()
            if self.file is None:
                buffer += data
            else:
                self.file.write(data)
        if dtype is None:
            return
        order = permutation(n, self.item_seed)
        if self.file is None:
            rows = np.frombuffer(buffer, dtype)
            for start in range(0, n, ROWS_OUT):
                yield _unpack(rows[order[start : start + ROWS_OUT]], types)
            return
        self.file.flush()
        fd, width = self.file.fileno(), dtype.itemsize
        for start in range(0, n, ROWS_OUT):
            rows_read = b"".join([os.pread(fd, width, i * width) for i in order[start : start + ROWS_OUT].tolist()])
            yield _unpack(np.frombuffer(rows_read, dtype), types)

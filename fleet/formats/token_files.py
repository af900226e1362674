"""Token sequences in the files decoder trainers memory-map: Megatron indexed datasets and flat
token files, one per item (or per shard), written as the sequences come (``SequenceWriter``;
``fleet_jobs.text.output.open_sequence_writer`` gives it an item's files) and read back
(``read_megatron_index``, ``read_sequences``, as docs/outputs.md reads them).

``output=megatron``: megatron-core's ``IndexedDataset`` layout, one sequence per document.
``<prefix>.bin`` holds the sequences' ids back to back; ``<prefix>.idx`` is the header
``MMIDIDX\\x00\\x00``, the version (uint64 1), the dtype code (uint8: 8 uint16, 4 int32), the
sequence count and the document count (uint64 each; the latter is one more than the documents,
as megatron-core counts its document indices), then each sequence's length (int32), its byte
offset in the .bin (int64), and the document indices 0..n (int64). The dtype is megatron-core's
own choice for the vocab (``DType.optimal_dtype``): uint16 below 65,500 ids, else int32, so the
files are those its ``IndexedDatasetBuilder`` writes for the same sequences, byte for byte.

``output=tokens``: ``<prefix>.bin`` the same ids back to back, little-endian uint16 for a vocab of
at most 65,536 ids, else uint32 (nanoGPT's layout), and ``<prefix>.npy`` the int64 token offsets
of the documents' starts, n + 1 of them (the last is the token count), as ``numpy.save`` writes them.

Memory is bounded whatever the item: the .bin is streamed, and the index needs 4 (tokens) or
20 (megatron) bytes per document. The token ids are checked against the vocab size before they
are narrowed, so an id can never wrap around in a narrow dtype.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import BinaryIO, Mapping, Sequence

import numpy as np

from fleet.formats import tfrecord

SEQUENCE_OUTPUTS = ("megatron", "tokens")
BIN_SUFFIX = ".bin"
INDEX_SUFFIXES = {"megatron": ".idx", "tokens": ".npy"}
DATA_PATH_FILE = "megatron-data-path.txt"  # Job.run_files: the run's --data-path list

MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_CODES: dict[np.dtype, int] = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}  # megatron-core's DType enum
MEGATRON_UINT16_BELOW = 65_500  # DType.optimal_dtype: uint16 for a vocab below this, else int32
INDEX_CHUNK = 1 << 20  # index entries converted and written at a time


def token_dtype(output: str, vocab_size: int) -> np.dtype:
    """The dtype of a run's token ids, from the vocab size alone: every id below it fits."""
    if vocab_size < 1:
        raise ValueError(f"vocab size {vocab_size}: at least 1")
    if output == "megatron":
        return np.dtype(np.uint16 if vocab_size < MEGATRON_UINT16_BELOW else np.int32)
    if output == "tokens":
        return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    raise ValueError(f"output {output!r} is not a token-sequence output ({', '.join(SEQUENCE_OUTPUTS)})")


class _Growing:
    """A 1-D int64 array appended to in batches, doubling its room (no list of Python ints)."""

    def __init__(self) -> None:
        self.data, self.n = np.zeros(1024, np.int64), 0

    def extend(self, values: np.ndarray) -> None:
        if self.n + len(values) > len(self.data):
            self.data = np.resize(self.data, max(2 * len(self.data), self.n + len(values)))
        self.data[self.n : self.n + len(values)] = values
        self.n += len(values)

    @property
    def values(self) -> np.ndarray:
        return self.data[: self.n]


class SequenceWriter:
    """One dataset's .bin, streamed; ``write_index`` writes its index once every sequence is in."""

    def __init__(self, out: BinaryIO, output: str, vocab_size: int):
        self.out, self.output, self.vocab_size = out, output, vocab_size
        self.dtype = token_dtype(output, vocab_size).newbyteorder("<")
        self.lengths = _Growing()
        self.tokens = 0

    @property
    def documents(self) -> int:
        return self.lengths.n

    def write(self, sequences: Sequence[Sequence[int] | np.ndarray]) -> None:
        """Whole sequences (a document's ids and its end token), in order; empty ones are kept."""
        arrays = [np.asarray(s, np.int64).reshape(-1) for s in sequences]
        if not arrays:
            return
        flat = np.concatenate(arrays)
        if flat.size and (flat.min() < 0 or flat.max() >= self.vocab_size):
            bad = int(flat.max()) if flat.max() >= self.vocab_size else int(flat.min())
            raise ValueError(f"token id {bad} is outside the vocab (size {self.vocab_size})")
        self.out.write(flat.astype(self.dtype).tobytes())
        self.lengths.extend(np.fromiter(map(len, arrays), np.int64, len(arrays)))
        self.tokens += int(flat.size)

    def write_index(self, out: BinaryIO) -> None:
        if self.output == "megatron":
            self._megatron_index(out)
        else:
            offsets = np.zeros(self.documents + 1, np.int64)
            np.cumsum(self.lengths.values, out=offsets[1:])
            np.lib.format.write_array(out, offsets.astype("<i8"), allow_pickle=False)

    def _megatron_index(self, out: BinaryIO) -> None:
        n, lengths = self.documents, self.lengths.values
        if len(lengths) and lengths.max() >= 1 << 31:
            raise ValueError(f"a sequence of {int(lengths.max())} tokens: Megatron's sizes are int32")
        out.write(
            MEGATRON_HEADER
            + struct.pack(
                "<QBQQ", MEGATRON_VERSION, MEGATRON_CODES[token_dtype(self.output, self.vocab_size)], n, n + 1
            )
        )
        for at in range(0, n, INDEX_CHUNK):
            out.write(lengths[at : at + INDEX_CHUNK].astype("<i4").tobytes())
        start = 0
        for at in range(0, n, INDEX_CHUNK):
            chunk = lengths[at : at + INDEX_CHUNK] * self.dtype.itemsize
            ends = np.cumsum(chunk) + start
            out.write((ends - chunk).astype("<i8").tobytes())
            start = int(ends[-1])
        for at in range(0, n + 1, INDEX_CHUNK):
            out.write(np.arange(at, min(n + 1, at + INDEX_CHUNK), dtype="<i8").tobytes())


def megatron_data_path(outputs: Mapping[str, Mapping[str, int]]) -> bytes:
    """Megatron's ``--data-path`` list of a run's datasets: ``<tokens> <prefix>`` per line, the
    prefix relative to the output folder, in output-name order; datasets of no tokens are left
    out (Megatron cannot sample from an empty one)."""
    lines = [
        f"{counts['tokens']} {name[: -len(BIN_SUFFIX)]}\n"
        for name, counts in sorted(outputs.items())
        if name.endswith(BIN_SUFFIX) and counts.get("tokens", 0) > 0
    ]
    return "".join(lines).encode()


# -- reading them back (the report, the tests; a trainer uses its own reader) -------------------


@dataclass(frozen=True)
class MegatronIndex:
    dtype: np.dtype
    sizes: np.ndarray  # int32, one per sequence
    pointers: np.ndarray  # int64 byte offsets into the .bin
    document_indices: np.ndarray  # int64, documents + 1


def read_megatron_index(data: bytes) -> MegatronIndex:
    """An ``.idx`` file's contents, checked; ValueError names what is wrong."""
    head = len(MEGATRON_HEADER) + 25
    if len(data) < head or not data.startswith(MEGATRON_HEADER):
        raise ValueError("not a Megatron index (no MMIDIDX header)")
    version, code, n, docs = struct.unpack_from("<QBQQ", data, len(MEGATRON_HEADER))
    dtype = {c: d for d, c in MEGATRON_CODES.items()}.get(code)
    if version != MEGATRON_VERSION or dtype is None:
        raise ValueError(f"Megatron index version {version}, dtype code {code}: not one this writes")
    if len(data) != head + 12 * n + 8 * docs:
        raise ValueError(f"Megatron index of {n} sequences and {docs} document indices: {len(data)} bytes")
    sizes = np.frombuffer(data, "<i4", n, head)
    pointers = np.frombuffer(data, "<i8", n, head + 4 * n)
    return MegatronIndex(dtype, sizes, pointers, np.frombuffer(data, "<i8", docs, head + 12 * n))


def read_sequences(bin_path: str, index: bytes, output: str, vocab_size: int) -> list[np.ndarray]:
    """Every sequence of one dataset, through ``numpy.memmap``, as the reader in docs/outputs.md does."""
    if output == "megatron":
        idx = read_megatron_index(index)
        if not idx.sizes.sum():
            return [np.zeros(0, idx.dtype) for _ in idx.sizes]  # (an empty file cannot be mapped)
        ids = np.memmap(bin_path, dtype=idx.dtype.newbyteorder("<"), mode="r")
        starts = idx.pointers // idx.dtype.itemsize
        return [np.asarray(ids[s : s + n]) for s, n in zip(starts.tolist(), idx.sizes.tolist())]
    starts = np.load(io.BytesIO(index), allow_pickle=False)
    dtype = token_dtype(output, vocab_size).newbyteorder("<")
    flat: np.ndarray = np.memmap(bin_path, dtype=dtype, mode="r") if starts[-1] else np.zeros(0, dtype)
    return [np.asarray(flat[a:b]) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


# -- between stages: a sequence as one record of the shuffle (--shards) ---------------------------

SEQUENCE_FEATURE = "input_ids"


def sequence_example(ids: Sequence[int] | np.ndarray) -> bytes:
    """A sequence as the shuffle before ``--shards`` carries it: a serialized ``tf.train.Example``
    of one int64 list ``input_ids`` as long as the sequence (records there are Examples)."""
    data, _ = tfrecord.varint_rows(np.asarray(ids, np.int64).reshape(1, -1))
    entry = (
        tfrecord.int64_entry_prefix(SEQUENCE_FEATURE, len(data)) + data
        if data
        else tfrecord.feature_entry(SEQUENCE_FEATURE, tfrecord.packed_int64_feature(b""))
    )
    return tfrecord.example_prefix(len(entry)) + entry


def describe(folder: str, output: str) -> str | None:
    """A finished local run's datasets in a few lines (``fleet local`` prints it)."""
    import glob
    import os

    indexes = sorted(glob.glob(os.path.join(folder, "part-*" + INDEX_SUFFIXES[output])))
    if not indexes:
        return None
    lengths = []
    for path in indexes:
        with open(path, "rb") as f:
            data = f.read()
        if output == "megatron":
            lengths.append(read_megatron_index(data).sizes.astype(np.int64))
        else:
            lengths.append(np.diff(np.load(io.BytesIO(data), allow_pickle=False)))
    sizes = np.concatenate(lengths)
    kind = "Megatron indexed datasets (.bin + .idx)" if output == "megatron" else "token files (.bin + .npy)"
    text = [f"{len(indexes)} {kind} in {folder}: {len(sizes):,} documents, {int(sizes.sum()):,} tokens"]
    if len(sizes):
        text.append(
            f"  tokens per document (with its end token): median {int(np.median(sizes)):,}, "
            f"longest {int(sizes.max()):,}"
        )
    if output == "megatron":
        text.append(f"  Megatron: --data-args-path {DATA_PATH_FILE} (prefixes relative to the folder: run from it)")
    return "\n".join(text)

"""BERT pre-training records (what ``run_pretraining.py`` parses), encoded a batch at a time.

No Python step per example but its checksum: every row's record is laid out
in one (rows, width) byte array, each feature in a column range of its
greatest size (the varints of the three int64 lists from a table of every
value's bytes, one ``np.take``; the other features depend only on a length or
a count: a constant prefix and 0/1 bytes, or a table row), with a mask of the
bytes used; one ``np.compress`` then gives the records back to back. Features
are written in sorted name order, the bytes ``tfrecord.example`` gives for
the same values, with no protobuf object.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fleet.formats import tfrecord
from .masking import Masked

FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)
# tf-models' names (official/nlp/data/pretrain_dataloader.py, use_v2_feature_names): only two change.
LAYOUT_BYTES = 8 << 20  # the byte layout of the rows encoded together (memory, and cache)
V2_NAMES = {"input_ids": "input_word_ids", "segment_ids": "input_type_ids"}


def feature_names(v2: bool) -> dict[str, str]:
    """BERT's feature name -> the name written."""
    return {name: V2_NAMES.get(name, name) if v2 else name for name in FEATURES}


@dataclass(frozen=True)
class BertLayout:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    v2_feature_names: bool = False


class BertRecordEncoder:
    def __init__(self, layout: BertLayout):
        self.layout = layout
        names = feature_names(layout.v2_feature_names)
        seq, preds = layout.max_seq_length, layout.max_predictions_per_seq

        def entry(name: str, feature: bytes) -> bytes:
            return tfrecord.feature_entry(names[name], feature)

        def weights_entry(k: int) -> bytes:
            return entry("masked_lm_weights", tfrecord.float_feature([1.0] * k + [0.0] * (preds - k)))

        def label_entry(label: int) -> bytes:
            return entry("next_sentence_labels", tfrecord.int64_feature([label]))

        def as_array(pieces: list[bytes]) -> np.ndarray:
            assert len(set(map(len, pieces))) == 1
            return np.frombuffer(b"".join(pieces), np.uint8).reshape(len(pieces), -1)

        # Features whose size never changes: a prefix and 0/1 bytes, or a table by count or label.
        self._mask_prefix = as_array([entry("input_mask", tfrecord.packed_int64_feature(b"\x00" * seq))[:-seq]])[0]
        self._segment_prefix = as_array([entry("segment_ids", tfrecord.packed_int64_feature(b"\x00" * seq))[:-seq]])[0]
        # (a row has fewer predictions than positions: counts stop at seq however big preds is)
        self._weights_table = as_array([weights_entry(k) for k in range(min(preds, seq) + 1)])
        self._labels_table = as_array([label_entry(label) for label in (0, 1)])
        self._names = names
        self._prefixes: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._example_prefixes = _padded([b""])
        self._frame_headers = np.zeros((0, 12), np.uint8)
        # The written order: sorted by the names written, as tfrecord.example orders them.
        self.order = sorted(FEATURES, key=names.__getitem__)

    def _prefix_table(self, name: str, max_payload: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The int64 entry prefix of every payload size up to ``max_payload``: ``_padded``."""
        key = name, max_payload
        if key not in self._prefixes:
            self._prefixes[key] = _padded(
                [tfrecord.int64_entry_prefix(self._names[name], n) for n in range(max_payload + 1)]
            )
        return self._prefixes[key]

    def _example_prefix_table(self, max_body: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(self._example_prefixes[0]) <= max_body:
            self._example_prefixes = _padded([tfrecord.example_prefix(n) for n in range(2 * max_body + 1)])
        return self._example_prefixes

    def _frame_header_table(self, max_length: int) -> np.ndarray:
        if len(self._frame_headers) <= max_length:
            self._frame_headers = tfrecord.frame_headers(2 * max_length + 1)
        return self._frame_headers

    def encode(self, masked: Masked, lengths: np.ndarray, first_lengths: np.ndarray, random_next: np.ndarray) -> bytes:
        """The framed TFRecords of all rows, joined (row order).

        Every row is laid out in one (rows, width) byte array, each feature's bytes in
        a column range of their greatest size with a mask of the bytes used; one
        boolean selection then gives the records back to back. Only the checksums
        take a call per record. Rows go a slice at a time so that layout stays a few MB
        whatever ``max_seq_length`` and ``max_predictions_per_seq`` are."""
        seq, preds = self.layout.max_seq_length, self.layout.max_predictions_per_seq
        step = max(1, LAYOUT_BYTES // (6 * (seq + 2 * preds) + 4 * preds + 256))  # (a row's layout, at most)
        if len(lengths) <= step:
            return self._encode(masked, lengths, first_lengths, random_next)
        return b"".join(
            self._encode(
                Masked(
                    masked.input_ids[i : i + step],
                    masked.positions[i : i + step],
                    masked.labels[i : i + step],
                    masked.counts[i : i + step],
                ),
                lengths[i : i + step],
                first_lengths[i : i + step],
                random_next[i : i + step],
            )
            for i in range(0, len(lengths), step)
        )

    def _encode(self, masked: Masked, lengths: np.ndarray, first_lengths: np.ndarray, random_next: np.ndarray) -> bytes:
        n_rows = len(lengths)
        if not n_rows:
            return b""
        seq = self.layout.max_seq_length
        pos = np.arange(seq)
        lengths = np.asarray(lengths, np.int64)[:, None]
        first_lengths = np.asarray(first_lengths, np.int64)[:, None]
        varints = {
            name: _varint_parts(values)
            for name, values in (
                ("input_ids", masked.input_ids),
                ("masked_lm_positions", masked.positions),
                ("masked_lm_ids", masked.labels),
            )
        }
        prefixes = {name: self._prefix_table(name, parts.shape[1]) for name, (parts, _, _) in varints.items()}
        fixed = {
            "input_mask": len(self._mask_prefix) + seq,
            "segment_ids": len(self._segment_prefix) + seq,
            "masked_lm_weights": self._weights_table.shape[1],
            "next_sentence_labels": self._labels_table.shape[1],
        }
        body_bytes = np.full(n_rows, sum(fixed.values()), np.int64)
        for name, (_, _, payload) in varints.items():
            body_bytes += prefixes[name][2][payload] + payload
        example_prefix, example_prefix_used, example_prefix_length = self._example_prefix_table(int(body_bytes.max()))
        example_bytes = body_bytes + example_prefix_length[body_bytes]
        headers = self._frame_header_table(int(example_bytes.max()))

        width = (
            12
            + example_prefix.shape[1]
            + 4
            + sum(
                prefixes[name][0].shape[1] + varints[name][0].shape[1] if name in varints else fixed[name]
                for name in self.order
            )
        )
        data = np.empty((n_rows, width), np.uint8)
        used = np.ones((n_rows, width), bool)
        at = 0

        def put(values: np.ndarray, mask: np.ndarray | None = None) -> None:
            nonlocal at
            end = at + values.shape[-1]
            data[:, at:end] = values
            if mask is not None:
                used[:, at:end] = mask
            at = end

        in_mask = pos < lengths
        put(rows_of(headers, example_bytes))
        put(rows_of(example_prefix, body_bytes), rows_of(example_prefix_used, body_bytes))
        for name in self.order:
            if name in varints:
                parts, parts_used, payload = varints[name]
                prefix, prefix_used, _ = prefixes[name]
                put(rows_of(prefix, payload), rows_of(prefix_used, payload))
                put(parts, parts_used)
            elif name == "input_mask":
                put(self._mask_prefix)
                put(in_mask)
            elif name == "segment_ids":
                put(self._segment_prefix)
                put(in_mask & (pos >= first_lengths))
            elif name == "masked_lm_weights":
                put(rows_of(self._weights_table, masked.counts))
            else:
                put(rows_of(self._labels_table, random_next))
        put(np.zeros(4, np.uint8))  # the data checksum, filled in below
        return tfrecord.checksum_frames(np.compress(used.ravel(), data.ravel()), example_bytes)


def rows_of(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``table[index]`` for a 2-D table (``np.take`` on axis 0 is several times faster)."""
    return np.take(table, index, axis=0)


def _padded(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte strings as rows of one array, zero padded; the mask of their bytes; their lengths."""
    width = max(map(len, pieces))
    data = np.zeros((len(pieces), width), np.uint8)
    used = np.zeros((len(pieces), width), bool)
    for i, piece in enumerate(pieces):
        data[i, : len(piece)] = np.frombuffer(piece, np.uint8)
        used[i, : len(piece)] = True
    return data, used, used.sum(axis=1)


def _varint_parts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed varints of every row of a 2-D array of values in [0, 2**35), each value's
    bytes in a fixed number of columns: (rows, columns) bytes, zero padded; (rows, columns)
    which are used; (rows,) how many are."""
    v = np.asarray(values)
    n_rows = len(v)
    if not v.size or (v.min() >= 0 and v.max() < 1 << 16):
        words = np.take(_varint_words(), v)
        # A byte is used if it is a value's first or follows one with the continuation bit.
        used: np.ndarray = (words & 0x8080) << 1 | 1  # (a bool array in the other branch)
        return (
            words.view(np.uint8).reshape(n_rows, -1),
            used.view(bool).reshape(n_rows, -1),
            np.take(tfrecord.varint_table()[1], v).sum(axis=1, dtype=np.int64),
        )
    v = v.astype(np.int64)
    if v.min() < 0 or v.max() >= 1 << 35:
        raise ValueError("varints of values in [0, 2**35) only")
    n_bytes = np.ones(v.shape, np.int64)
    for k in range(1, 5):
        n_bytes += v >= 1 << (7 * k)
    width = int(n_bytes.max())
    parts = np.empty(v.shape + (width,), np.uint8)
    for k in range(width):
        parts[..., k] = ((v >> (7 * k)) & 0x7F) | np.where(n_bytes > k + 1, 0x80, 0)
    used = np.arange(width) < n_bytes[..., None]
    return parts.reshape(n_rows, -1), used.reshape(n_rows, -1), n_bytes.sum(axis=1)


@functools.cache
def _varint_words() -> np.ndarray:
    """For every value below 2**16, its varint bytes padded to four, as one uint32 (so one
    ``np.take`` gives them; little-endian, as the bytes are read back)."""
    words = np.zeros((1 << 16, 4), np.uint8)
    words[:, :3] = tfrecord.varint_table()[0]
    return words.view("<u4").ravel()

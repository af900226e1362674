"""BERT pre-training records (what ``run_pretraining.py`` parses), encoded a batch at a time.

The varints of the three per-example int64 lists come from one numpy pass
over the batch (``tfrecord.varint_rows``); the other features depend only on
a length or a count, so their bytes are cached; an example is then one join
of ready-made pieces, with no protobuf object. Features are written in
sorted name order, the bytes ``tfrecord.example`` gives for the same values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from jobs.text import tfrecord
from .masking import Masked

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")
# tf-models' names (official/nlp/data/pretrain_dataloader.py, use_v2_feature_names): only two change.
V2_NAMES = {"input_ids": "input_word_ids", "segment_ids": "input_type_ids"}


def feature_names(v2: bool) -> dict[str, str]:
    """BERT's feature name -> the name written."""
    return {name: V2_NAMES.get(name, name) if v2 else name for name in FEATURES}


@dataclass(frozen=True)
class BertLayout:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    v2_feature_names: bool = False


class _Cache(dict):
    """key -> bytes, computed on first use."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


class BertRecordEncoder:
    def __init__(self, layout: BertLayout):
        self.layout = layout
        names = feature_names(layout.v2_feature_names)
        seq, preds = layout.max_seq_length, layout.max_predictions_per_seq

        def entry(name: str, feature: bytes) -> bytes:
            return tfrecord.feature_entry(names[name], feature)

        def mask_entry(n: int) -> bytes:
            return entry("input_mask", tfrecord.packed_int64_feature(b"\x01" * n + b"\x00" * (seq - n)))

        def segment_entry(key: tuple[int, int]) -> bytes:
            n_first, n = key
            payload = b"\x00" * n_first + b"\x01" * (n - n_first) + b"\x00" * (seq - n)
            return entry("segment_ids", tfrecord.packed_int64_feature(payload))

        def weights_entry(k: int) -> bytes:
            return entry("masked_lm_weights", tfrecord.float_feature([1.0] * k + [0.0] * (preds - k)))

        def label_entry(label: int) -> bytes:
            return entry("next_sentence_labels", tfrecord.int64_feature([label]))

        self._mask = _Cache(mask_entry)
        self._segments = _Cache(segment_entry)
        self._weights = _Cache(weights_entry)
        self._labels = _Cache(label_entry)
        self._ids_prefix = _Cache(lambda n: tfrecord.int64_entry_prefix(names["input_ids"], n))
        self._positions_prefix = _Cache(lambda n: tfrecord.int64_entry_prefix(names["masked_lm_positions"], n))
        self._mlm_ids_prefix = _Cache(lambda n: tfrecord.int64_entry_prefix(names["masked_lm_ids"], n))
        # The written order: sorted by the names written, as tfrecord.example orders them.
        self.order = sorted(FEATURES, key=names.__getitem__)

    def encode(self, masked: Masked, lengths: np.ndarray, first_lengths: np.ndarray,
               random_next: np.ndarray) -> list[bytes]:
        """One framed TFRecord per row."""
        ids, ids_at = tfrecord.varint_rows(masked.input_ids)
        positions, positions_at = tfrecord.varint_rows(masked.positions)
        mlm_ids, mlm_ids_at = tfrecord.varint_rows(masked.labels)
        mask, segments, weights, labels = self._mask, self._segments, self._weights, self._labels
        ids_prefix, positions_prefix, mlm_ids_prefix = self._ids_prefix, self._positions_prefix, self._mlm_ids_prefix
        example_prefix, frame_header, crc, pack = (tfrecord.example_prefix, tfrecord._frame_header,
                                                   tfrecord.masked_crc32c, struct.Struct("<I").pack)
        # Each record's seven pieces, put in the written order by a tuple index (no dict per record).
        at = {name: i for i, name in enumerate(FEATURES)}
        i0, i1, i2, i3, i4, i5, i6 = (at[name] for name in self.order)
        out = []
        for i, (n, n_first, k, label) in enumerate(zip(lengths.tolist(), first_lengths.tolist(),
                                                       masked.counts.tolist(), random_next.tolist())):
            a, b = ids_at[i], ids_at[i + 1]
            c, d = positions_at[i], positions_at[i + 1]
            e, f = mlm_ids_at[i], mlm_ids_at[i + 1]
            pieces = (ids_prefix[b - a] + ids[a:b], mask[n], segments[n_first, n],
                      positions_prefix[d - c] + positions[c:d], mlm_ids_prefix[f - e] + mlm_ids[e:f], weights[k],
                      labels[label])  # in FEATURES order
            body = b"".join((pieces[i0], pieces[i1], pieces[i2], pieces[i3], pieces[i4], pieces[i5], pieces[i6]))
            example = example_prefix(len(body)) + body
            out.append(frame_header(len(example)) + example + pack(crc(example)))
        return out

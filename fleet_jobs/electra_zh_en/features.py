"""The features of every ELECTRA example (``Job.features``, for the run's readers): ``input_ids``,
``input_mask`` and ``segment_ids``, ``max_seq_length`` int64 each (ELECTRA's
``build_pretraining_dataset.py``); the same in TFRecords and Parquet rows (ints stored as int32)."""

from __future__ import annotations

from fleet.job import Feature

ELECTRA_FEATURES = ("input_ids", "input_mask", "segment_ids")


def electra_features(config) -> dict[str, Feature]:
    """``{name: Feature}`` for an ElectraConfig."""
    return {name: Feature(config.max_seq_length) for name in ELECTRA_FEATURES}

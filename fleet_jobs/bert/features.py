"""The features of every BERT example (``Job.features``, for the run's readers): what BERT's
``run_pretraining.py`` parses, under tf-models' v2 names when ``v2_feature_names``. The same in
TFRecords and Parquet rows (where ints are stored as int32)."""

from __future__ import annotations

from fleet.job import Feature

from .records import FEATURES, feature_names


def bert_features(config) -> dict[str, Feature]:
    """``{name: Feature}`` for a BertConfig."""
    seq, preds = config.max_seq_length, config.max_predictions_per_seq
    lengths = {
        "input_ids": seq,
        "input_mask": seq,
        "segment_ids": seq,
        "masked_lm_positions": preds,
        "masked_lm_ids": preds,
        "masked_lm_weights": preds,
        "next_sentence_labels": 1,
    }
    names = feature_names(config.v2_feature_names)
    return {
        names[name]: Feature(lengths[name], "float32" if name == "masked_lm_weights" else "int64") for name in FEATURES
    }

"""The features of every example a run writes, by format (``Job.features``, for the run's readers).

``format=electra``: ``input_ids``, ``input_mask`` and ``segment_ids``, ``max_seq_length``
int64 each (ELECTRA's ``build_pretraining_dataset.py``). ``format=bert``: what BERT's
``run_pretraining.py`` parses, under tf-models' v2 names when ``v2_feature_names``.
The same in TFRecords and Parquet rows (where ints are stored as int32).
"""

from __future__ import annotations

from fleet.job import Feature

from .bert_records import FEATURES, feature_names

ELECTRA_FEATURES = ("input_ids", "input_mask", "segment_ids")


def feature_layout(config) -> dict[str, Feature]:
    """``{name: Feature}`` for an ElectraConfig."""
    seq = config.max_seq_length
    if config.format != "bert":
        return {name: Feature(seq) for name in ELECTRA_FEATURES}
    preds = config.max_predictions_per_seq
    lengths = {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": preds,
               "masked_lm_ids": preds, "masked_lm_weights": preds, "next_sentence_labels": 1}
    names = feature_names(config.v2_feature_names)
    return {names[name]: Feature(lengths[name], "float32" if name == "masked_lm_weights" else "int64")
            for name in FEATURES}

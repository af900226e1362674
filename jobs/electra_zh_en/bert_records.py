"""BERT's feature names where ``reader`` (``format=bert`` runs) imports them from, until the reader
moves to ``fleet.follow`` and each job gives its own feature layout (issue 22): then this goes."""

from jobs.bert.records import FEATURES, V2_NAMES, feature_names

__all__ = ["FEATURES", "V2_NAMES", "feature_names"]

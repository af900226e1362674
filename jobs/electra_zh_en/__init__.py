"""Chinese + English text to ELECTRA / BERT pre-training TFRecords (the fleet's first job)."""

from .job import ElectraConfig, ElectraConverter, ElectraJob

JOB = ElectraJob()

__all__ = ["JOB", "ElectraConfig", "ElectraConverter", "ElectraJob"]

"""Chinese + English text to ELECTRA pre-training TFRecords (the fleet's first job); ``format=bert``
is the ``bert`` job (``fleet_jobs/bert``) under its former name."""

from .job import ElectraConfig, ElectraConverter, ElectraJob

JOB = ElectraJob()

__all__ = ["JOB", "ElectraConfig", "ElectraConverter", "ElectraJob"]

"""Chinese + English text to ELECTRA pre-training TFRecords (the fleet's first job). BERT's records
are the ``bert`` job (``fleet_jobs/bert``); ``format=bert``, their former name here, is read as it by
discovery (``fleet.core.discovery.FORMER_NAMES``)."""

from .job import ElectraConfig, ElectraConverter, ElectraJob

JOB = ElectraJob()

__all__ = ["JOB", "ElectraConfig", "ElectraConverter", "ElectraJob"]

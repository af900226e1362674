"""BERT masked-LM + next-sentence pre-training records (``run_pretraining.py``'s features),
from Chinese and English text, with whole-word masking (rjieba for Chinese words)."""

from .job import BertConfig, BertConverter, BertJob

JOB = BertJob()

__all__ = ["JOB", "BertConfig", "BertConverter", "BertJob"]

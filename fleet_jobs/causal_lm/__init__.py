"""GPT-style causal-LM data: documents tokenized, ended by an end-of-document token, cut into
fixed-size blocks of ``input_ids`` (plus ``attention_mask`` when partial blocks are padded)."""

from .job import CausalLMConfig, CausalLMConverter, CausalLMJob

JOB = CausalLMJob()

__all__ = ["JOB", "CausalLMConfig", "CausalLMConverter", "CausalLMJob"]

"""fleet: a very large text corpus to pre-training data (BERT/ELECTRA/GPT-style records as TFRecord,
Parquet, Megatron or tokens), on one machine or a self-deleting fleet of Spot VMs coordinated through
a bucket. As a library: ``fleet.local(...)`` (fleet.cli.api), imported when first used, so that
``import fleet`` (each worker process does) stays light."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["local", "LocalRun", "PlanError", "Interrupted"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fleet.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'fleet' has no attribute {name!r}")

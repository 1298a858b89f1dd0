"""Benchmarks: SFT and DPO training throughput against TRL (:mod:`omnimed.bench.train` and :mod:`omnimed.bench.dpo`,
the parents of :mod:`omnimed.bench.train_child`); ``omnimed-bench`` wraps them.

Nothing is imported eagerly: ``python -m omnimed.bench.train_child`` (the per-side child process) must not find its
own module already imported by the package.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {"TrainBenchConfig": "omnimed.bench.train_config", "bench_train": "omnimed.bench.train",
          "DPOBenchConfig": "omnimed.bench.dpo_config", "bench_dpo": "omnimed.bench.dpo"}
__all__ = ["DPOBenchConfig", "TrainBenchConfig", "bench_dpo", "bench_train"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'omnimed.bench' has no attribute {name!r}")

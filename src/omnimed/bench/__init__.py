"""Benchmarks: SFT training throughput against TRL (:mod:`omnimed.bench.train`); ``omnimed-bench`` wraps them.

Nothing is imported eagerly: ``python -m omnimed.bench.train`` (the per-side child process) must not find its own
module already imported by the package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainBenchConfig", "bench_train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from omnimed.bench import train

        return getattr(train, name)
    raise AttributeError(f"module 'omnimed.bench' has no attribute {name!r}")

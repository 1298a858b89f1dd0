"""Timing of world builds (the ``omnimed-bench`` CLI wraps this)."""

from __future__ import annotations

import time
from typing import Any

from omnimed.data.world.build import build_world


def bench_world(seed: int = 0, size: str = "large") -> dict[str, Any]:
    """Build the world once and report wall time, passages per second and record counts.

    Single process, single thread: the generator is pure Python, so the number is what one core does.
    """
    start = time.perf_counter()
    world = build_world(seed=seed, size=size)
    seconds = time.perf_counter() - start
    counts = world.counts()
    return {
        "seed": seed,
        "size": size,
        "build_seconds": round(seconds, 3),
        "passages_per_second": round(counts["passages"] / seconds, 1) if seconds > 0 else float("inf"),
        "records": len(world.records()),
        **counts,
    }

"""DPO training-step throughput of ours against TRL's ``DPOTrainer``: same model, pairs, batches and settings.

:func:`bench_dpo` is ``omnimed-bench train``'s machinery (:func:`omnimed.bench.train.run_bench`: one child process
per side and run, alternated over ``repeats``, the median run of each side, the ratios ours/TRL, the first-step
loss check, peak RSS) on a :class:`~omnimed.bench.dpo_config.DPOBenchConfig`, whose sides are
:mod:`omnimed.bench.dpo_ours` (``DPOModule`` under Lightning) and :mod:`omnimed.bench.dpo_trl` (``DPOTrainer``).
Both train SmolLM2-135M-Instruct + LoRA r16 with beta 0.1 in fp32 on CPU (or the config's GPU scenario: bf16, ZeRO-3,
``qwen2.5-1.5b-shape``) on the same preference pairs
(:mod:`omnimed.bench.dpo_data`), TRL reading our batches in our order, each computing the adapter-disabled
reference every step. Tokens/s count the real (non-padding) tokens of the chosen and rejected rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omnimed.bench.dpo_config import DPOBenchConfig
from omnimed.bench.dpo_data import pair_data_stats
from omnimed.bench.train import run_bench


def bench_dpo(cfg: DPOBenchConfig | None = None, **overrides: Any) -> dict[str, Any]:
    """Benchmark our DPO step against TRL's ``DPOTrainer``; returns a JSON-ready dict (the keys of
    :func:`~omnimed.bench.train.run_bench`, with ``data`` from :func:`~omnimed.bench.dpo_data.pair_data_stats`).
    ``cfg`` fields can be overridden by keyword (``bench_dpo(steps=2, model="tiny-llama")``)."""
    return run_bench(dataclasses.replace(cfg or DPOBenchConfig(), **overrides), pair_data_stats)

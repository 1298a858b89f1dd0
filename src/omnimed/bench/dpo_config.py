"""The scenario of ``omnimed-bench dpo``: :class:`DPOBenchConfig`, ``omnimed-bench train``'s
:class:`~omnimed.bench.train_config.TrainBenchConfig` with DPO's settings, so that both sides load the same model
(SmolLM2-135M + LoRA r16 on the same modules, via :func:`~omnimed.bench.train_config.model_config`) and the same
``TaskConfig`` (:func:`~omnimed.bench.train_config.task_config` plus ``objective=dpo`` and ``beta``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omnimed.bench.train_config import TrainBenchConfig


@dataclass
class DPOBenchConfig(TrainBenchConfig):
    """What both sides of ``omnimed-bench dpo`` share: :class:`TrainBenchConfig`'s fields (``batch_size`` counts
    pairs: a step runs ``2 * batch_size`` sequences) plus ``beta`` and ``pairs`` (how many preference pairs to build,
    None: every world instruction that yields one within ``max_length``). The first-step losses must agree to
    ``loss_atol`` (both are log 2: at step 0 the policy is its reference); the goal is ``target_ratio`` x TRL's real
    tokens/s. No packing (a pair's two sequences are scored whole) and TRL reads our batches (``trl_order``
    matched)."""

    bench: ClassVar[str] = "dpo"

    steps: int = 10
    warmup: int = 2
    beta: float = 0.1
    pairs: int | None = None
    repeats: int = 3
    loss_rtol: float = 0.0
    loss_atol: float = 1e-5
    target_ratio: float = 1.3
    target_peak_rss_mb: float | None = None  # the DPO goal is "no higher than TRL's"
    micro_batch_tokens: int | None = None  # DPO scores each batch of pairs whole
    head_chunk_positions: int | None = None  # our token log-probs a chunk of positions at a time (LoRA only)

    def validate(self) -> None:
        super().validate()
        if self.packing:
            raise ValueError("omnimed-bench dpo does not pack: a pair's chosen and rejected sequences are scored whole")
        if self.trl_order != "matched":
            raise ValueError("omnimed-bench dpo feeds TRL our batches (trl_order='matched') only")
        if self.micro_batch_tokens is not None:
            raise ValueError("omnimed-bench dpo scores each batch of pairs whole (micro_batch_tokens=None)")
        if self.head_chunk_positions is not None and not self.lora_r:
            raise ValueError("omnimed-bench dpo: the chunked LM head (head_chunk_positions) needs the head frozen, "
                             "i.e. LoRA (lora_r > 0); full fine-tuning trains it")
        if self.beta <= 0 or (self.pairs is not None and self.pairs < 1):
            raise ValueError(f"beta > 0 and pairs >= 1 are needed, got beta={self.beta}, pairs={self.pairs}")

    def task_fields(self) -> dict[str, Any]:
        return {"name": "bench_dpo", "objective": "dpo", "beta": self.beta}

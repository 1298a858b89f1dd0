"""The scenario of ``omnimed-bench train``: :class:`TrainBenchConfig` (everything both sides share) and the model
and task configs that both sides load from it, so ours and TRL's train the same model with the same settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omnimed.models.config import ModelConfig
    from omnimed.training.config import TaskConfig

SIDES = ("ours", "trl")
MODELS = ("smollm2-135m", "tiny-llama")


@dataclass
class TrainBenchConfig:
    """Everything both sides share. ``model`` is ``smollm2-135m`` (the real model) or ``tiny-llama`` (tests).

    A subclass is another benchmark on the same machinery (:class:`omnimed.bench.dpo_config.DPOBenchConfig`):
    ``bench`` names it for the child process, :meth:`task_fields` adds to the ``TaskConfig`` both sides load."""

    bench: ClassVar[str] = "train"

    model: str = "smollm2-135m"
    steps: int = 20
    warmup: int = 3
    batch_size: int = 4
    max_length: int = 256
    threads: int = 2
    packing: bool = False
    lr: float = 2e-4
    seed: int = 0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    world_size: str = "small"
    world_seed: int = 0
    max_examples: int | None = None
    trl_order: str = "matched"  # matched | native
    ours_loss: str = "model"  # model (SFTModule as is) | selective (bench variant: LM head on supervised positions)
    repeats: int = 1
    loss_rtol: float = 1e-3
    loss_atol: float = 0.0  # first-step losses match when |diff| <= max(loss_atol, loss_rtol * |loss|)
    target_ratio: float = 1.2
    target_real_fraction: float = 0.9
    child_timeout_s: float = 1800.0
    sides: list[str] = field(default_factory=lambda: list(SIDES))

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.steps < 1 or self.warmup < 0 or self.batch_size < 1 or self.max_length < 8 or self.threads < 1:
            raise ValueError("steps >= 1, warmup >= 0, batch_size >= 1, max_length >= 8 and threads >= 1 are needed")
        if self.trl_order not in ("matched", "native"):
            raise ValueError(f"trl_order must be matched | native, got {self.trl_order!r}")
        if self.ours_loss not in ("model", "selective"):
            raise ValueError(f"ours_loss must be model | selective, got {self.ours_loss!r}")
        unknown = set(self.sides) - set(SIDES)
        if unknown or not self.sides:
            raise ValueError(f"sides must be a non-empty subset of {SIDES}, got {self.sides}")

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def task_fields(self) -> dict[str, Any]:
        """``TaskConfig`` fields set on top of :func:`task_config`'s (none for SFT)."""
        return {}


def model_config(cfg: TrainBenchConfig) -> ModelConfig:
    """The ``ModelConfig`` both sides load (LoRA on the default seven projection modules)."""
    from omnimed.models.config import LoraSettings, ModelConfig

    lora = LoraSettings(enabled=True, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)
    if cfg.model == "tiny-llama":
        return ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama", lora=lora)
    return ModelConfig(name="smollm2-135m", source="packaged", name_or_path="smollm2-135m", dtype="float32",
                       attn_implementation="sdpa", lora=lora)


def task_config(cfg: TrainBenchConfig) -> TaskConfig:
    """Our ``TaskConfig``: same lr, no weight decay, cosine with 3% warmup (TRL gets the same), no masked spans
    (TRL has no span masking, so neither side masks evidence)."""
    from omnimed.training.config import TaskConfig

    return TaskConfig(lr=cfg.lr, weight_decay=0.0, warmup_ratio=0.03, scheduler="cosine",
                      max_length=cfg.max_length, mask_spans=[], **cfg.task_fields())


def warmup_steps(cfg: TrainBenchConfig) -> int:
    """LR warmup steps, computed as ``SFTModule.configure_optimizers`` does, so TRL gets the same number."""
    return math.ceil(0.03 * max(cfg.total_steps, 1))

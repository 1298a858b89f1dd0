"""The scenario of ``omnimed-bench train``: :class:`TrainBenchConfig` (everything both sides share) and the model
and task configs that both sides load from it, so ours and TRL's train the same model with the same settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omnimed.models.config import ModelConfig
    from omnimed.training.config import StrategyConfig, TaskConfig, TrainerConfig

SIDES = ("ours", "trl")
MODELS = ("smollm2-135m", "tiny-llama", "qwen2.5-1.5b-shape", "llama3.2-1b-shape", "smollm2-135m-shape")
ACCELERATORS = ("cpu", "cuda")
PRECISIONS = ("32-true", "bf16-mixed")
STRATEGIES = ("single", "deepspeed_zero3")


def check_sides(sides: list[str], known: tuple[str, ...]) -> None:
    """Refuse an empty ``sides`` or one naming a side the bench does not have (``known``)."""
    if not sides or set(sides) - set(known):
        raise ValueError(f"sides must be a non-empty subset of {known}, got {sides}")


@dataclass
class TrainBenchConfig:
    """Everything both sides share. ``model`` is ``smollm2-135m`` (the real model), ``tiny-llama`` (tests) or
    ``qwen2.5-1.5b-shape`` / ``llama3.2-1b-shape`` / ``smollm2-135m-shape`` (those models' shapes with random weights:
    GPU runs with no hub). ``lora_r`` 0 trains every weight (full fine-tuning) instead of LoRA adapters.

    ``accelerator``, ``precision`` and ``strategy`` are the hardware scenario: one CPU process in fp32 (default), or
    one GPU, bf16 and ``deepspeed_zero3`` (``conf/strategy/deepspeed_zero3.yaml`` for both sides: Lightning's
    ``DeepSpeedStrategy`` for ours, the same dict as ``TrainingArguments.deepspeed`` for TRL's). ZeRO-3 also runs on
    CPU (fp32, ``DS_ACCELERATOR=cpu``, which the parent sets for the sides), so its code path is tested without a GPU.

    A subclass is another benchmark on the same machinery (:class:`omnimed.bench.dpo_config.DPOBenchConfig`):
    ``bench`` names it for the child process, :meth:`task_fields` adds to the ``TaskConfig`` both sides load."""

    bench: ClassVar[str] = "train"

    model: str = "smollm2-135m"
    steps: int = 20
    warmup: int = 3
    batch_size: int = 4
    max_length: int = 256
    threads: int = 2
    accelerator: str = "cpu"  # cpu | cuda
    precision: str = "32-true"  # 32-true | bf16-mixed (Lightning's names; TRL gets bf16=True)
    strategy: str = "single"  # single (one process, no wrapper) | deepspeed_zero3
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
    # ours: task.micro_batch_tokens (a batch of more positions runs as chunks of rows in the same step); None: whole
    micro_batch_tokens: int | None = 320  # conf/task/sft.yaml's
    # ours: task.head_chunk_positions (the LM head and its loss this many positions at a time); None: the whole head
    head_chunk_positions: int | None = 1024  # conf/task/sft.yaml's
    lean_mlp: bool = True  # ours: model.lean_mlp (activation and product recomputed in backward; TRL's side never)
    fused_kernels: bool = False  # ours: model.fused_kernels (Liger's RMSNorm, SwiGLU and rotary kernels; CUDA only)
    trl_liger: bool = False  # TRL: use_liger_kernel=True (TRL applies the same three Liger kernels itself)
    repeats: int = 1
    # a warmup step (0-based, 1 .. warmup-1) run under torch.profiler on both sides; its table lands in the result
    profile_step: int | None = None
    loss_rtol: float = 1e-3
    loss_atol: float = 0.0  # first-step losses match when |diff| <= max(loss_atol, loss_rtol * |loss|)
    target_ratio: float = 1.5  # issue 18: ours at least 1.5x TRL's real tokens/s
    target_peak_rss_mb: float | None = 2000.0  # issue 18: our peak RSS at most 2.0 GB
    target_real_fraction: float = 0.9
    child_timeout_s: float = 1800.0
    sides: list[str] = field(default_factory=lambda: list(SIDES))

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.steps < 1 or self.warmup < 0 or self.batch_size < 1 or self.max_length < 8 or self.threads < 1:
            raise ValueError("steps >= 1, warmup >= 0, batch_size >= 1, max_length >= 8 and threads >= 1 are needed")
        if self.profile_step is not None and not 1 <= self.profile_step < self.warmup:
            raise ValueError(f"profile_step must be an untimed warmup step after the first, 1 .. {self.warmup - 1} "
                             f"(warmup={self.warmup}), got {self.profile_step}")
        if self.lora_r < 0:
            raise ValueError(f"lora_r must be >= 0 (0: full fine-tuning), got {self.lora_r}")
        if self.trl_order not in ("matched", "native"):
            raise ValueError(f"trl_order must be matched | native, got {self.trl_order!r}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be None or >= 1, got {self.micro_batch_tokens!r}")
        if self.head_chunk_positions is not None and self.head_chunk_positions < 1:
            raise ValueError(f"head_chunk_positions must be None or >= 1, got {self.head_chunk_positions!r}")
        for name, value, allowed in (("accelerator", self.accelerator, ACCELERATORS),
                                     ("precision", self.precision, PRECISIONS), ("strategy", self.strategy, STRATEGIES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.accelerator == "cpu" and self.precision != "32-true":
            raise ValueError("accelerator=cpu runs fp32 (precision=32-true): DeepSpeed on CPU is fp32 only, and "
                             "bf16 autocast on CPU is not a scenario anyone trains in")
        if (self.fused_kernels or self.trl_liger) and self.accelerator != "cuda":
            raise ValueError("fused_kernels and trl_liger are Liger's Triton kernels: they need accelerator=cuda")
        check_sides(self.sides, SIDES)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def task_fields(self) -> dict[str, Any]:
        """``TaskConfig`` fields set on top of :func:`task_config`'s (none for SFT)."""
        return {}


def model_config(cfg: TrainBenchConfig) -> ModelConfig:
    """The ``ModelConfig`` both sides load (LoRA on the default seven projection modules; every weight trained when
    ``lora_r`` is 0)."""
    from omnimed.models.config import LoraSettings, ModelConfig
    from omnimed.models.tiny import TINY_MODELS

    lora = LoraSettings(enabled=cfg.lora_r > 0, r=max(cfg.lora_r, 1), alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)
    if cfg.model in TINY_MODELS:  # random weights built here
        return ModelConfig(name=cfg.model, source="tiny", name_or_path=cfg.model, dtype="float32",
                           attn_implementation="sdpa", lora=lora, lean_mlp=cfg.lean_mlp,
                           fused_kernels=cfg.fused_kernels)
    return ModelConfig(name="smollm2-135m", source="packaged", name_or_path="smollm2-135m", dtype="float32",
                       attn_implementation="sdpa", lora=lora, lean_mlp=cfg.lean_mlp,
                       fused_kernels=cfg.fused_kernels)


def trl_model_config(mcfg: ModelConfig) -> ModelConfig:
    """The model TRL's side trains: ours with PEFT's own LoRA layers and the model's own MLP, as a TRL user loads
    it (our fused LoRA layers, lean MLP and fused kernels are part of our training stack, so they are measured on our
    side only; TRL gets Liger's kernels its own way, ``use_liger_kernel``, with ``trl_liger``)."""
    from dataclasses import replace

    return replace(mcfg, lean_mlp=False, fused_kernels=False, lora=replace(mcfg.lora, fused=False))


def task_config(cfg: TrainBenchConfig) -> TaskConfig:
    """Our ``TaskConfig``: same lr, no weight decay, cosine with 3% warmup (TRL gets the same), no masked spans
    (TRL has no span masking, so neither side masks evidence)."""
    from omnimed.training.config import TaskConfig

    return TaskConfig(lr=cfg.lr, weight_decay=0.0, warmup_ratio=0.03, scheduler="cosine",
                      max_length=cfg.max_length, mask_spans=[], micro_batch_tokens=cfg.micro_batch_tokens,
                      head_chunk_positions=cfg.head_chunk_positions, **cfg.task_fields())


def warmup_steps(cfg: TrainBenchConfig) -> int:
    """LR warmup steps, computed as ``SFTModule.configure_optimizers`` does, so TRL gets the same number."""
    return math.ceil(0.03 * max(cfg.total_steps, 1))


def deepspeed_zero3_dict(cfg: TrainBenchConfig) -> dict[str, Any]:
    """``conf/strategy/deepspeed_zero3.yaml``'s DeepSpeed dict resolved for this scenario (micro batch, clipping 1.0,
    bf16 from ``precision``; :func:`omnimed.training.strategies.resolve_deepspeed_config`): ours and TRL's get the
    same dict."""
    from omnimed.training.strategies import resolve_deepspeed_config

    return resolve_deepspeed_config(strategy_config(cfg).deepspeed, precision=cfg.precision,
                                    trainer_cfg=trainer_config(cfg), micro_batch_size=cfg.batch_size)


def strategy_config(cfg: TrainBenchConfig) -> StrategyConfig:
    """The ``StrategyConfig`` of ``cfg.strategy``: ``conf/strategy/deepspeed_zero3.yaml`` or the single process."""
    from omnimed.conf import load_option
    from omnimed.training.config import StrategyConfig

    if cfg.strategy == "single":
        return StrategyConfig(name="cpu")
    return load_option("strategy", cfg.strategy, StrategyConfig)


def trainer_config(cfg: TrainBenchConfig) -> TrainerConfig:
    """The ``TrainerConfig`` our side's hardware is resolved from (one device, clipping 1.0, no accumulation)."""
    from omnimed.training.config import TrainerConfig

    return TrainerConfig(accelerator=cfg.accelerator, devices=1, precision=cfg.precision, gradient_clip_val=1.0,
                         accumulate_grad_batches=1, max_steps=cfg.total_steps)

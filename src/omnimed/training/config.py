"""Structured configs of a training run. Hydra validates every group against these dataclasses at compose time,
so a wrong key or type fails before any work starts and names the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import PathsConfig
from omnimed.models.config import ModelConfig
from omnimed.tracking import LoggerConfig


@dataclass
class TaskConfig:
    """What is trained and with which objective and optimisation (paper presets live in conf/task/)."""

    name: str = "sft"
    objective: str = "sft"  # sft (dpo, distill: later tasks)
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    scheduler: str = "cosine"  # cosine | linear | constant
    max_length: int = 256
    # spans masked from the loss, each [open, close] marker pair (Self-RAG masks <paragraph>...</paragraph>)
    mask_spans: list[list[str]] = field(default_factory=list)
    # tokens the task's data format needs (e.g. Self-RAG's reflective tokens): added to the model's tokenizer as
    # special tokens on top of model.special_tokens, so any model config can be trained on the task
    special_tokens: list[str] = field(default_factory=list)


@dataclass
class DataConfig:
    """Where the examples come from and how they are batched."""

    name: str = "world_small"
    source: str = "world"  # world | records (a records.jsonl / record-set dir from omnimed-data)
    path: Optional[str] = None
    world_size: str = "small"
    world_seed: int = 0
    record_kind: str = "instruction"
    split: Optional[str] = "train"  # keep records of this split (field `split` or metadata["split"]); null: all
    max_examples: Optional[int] = None
    val_fraction: float = 0.05
    batch_size: int = 8
    num_workers: int = 0
    packing: bool = False
    shuffle_seed: int = 0


@dataclass
class TrainerConfig:
    """Lightning Trainer knobs."""

    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    precision: str = "auto"  # auto: bf16-mixed where the hardware has it, else 32-true
    max_epochs: int = 1
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = 1.0
    log_every_n_steps: int = 1
    val_check_interval: Optional[float] = None  # > 1: every N steps; <= 1: fraction of an epoch; null: epoch end
    limit_val_batches: Optional[float] = None
    checkpoint_every_n_steps: int = 50
    num_threads: Optional[int] = None
    deterministic: bool = False


@dataclass
class StrategyConfig:
    """Distribution strategy: cpu | ddp | fsdp2 | deepspeed. ``deepspeed`` holds the DeepSpeed config dict."""

    name: str = "cpu"
    process_group_backend: Optional[str] = None  # None: nccl on GPUs, gloo on CPU
    deepspeed: dict[str, Any] = field(default_factory=dict)


@dataclass
class DebugConfig:
    """Debug presets: fast_dev_run, overfit one batch, profiler."""

    name: str = "none"
    fast_dev_run: Any = False
    overfit_batches: int = 0  # N batches (Lightning reads a float as a fraction of the data)
    profiler: Optional[str] = None


@dataclass
class TrainConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    seed: int = 0
    experiment: Optional[str] = None
    run_name: Optional[str] = None
    # "last" resumes the newest checkpoint of this run name; "auto" resumes run_name if it has one, else starts it
    ckpt_path: Optional[str] = None


#: each group of ``conf/train.yaml`` and the dataclass that validates it (``<group>_schema``)
GROUP_SCHEMAS = {
    "task": TaskConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "strategy": StrategyConfig,
    "logger": LoggerConfig,
    "paths": PathsConfig,
    "debug": DebugConfig,
}


def register_train_configs() -> None:
    """Schemas of ``omnimed-train``: the root ``train_schema`` and one ``<group>_schema`` per group, which every
    YAML option of that group lists first in its defaults so Hydra validates it."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)

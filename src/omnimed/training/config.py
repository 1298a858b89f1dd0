"""Structured configs of a training run. Hydra validates every group against these dataclasses at compose time,
so a wrong key or type fails before any work starts and names the key; :func:`validate_train_config` checks the
values (a learning rate > 0, ``data.path`` for ``data=records``, ...) before the run creates any folder."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import PathsConfig
from omnimed.data.world.difficulty import DifficultyConfig
from omnimed.models.config import ModelConfig
from omnimed.tracking import LoggerConfig


@dataclass
class TaskConfig:
    """What is trained and with which objective and optimisation (paper presets live in conf/task/)."""

    name: str = "sft"
    objective: str = "sft"  # sft | dpo | distill (omnimed.training.objectives)
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    scheduler: str = "cosine"  # cosine | linear | constant | wsd (omnimed.training.schedules)
    decay_ratio: float = 0.2  # wsd: the share of the steps, at the end, over which the lr decays to 0
    max_length: int = 256
    # sft: a batch of more positions (rows x padded length) than this runs as chunks of rows that fit, one after the
    # other in the same optimizer step (omnimed.training.micro_batches): the same gradient, activations for one
    # chunk at a time. null: the whole batch in one forward pass. Used on one process without DeepSpeed; elsewhere
    # the run warns and trains whole batches (save memory there with trainer.accumulate_grad_batches)
    micro_batch_tokens: Optional[int] = None
    # sft: the LM head and its cross-entropy run this many supervised positions at a time, their gradients computed
    # in the forward pass, so that no [positions, vocab] logits are held (omnimed.training.chunked_head; the same
    # loss). null: the whole head at once. Pays where logits dominate: full fine-tuning of a large vocabulary.
    # dpo: each completion token's log-prob the same way; the head must be frozen (LoRA without trainable tokens)
    head_chunk_positions: Optional[int] = None
    # spans masked from the loss, each [open, close] marker pair (Self-RAG masks <paragraph>...</paragraph>)
    mask_spans: list[list[str]] = field(default_factory=list)
    # tokens the task's data format needs (e.g. Self-RAG's reflective tokens): added to the model's tokenizer as
    # special tokens on top of model.special_tokens, so any model config can be trained on the task
    special_tokens: list[str] = field(default_factory=list)
    # dpo: the temperature of the implicit reward beta * log(policy / reference) (TRL's default, the usual value)
    beta: float = 0.1
    # dpo: compute the reference's log-probs of every train/val pair once before training instead of every step
    precompute_ref_log_probs: bool = False
    # distill: the student's softmax temperature over cosines (PolyRAG / FlagEmbedding: 0.05), the teacher scores'
    # temperature, the passages per query (the paper's window: 50), and whether other queries' passages join the
    # student's softmax as negatives
    temperature: float = 0.05
    teacher_temperature: float = 1.0
    passage_window: int = 50
    in_batch_negatives: bool = False
    # distill: texts per encoder forward pass, sorted by length so that each pass pads only to its own longest
    # text; 0: a batch's passages in one pass, padded to the longest of them all; null: 32 on the CPU (1.9x the
    # samples/s of one pass there), one pass on an accelerator (chunks measured slower on an H200; README)
    encode_batch_size: Optional[int] = None


@dataclass
class DataConfig:
    """Where the examples come from and how they are batched."""

    name: str = "world_small"
    source: str = "world"  # world | records (a records.jsonl / record-set dir from omnimed-data)
    path: Optional[str] = None
    world_size: str = "small"
    world_seed: int = 0
    world_difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)
    record_kind: str = "instruction"
    split: Optional[str] = "train"  # keep records of this split (field `split` or metadata["split"]); null: all
    max_examples: Optional[int] = None
    val_fraction: float = 0.05
    batch_size: int = 8
    num_workers: int = 0
    packing: bool = False
    shuffle_seed: int = 0
    # a key of the records (a field, or one of their metadata, e.g. a question's kind): the validation loss is
    # also logged per value of it, val/loss/<value>, each the per-token mean over that value's examples
    val_group_by: Optional[str] = None


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


#: strategies whose ranks each hold a shard of the model: a run is exported from its saved shards
SHARDED_STRATEGIES: tuple[str, ...] = ("deepspeed", "fsdp2")


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
    memory: bool = False  # RSS per phase (model load, tokenization, forward, backward, ...) into memory.json


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


#: data.source values that load_examples reads
DATA_SOURCES: tuple[str, ...] = ("world", "records")
PROFILERS: tuple[str, ...] = ("simple", "advanced", "pytorch")


def config_problems(cfg: TrainConfig) -> list[str]:
    """What is wrong with the values of a run's config, one ``key=value: expected ...`` per problem.

    The schema checks types and keys at compose time; these are the checks of values (ranges, required keys of
    a choice) that would otherwise surface late: after folders are created, or deep inside ``fit`` as an opaque
    optimizer or Lightning error. Checks that belong to one objective (e.g. the SFT schedulers) stay with it."""
    t, d, tr = cfg.task, cfg.data, cfg.trainer
    problems: list[str] = []

    def need(ok: bool, key: str, value: Any, expected: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: expected {expected}")

    need(math.isfinite(t.lr) and t.lr > 0, "task.lr", t.lr, "a learning rate > 0")
    need(math.isfinite(t.weight_decay) and t.weight_decay >= 0, "task.weight_decay", t.weight_decay, "a value >= 0")
    need(0 <= t.warmup_ratio <= 1, "task.warmup_ratio", t.warmup_ratio, "a share between 0 and 1")
    need(t.scheduler != "wsd" or 0 < t.decay_ratio <= 1 - t.warmup_ratio, "task.decay_ratio", t.decay_ratio,
         f"a share in (0, 1 - task.warmup_ratio = {1 - t.warmup_ratio:g}]: the decay follows the warmup")
    need(t.max_length > 0, "task.max_length", t.max_length, "a number of tokens > 0")
    need(t.micro_batch_tokens is None or t.micro_batch_tokens > 0, "task.micro_batch_tokens", t.micro_batch_tokens,
         "null or a number of positions > 0")
    need(t.micro_batch_tokens is None or t.objective not in ("dpo", "distill"), "task.micro_batch_tokens",
         t.micro_batch_tokens, f"null with task.objective={t.objective} (micro-batches split SFT batches only)")
    need(t.head_chunk_positions is None or t.head_chunk_positions > 0, "task.head_chunk_positions",
         t.head_chunk_positions, "null or a number of positions > 0")
    need(t.head_chunk_positions is None or t.objective != "distill", "task.head_chunk_positions",
         t.head_chunk_positions, "null with task.objective=distill (an embedder has no LM head)")
    need(math.isfinite(t.beta) and t.beta > 0, "task.beta", t.beta, "a reward temperature > 0")
    need(t.temperature > 0, "task.temperature", t.temperature, "a softmax temperature > 0")
    need(t.teacher_temperature > 0, "task.teacher_temperature", t.teacher_temperature, "a softmax temperature > 0")
    need(t.passage_window >= 1, "task.passage_window", t.passage_window, "at least 1 passage per query")
    need(t.encode_batch_size is None or t.encode_batch_size >= 0, "task.encode_batch_size", t.encode_batch_size,
         "null (32 on the CPU, one pass on an accelerator), 0 (one pass) or a number of texts per pass")
    need(t.objective != "distill" or cfg.strategy.name not in SHARDED_STRATEGIES, "strategy", cfg.strategy.name,
         "cpu or ddp with task.objective=distill (a bi-encoder, BGE-M3's 568M parameters, fits one device: it is "
         "replicated, not sharded)")
    need(d.source in DATA_SOURCES, "data.source", d.source, f"one of {', '.join(DATA_SOURCES)}")
    if d.source == "records" and not d.path:
        problems.append(f"data.path is not set: data={d.name} (data.source=records) reads a records.jsonl or an "
                        "omnimed-data output folder; set data.path=DIR")
    need(d.batch_size > 0, "data.batch_size", d.batch_size, "a batch size > 0")
    need(0 <= d.val_fraction < 1, "data.val_fraction", d.val_fraction, "a share in [0, 1)")
    need(d.max_examples is None or d.max_examples >= 0, "data.max_examples", d.max_examples,
         "null or a count >= 0 (null and 0: every example)")
    need(d.num_workers >= 0, "data.num_workers", d.num_workers, "a count >= 0")
    need(d.val_group_by is None or (t.objective == "sft" and not d.packing), "data.val_group_by", d.val_group_by,
         "null with packing or another objective than sft (a packed block mixes examples; only the sft objective "
         "logs a loss per group)")
    need(tr.num_nodes >= 1, "trainer.num_nodes", tr.num_nodes, "a count >= 1")
    need(tr.accumulate_grad_batches >= 1, "trainer.accumulate_grad_batches", tr.accumulate_grad_batches,
         "a count >= 1")
    need(tr.gradient_clip_val is None or tr.gradient_clip_val >= 0, "trainer.gradient_clip_val",
         tr.gradient_clip_val, "null or a value >= 0")
    need(cfg.debug.profiler in (None, "", *PROFILERS), "debug.profiler", cfg.debug.profiler,
         f"null or one of {', '.join(PROFILERS)}")
    if cfg.ckpt_path == "auto" and not cfg.run_name:
        problems.append("ckpt_path=auto needs run_name (the run to continue or start)")
    return problems


def validate_train_config(cfg: TrainConfig) -> None:
    """Raise ValueError listing every problem :func:`config_problems` finds (on one line), before a run creates
    anything: an invalid config must leave no checkpoint folder behind."""
    problems = config_problems(cfg)
    if problems:
        raise ValueError("invalid training config: " + "; ".join(problems))


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

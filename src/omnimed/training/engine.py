"""One training run from a composed config: data -> module -> Lightning Trainer -> checkpoint, HF export, metrics.

Layout of a run (``checkpoints/<task>/<run>/``): ``lightning/`` (resumable checkpoints, ``last.ckpt``), ``hf/`` (an
export that ``from_pretrained`` loads: full model or LoRA adapter, optional ``hf/merged``), ``config.yaml`` (the
resolved config), ``versions.json`` (package versions and git state). The Hydra run directory gets ``metrics.json``
(flat name -> value) and the logger's files.

Without ``run_name`` a run is named ``<model>_<data>_s<seed>[_j<NNN>_<swept values>]_<config key>``
(:func:`default_run_name`; no clock), with ``-2``, ``-3``, ... when that folder exists. The config is validated and
the examples are read before the run's folder is created, so an invalid config or input leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from omegaconf import DictConfig, OmegaConf

from omnimed.data.artifacts import atomic_write_json, atomic_write_text
from omnimed.training.config import SHARDED_STRATEGIES, TrainConfig, validate_train_config

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    hf_dir: Path | None
    output_dir: Path
    metrics: dict[str, float]
    logger_dir: str | None = None
    losses: list[float] = field(default_factory=list)
    profiler_report: Path | None = None


def _to_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    if isinstance(cfg, TrainConfig):
        return cfg
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


#: config keys that say where a run's files go and how it is logged, not what is trained: left out of its key
NOT_RUN_SETTINGS = ("paths", "logger", "run_name", "ckpt_path", "hydra")
#: a process spawned by Lightning for another rank (DDP, DeepSpeed) reads its rank 0's run name here: a default
#: name may carry a ``-N`` suffix that only rank 0 could choose
RUN_NAME_ENV = "_OMNIMED_RANK0_RUN_NAME"


def run_config_key(cfg: TrainConfig, length: int = 8) -> str:
    """A short hash of everything that decides what a run trains (the config but :data:`NOT_RUN_SETTINGS`)."""
    config = OmegaConf.to_container(OmegaConf.structured(cfg))
    settings = {k: v for k, v in config.items() if k not in NOT_RUN_SETTINGS}
    blob = json.dumps(settings, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def default_run_name(cfg: TrainConfig, job_num: int | None = None, job_overrides: Sequence[str] = ()) -> str:
    """``<model>_<data>_s<seed>[_j<NNN>_<values>]_<key>``: ``key`` is :func:`run_config_key`, ``_j<NNN>`` the
    job's number in a sweep (zero-padded, so a sweep's runs sort in job order) and ``<values>`` the values the job
    was given for ``task.`` / ``model.`` / ``trainer.`` / ``data.`` keys (``lr0.001_r16``: the swept ones among
    them). No clock: the same command and config give the same name on every rank and every machine;
    :func:`claim_run_dir` adds ``-2``, ``-3``, ... when a run of that name already exists, so a repeated command
    never writes into an earlier run's folder."""
    job = "" if job_num is None else f"_j{job_num:03d}" + "".join(f"_{v}" for v in swept_values(job_overrides))
    return f"{cfg.model.name}_{cfg.data.name}_s{cfg.seed}{job}_{run_config_key(cfg)}"


def _short(value: str) -> str:
    """A float as 4 significant digits (an Optuna trial's ``0.0008558894657793092`` -> ``0.0008559``); other
    values as they are."""
    try:
        number = float(value)
    except ValueError:
        return value
    return value if number.is_integer() or len(value) <= 8 else f"{number:.4g}"


def swept_values(overrides: Sequence[str]) -> list[str]:
    """``task.lr=0.00125`` -> ``lr0.00125``: a sweep job's values of training keys, for its run name (file-safe,
    floats to 4 significant digits, each at most 24 characters)."""
    out = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if value and key.split(".")[0] in ("task", "model", "trainer", "data") and "." in key:
            out.append(re.sub(r"[^A-Za-z0-9.@-]+", "-", f"{key.rsplit('.', 1)[-1]}{_short(value)}")[:24])
    return out


def claim_run_dir(task_dir: Path, base: str) -> Path:
    """Create and return ``task_dir/<base>``, or ``<base>-2``, ``<base>-3``, ... the first that does not exist yet.
    ``mkdir`` without ``exist_ok`` is the claim, so two runs started at once never get the same folder."""
    task_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        run_dir = task_dir / (base if n == 1 else f"{base}-{n}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            n += 1


def _launched_world_size() -> int:
    """How many processes an outside launcher (torchrun, SLURM) started for this run; 1 without one."""
    sizes = [os.environ.get(var, "") for var in ("WORLD_SIZE", "SLURM_NTASKS")]
    return max([int(v) for v in sizes if v.isdigit()] or [1])


def _is_rank_zero() -> bool:
    """Rank 0 from the launcher's environment (RANK / LOCAL_RANK / SLURM_PROCID): right before ``fit`` too, when
    Lightning has not yet started the other ranks or set the strategy's ranks."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def _write_run_files(run_dir: Path, config_dict: dict, lineage: dict) -> None:
    """The run's resolved config and package versions + git state, next to its checkpoints."""
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(config_dict))
    atomic_write_json(run_dir / "versions.json", {"packages": lineage["versions"], "git": lineage["git"]})


def _profiler(cfg: TrainConfig, output_dir: Path):
    """``debug.profiler`` (simple | advanced | pytorch) writing its report to ``<output_dir>/fit-profiler.txt``
    (Lightning's string form only prints it); None without one."""
    name = cfg.debug.profiler
    if not name:
        return None
    from lightning.pytorch import profilers

    classes = {"simple": profilers.SimpleProfiler, "advanced": profilers.AdvancedProfiler,
               "pytorch": profilers.PyTorchProfiler}
    if name not in classes:
        raise ValueError(f"debug.profiler={name!r}: expected one of {', '.join(classes)}")
    return classes[name](dirpath=str(output_dir), filename="profiler")


def data_artifact_name(lineage: dict[str, Any]) -> str:
    """The W&B dataset artifact a run's data is a version of: the world by size (``world-small``), a records set
    by its folder's name (``records-critic_data``); versions differ by content."""
    from omnimed.tracking import records_artifact_name

    if lineage["source"] == "world":
        return f"world-{lineage['size']}"
    return records_artifact_name(Path(lineage["path"]))


def load_examples(cfg: TrainConfig) -> tuple[list, dict[str, Any]]:
    """The training records named by ``cfg.data`` and their lineage (where from, fingerprint)."""
    from omnimed.data.hf import split_of
    from omnimed.data.records import record_type

    d = cfg.data
    cls = record_type(d.record_kind)
    if d.source == "world":
        from omnimed.data.world import build_world
        from omnimed.data.world.difficulty import world_knobs

        world = build_world(seed=d.world_seed, size=d.world_size, difficulty=world_knobs(d.world_difficulty))
        records = [r for r in world.records() if isinstance(r, cls)]
        digest = hashlib.sha256("\n".join(r.to_json() for r in records).encode()).hexdigest()
        lineage = {"source": "world", "size": d.world_size, "seed": d.world_seed,
                   "difficulty": world.difficulty.as_dict(), "fingerprint": digest}
    elif d.source == "records":
        from omnimed.data.io import read_json, read_records

        if not d.path:
            raise ValueError("data.source=records needs data.path (a records.jsonl or an omnimed-data output folder)")
        path = Path(d.path)
        folder = path if path.is_dir() else path.parent
        jsonl = path / "records.jsonl" if path.is_dir() else path
        if not jsonl.exists():
            raise FileNotFoundError(f"data.path={d.path}: no records.jsonl there")
        records = read_records(jsonl, cls)
        manifest = folder / "manifest.json"
        fingerprint = (
            read_json(manifest)["fingerprint"]
            if manifest.exists()
            else hashlib.sha256(jsonl.read_bytes()).hexdigest()
        )
        lineage = {"source": "records", "path": str(jsonl.resolve()), "fingerprint": fingerprint}
    else:
        raise ValueError(f"data.source={d.source!r}: expected one of world, records")
    if d.split:
        records = [r for r in records if split_of(r) in (d.split, None)]
    if d.max_examples:
        records = records[: d.max_examples]
    if not records:
        raise ValueError(f"data {d.name}: no {d.record_kind} records found")
    lineage["examples"] = len(records)
    return records, lineage


def _val_every(trainer_cfg) -> int | float | None:
    """Lightning's ``val_check_interval``: whole training batches above 1, capped at the run's (``max_steps`` x
    ``accumulate_grad_batches``: a 10-step run with the default interval of 20 validates at step 10); a fraction of
    an epoch or None as given."""
    vci, steps = trainer_cfg.val_check_interval, trainer_cfg.max_steps
    if not vci or vci <= 1:
        return vci
    return int(min(vci, steps * trainer_cfg.accumulate_grad_batches)) if steps > 0 else int(vci)


def _callbacks(cfg: TrainConfig, ckpt_dir: Path, history):
    from omnimed.training.progress import progress_bar
    from omnimed.training.resume import LoaderPositionCallback, RNGStateCallback, StepCheckpoint

    ckpt = StepCheckpoint(
        dirpath=str(ckpt_dir),
        filename="step{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=max(1, cfg.trainer.checkpoint_every_n_steps),
        save_last=True,
        save_top_k=1,
    )
    # with max_epochs -1 (the default trainer), Lightning's bars count the epoch's batches or the steps left,
    # whichever is fewer, so a 20-step run shows 20 and its ETA
    return [ckpt, RNGStateCallback(), LoaderPositionCallback(), history, progress_bar()]


class TrainHistory(Callback):
    """Collects per-step training loss (this process's), the real (non-pad) input tokens and supervised target
    tokens of every process (counted per process, summed over the processes when training ends), and the wall time
    of training."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.tokens = 0
        self.target_tokens = 0
        self.start: float | None = None
        self.seconds = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.losses.append(float(loss.detach()))
        if isinstance(batch, dict) and "attention_mask" in batch:  # as the step's logged train/tokens and the bench
            self.tokens += int(batch["attention_mask"].sum())
        if isinstance(batch, dict) and "labels" in batch:
            self.target_tokens += int((batch["labels"] != -100).sum())

    def on_train_end(self, trainer, pl_module) -> None:
        if self.start is not None:
            self.seconds = time.perf_counter() - self.start
        if trainer.world_size > 1:  # DDP / FSDP2 / DeepSpeed: each process saw its own share of the batches
            counts = torch.tensor([self.tokens, self.target_tokens], dtype=torch.float64,
                                  device=trainer.strategy.root_device)
            total = trainer.strategy.reduce(counts, reduce_op="sum")
            self.tokens, self.target_tokens = int(total[0]), int(total[1])


def train(
    cfg_in: DictConfig | TrainConfig, output_dir: str | Path | None = None, *, job_num: int | None = None,
    job_overrides: Sequence[str] = (),
) -> TrainResult:
    """Run one training job; see the module docstring for what it writes. ``job_num`` and ``job_overrides``: the
    job's number in a sweep and the overrides it was given (they join the default run name)."""
    import lightning as L

    from omnimed.models.loading import base_model_id, load_tokenizer
    from omnimed.tracking import build_logger, log_lineage, log_model, use_dataset, wandb_run_dir
    from omnimed.training.export import consolidate_checkpoint, export_hf
    from omnimed.training.memory_profile import MemoryPhases, write_report
    from omnimed.training.objectives import get_objective
    from omnimed.training.resume import find_last_checkpoint
    from omnimed.training.strategies import build_strategy

    resolved = OmegaConf.to_container(cfg_in, resolve=True) if isinstance(cfg_in, DictConfig) else None
    cfg = _to_config(cfg_in)
    # before any work or folder: an invalid value, or an objective that is not built, fails naming the key
    validate_train_config(cfg)
    # the task's format tokens join the model's own, once each, model's first (stable ids across tasks)
    cfg.model.special_tokens = list(dict.fromkeys([*cfg.model.special_tokens, *cfg.task.special_tokens]))
    objective = get_objective(cfg.task.objective, cfg.task.name)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    output_dir = Path(output_dir or cfg.paths.output_dir)
    task_dir = Path(cfg.paths.root) / cfg.paths.checkpoints / cfg.task.name
    ckpt_path = None
    run_name: str | None
    if cfg.ckpt_path == "auto":  # resume run_name when it left a checkpoint, else start it: for scripted pipelines
        last = task_dir / cfg.run_name / "lightning" / "last.ckpt"
        ckpt_path = last if last.exists() else None
        run_name = cfg.run_name
    elif cfg.ckpt_path == "last":
        ckpt_path = find_last_checkpoint(task_dir, cfg.run_name)
        run_name = ckpt_path.parent.parent.name
    elif cfg.ckpt_path:
        ckpt_path = Path(cfg.ckpt_path)
        if not ckpt_path.exists():
            raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path}: no such checkpoint")
        run_name = cfg.run_name or ckpt_path.parent.parent.name
    else:
        run_name = cfg.run_name  # None: a default name, chosen (and its folder claimed) once the inputs are read
    finished = run_name is not None and (task_dir / run_name / "hf").exists()
    if finished and ckpt_path is None and not cfg.debug.fast_dev_run:
        raise FileExistsError(
            f"run {run_name!r} already finished ({task_dir / run_name / 'hf'} exists): continue it with "
            "ckpt_path=last (and a larger trainer.max_steps), or pick another run_name"
        )

    # the inputs, before any folder: a missing or unreadable data.path leaves nothing behind
    memory = MemoryPhases() if cfg.debug.memory else None
    mark = memory.mark if memory is not None else (lambda phase: None)
    mark("tokenizer and records")
    tokenizer = load_tokenizer(cfg.model)
    records, data_lineage = load_examples(cfg)
    datamodule = objective.datamodule(cfg, records, tokenizer)
    mark("model load")
    module = objective.module(cfg, tokenizer)
    mark("run setup (logger, folders)")
    built = build_strategy(cfg.strategy, cfg.trainer, micro_batch_size=cfg.data.batch_size)

    output_dir.mkdir(parents=True, exist_ok=True)
    run_dir = _run_dir(cfg, task_dir, run_name, job_num, job_overrides)
    run_name = run_dir.name

    logger = build_logger(
        cfg.logger.name,
        save_dir=output_dir,
        project=cfg.logger.project,
        run_name=run_name,
        group=cfg.logger.group or cfg.experiment or cfg.task.name,
        job_type=cfg.logger.job_type or f"train-{cfg.task.name}",
        tags=[*cfg.logger.tags, cfg.task.name, cfg.model.name, cfg.data.name, *([cfg.experiment] if cfg.experiment else [])],
        entity=cfg.logger.entity,
    )
    config_dict = resolved if resolved is not None else OmegaConf.to_container(OmegaConf.structured(cfg))
    config_dict = {k: v for k, v in config_dict.items() if k != "hydra"}
    lineage = log_lineage(logger, config_dict, {"data_lineage": data_lineage, "run_name": run_name})
    if _is_rank_zero():
        use_dataset(logger, data_artifact_name(data_lineage), data_lineage)
    # before fit, so that a run which crashes or is killed still says what it was (rewritten after fit)
    if _is_rank_zero() and not cfg.debug.fast_dev_run:
        _write_run_files(run_dir, config_dict, lineage)
    profiler = _profiler(cfg, output_dir)

    history = TrainHistory()
    trainer = L.Trainer(
        accelerator=built.accelerator,
        devices=built.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=built.strategy,
        precision=built.precision,
        max_epochs=cfg.trainer.max_epochs,
        max_steps=cfg.trainer.max_steps,
        accumulate_grad_batches=cfg.trainer.accumulate_grad_batches,
        gradient_clip_val=built.gradient_clip_val,
        log_every_n_steps=cfg.trainer.log_every_n_steps,
        # > 1 means "every N training steps", counted across epochs (at most the run's steps, so a run shorter
        # than the interval still validates at its end); <= 1 is a fraction of an epoch
        val_check_interval=_val_every(cfg.trainer),
        check_val_every_n_epoch=None if (vci := cfg.trainer.val_check_interval) and vci > 1 else 1,
        limit_val_batches=cfg.trainer.limit_val_batches,
        deterministic=cfg.trainer.deterministic,
        fast_dev_run=cfg.debug.fast_dev_run,
        overfit_batches=cfg.debug.overfit_batches,
        profiler=profiler,
        logger=logger if logger is not None else False,
        callbacks=_callbacks(cfg, run_dir / "lightning", history) + ([memory] if memory is not None else []),
        use_distributed_sampler=False,
        enable_model_summary=False,
        default_root_dir=str(output_dir),
    )
    mark("tokenization (data setup)")
    with _run_name_for_spawned_ranks(run_name):
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None)

    mark("export")
    hf_dir = None
    if trainer.is_global_zero and not cfg.debug.fast_dev_run:
        _write_run_files(run_dir, config_dict, lineage)
    trainer.strategy.barrier()
    if not cfg.debug.fast_dev_run:
        hf_dir = run_dir / "hf"
        export_options = {"merge_lora": cfg.model.lora.merge_on_export, "base_model_id": base_model_id(cfg.model),
                          "overwrite": True}
        if objective.export is not None:
            if trainer.is_global_zero:
                objective.export(module, tokenizer, hf_dir, cfg)
        elif cfg.strategy.name in SHARDED_STRATEGIES:  # rebuilt whole from the saved shards
            last = run_dir / "lightning" / "last.ckpt"  # the final step (StepCheckpoint)
            if trainer.is_global_zero:
                state = consolidate_checkpoint(last, prefix=None)
                model = module.build_model_for_export(state)
                export_hf(model, tokenizer, hf_dir, **export_options)
        elif trainer.is_global_zero:
            export_hf(module.model, tokenizer, hf_dir, **export_options)

    metrics = _final_metrics(trainer, history)
    if getattr(datamodule, "dropped_too_long", None) is not None:
        metrics["data/dropped_too_long"] = float(datamodule.dropped_too_long)
        metrics["data/examples"] = float(datamodule.num_examples)
        for key in ("truncated", "needed_length"):  # what max_length cut, and the value that cuts nothing
            if getattr(datamodule, key, None) is not None:
                metrics[f"data/{key}"] = float(getattr(datamodule, key))
    if memory is not None:
        report = memory.stop()
        metrics["memory/peak_rss_mb"] = report["peak_mb"]
        if trainer.is_global_zero:
            log.info("memory per phase (memory.json):\n%s", write_report(report, output_dir / "memory.json"))
    if trainer.is_global_zero:
        atomic_write_json(output_dir / "metrics.json", metrics)
    logger_dir = wandb_run_dir(logger) if logger is not None else None
    if logger is not None and logger_dir is None:
        logger_dir = getattr(logger, "log_dir", None)
    if logger is not None and cfg.logger.name == "wandb" and trainer.is_global_zero:
        logger.experiment.summary.update(metrics)
        if hf_dir is not None:
            log_model(logger, hf_dir, f"{cfg.task.name}-{run_name}",
                      {"task": cfg.task.name, "model": cfg.model.name, "base_model": export_options["base_model_id"],
                       "data_fingerprint": data_lineage["fingerprint"], **metrics})
        logger.experiment.finish()
    profiler_report = None
    if profiler is not None:
        reports = sorted(output_dir.glob("*profiler*.txt"))
        profiler_report = reports[0] if reports else None
    return TrainResult(run_dir, hf_dir, output_dir, metrics, logger_dir, list(history.losses), profiler_report)


def _run_dir(cfg: TrainConfig, task_dir: Path, run_name: str | None, job_num: int | None,
             job_overrides: Sequence[str] = ()) -> Path:
    """The run's checkpoint folder, created (except under ``debug.fast_dev_run``, which writes none).

    A given ``run_name`` is used as is. A default name (:func:`default_run_name`) gets a fresh folder
    (:func:`claim_run_dir`) in the launching process; a rank that Lightning spawned takes its rank 0's choice
    (:data:`RUN_NAME_ENV`); ranks started by an outside launcher (torchrun, SLURM) cannot agree on a suffix, so
    they all use the plain default name and rank 0 refuses one that exists."""
    if run_name is not None:
        run_dir = task_dir / run_name
    elif not _is_rank_zero() and os.environ.get(RUN_NAME_ENV):
        return task_dir / os.environ[RUN_NAME_ENV]
    else:
        base = default_run_name(cfg, job_num, job_overrides)
        if cfg.debug.fast_dev_run or not _is_rank_zero():
            return task_dir / base
        if _launched_world_size() == 1:
            return claim_run_dir(task_dir, base)
        run_dir = task_dir / base
        if run_dir.exists():
            raise FileExistsError(
                f"run {base!r} exists ({run_dir}): the {_launched_world_size()} processes of this launch cannot "
                f"agree on another default name; continue it with run_name={base} ckpt_path=last, or set run_name"
            )
    if not cfg.debug.fast_dev_run:
        run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


@contextlib.contextmanager
def _run_name_for_spawned_ranks(run_name: str) -> Iterator[None]:
    """While ``fit`` runs, :data:`RUN_NAME_ENV` holds the run name, so the ranks Lightning spawns (they inherit
    the environment) write into this run's folder; restored afterwards, so that the next run of the same process
    (a sweep job) does not inherit it."""
    before = os.environ.get(RUN_NAME_ENV)
    os.environ[RUN_NAME_ENV] = run_name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RUN_NAME_ENV, None)
        else:
            os.environ[RUN_NAME_ENV] = before


def _final_metrics(trainer, history) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for key, value in trainer.callback_metrics.items():
        v = float(value)
        if math.isfinite(v):
            metrics[key] = v
    losses = history.losses
    if losses:
        k = max(1, min(5, len(losses) // 4 or 1))
        metrics["train/loss_first"] = sum(losses[:k]) / k
        metrics["train/loss_last"] = sum(losses[-k:]) / k
    metrics["train/steps"] = float(trainer.global_step)
    metrics["train/seconds"] = round(history.seconds, 3)
    if history.tokens:  # objectives that count tokens (SFT, DPO); a bi-encoder's batches are queries
        metrics["train/tokens"] = float(history.tokens)
        metrics["train/target_tokens"] = float(history.target_tokens)
        if history.seconds > 0:
            metrics["train/tokens_per_s"] = round(history.tokens / history.seconds, 2)
    return metrics

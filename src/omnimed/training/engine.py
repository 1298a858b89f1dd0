"""One training run from a composed config: data -> module -> Lightning Trainer -> checkpoint, HF export, metrics.

Layout of a run (``checkpoints/<task>/<run>/``): ``lightning/`` (resumable checkpoints, ``last.ckpt``), ``hf/`` (an
export that ``from_pretrained`` loads: full model or LoRA adapter, optional ``hf/merged``), ``config.yaml`` (the
resolved config), ``versions.json`` (package versions and git state). The Hydra run directory gets ``metrics.json``
(flat name -> value) and the logger's files.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from omegaconf import DictConfig, OmegaConf

from omnimed.data.artifacts import atomic_write_json, atomic_write_text
from omnimed.training.config import TrainConfig


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


def default_run_name(cfg: TrainConfig, job_num: int | None = None) -> str:
    """``<model>_<data>_s<seed>_<time>``, plus ``_j<N>`` for job N of a sweep: the jobs of a parallel sweep start
    in the same second and would otherwise share (and overwrite) one checkpoint folder."""
    name = f"{cfg.model.name}_{cfg.data.name}_s{cfg.seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    return name if job_num is None else f"{name}_j{job_num}"


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


def load_examples(cfg: TrainConfig) -> tuple[list, dict[str, Any]]:
    """The training records named by ``cfg.data`` and their lineage (where from, fingerprint)."""
    from omnimed.data.records import record_type

    d = cfg.data
    cls = record_type(d.record_kind)
    if d.source == "world":
        from omnimed.data.world import build_world

        world = build_world(seed=d.world_seed, size=d.world_size)
        records = [r for r in world.records() if isinstance(r, cls)]
        digest = hashlib.sha256("\n".join(r.to_json() for r in records).encode()).hexdigest()
        lineage = {"source": "world", "size": d.world_size, "seed": d.world_seed, "fingerprint": digest}
    elif d.source == "records":
        from omnimed.data.io import read_records

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
            json.loads(manifest.read_text())["fingerprint"]
            if manifest.exists()
            else hashlib.sha256(jsonl.read_bytes()).hexdigest()
        )
        lineage = {"source": "records", "path": str(jsonl.resolve()), "fingerprint": fingerprint}
    else:
        raise ValueError(f"data.source={d.source!r}: expected one of world, records")
    if d.split:
        records = [r for r in records if _split_of(r) in (d.split, None)]
    if d.max_examples:
        records = records[: d.max_examples]
    if not records:
        raise ValueError(f"data {d.name}: no {d.record_kind} records found")
    lineage["examples"] = len(records)
    return records, lineage


def _split_of(record) -> str | None:
    return getattr(record, "split", None) or getattr(record, "metadata", {}).get("split")


def _callbacks(cfg: TrainConfig, ckpt_dir: Path, history):
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    from omnimed.training.resume import RNGStateCallback, StepCheckpoint

    ckpt = StepCheckpoint(
        dirpath=str(ckpt_dir),
        filename="step{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=max(1, cfg.trainer.checkpoint_every_n_steps),
        save_last=True,
        save_top_k=1,
    )
    bar = RichProgressBar() if sys.stderr.isatty() else TQDMProgressBar(refresh_rate=10)
    return [ckpt, RNGStateCallback(), history, bar]


class TrainHistory(Callback):
    """Collects per-step training loss, real (unmasked) target tokens and the wall time of training."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.tokens = 0
        self.start: float | None = None
        self.seconds = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.losses.append(float(loss.detach()))
        if isinstance(batch, dict) and "labels" in batch:
            self.tokens += int((batch["labels"] != -100).sum())

    def on_train_end(self, trainer, pl_module) -> None:
        if self.start is not None:
            self.seconds = time.perf_counter() - self.start


def train(
    cfg_in: DictConfig | TrainConfig, output_dir: str | Path | None = None, *, job_num: int | None = None
) -> TrainResult:
    """Run one training job; see the module docstring for what it writes. ``job_num``: the job's number in a
    sweep (it joins the default run name)."""
    import lightning as L

    from omnimed.models.loading import load_tokenizer
    from omnimed.tracking import build_logger, log_lineage, wandb_run_dir
    from omnimed.training.export import consolidate_checkpoint, export_hf
    from omnimed.training.objectives import get_objective
    from omnimed.training.resume import find_last_checkpoint
    from omnimed.training.strategies import build_strategy

    resolved = OmegaConf.to_container(cfg_in, resolve=True) if isinstance(cfg_in, DictConfig) else None
    cfg = _to_config(cfg_in)
    # the task's format tokens join the model's own, once each, model's first (stable ids across tasks)
    cfg.model.special_tokens = list(dict.fromkeys([*cfg.model.special_tokens, *cfg.task.special_tokens]))
    objective = get_objective(cfg.task.objective, cfg.task.name)  # before any work: an unbuilt one fails by name
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    output_dir = Path(output_dir or cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    task_dir = Path(cfg.paths.root) / cfg.paths.checkpoints / cfg.task.name
    ckpt_path = None
    if cfg.ckpt_path == "auto":  # resume run_name when it left a checkpoint, else start it: for scripted pipelines
        if not cfg.run_name:
            raise ValueError("ckpt_path=auto needs run_name (the run to continue or start)")
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
        run_name = cfg.run_name or default_run_name(cfg, job_num)
    run_dir = task_dir / run_name
    if ckpt_path is None and not cfg.debug.fast_dev_run and (run_dir / "hf").exists():
        raise FileExistsError(
            f"run {run_name!r} already finished ({run_dir / 'hf'} exists): continue it with ckpt_path=last "
            "(and a larger trainer.max_steps), or pick another run_name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(cfg.model)
    records, data_lineage = load_examples(cfg)
    datamodule = objective.datamodule(cfg, records, tokenizer)
    module = objective.module(cfg, tokenizer)
    built = build_strategy(cfg.strategy, cfg.trainer, micro_batch_size=cfg.data.batch_size)

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
        gradient_clip_val=cfg.trainer.gradient_clip_val if cfg.strategy.name != "deepspeed" else None,
        log_every_n_steps=cfg.trainer.log_every_n_steps,
        # > 1 means "every N training steps", counted across epochs; <= 1 is a fraction of an epoch
        val_check_interval=int(vci) if (vci := cfg.trainer.val_check_interval) and vci > 1 else vci,
        check_val_every_n_epoch=None if vci and vci > 1 else 1,
        limit_val_batches=cfg.trainer.limit_val_batches,
        deterministic=cfg.trainer.deterministic,
        fast_dev_run=cfg.debug.fast_dev_run,
        overfit_batches=cfg.debug.overfit_batches,
        profiler=profiler,
        logger=logger if logger is not None else False,
        callbacks=_callbacks(cfg, run_dir / "lightning", history),
        use_distributed_sampler=False,
        enable_model_summary=False,
        default_root_dir=str(output_dir),
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None)

    hf_dir = None
    if trainer.is_global_zero and not cfg.debug.fast_dev_run:
        _write_run_files(run_dir, config_dict, lineage)
    trainer.strategy.barrier()
    if not cfg.debug.fast_dev_run:
        hf_dir = run_dir / "hf"
        if cfg.strategy.name == "deepspeed":
            last = run_dir / "lightning" / "last.ckpt"  # the final step (StepCheckpoint)
            if trainer.is_global_zero:
                state = consolidate_checkpoint(last, prefix=None)
                model = module.build_model_for_export(state)
                export_hf(model, tokenizer, hf_dir, merge_lora=cfg.model.lora.merge_on_export, overwrite=True)
        elif trainer.is_global_zero:
            export_hf(module.model, tokenizer, hf_dir, merge_lora=cfg.model.lora.merge_on_export, overwrite=True)

    metrics = _final_metrics(trainer, history)
    if getattr(datamodule, "dropped_too_long", None) is not None:
        metrics["data/dropped_too_long"] = float(datamodule.dropped_too_long)
        metrics["data/examples"] = float(datamodule.num_examples)
    if trainer.is_global_zero:
        atomic_write_json(output_dir / "metrics.json", metrics)
    logger_dir = wandb_run_dir(logger) if logger is not None else None
    if logger is not None and logger_dir is None:
        logger_dir = getattr(logger, "log_dir", None)
    if logger is not None and cfg.logger.name == "wandb" and trainer.is_global_zero:
        logger.experiment.summary.update(metrics)
        logger.experiment.finish()
    profiler_report = None
    if profiler is not None:
        reports = sorted(output_dir.glob("*profiler*.txt"))
        profiler_report = reports[0] if reports else None
    return TrainResult(run_dir, hf_dir, output_dir, metrics, logger_dir, list(history.losses), profiler_report)


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
    if history.seconds > 0:
        metrics["train/tokens_per_s"] = round(history.tokens / history.seconds, 2)
    metrics["train/tokens"] = float(history.tokens)
    return metrics

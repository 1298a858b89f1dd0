"""TRL's side of ``omnimed-bench train``, run in its own process by :mod:`omnimed.bench.train_child`.

TRL's side is ``trl.SFTTrainer`` with ``SFTConfig`` (``completion_only_loss``, ``max_length``, no gradient
checkpointing, fp32, ``use_cpu``, our model with PEFT's own LoRA layers (``trl_model_config``),
``optim="adamw_torch_fused"`` (HF's default; ours runs torch's fused AdamW too, on one process or under DeepSpeed,
fp32 or bf16), i.e. the same optimizer as ours, same lr/clipping/schedule, logging every step, no
reporting, no saving, no progress output).
With ``trl_order="matched"`` (default) it consumes exactly our first-epoch batches: unpacked, our sampler's order of
the same prompt/completion strings, tokenized by TRL itself (its own completion mask), read sequentially; packed,
our packed blocks as a pre-tokenized dataset. Equal first batches make the first-step losses comparable and isolate
the training step. With ``trl_order="native"`` TRL uses its own default pipeline (random order and pad-to-longest,
or its own BFD packing when ``packing``): batches then differ, so the loss comparison is reported but not expected
to match.

The loop around the trainer (our batch order, the step timer, the collator that counts tokens and keeps the first
batch, the loss of every step, the arguments both TRL trainers share, the result) is :func:`run_trl_side`, which
``omnimed-bench dpo``'s TRL side (:mod:`omnimed.bench.dpo_trl`, ``DPOTrainer``) shares.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from omnimed.bench.mfu import gpu_mfu
from omnimed.bench.train_config import TrainBenchConfig, deepspeed_zero3_dict, trl_model_config, warmup_steps
from omnimed.bench.train_data import check_epoch, datamodule, first_epoch_batches, sft_rows, side_setup
from omnimed.bench.train_measure import PeakRSS, peak_gpu_memory, step_log


def trainer_args(cfg: TrainBenchConfig, output_dir: str) -> dict[str, Any]:
    """The ``TrainingArguments`` both TRL trainers get: our batch size, steps, AdamW (torch's), lr, cosine schedule
    with our warmup, clipping 1.0 and ``max_length``; fp32 on CPU (TRL would default to bf16 there), bf16 where the
    scenario says so, our DeepSpeed dict under ``deepspeed_zero3``; Liger's layer kernels with ``trl_liger``; no
    gradient checkpointing, no workers, logging every step, no reporting, saving, evaluation or progress bar."""
    deepspeed = deepspeed_zero3_dict(cfg) if cfg.strategy == "deepspeed_zero3" else None
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": cfg.batch_size,
        "gradient_accumulation_steps": 1,
        "max_steps": cfg.total_steps,
        "learning_rate": cfg.lr,
        "weight_decay": 0.0,
        "optim": "adamw_torch_fused",
        "lr_scheduler_type": "cosine",
        "warmup_steps": warmup_steps(cfg),
        "max_grad_norm": 1.0,
        "max_length": cfg.max_length,
        "bf16": cfg.precision.startswith("bf16"),
        "fp16": False,
        "use_cpu": cfg.accelerator == "cpu",
        "deepspeed": deepspeed,
        "gradient_checkpointing": False,
        "use_liger_kernel": cfg.trl_liger,
        "report_to": [],
        "dataloader_num_workers": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "disable_tqdm": True,
        "seed": cfg.seed,
        "data_seed": cfg.seed,
    }


def _single_process_group_env() -> None:
    """The variables ``torch.distributed`` reads, for a world of one process: what a launcher (``deepspeed``,
    ``torchrun``) would set, so ``TrainingArguments(deepspeed=...)`` runs in this plain process (Lightning sets them
    for ours itself)."""
    import os
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def run_trl_side(
    cfg: TrainBenchConfig,
    *,
    trainer_cls: type,
    config_cls: type,
    train_dataset: Callable[[Any, list[dict[str, Any]], list[int]], Any],
    config_kwargs: Callable[[Any], dict[str, Any]],
    labels_of: Callable[[dict[str, Any]], Any],
    rows: Callable[[Any, Any], list[dict[str, Any]]] = sft_rows,
    datamodule_cls: type | None = None,
) -> tuple[dict[str, Any], Any]:
    """One TRL trainer, timed as our side is; returns (this run's JSON-ready result, the trainer).

    ``rows(tokenizer, cfg)`` are the examples both sides load; our data module (``datamodule_cls``, default
    ``SFTDataModule``) over them gives the batch order; ``train_dataset(our data module, rows, order)`` is what TRL
    trains on (``order``: our first-epoch indices, batch after batch); ``config_kwargs(train dataset)`` adds the
    trainer's own arguments to :func:`trainer_args`; ``labels_of(batch)`` are a TRL batch's labels as ours are laid
    out (-100 where nothing is supervised), so its first batch is compared with ours. With ``trl_order="matched"``
    the data are read in order (a sequential sampler)."""
    import torch
    from torch.utils.data import SequentialSampler
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback

    from omnimed.models.loading import load_causal_lm

    matched = cfg.trl_order == "matched"
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        mcfg, tokenizer, data_rows = side_setup(cfg, rows)
        ours_dm = datamodule(data_rows, tokenizer, cfg, packing=cfg.packing, module_cls=datamodule_cls)
        ours_loader = ours_dm.train_dataloader()
        check_epoch(len(ours_loader), cfg)
        ours_first = next(iter(ours_loader))
        order = [i for batch in first_epoch_batches(ours_loader)[: cfg.total_steps] for i in batch]
        train_ds = train_dataset(ours_dm, data_rows, order)
        log = step_log(cfg.accelerator, cfg.profile_step)
        first_batch: dict[str, torch.Tensor] = {}

        class RecordingCollator:
            """TRL's own collator, counting each batch's tokens in the order the loader asks for them."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
                batch = self.inner(features)
                log.record_batch(batch)
                if not first_batch:
                    first_batch.update(input_ids=batch["input_ids"].clone(), labels=labels_of(batch).clone())
                return batch

        class StepTimer(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                log.begin()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                log.step_end()
                if log.threads_in_loop is None:
                    log.threads_in_loop = torch.get_num_threads()

        class BenchTrainer(trainer_cls):  # type: ignore[misc, valid-type]
            """The TRL trainer reading the data in order (matched mode) and recording the loss of every step."""

            def _get_train_sampler(self, train_dataset: Any = None) -> Any:
                if matched:
                    return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)
                return super()._get_train_sampler(train_dataset)

            def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
                loss = super().training_step(*args, **kwargs)
                log.losses.append(float(loss.detach()))
                return loss

        BenchTrainer.__name__ = BenchTrainer.__qualname__ = f"Bench{trainer_cls.__name__}"
        torch.manual_seed(cfg.seed)
        if cfg.strategy != "single":
            _single_process_group_env()
        model = load_causal_lm(trl_model_config(mcfg), tokenizer, for_training=True)
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-trl-") as tmp:
            args = config_cls(**trainer_args(cfg, tmp), **config_kwargs(train_ds))
            trainer = BenchTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                                   callbacks=[StepTimer()])
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
            trainer.data_collator = RecordingCollator(trainer.data_collator)
            setup_s = time.perf_counter() - t0
            trainer.train()
    result = log.summary(cfg.warmup, cfg.steps)
    result.update(rss.result())
    result.update(peak_gpu_memory(cfg.accelerator))
    result.update(gpu_mfu(cfg.accelerator, model, cfg.max_length, result["tokens_per_s_total"]))
    same_first = (
        bool(first_batch)
        and first_batch["input_ids"].shape == ours_first["input_ids"].shape
        and bool((first_batch["input_ids"] == ours_first["input_ids"]).all())
        and bool((first_batch["labels"] == ours_first["labels"]).all())
    )
    result.update(
        side="trl",
        loop=f"trl.{trainer_cls.__name__}.train()",
        order=cfg.trl_order,
        first_batch_identical_to_ours=same_first,
        first_batch_supervised_tokens=int((first_batch["labels"][:, 1:] != -100).sum()) if first_batch else None,
        ours_first_batch_supervised_tokens=int((ours_first["labels"][:, 1:] != -100).sum()),
        setup_s=round(setup_s, 2),
        rss_after_model_load_mb=round(rss_model_mb, 1),
        threads=log.threads_in_loop,
        trainable_params=sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad),
        optimizer=type(trainer.optimizer).__name__,
        strategy="deepspeed" if trainer.is_deepspeed_enabled else "single",
        precision="bf16" if trainer.args.bf16 else "fp32",
    )
    return result, trainer


def run_trl(cfg: TrainBenchConfig) -> dict[str, Any]:
    """TRL's side: ``trl.SFTTrainer`` + ``SFTConfig`` on the same model and data (see the module docstring);
    returns this run's step log summary, peak RSS, first-batch check and set-up details as a JSON-ready dict."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    matched = cfg.trl_order == "matched"

    def train_dataset(ours_dm: Any, rows: list[dict[str, Any]], order: list[int]) -> datasets.Dataset:
        if matched and cfg.packing:  # our packed blocks, pre-tokenized, in our order
            return ours_dm.train_dataset.select(order).select_columns(["input_ids", "labels"])
        if matched:  # the same prompt/completion strings in our sampler's order; TRL tokenizes them
            if len(ours_dm.train_dataset) != len(rows):
                raise RuntimeError("our data module dropped examples: row indices no longer match")
            return datasets.Dataset.from_list([rows[i] for i in order])
        return datasets.Dataset.from_list(rows)

    def config_kwargs(train_ds: datasets.Dataset) -> dict[str, Any]:
        pretokenized = "input_ids" in train_ds.column_names
        return {"packing": cfg.packing and not matched, "padding_free": False,
                "completion_only_loss": None if pretokenized else True, "shuffle_dataset": False}

    result, trainer = run_trl_side(cfg, trainer_cls=SFTTrainer, config_cls=SFTConfig, train_dataset=train_dataset,
                                   config_kwargs=config_kwargs, labels_of=lambda batch: batch["labels"])
    result.update(trl_packing=trainer.args.packing,
                  trl_padding_free=bool(getattr(trainer, "padding_free", False)))
    return result

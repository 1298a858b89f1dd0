"""Training-step throughput of our SFT stack against TRL's ``SFTTrainer``, on the same model, data and settings.

:func:`bench_train` (the parent) runs one child process per side, ``python -m omnimed.bench.train --side ours|trl``,
back to back (with ``repeats`` > 1 the order alternates: ours, trl, trl, ours, ...), so each side's peak RSS is its
own and the two sides see the same machine load as far as back-to-back runs can. Each child:

* sets ``torch.set_num_threads(threads)`` (and ``OMP_NUM_THREADS``) before anything runs;
* formats the synthetic world's instruction examples into prompt/completion strings with
  :func:`omnimed.training.tokenize.format_example` (the chat template for SmolLM2), keeping the examples that have a
  supervised token within ``max_length`` (so neither side drops any);
* loads the model through :func:`omnimed.models.loading.load_causal_lm` (SmolLM2-135M + LoRA r16 on the same
  target modules for both sides; LoRA B starts at zero, so the first forward pass is the base model's);
* trains ``warmup + steps`` optimizer steps, stamping the wall clock at the end of every step, and reports the
  mean step time over the last ``steps`` (the interval between the end of warmup step W and the end of step W+N:
  data loading, forward, backward, clipping, AdamW, LR schedule and per-step logging all included, i.e. what a user
  waits for), real (non-padding) and total tokens per second over those steps, first-step loss and peak RSS.

Our side is the real thing: :class:`~omnimed.training.sft.SFTModule` fitted by a Lightning ``Trainer`` (fp32,
gradient clipping 1.0, cosine schedule with 3% warmup, no logger, no checkpointing, no progress bar) on batches of
:class:`~omnimed.training.data.SFTDataModule` (length-grouped per-batch padding, or packing). A Lightning Trainer
rather than calling ``training_step`` by hand, because that loop (hooks, logging, closure, clipping, scheduler) is
the overhead a user pays, and TRL's side pays its own ``transformers.Trainer`` loop.

TRL's side is ``trl.SFTTrainer`` with ``SFTConfig`` (``completion_only_loss``, ``max_length``, no gradient
checkpointing, fp32, ``use_cpu``, ``optim="adamw_torch"``, i.e. the same ``torch.optim.AdamW`` as ours rather than
HF's fused default, same lr/clipping/schedule, logging every step, no reporting, no saving, no progress output).
With ``trl_order="matched"`` (default) it consumes exactly our first-epoch batches: unpacked, our sampler's order of
the same prompt/completion strings, tokenized by TRL itself (its own completion mask), read sequentially; packed,
our packed blocks as a pre-tokenized dataset. Equal first batches make the first-step losses comparable and isolate
the training step. With ``trl_order="native"`` TRL uses its own default pipeline (random order and pad-to-longest,
or its own BFD packing when ``packing``): batches then differ, so the loss comparison is reported but not expected
to match.

The parent also measures, without a model, the real-token fraction per step of our two batching modes (packing and
length-grouped per-batch padding) against random-order pad-to-longest batches and padding everything to
``max_length``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnimed.bench.sampling import BackgroundSampler

SIDES = ("ours", "trl")
MODELS = ("smollm2-135m", "tiny-llama")


# ----------------------------------------------------------------------------------------------- config
@dataclass
class TrainBenchConfig:
    """Everything both sides share. ``model`` is ``smollm2-135m`` (the real model) or ``tiny-llama`` (tests)."""

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


def model_config(cfg: TrainBenchConfig):
    """The ``ModelConfig`` both sides load (LoRA on the default seven projection modules)."""
    from omnimed.models.config import LoraSettings, ModelConfig

    lora = LoraSettings(enabled=True, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)
    if cfg.model == "tiny-llama":
        return ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama", lora=lora)
    return ModelConfig(name="smollm2-135m", source="packaged", name_or_path="smollm2-135m", dtype="float32",
                       attn_implementation="sdpa", lora=lora)


def task_config(cfg: TrainBenchConfig):
    """Our ``TaskConfig``: same lr, no weight decay, cosine with 3% warmup (TRL gets the same), no masked spans
    (TRL has no span masking, so neither side masks evidence)."""
    from omnimed.training.config import TaskConfig

    return TaskConfig(lr=cfg.lr, weight_decay=0.0, warmup_ratio=0.03, scheduler="cosine",
                      max_length=cfg.max_length, mask_spans=[])


def warmup_steps(cfg: TrainBenchConfig) -> int:
    """LR warmup steps, computed as ``SFTModule.configure_optimizers`` does, so TRL gets the same number."""
    return math.ceil(0.03 * max(cfg.total_steps, 1))


# ----------------------------------------------------------------------------------------------- data
def sft_rows(tokenizer: Any, cfg: TrainBenchConfig) -> list[dict[str, str]]:
    """The world's instruction examples as ``{"prompt", "completion"}`` strings, keeping those with at least one
    supervised token within ``max_length`` (so our data module drops none and indices map 1:1 to rows)."""
    from omnimed.data.world import build_world
    from omnimed.training.tokenize import IGNORE_INDEX, format_example, tokenize_prompt_completion

    examples = build_world(seed=cfg.world_seed, size=cfg.world_size).instructions
    if cfg.max_examples is not None:
        examples = examples[: cfg.max_examples]
    rows = [format_example(ex, tokenizer) for ex in examples]
    feats = tokenize_prompt_completion(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]},
        tokenizer,
        cfg.max_length,
    )
    kept = [row for row, labels in zip(rows, feats["labels"]) if any(lab != IGNORE_INDEX for lab in labels)]
    if not kept:
        raise ValueError("no instruction example has a supervised token within max_length")
    return kept


def datamodule(rows: list[dict[str, str]], tokenizer: Any, cfg: TrainBenchConfig, *, packing: bool):
    """Our ``SFTDataModule`` over ``rows``, set up (in memory, no validation split, seed = ``cfg.seed``)."""
    from omnimed.training.config import DataConfig
    from omnimed.training.data import SFTDataModule

    data_cfg = DataConfig(batch_size=cfg.batch_size, num_workers=0, val_fraction=0.0, packing=packing,
                          shuffle_seed=cfg.seed)
    dm = SFTDataModule(rows, tokenizer, data_cfg, task_config(cfg), cache_dir=None)
    dm.setup("fit")
    return dm


def _fraction(real: int, total: int) -> float:
    return real / total if total else 0.0


def data_stats(cfg: TrainBenchConfig) -> dict[str, Any]:
    """Real-token fraction of a step (real tokens / positions, over a whole epoch and over the first ``warmup +
    steps`` batches) for our packing and our length-grouped per-batch padding, against random-order
    pad-to-longest batches (TRL's default sampler) and padding every example to ``max_length``. Model-free."""
    import torch

    from omnimed.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_config(cfg))
    rows = sft_rows(tokenizer, cfg)
    out: dict[str, Any] = {"examples": len(rows)}
    lengths: list[int] = []
    for name, packing in (("per_batch_padding", False), ("packing", True)):
        dm = datamodule(rows, tokenizer, cfg, packing=packing)
        if not packing:
            lengths = list(dm.train_dataset["length"])
        real = total = 0
        head_real = head_total = 0
        n_batches = 0
        for i, batch in enumerate(dm.train_dataloader()):
            r, t = int(batch["attention_mask"].sum()), batch["attention_mask"].numel()
            real, total, n_batches = real + r, total + t, n_batches + 1
            if i < cfg.total_steps:
                head_real, head_total = head_real + r, head_total + t
        out[name] = {
            "real_fraction_epoch": round(_fraction(real, total), 4),
            "real_fraction_timed_batches": round(_fraction(head_real, head_total), 4),
            "batches_per_epoch": n_batches,
            "real_tokens_per_epoch": real,
        }
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    real, total = sum(lengths), 0
    for b in range(0, len(perm), cfg.batch_size):
        batch_lengths = [lengths[j] for j in perm[b : b + cfg.batch_size]]
        total += max(batch_lengths) * len(batch_lengths)
    out["random_order_pad_to_longest"] = {"real_fraction_epoch": round(_fraction(real, total), 4)}
    out["pad_to_max_length"] = {"real_fraction_epoch": round(_fraction(real, len(lengths) * cfg.max_length), 4)}
    out["mean_example_tokens"] = round(real / max(len(lengths), 1), 1)
    best = max(out["packing"]["real_fraction_epoch"], out["per_batch_padding"]["real_fraction_epoch"])
    out["meets_real_fraction_target"] = best >= cfg.target_real_fraction
    return out


# ----------------------------------------------------------------------------------------------- measurement
class PeakRSS(BackgroundSampler):
    """Peak resident set size of this process: the kernel's high-water mark (``ru_maxrss``) and a psutil sample
    taken every ``interval`` seconds by a daemon thread (the sampled peak can miss short spikes)."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process()
        self.sampled_peak = 0
        super().__init__(interval, "rss-sampler")

    def sample(self) -> None:
        self.sampled_peak = max(self.sampled_peak, self._proc.memory_info().rss)

    def current_mb(self) -> float:
        return self._proc.memory_info().rss / 2**20

    def result(self) -> dict[str, float]:
        kernel_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        return {"peak_rss_mb": round(kernel_peak_mb, 1), "peak_rss_sampled_mb": round(self.sampled_peak / 2**20, 1)}


@dataclass
class StepLog:
    """Per-step wall-clock end times, real/total tokens and losses, filled in by the trainer hooks."""

    start: float = 0.0
    cpu_start: float = 0.0
    ends: list[float] = field(default_factory=list)
    cpu_ends: list[float] = field(default_factory=list)
    real: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    threads_in_loop: int | None = None

    def begin(self) -> None:
        """Mark the start of training (wall clock and this process's CPU time, all threads)."""
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def step_end(self) -> None:
        """Mark the end of an optimizer step."""
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())

    def record_batch(self, batch: Any) -> None:
        """Count a batch's real tokens (attention mask; a padding-free batch: all its positions) and positions."""
        ids = batch["input_ids"]
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        self.real.append(int(mask.sum()) if mask is not None else ids.numel())
        self.total.append(ids.numel())

    def summary(self, warmup: int, steps: int) -> dict[str, Any]:
        """Mean step time and tokens/s over steps ``warmup+1 .. warmup+steps`` (from the end of step ``warmup``)."""
        n = warmup + steps
        if len(self.ends) < n or len(self.real) < n:
            raise RuntimeError(f"only {len(self.ends)} steps ran ({len(self.real)} batches seen); {n} were needed")
        begin = self.ends[warmup - 1] if warmup > 0 else self.start
        seconds = self.ends[n - 1] - begin
        stamps = [begin, *self.ends[warmup:n]]
        step_times = [b - a for a, b in itertools.pairwise(stamps)]
        real, total = sum(self.real[warmup:n]), sum(self.total[warmup:n])
        cpu_seconds = self.cpu_ends[n - 1] - (self.cpu_ends[warmup - 1] if warmup > 0 else self.cpu_start)
        return {
            "timed_steps": steps,
            "warmup_steps": warmup,
            "timed_seconds": round(seconds, 4),
            "mean_step_s": round(seconds / steps, 4),
            "median_step_s": round(statistics.median(step_times), 4),
            "stdev_step_s": round(statistics.stdev(step_times), 4) if len(step_times) > 1 else 0.0,
            "step_times_s": [round(t, 4) for t in step_times],
            "real_tokens": real,
            "total_tokens": total,
            "tokens_per_s_real": round(real / seconds, 2),
            "tokens_per_s_total": round(total / seconds, 2),
            # robust to the multi-second stalls a shared machine inserts: mean tokens per step / median step time
            "tokens_per_s_real_median_step": round(real / steps / statistics.median(step_times), 2),
            "real_fraction": round(_fraction(real, total), 4),
            "cpu_seconds_per_step": round(cpu_seconds / steps, 4),
            "real_tokens_per_cpu_s": round(real / cpu_seconds, 2) if cpu_seconds > 0 else None,
            "first_step_loss": self.losses[0] if self.losses else None,
            "losses": [round(v, 5) for v in self.losses[:n]],
            "first_step_s": round(self.ends[0] - self.start, 4),
        }


def _common(cfg: TrainBenchConfig) -> tuple[Any, Any, list[dict[str, str]]]:
    """Thread count, model config, tokenizer and rows: the set-up both children share."""
    import torch

    from omnimed.models.loading import load_tokenizer

    torch.set_num_threads(cfg.threads)
    mcfg = model_config(cfg)
    tokenizer = load_tokenizer(mcfg)
    return mcfg, tokenizer, sft_rows(tokenizer, cfg)


def first_epoch_batches(loader: Any) -> list[list[int]]:
    """The dataset indices of every batch ``loader`` yields in its first epoch, in order (from its batch sampler, or
    from its sampler cut into ``batch_size`` chunks), without loading any data."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None:
        return [list(b) for b in batch_sampler]
    indices = list(loader.sampler)
    return [indices[i : i + loader.batch_size] for i in range(0, len(indices), loader.batch_size)]


def _check_epoch(n_batches: int, cfg: TrainBenchConfig) -> None:
    if n_batches < cfg.total_steps:
        raise ValueError(
            f"one epoch has {n_batches} batches but warmup + steps = {cfg.total_steps}: use fewer steps, a smaller "
            f"batch size or a larger world (world_size)"
        )


def _selective_module_cls():
    """``SFTModule`` whose loss projects only the supervised positions through the LM head (bench variant).

    The stock module lets the HF model build the full ``(batch, seq, vocab)`` logits and their cross-entropy; with
    prompt tokens masked, most of those rows are thrown away. This variant runs the decoder, gathers the hidden
    states whose next-token label is supervised, and applies the LM head and cross-entropy to those rows only: the
    same loss (sum over supervised tokens / their count), a fraction of the head's FLOPs and memory. (Boolean
    indexing syncs with the host, which costs nothing on CPU; on GPU a ``torch.where`` mask would avoid it.)
    """
    import torch.nn.functional as F
    from peft import PeftModel

    from omnimed.training.sft import SFTModule
    from omnimed.training.tokenize import IGNORE_INDEX

    class SelectiveHeadSFTModule(SFTModule):
        def _loss(self, batch):  # type: ignore[override]
            model = self._require_model()
            base = model.get_base_model() if isinstance(model, PeftModel) else model
            decoder = getattr(base, base.base_model_prefix)
            hidden = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             use_cache=False).last_hidden_state
            targets = batch["labels"][:, 1:]
            keep = targets != IGNORE_INDEX
            n_targets = keep.sum()
            logits = base.get_output_embeddings()(hidden[:, :-1][keep])
            loss = F.cross_entropy(logits.float(), targets[keep], reduction="sum") / n_targets.clamp(min=1)
            return loss, n_targets

    return SelectiveHeadSFTModule


def run_ours(cfg: TrainBenchConfig) -> dict[str, Any]:
    """Our side: ``SFTModule`` + ``SFTDataModule`` under a Lightning ``Trainer`` (see the module docstring)."""
    import lightning as L
    import torch
    from lightning.pytorch import Callback

    from omnimed.training.sft import SFTModule

    with PeakRSS() as rss:
        t0 = time.perf_counter()
        mcfg, tokenizer, rows = _common(cfg)
        dm = datamodule(rows, tokenizer, cfg, packing=cfg.packing)
        _check_epoch(len(dm.train_dataloader()), cfg)
        log = StepLog()

        class StepTimer(Callback):
            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                log.begin()

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
                log.step_end()
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                log.losses.append(float(loss.detach()))
                log.record_batch(batch)
                if log.threads_in_loop is None:
                    log.threads_in_loop = torch.get_num_threads()

        L.seed_everything(cfg.seed, workers=True, verbose=False)
        module_cls = SFTModule if cfg.ours_loss == "model" else _selective_module_cls()
        module = module_cls(mcfg, task_config(cfg), tokenizer)
        module.configure_model()  # load now, so setup_s covers it and the timed loop does not
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-") as tmp:
            trainer = L.Trainer(
                accelerator="cpu",
                devices=1,
                precision="32-true",
                max_steps=cfg.total_steps,
                max_epochs=1,
                gradient_clip_val=1.0,
                accumulate_grad_batches=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                limit_val_batches=0,
                use_distributed_sampler=False,
                log_every_n_steps=1,
                callbacks=[StepTimer()],
                default_root_dir=tmp,
            )
            setup_s = time.perf_counter() - t0
            trainer.fit(module, datamodule=dm)
    result = log.summary(cfg.warmup, cfg.steps)
    result.update(rss.result())
    result.update(
        side="ours",
        loop="lightning.Trainer.fit(SFTModule, SFTDataModule)",
        loss_impl=cfg.ours_loss,
        setup_s=round(setup_s, 2),
        rss_after_model_load_mb=round(rss_model_mb, 1),
        threads=log.threads_in_loop,
        trainable_params=sum(p.numel() for p in module.model.parameters() if p.requires_grad),
        batches_per_epoch=len(dm.train_dataloader()),
    )
    return result


def run_trl(cfg: TrainBenchConfig) -> dict[str, Any]:
    """TRL's side: ``trl.SFTTrainer`` + ``SFTConfig`` on the same model and data (see the module docstring)."""
    import datasets
    import torch
    from torch.utils.data import SequentialSampler
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from omnimed.models.loading import load_causal_lm

    matched = cfg.trl_order == "matched"
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        mcfg, tokenizer, rows = _common(cfg)
        ours_dm = datamodule(rows, tokenizer, cfg, packing=cfg.packing)
        ours_loader = ours_dm.train_dataloader()
        _check_epoch(len(ours_loader), cfg)
        ours_first = next(iter(ours_loader))
        order = [i for batch in first_epoch_batches(ours_loader)[: cfg.total_steps] for i in batch]
        if matched and cfg.packing:  # our packed blocks, pre-tokenized, in our order
            train_ds = ours_dm.train_dataset.select(order).select_columns(["input_ids", "labels"])
        elif matched:  # the same prompt/completion strings in our sampler's order; TRL tokenizes them
            if len(ours_dm.train_dataset) != len(rows):
                raise RuntimeError("our data module dropped examples: row indices no longer match")
            train_ds = datasets.Dataset.from_list([rows[i] for i in order])
        else:
            train_ds = datasets.Dataset.from_list(rows)
        log = StepLog()
        first_batch: dict[str, torch.Tensor] = {}

        class RecordingCollator:
            """TRL's own collator, counting each batch's tokens in the order the loader asks for them."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
                batch = self.inner(features)
                log.record_batch(batch)
                if not first_batch:
                    first_batch.update({k: batch[k].clone() for k in ("input_ids", "labels")})
                return batch

        class StepTimer(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                log.begin()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                log.step_end()
                if log.threads_in_loop is None:
                    log.threads_in_loop = torch.get_num_threads()

        class BenchSFTTrainer(SFTTrainer):
            """``SFTTrainer`` reading the data in order (matched mode) and recording the loss of every step."""

            def _get_train_sampler(self, train_dataset: Any = None) -> Any:
                if matched:
                    return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)
                return super()._get_train_sampler(train_dataset)

            def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
                loss = super().training_step(*args, **kwargs)
                log.losses.append(float(loss.detach()))
                return loss

        torch.manual_seed(cfg.seed)
        model = load_causal_lm(mcfg, tokenizer, for_training=True)
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-trl-") as tmp:
            pretokenized = "input_ids" in train_ds.column_names
            args = SFTConfig(
                output_dir=tmp,
                per_device_train_batch_size=cfg.batch_size,
                gradient_accumulation_steps=1,
                max_steps=cfg.total_steps,
                learning_rate=cfg.lr,
                weight_decay=0.0,
                optim="adamw_torch",
                lr_scheduler_type="cosine",
                warmup_steps=warmup_steps(cfg),
                max_grad_norm=1.0,
                max_length=cfg.max_length,
                packing=cfg.packing and not matched,
                padding_free=False,
                completion_only_loss=None if pretokenized else True,
                shuffle_dataset=False,
                bf16=False,
                fp16=False,
                use_cpu=True,
                gradient_checkpointing=False,
                report_to=[],
                dataloader_num_workers=0,
                logging_steps=1,
                save_strategy="no",
                eval_strategy="no",
                disable_tqdm=True,
                seed=cfg.seed,
                data_seed=cfg.seed,
            )
            trainer = BenchSFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                                      callbacks=[StepTimer()])
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
            trainer.data_collator = RecordingCollator(trainer.data_collator)
            setup_s = time.perf_counter() - t0
            trainer.train()
    result = log.summary(cfg.warmup, cfg.steps)
    result.update(rss.result())
    same_first = (
        bool(first_batch)
        and first_batch["input_ids"].shape == ours_first["input_ids"].shape
        and bool((first_batch["input_ids"] == ours_first["input_ids"]).all())
        and bool((first_batch["labels"] == ours_first["labels"]).all())
    )
    result.update(
        side="trl",
        loop="trl.SFTTrainer.train()",
        order=cfg.trl_order,
        trl_packing=args.packing,
        trl_padding_free=bool(getattr(trainer, "padding_free", False)),
        first_batch_identical_to_ours=same_first,
        first_batch_supervised_tokens=int((first_batch["labels"][:, 1:] != -100).sum()) if first_batch else None,
        ours_first_batch_supervised_tokens=int((ours_first["labels"][:, 1:] != -100).sum()),
        setup_s=round(setup_s, 2),
        rss_after_model_load_mb=round(rss_model_mb, 1),
        threads=log.threads_in_loop,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        optimizer=type(trainer.optimizer).__name__,
    )
    return result


# ----------------------------------------------------------------------------------------------- parent
def hardware() -> dict[str, Any]:
    """CPU model, core counts, load average, and the versions that decide the numbers."""
    import importlib.metadata as md

    import psutil

    cpu_model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("torch", "transformers", "trl", "peft", "lightning", "accelerate", "datasets"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu_model": cpu_model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
    }


def _run_child(side: str, cfg: TrainBenchConfig, workdir: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its JSON result (raising with its log tail on failure)."""
    cfg_path = workdir / f"config-{side}.json"
    out_path = workdir / f"result-{side}.json"
    log_path = workdir / f"log-{side}.txt"
    cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    threads = str(cfg.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"), WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "omnimed.bench.train", "--side", side, "--config", str(cfg_path),
           "--out", str(out_path)]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=cfg.child_timeout_s)
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"benchmark side {side!r} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out_path.read_text())


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def compare(ours: dict[str, Any], trl: dict[str, Any], cfg: TrainBenchConfig) -> dict[str, Any]:
    """Ratios ours/TRL and the first-step loss check."""
    out: dict[str, Any] = {
        "ratio_tokens_per_s_real": round(ours["tokens_per_s_real"] / trl["tokens_per_s_real"], 3),
        "ratio_tokens_per_s_total": round(ours["tokens_per_s_total"] / trl["tokens_per_s_total"], 3),
        "ratio_tokens_per_s_real_median_step": round(
            ours["tokens_per_s_real_median_step"] / trl["tokens_per_s_real_median_step"], 3
        ),
        "ratio_step_time_trl_over_ours": round(trl["mean_step_s"] / ours["mean_step_s"], 3),
        "ratio_real_tokens_per_cpu_s": round(ours["real_tokens_per_cpu_s"] / trl["real_tokens_per_cpu_s"], 3),
        "ratio_peak_rss": round(ours["peak_rss_mb"] / trl["peak_rss_mb"], 3),
    }
    a, b = ours.get("first_step_loss"), trl.get("first_step_loss")
    if a is not None and b is not None:
        diff = abs(a - b)
        out["first_step_loss_abs_diff"] = diff
        out["first_step_loss_match"] = diff <= cfg.loss_rtol * max(abs(a), abs(b), 1e-12)
    out["same_first_batch"] = bool(trl.get("first_batch_identical_to_ours"))
    out["meets_ratio_target"] = out["ratio_tokens_per_s_real"] >= cfg.target_ratio
    return out


def bench_train(cfg: TrainBenchConfig | None = None, **overrides: Any) -> dict[str, Any]:
    """Benchmark our SFT training step against TRL's ``SFTTrainer``; returns a JSON-ready dict.

    ``cfg`` fields can be overridden by keyword (``bench_train(steps=2, model="tiny-llama")``). Keys: ``config``,
    ``hardware``, ``data`` (real-token fractions, see :func:`data_stats`), ``runs`` (every child's result, in run
    order), ``ours`` and ``trl`` (the run with the median real tokens/s of each side), ``comparison`` (ratios
    ours/TRL of the medians, first-step loss match, targets) and ``ratios_per_repeat``.
    """
    cfg = dataclasses.replace(cfg or TrainBenchConfig(), **overrides)
    cfg.validate()
    started = time.time()
    hw = hardware()
    data = data_stats(cfg)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="omnimed-bench-") as tmp:
        for rep in range(max(cfg.repeats, 1)):
            order = list(cfg.sides) if rep % 2 == 0 else list(reversed(cfg.sides))
            for side in order:
                result = _run_child(side, cfg, Path(tmp))
                result["repeat"] = rep
                runs.append(result)
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "hardware": hw, "data": data, "runs": runs}
    for side in cfg.sides:
        side_runs = [r for r in runs if r["side"] == side]
        med = _median([r["tokens_per_s_real"] for r in side_runs])
        result[side] = min(side_runs, key=lambda r: abs(r["tokens_per_s_real"] - med))
    if set(SIDES) <= set(cfg.sides):
        result["comparison"] = compare(result["ours"], result["trl"], cfg)
        by_rep = {}
        for r in runs:
            by_rep.setdefault(r["repeat"], {})[r["side"]] = r
        result["ratios_per_repeat"] = [
            round(p["ours"]["tokens_per_s_real"] / p["trl"]["tokens_per_s_real"], 3) for p in by_rep.values()
        ]
    result["hardware"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.time() - started, 1)
    return result


# ----------------------------------------------------------------------------------------------- child entry
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omnimed.bench.train --side ours|trl --config CFG.json --out RESULT.json`` (one side, one run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--config", required=True, help="a TrainBenchConfig as JSON")
    parser.add_argument("--out", required=True, help="where to write this side's result JSON")
    args = parser.parse_args(argv)
    cfg = TrainBenchConfig(**json.loads(Path(args.config).read_text()))
    cfg.validate()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run_ours(cfg) if args.side == "ours" else run_trl(cfg)
    from omnimed.data.io import atomic_write_json

    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Supervised fine-tuning of a causal LM on prompt/completion features, as a Lightning module.

The batches come from :class:`omnimed.training.data.SFTDataModule`: ``input_ids``, ``attention_mask`` and
``labels`` where prompt tokens, masked spans (Self-RAG evidence) and padding are -100. The loss is the causal-LM
cross-entropy averaged over the supervised tokens of the micro-batch, the LM head applied to those tokens only.

The model is built in :meth:`SFTModule.configure_model`, not in ``__init__``, so that DeepSpeed ZeRO-3 can
partition it while it is created and FSDP2 (Lightning's ``ModelParallelStrategy``) can shard it before the
optimizer sees it. Full fine-tuning or LoRA follows ``model_cfg.lora.enabled`` (see ``omnimed.models.loading``);
mixed precision (bf16) is the Trainer's ``precision``, not a concern of this module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from functools import partial
from typing import Any, TypeVar

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from omegaconf import DictConfig, OmegaConf
from torch import nn

from omnimed.models.config import ModelConfig
from omnimed.training.chunked_head import supervised_loss_sum, supervised_token_losses
from omnimed.training.config import TaskConfig
from omnimed.training.data import GROUP
from omnimed.training.lm_head import supervised_logits
from omnimed.training.micro_batches import micro_batches
from omnimed.training.objectives import Objective, register_objective
from omnimed.training.tokenize import IGNORE_INDEX

C = TypeVar("C")
log = logging.getLogger(__name__)

#: set in a LoRA checkpoint saved without its frozen base weights (:meth:`SFTModule.on_save_checkpoint`)
FROZEN_BASE_OMITTED = "omnimed_frozen_base_omitted"


def as_config(cls: type[C], value: C | Mapping[str, Any] | DictConfig) -> C:
    """``value`` as a ``cls`` dataclass: kept when it is one, else validated against ``cls`` by OmegaConf (a plain
    dict from a checkpoint's hyperparameters, or a Hydra ``DictConfig``)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, (Mapping, DictConfig)):
        merged = OmegaConf.merge(OmegaConf.structured(cls), value)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    raise TypeError(f"expected a {cls.__name__} or a mapping, got {type(value).__name__}")


def is_no_decay(module: nn.Module, param_name: str) -> bool:
    """Biases and normalisation weights get no weight decay (decaying a norm's gain towards 0 only hurts).

    Decided by the module's type and the parameter's name, never by tensor shape: under DeepSpeed ZeRO-3 every
    parameter is a flat 1-D shard, so ``ndim`` says nothing.
    """
    return (
        param_name == "bias"
        or isinstance(module, (nn.LayerNorm, nn.RMSNorm))
        or "norm" in type(module).__name__.lower()
    )


def optimizer_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups over the *trainable* parameters only: with and without weight decay."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # tied weights appear twice
                continue
            seen.add(id(param))
            (no_decay if is_no_decay(module, name) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _plain_strategy(strategy: Any) -> bool:
    """One process or DDP, each process holding the whole model and optimizer (DeepSpeedStrategy is a DDPStrategy
    that partitions and saves its own way; FSDP2 shards)."""
    return isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) and not isinstance(strategy, DeepSpeedStrategy)


def _no_loss_scaler(trainer: L.Trainer) -> bool:
    """Gradients come out of backward at their true scale: full precision, or bf16 mixed precision (fp16's loss
    scaler would leave them scaled until the optimizer step)."""
    plugin = trainer.precision_plugin
    return not isinstance(plugin, MixedPrecision) or plugin.scaler is None


class SFTModule(L.LightningModule):
    """Causal-LM SFT: loss on the supervised tokens, AdamW + warmup/decay schedule stepped every optimizer step.

    Args:
        model_cfg: which model, dtype, LoRA, special tokens, gradient checkpointing (a ``ModelConfig``, a Hydra
            node or a plain dict, as stored in checkpoints).
        task_cfg: learning rate, weight decay, warmup ratio and scheduler.
        tokenizer: the tokenizer the data was made with; the model's embeddings are resized to it. Not saved in
            the hyperparameters: pass it again to ``load_from_checkpoint`` (when None it is loaded from
            ``model_cfg``).
    """

    def __init__(
        self,
        model_cfg: ModelConfig | Mapping[str, Any] | DictConfig,
        task_cfg: TaskConfig | Mapping[str, Any] | DictConfig,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        self.model_cfg: ModelConfig = as_config(ModelConfig, model_cfg)
        self.task_cfg: TaskConfig = as_config(TaskConfig, task_cfg)
        if tokenizer is None:
            from omnimed.models.loading import load_tokenizer

            tokenizer = load_tokenizer(self.model_cfg)
        self.tokenizer = tokenizer
        # plain dicts: readable by any logger and enough for load_from_checkpoint(path, tokenizer=...)
        self.save_hyperparameters(
            {"model_cfg": dataclasses.asdict(self.model_cfg), "task_cfg": dataclasses.asdict(self.task_cfg)}
        )
        self.model: nn.Module | None = None
        self._micro_batch_tokens = self.task_cfg.micro_batch_tokens  # None where the strategy cannot split a step
        self._zeroed_in_step = False  # training_step zeroed the gradients before its micro-batches' backward passes
        # per-group validation loss sums and token counts of the epoch running (data.val_group_by)
        self._group_sums: torch.Tensor | None = None
        self._group_counts: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------------- model
    def configure_model(self) -> None:
        """Create the model (once; Lightning calls this again on resume and in ``load_from_checkpoint``), then
        shard it with FSDP2 when a device mesh is set (``ModelParallelStrategy``)."""
        if self.model is not None:
            return
        from omnimed.models.loading import load_causal_lm
        from omnimed.training.strategies import hf_zero3_context

        trainer = self._trainer  # None outside a Trainer (e.g. load_from_checkpoint)
        with hf_zero3_context(trainer.strategy if trainer is not None else None):
            self.model = load_causal_lm(self.model_cfg, self.tokenizer, for_training=True)
        if self.device_mesh is not None:
            from omnimed.training.strategies import apply_fsdp2

            apply_fsdp2(self.model, self.device_mesh)

    def build_model_for_export(self, state: Mapping[str, Any]) -> nn.Module:
        """A fresh model (same LoRA structure) holding the weights of a consolidated checkpoint, for export.

        ``state`` is a Lightning checkpoint dict (with ``state_dict``) or a bare state dict whose keys all carry
        this module's ``model.`` prefix (``consolidate_checkpoint(..., prefix=None)``), which is removed once. A LoRA
        checkpoint without the frozen base weights (:meth:`on_save_checkpoint`) takes them from the fresh model,
        which loaded the same base; every trained parameter must be in ``state``.
        """
        from omnimed.models.loading import load_causal_lm

        state_dict = state.get("state_dict", state)
        prefix = "model."
        foreign = [k for k in state_dict if not k.startswith(prefix)]
        if foreign:
            raise ValueError(f"checkpoint keys without the module's '{prefix}' prefix, e.g. {foreign[:3]}")
        stripped = {k[len(prefix) :]: v for k, v in state_dict.items()}
        model = load_causal_lm(self.model_cfg, self.tokenizer, for_training=True)
        trained = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
        lacking = sorted(trained - stripped.keys())
        if lacking:
            raise ValueError(f"the checkpoint lacks {len(lacking)} trained parameters, e.g. {lacking[:3]}")
        model.load_state_dict({**model.state_dict(), **stripped}, strict=True)
        return model.eval()

    # ------------------------------------------------------------------------------------------- checkpoints
    def _frozen_keys(self) -> set[str]:
        """State-dict keys of the parameters that do not train (tied weights under each of their names)."""
        return {f"model.{n}" for n, p in self._require_model().named_parameters(remove_duplicate=False)
                if not p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A LoRA run's checkpoint holds what trains (adapters, added token rows) and the optimizer state, not the
        frozen base weights: they come from the base model again when it loads (:meth:`on_load_checkpoint`,
        :meth:`build_model_for_export`). For SmolLM2 that is 20 MB instead of 560 MB per checkpoint, and saving
        no longer serialises 540 MB of weights (the default job's memory peak). Full fine-tuning, DeepSpeed and
        FSDP2 checkpoints are kept whole."""
        if not (self.model_cfg.lora.enabled and _plain_strategy(self.trainer.strategy) and "state_dict" in checkpoint):
            return
        frozen = self._frozen_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}
        checkpoint[FROZEN_BASE_OMITTED] = True

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Put the frozen base weights this module was built with back into a checkpoint saved without them, so
        Lightning's strict loading still checks every trained parameter."""
        if checkpoint.pop(FROZEN_BASE_OMITTED, False):
            own = self.state_dict()
            checkpoint["state_dict"].update({k: own[k] for k in self._frozen_keys() - checkpoint["state_dict"].keys()})

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("SFTModule.model is not built yet: call configure_model() (the Trainer does)")
        return self.model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ):
        return self._require_model()(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    # ------------------------------------------------------------------------------------------- steps
    def _loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy over the supervised tokens, and their number.

        The float32 cross-entropy of the model's own causal-LM loss (position t - 1 predicts label t, summed over
        the supervised tokens, divided by their number), with the LM head applied to the positions that predict a
        supervised token only (:func:`~omnimed.training.lm_head.supervised_logits`): the same loss, without the
        ``[positions, vocab]`` logits of the prompt. Clamping the count at 1 makes a batch without supervised tokens
        give loss 0 (no gradient) instead of 0/0 = NaN.
        """
        loss_sum, n_targets = self._loss_sum(batch)
        return loss_sum / n_targets.clamp(min=1), n_targets

    def _loss_sum(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed cross-entropy over the supervised tokens of ``batch``, and their number; with
        ``task.head_chunk_positions``, the head and the loss a chunk of positions at a time
        (:mod:`omnimed.training.chunked_head`)."""
        model_kwargs, index, targets, _ = self._supervised_positions(batch)
        return self._head_loss(model_kwargs, index, targets, "sum"), targets.new_tensor(targets.numel())

    def _head_loss(self, model_kwargs: dict[str, torch.Tensor], index: torch.Tensor, targets: torch.Tensor,
                   reduction: str) -> torch.Tensor:
        """The float32 cross-entropy of the hidden states at ``index`` against ``targets``, summed or per token
        (``reduction``: sum | none; per token only without gradients, for validation): the head on those positions
        only, or with ``task.head_chunk_positions`` a chunk of them at a time."""
        chunk, model = self.task_cfg.head_chunk_positions, self._require_model()
        if chunk is None:
            logits = supervised_logits(model, model_kwargs, index)
            return F.cross_entropy(logits.float(), targets, reduction=reduction)
        if reduction == "sum":
            return supervised_loss_sum(model, model_kwargs, index, targets, chunk)
        return supervised_token_losses(model, model_kwargs, index, targets, chunk)

    @staticmethod
    def _supervised_positions(
        batch: Mapping[str, torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model's inputs, the flat index of each position that predicts a supervised token, those tokens, and
        the row of each."""
        labels = batch["labels"]
        supervised = labels[:, 1:] != IGNORE_INDEX
        rows, source = supervised.nonzero(as_tuple=True)
        model_kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        return model_kwargs, rows * labels.size(1) + source, labels[:, 1:][supervised], rows

    def on_train_end(self) -> None:
        """On an accelerator, drop the gradients and optimizer state before Lightning's teardown copies them to host
        memory (:mod:`omnimed.training.release`; the run's checkpoints are written by now)."""
        from omnimed.training.release import release_after_fit

        release_after_fit(self)

    def on_fit_start(self) -> None:
        """Use ``task.micro_batch_tokens`` where one step's several backward passes add up to the whole batch's:
        one process; DDP (the chunks before the last run their backward pass inside DDP's forward, before its
        reducer expects gradients, so they accumulate locally and the last one's backward all-reduces the sum);
        FSDP2 (gradient sync switched off for the chunks before the last, so the last backward reduce-scatters the
        sum once). Both measured equal to whole batches. Not under DeepSpeed: its engine starts a micro-step in
        its own ``forward``, which under Lightning wraps the whole ``training_step``, and ZeRO-3 copies a gradient
        partition instead of adding it until a new micro-step starts (tried with the engine's accumulation boundary
        switched off for the chunks before the last: the losses left the whole batches' at the third step).
        There the run says it splits nothing and trains whole batches."""
        self._micro_batch_tokens = self.task_cfg.micro_batch_tokens
        strategy = self.trainer.strategy
        if self._micro_batch_tokens is not None and not (_plain_strategy(strategy) or self._fsdp2()):
            log.warning(
                "task.micro_batch_tokens=%d is not used with %s on %d process(es): whole batches are trained (lower "
                "data.batch_size and raise trainer.accumulate_grad_batches to save memory there)",
                self._micro_batch_tokens, type(strategy).__name__, self.trainer.world_size,
            )
            self._micro_batch_tokens = None

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        chunks = micro_batches(batch, self._micro_batch_tokens)
        passes = self._passes_on_every_rank(len(chunks)) if self._micro_batch_tokens is not None else 1
        if passes == 1:
            loss, _ = self._loss(batch)
        else:
            # Lightning zeroes the gradients between this step and its backward pass: zero them now instead, when
            # this batch starts an accumulation cycle, so the chunks' gradients before the last one survive
            if batch_idx % self.trainer.accumulate_grad_batches == 0:
                for optimizer in self.trainer.optimizers:
                    optimizer.zero_grad(set_to_none=True)
                self._zeroed_in_step = True
            loss = self._chunked_loss(chunks, passes, (batch["labels"][:, 1:] != IGNORE_INDEX).sum().clamp(min=1))
        self._log_train_step(loss, batch, batch["input_ids"].size(0))
        return loss

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        if self._zeroed_in_step:  # training_step did it before its chunks' backward passes
            self._zeroed_in_step = False
            return
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def _chunked_loss(self, chunks: list[dict[str, torch.Tensor]], passes: int, n_targets: torch.Tensor,
                      ) -> torch.Tensor:
        """Backward through every pass but the last here; return a loss whose value is the whole batch's and whose
        graph is the last pass's, for Lightning's own backward pass. Each chunk's loss is its summed cross-entropy
        over the whole batch's ``n_targets``, so the gradients add up to the whole batch's. Passes beyond
        ``chunks`` (FSDP2, where another rank has more chunks) repeat the last chunk with weight 0."""
        done = torch.zeros((), device=n_targets.device)
        weighted = [(chunk, 1.0) for chunk in chunks] + [(chunks[-1], 0.0)] * (passes - len(chunks))
        fsdp2 = self._fsdp2()
        if fsdp2:  # accumulate unsharded gradients locally; the last pass's backward reduce-scatters their sum
            self._require_model().set_requires_gradient_sync(False)
        try:
            for chunk, weight in weighted[:-1]:
                part = self._loss_sum(chunk)[0] * weight / n_targets
                self.trainer.strategy.backward(part, None)
                done = done + part.detach()
        finally:
            if fsdp2:
                self._require_model().set_requires_gradient_sync(True)
        chunk, weight = weighted[-1]
        return self._loss_sum(chunk)[0] * weight / n_targets + done

    def _passes_on_every_rank(self, chunks: int) -> int:
        """How many forward and backward passes this step runs: its own chunks, or under FSDP2 the most chunks any
        rank has, since every pass gathers the shards from all ranks and a rank that stopped early would hang the
        others."""
        if not self._fsdp2():
            return chunks
        return int(self.trainer.strategy.reduce(torch.tensor(chunks, device=self.device), reduce_op="max"))

    def _fsdp2(self) -> bool:
        """Whether the model is sharded by FSDP2 (:func:`omnimed.training.strategies.apply_fsdp2`)."""
        from torch.distributed.fsdp import FSDPModule

        return isinstance(self.model, FSDPModule)

    def _log_train_step(self, loss: torch.Tensor, batch: Mapping[str, torch.Tensor], bs: int) -> None:
        """``train/loss``, ``train/tokens`` (real, non-pad tokens of the micro-batch, summed over ranks) and
        ``train/lr``, every step; ``bs`` is the micro-batch's size in examples."""
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=bs)
        real_tokens = batch["attention_mask"].sum().float()
        self.log(
            "train/tokens",
            real_tokens,
            on_step=True,
            on_epoch=False,
            reduce_fx="sum",
            sync_dist=True,
            batch_size=bs,
        )
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.log("train/lr", lr, on_step=True, on_epoch=False, prog_bar=True, batch_size=bs)

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if GROUP in batch:
            loss, n_targets = self._grouped_loss(batch)
        else:
            loss, n_targets = self._loss(batch)
        # weight each batch by its supervised tokens, so val/loss is the per-token mean over the whole set
        self.log(
            "val/loss",
            loss,
            on_step=False,
            on_epoch=True,
            prog_bar=True,
            sync_dist=True,
            batch_size=max(int(n_targets), 1),
        )
        return loss

    def _grouped_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's loss as :meth:`_loss` gives it, adding each supervised token's loss to its example's group
        (``data.val_group_by``): :meth:`on_validation_epoch_end` logs each group's per-token mean."""
        model_kwargs, index, targets, rows = self._supervised_positions(batch)
        losses = self._head_loss(model_kwargs, index, targets, "none")
        groups = batch[GROUP][rows]
        if self._group_sums is None or self._group_counts is None:
            raise RuntimeError("a validation batch carries groups but the datamodule names none (val_groups)")
        self._group_sums.index_add_(0, groups, losses.detach().double())
        self._group_counts.index_add_(0, groups, torch.ones_like(losses, dtype=torch.float64))
        n_targets = targets.new_tensor(targets.numel())
        return losses.sum() / n_targets.clamp(min=1), n_targets

    def on_validation_epoch_start(self) -> None:
        """Zero the per-group sums where the datamodule groups its validation examples (on every rank, so that
        each one takes part in the reduction at the end even if it evaluated no batch)."""
        names = getattr(self.trainer.datamodule, "val_groups", None)
        self._group_sums = torch.zeros(len(names), dtype=torch.float64, device=self.device) if names else None
        self._group_counts = None if self._group_sums is None else torch.zeros_like(self._group_sums)

    def on_validation_epoch_end(self) -> None:
        """``val/loss/<group>`` for every group of ``data.val_group_by`` that the evaluated batches held, summed over
        the ranks first."""
        if self._group_sums is None or self._group_counts is None:
            return
        sums = self.trainer.strategy.reduce(self._group_sums, reduce_op="sum")
        counts = self.trainer.strategy.reduce(self._group_counts, reduce_op="sum")
        for name, total, n in zip(self.trainer.datamodule.val_groups, sums.tolist(), counts.tolist()):
            if n:
                self.log(f"val/loss/{name}", total / n, on_step=False, on_epoch=True)
        self._group_sums = self._group_counts = None

    # ------------------------------------------------------------------------------------------- optimisation
    def _adamw(self) -> Any:
        """torch's AdamW, or DeepSpeed's CPU AdamW when ZeRO offloads the optimizer state to the CPU (DeepSpeed
        refuses a torch optimizer there: the update runs on the CPU, where its vectorised kernel is the fast one).

        torch's AdamW runs its fused kernel (one pass over all parameters instead of a dozen: 4x faster for
        SmolLM2's 420 adapters on CPU, and on a GPU a full fine-tuning step's optimizer reads each fp32 state once)
        on one process or DDP without a loss scaler (fp32 or bf16; fp16's scaler would have to be undone before
        clipping) and under DeepSpeed, which hands it its own flat partitions and clips before the step. FSDP2's
        sharded tensors get the per-parameter loop."""
        strategy = self.trainer.strategy
        config = getattr(strategy, "config", None) or {}
        offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
        if offload.get("device") == "cpu":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return partial(DeepSpeedCPUAdam, adamw_mode=True)
        if isinstance(strategy, DeepSpeedStrategy) or (_plain_strategy(strategy) and _no_loss_scaler(self.trainer)):
            return partial(torch.optim.AdamW, fused=True)
        return torch.optim.AdamW

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip as Lightning does, the fused AdamW under bf16 included: Lightning's mixed-precision plugin refuses
        to clip for any optimizer that unscales gradients itself, but bf16 has no loss scale to undo, so the
        gradients are clipped as they are at full precision."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)  # past MixedPrecision's check
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over trainable parameters (no decay on norms/biases) with a per-step warmup + decay schedule.

        Warmup is ``warmup_ratio`` of the trainer's estimated optimizer steps (which accounts for epochs,
        ``max_steps``, gradient accumulation and the number of devices).
        """
        from omnimed.training.schedules import lr_schedule

        groups = optimizer_groups(self._require_model(), self.task_cfg.weight_decay)
        if not groups:
            raise RuntimeError("the model has no trainable parameters")
        optimizer = self._adamw()(groups, lr=self.task_cfg.lr)
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError(
                "cannot size the LR schedule: set trainer.max_steps (the number of steps is unknown)"
            )
        return {"optimizer": optimizer, "lr_scheduler": lr_schedule(optimizer, self.task_cfg, total)}


def _datamodule(cfg: Any, records: list, tokenizer: Any) -> Any:
    from pathlib import Path

    from omnimed.training.data import SFTDataModule
    from omnimed.training.tokenize import template_mode

    return SFTDataModule(records, tokenizer, data_cfg=cfg.data, task_cfg=cfg.task,
                         cache_dir=Path(cfg.paths.cache) / "tokenized",
                         template=template_mode(cfg.model.prompt_layout))


def _module(cfg: Any, tokenizer: Any) -> SFTModule:
    return SFTModule(cfg.model, cfg.task, tokenizer)


register_objective(Objective("sft", datamodule=_datamodule, module=_module))

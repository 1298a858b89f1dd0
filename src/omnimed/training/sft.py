"""Supervised fine-tuning of a causal LM on prompt/completion features, as a Lightning module.

The batches come from :class:`omnimed.training.data.SFTDataModule`: ``input_ids``, ``attention_mask`` and
``labels`` where prompt tokens, masked spans (Self-RAG evidence) and padding are -100. The loss is the HF model's
own causal-LM loss (it shifts the labels itself), averaged over the supervised tokens of the micro-batch.

The model is built in :meth:`SFTModule.configure_model`, not in ``__init__``, so that DeepSpeed ZeRO-3 can
partition it while it is created and FSDP2 (Lightning's ``ModelParallelStrategy``) can shard it before the
optimizer sees it. Full fine-tuning or LoRA follows ``model_cfg.lora.enabled`` (see ``omnimed.models.loading``);
mixed precision (bf16) is the Trainer's ``precision``, not a concern of this module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import partial
from typing import Any, TypeVar

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from omnimed.models.config import ModelConfig
from omnimed.training.config import TaskConfig
from omnimed.training.objectives import Objective, register_objective
from omnimed.training.tokenize import IGNORE_INDEX

C = TypeVar("C")

#: ``TaskConfig.scheduler`` -> ``transformers.get_scheduler`` name; every one warms up linearly first.
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


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
        this module's ``model.`` prefix (``consolidate_checkpoint(..., prefix=None)``), which is removed once.
        """
        from omnimed.models.loading import load_causal_lm

        state_dict = state.get("state_dict", state)
        prefix = "model."
        foreign = [k for k in state_dict if not k.startswith(prefix)]
        if foreign:
            raise ValueError(f"checkpoint keys without the module's '{prefix}' prefix, e.g. {foreign[:3]}")
        stripped = {k[len(prefix) :]: v for k, v in state_dict.items()}
        model = load_causal_lm(self.model_cfg, self.tokenizer, for_training=True)
        model.load_state_dict(stripped, strict=True)
        return model.eval()

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

        The count is passed to the model as ``num_items_in_batch`` so the HF loss divides by it; clamping it at 1
        makes a batch without supervised tokens give loss 0 (no gradient) instead of 0/0 = NaN, without a
        host-device sync.
        """
        labels = batch["labels"]
        n_targets = (labels[:, 1:] != IGNORE_INDEX).sum()
        out = self._require_model()(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=labels,
            num_items_in_batch=n_targets.clamp(min=1),
            use_cache=False,
        )
        return out.loss, n_targets

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, _ = self._loss(batch)
        self._log_train_step(loss, batch, batch["input_ids"].size(0))
        return loss

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

    # ------------------------------------------------------------------------------------------- optimisation
    def _adamw(self) -> Any:
        """torch's AdamW, or DeepSpeed's CPU AdamW when ZeRO offloads the optimizer state to the CPU (DeepSpeed
        refuses a torch optimizer there: the update runs on the CPU, where its vectorised kernel is the fast one)."""
        config = getattr(self.trainer.strategy, "config", None) or {}
        offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
        if offload.get("device") == "cpu":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return partial(DeepSpeedCPUAdam, adamw_mode=True)
        return torch.optim.AdamW

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over trainable parameters (no decay on norms/biases) with a per-step warmup + decay schedule.

        Warmup is ``warmup_ratio`` of the trainer's estimated optimizer steps (which accounts for epochs,
        ``max_steps``, gradient accumulation and the number of devices).
        """
        from transformers import get_scheduler

        name = self.task_cfg.scheduler
        if name not in SCHEDULERS:
            raise ValueError(f"task.scheduler must be one of {sorted(SCHEDULERS)}, got {name!r}")
        groups = optimizer_groups(self._require_model(), self.task_cfg.weight_decay)
        if not groups:
            raise RuntimeError("the model has no trainable parameters")
        optimizer = self._adamw()(groups, lr=self.task_cfg.lr)
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError(
                "cannot size the LR schedule: set trainer.max_steps (the number of steps is unknown)"
            )
        total = max(int(total), 1)
        warmup = math.ceil(self.task_cfg.warmup_ratio * total)
        scheduler = get_scheduler(
            SCHEDULERS[name], optimizer, num_warmup_steps=warmup, num_training_steps=total
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }


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

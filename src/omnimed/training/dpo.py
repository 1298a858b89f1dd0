"""Direct preference optimisation (Rafailov et al., 2023) of a causal LM on preference pairs, as a Lightning module.

The loss is TRL's ``sigmoid`` DPO loss, averaged over the pairs of the micro-batch::

    -log sigmoid(beta * ((log pi(y+|x) - log ref(y+|x)) - (log pi(y-|x) - log ref(y-|x))))

where a sequence's log-prob is the *sum* of its completion tokens' log-probs (TRL's default; the prompt is masked
exactly as in SFT) and ``beta`` is ``task.beta``. Chosen and rejected run in one forward pass (the batch holds
both halves, :mod:`omnimed.training.dpo_data`), as TRL's ``concatenated_forward`` does, but packed: each pair's
prompt runs once, shared by its two completions, and the LM head sees only the positions that predict a supervised
token (:mod:`omnimed.training.dpo_logps`). The sums are the same; the work is about half (prompts are most of a
pair's tokens, completions a small part of each sequence).

The reference model:

* LoRA (``model.lora.enabled``): the same model with the adapter switched off (``model.disable_adapter()``, no
  gradient). A model loaded from an ``omnimed-train`` export starts as that export (a LoRA export is merged on
  load), so when an SFT run's export is the starting point, the reference is that SFT model (DPO's
  pi_ref = pi_SFT);
* full fine-tuning: a frozen copy loaded from the same model config (eval mode, no gradient), built on first use
  and held outside the module tree: it is not trained, not in the optimizer, not in checkpoints nor exports.
  Under DeepSpeed ZeRO-3 it is a full (unpartitioned) replica on every rank: prefer LoRA there, or
  ``task.precompute_ref_log_probs``, which drops it once its log-probs are computed.

With ``task.precompute_ref_log_probs`` the reference's log-probs of every train and validation pair are computed
once when fit starts (batched, no gradient, each rank a share, gathered) and stored as columns of the datasets,
so each training step runs one model.

Dropout is switched off in the policy (TRL's ``disable_dropout=True``): with it, the policy's log-ratio against
the reference would be noise even at step 0, where it must be exactly 0.

Model building, optimizer, schedule, LoRA and ZeRO-3 / FSDP2 handling are :class:`~omnimed.training.sft.SFTModule`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnimed.training.dpo_logps import PairInputs, can_share_prompts, pair_inputs, sequence_log_probs
from omnimed.training.objectives import Objective, register_objective
from omnimed.training.sft import SFTModule

#: the reward statistics logged as ``train/<name>`` and ``val/<name>`` (TRL's metric names)
REWARD_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def dpo_loss(
    policy: torch.Tensor, reference: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's sigmoid DPO loss over sequence log-probs laid out ``[chosen..., rejected...]`` (2B values each),
    averaged over the B pairs, and TRL's reward statistics (``rewards/chosen`` = beta * the chosen log-ratio,
    ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``: share of pairs with chosen > rejected)."""
    pi_chosen, pi_rejected = policy.chunk(2)
    ref_chosen, ref_rejected = reference.chunk(2)
    chosen_logratios = pi_chosen - ref_chosen
    rejected_logratios = pi_rejected - ref_rejected
    loss = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios)).mean()
    chosen, rejected = beta * chosen_logratios.detach(), beta * rejected_logratios.detach()
    stats = {"rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
             "rewards/margins": (chosen - rejected).mean(), "rewards/accuracies": (chosen > rejected).float().mean()}
    return loss, stats


def disable_dropout(model: nn.Module) -> None:
    """Set every ``nn.Dropout`` of ``model`` (LoRA's included) to p = 0, as TRL's ``disable_dropout_in_model``."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


class DPOModule(SFTModule):
    """DPO against a reference (see the module docstring); arguments as :class:`SFTModule`, with ``task.beta``
    and ``task.precompute_ref_log_probs`` read from ``task_cfg``."""

    #: score each pair as one row, its prompt shared (when the model allows it); False: as the batch's two rows
    share_prompts = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the frozen reference of full fine-tuning, in a list so that nn.Module does not register it: it stays out
        # of parameters(), state_dict(), the optimizer, checkpoints and DeepSpeed's partitioning
        self._frozen: list[nn.Module] = []

    def configure_model(self) -> None:
        super().configure_model()
        disable_dropout(self._require_model())

    # ------------------------------------------------------------------------------------------- reference
    @property
    def uses_adapter_reference(self) -> bool:
        """Whether the reference is the policy with its LoRA adapter disabled (else a frozen copy)."""
        return bool(self.model_cfg.lora.enabled)

    def reference_model(self) -> nn.Module | None:
        """The frozen copy of full fine-tuning, loaded from ``model_cfg`` on first use, on this module's device
        and in its parameters' dtype; None under LoRA."""
        if self.uses_adapter_reference:
            return None
        if not self._frozen:
            from omnimed.models.loading import load_causal_lm

            ref = load_causal_lm(self.model_cfg, self.tokenizer, for_training=False)
            dtype = next(self._require_model().parameters()).dtype
            self._frozen.append(ref.to(device=self.device, dtype=dtype))
        return self._frozen[0]

    @torch.no_grad()
    def reference_log_probs(
        self, batch: Mapping[str, torch.Tensor], inputs: PairInputs | None = None
    ) -> torch.Tensor:
        """The reference's sequence log-probs of the batch's 2B rows: precomputed ones when the batch carries
        them, else a forward pass of the adapter-disabled policy (LoRA) or of the frozen copy (on ``inputs``, the
        batch's :meth:`pair_inputs`, when the caller has them)."""
        if "ref_chosen_logps" in batch:
            return torch.cat([batch["ref_chosen_logps"], batch["ref_rejected_logps"]])
        inputs = inputs or self.pair_inputs(batch)
        frozen = self.reference_model()
        if frozen is not None:
            return sequence_log_probs(frozen, inputs, self.task_cfg.head_chunk_positions)
        model = self._require_model()
        with model.disable_adapter():
            return sequence_log_probs(model, inputs, self.task_cfg.head_chunk_positions)

    def on_fit_start(self) -> None:
        """With ``task.precompute_ref_log_probs``: the reference log-probs of the data module's train and val
        pairs, added as columns before any batch is served; the frozen copy is dropped afterwards."""
        if not self.task_cfg.precompute_ref_log_probs:
            return
        from omnimed.training.dpo_data import REF_COLUMNS, with_reference_log_probs

        dm = self.trainer.datamodule
        for name in ("train_dataset", "val_dataset"):
            ds = getattr(dm, name, None)
            if ds is not None and REF_COLUMNS[0] not in ds.column_names:
                setattr(dm, name, with_reference_log_probs(ds, *self.precompute_reference(ds, dm.collator())))
        self._frozen.clear()

    def precompute_reference(self, ds: Any, collate: Any) -> tuple[list[float], list[float]]:
        """Reference log-probs (chosen, rejected) of every row of ``ds``. Rank r scores rows r, r + W, ...
        (padded to the same number of batches on every rank: ZeRO-3 gathers parameters collectively), then the
        ranks' values are all-gathered."""
        world, rank = self.trainer.world_size, self.trainer.global_rank
        n, size = len(ds), self.trainer.datamodule.data_cfg.batch_size
        share = math.ceil(n / world)
        mine = list(range(rank, n, world))
        mine += [mine[-1] if mine else 0] * (share - len(mine))
        values = []
        with self.trainer.precision_plugin.forward_context():
            for start in range(0, share, size):
                batch = collate([ds[i] for i in mine[start:start + size]])
                batch = {k: v.to(self.device) for k, v in batch.items()}
                values.append(self.reference_log_probs(batch).view(2, -1).T)  # [pairs, (chosen, rejected)]
        local = torch.cat(values).float()
        gathered = self.all_gather(local) if world > 1 else local[None]  # [world, share, 2]
        rows = [gathered[i % world, i // world] for i in range(n)]
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows]

    # ------------------------------------------------------------------------------------------- steps
    def pair_inputs(self, batch: Mapping[str, torch.Tensor]) -> PairInputs:
        """The model inputs of a batch of pairs: one row per pair, its prompt shared, when the model allows it
        (:func:`~omnimed.training.dpo_logps.can_share_prompts`), else the batch's rows."""
        return pair_inputs(batch, share_prompts=self.share_prompts and can_share_prompts(self._require_model()))

    def pair_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The DPO loss of a batch of pairs (one forward pass over chosen and rejected) and its reward stats."""
        inputs = self.pair_inputs(batch)
        policy = sequence_log_probs(self._require_model(), inputs, self.task_cfg.head_chunk_positions)
        return dpo_loss(policy, self.reference_log_probs(batch, inputs), self.task_cfg.beta)

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, stats = self.pair_loss(batch)
        pairs = batch["input_ids"].size(0) // 2
        self._log_train_step(loss, batch, pairs)
        for name, value in stats.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False, batch_size=pairs)
        return loss

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """``val/loss`` and the reward stats, means over the validation pairs (batches weighted by their pairs)."""
        loss, stats = self.pair_loss(batch)
        pairs = batch["input_ids"].size(0) // 2
        self.log("val/loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=pairs)
        for name, value in stats.items():
            self.log(f"val/{name}", value, on_step=False, on_epoch=True, sync_dist=True, batch_size=pairs)
        return loss


def _datamodule(cfg: Any, records: Sequence[Any], tokenizer: Any) -> Any:
    from omnimed.training.dpo_data import DPODataModule
    from omnimed.training.tokenize import template_mode

    return DPODataModule(list(records), tokenizer, data_cfg=cfg.data, task_cfg=cfg.task,
                         cache_dir=Path(cfg.paths.cache) / "tokenized",
                         template=template_mode(cfg.model.prompt_layout))


def _module(cfg: Any, tokenizer: Any) -> DPOModule:
    return DPOModule(cfg.model, cfg.task, tokenizer)


register_objective(Objective("dpo", datamodule=_datamodule, module=_module))

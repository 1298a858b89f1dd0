"""Our side of ``omnimed-bench dpo``, run in its own process by :mod:`omnimed.bench.train_child`.

The real thing, in ``omnimed-bench train``'s loop (:func:`omnimed.bench.train_ours.run_ours`: a Lightning
``Trainer``, fp32, clipping 1.0, cosine schedule, no logger, checkpoints or progress bar):
:class:`~omnimed.training.dpo.DPOModule` (sigmoid DPO, ``beta``, the reference is the policy with its LoRA adapter
disabled, computed every step, dropout off) on :class:`~omnimed.training.dpo_data.DPODataModule` batches of the
bench's pairs (:func:`omnimed.bench.dpo_data.preference_rows`: chosen rows then rejected rows, length-grouped).
``DPOModule`` scores each pair as one row whose prompt its two completions share, and applies the LM head to the
supervised positions only (:mod:`omnimed.training.dpo_logps`); tokens/s still count the batch's chosen and rejected
rows, as TRL's side does."""

from __future__ import annotations

from typing import Any

from omnimed.bench.dpo_config import DPOBenchConfig
from omnimed.bench.dpo_data import preference_rows
from omnimed.bench.train_config import model_config
from omnimed.bench.train_ours import run_ours


def run_dpo_ours(cfg: DPOBenchConfig) -> dict[str, Any]:
    """Our DPO side (see the module docstring); returns this run's step log summary (tokens over chosen and
    rejected rows), peak RSS and set-up details as a JSON-ready dict."""
    from omnimed.training.dpo import DPOModule
    from omnimed.training.dpo_data import DPODataModule

    result = run_ours(cfg, rows=preference_rows, module_cls=DPOModule, datamodule_cls=DPODataModule)
    shared = DPOModule.share_prompts and model_config(cfg).attn_implementation == "sdpa"
    result.update(beta=cfg.beta, reference="policy with the LoRA adapter disabled (every step)",
                  pair_scoring=("one row per pair, prompt shared" if shared else "chosen and rejected rows")
                  + "; LM head on supervised positions only")
    return result

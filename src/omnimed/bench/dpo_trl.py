"""TRL's side of ``omnimed-bench dpo``, run in its own process by :mod:`omnimed.bench.train_child`.

``trl.DPOTrainer`` with ``DPOConfig`` (``loss_type=["sigmoid"]``, ``beta``, ``max_length``, the rest as
``omnimed-bench train``'s TRL side: :func:`omnimed.bench.train_trl.trainer_args`, notably ``bf16=False``, which TRL
would otherwise turn on for CPU, and no gradient checkpointing, which ``DPOConfig`` would otherwise turn on) given
the same model as ours (SmolLM2 + LoRA from :func:`~omnimed.models.loading.load_causal_lm`, with PEFT's own LoRA
layers and the model's own MLP: :func:`~omnimed.bench.train_config.trl_model_config`) and no
``ref_model``: TRL's default for a PEFT model, the reference is the policy with the adapter disabled, every step.
Dropout is off (TRL's ``disable_dropout``).

TRL reads our batches: the pairs in our data module's first-epoch order, read sequentially, as the prompt and
completion strings our data module tokenizes (:func:`omnimed.bench.dpo_data.trl_string_rows`); TRL tokenizes them
and pads them itself (``DataCollatorForPreference``: chosen rows then rejected rows, right-padded), and the first
batch is checked to be ours (same ids, completion mask = our labels != -100).
"""

from __future__ import annotations

from typing import Any

from omnimed.bench.dpo_config import DPOBenchConfig
from omnimed.bench.dpo_data import preference_rows, trl_string_rows
from omnimed.bench.train_trl import run_trl_side


def run_dpo_trl(cfg: DPOBenchConfig) -> dict[str, Any]:
    """TRL's DPO side (see the module docstring); returns this run's step log summary, peak RSS, first-batch check
    and set-up details as a JSON-ready dict."""
    import datasets
    from trl import DPOConfig, DPOTrainer

    from omnimed.training.dpo_data import DPODataModule

    def train_dataset(ours_dm: Any, rows: list[dict[str, Any]], order: list[int]) -> datasets.Dataset:
        if len(ours_dm.train_dataset) != len(rows):
            raise RuntimeError("our data module dropped pairs: row indices no longer match")
        return datasets.Dataset.from_list(trl_string_rows([rows[i] for i in order], ours_dm.tokenizer))

    def labels_of(batch: dict[str, Any]) -> Any:
        return batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)

    result, trainer = run_trl_side(
        cfg, trainer_cls=DPOTrainer, config_cls=DPOConfig, train_dataset=train_dataset,
        config_kwargs=lambda ds: {"beta": cfg.beta, "loss_type": ["sigmoid"], "precompute_ref_log_probs": False},
        labels_of=labels_of, rows=preference_rows, datamodule_cls=DPODataModule,
    )
    result.update(beta=trainer.beta, reference="policy with the LoRA adapter disabled (every step)",
                  trl_bf16=trainer.args.bf16,
                  trl_activation_checkpointing=bool(getattr(trainer.args, "activation_checkpointing", False)))
    return result

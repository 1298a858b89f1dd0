"""The shared data of ``omnimed-bench dpo``: preference pairs built deterministically from the synthetic world,
the strings TRL is given for them, and the model-free real-token fractions of our pair batches.

A pair is a world instruction example (its user turn as the chat layout renders it: instruction, input, evidence)
with its own output as ``chosen`` and, as ``rejected``, the output of the next example of the same task (the
instructions wrap around) whose output differs: a fluent, well-formed but wrong answer. Only the pairs whose
chosen and rejected sequences both fit whole within ``max_length`` are kept, so neither side drops or cuts any.
"""

from __future__ import annotations

from typing import Any

from omnimed.bench.dpo_config import DPOBenchConfig
from omnimed.bench.train_measure import real_fraction


def _rejected_outputs(examples: list[Any]) -> list[str | None]:
    """For each example, the output of the next example (wrapping around) with the same task and another output."""
    out: list[str | None] = []
    n = len(examples)
    for i, ex in enumerate(examples):
        task = ex.metadata.get("task")
        wrong = None
        for step in range(1, n):
            other = examples[(i + step) % n]
            if other.metadata.get("task") == task and other.output != ex.output:
                wrong = other.output
                break
        out.append(wrong)
    return out


def preference_rows(tokenizer: Any, cfg: DPOBenchConfig) -> list[dict[str, list[dict[str, str]]]]:
    """The world's instruction examples as conversational preference rows (``prompt`` / ``chosen`` /
    ``rejected`` message lists, see the module docstring), the first ``cfg.pairs`` of those that fit whole within
    ``max_length`` (tokenized as our data module tokenizes them)."""
    from omnimed.data.text import user_text
    from omnimed.data.world import build_world
    from omnimed.training.dpo_data import pair_features

    examples = build_world(seed=cfg.world_seed, size=cfg.world_size).instructions
    if cfg.max_examples is not None:
        examples = examples[: cfg.max_examples]
    rows = [
        {"prompt": [{"role": "user", "content": user_text(ex.instruction, ex.input, ex.evidence)}],
         "chosen": [{"role": "assistant", "content": ex.output}],
         "rejected": [{"role": "assistant", "content": wrong}]}
        for ex, wrong in zip(examples, _rejected_outputs(examples)) if wrong is not None
    ]
    feats = pair_features({k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")}, tokenizer,
                          cfg.max_length, [], "auto")
    kept = [row for row, full in zip(rows, feats["full_length"]) if full <= cfg.max_length]
    if cfg.pairs is not None:
        kept = kept[: cfg.pairs]
    if not kept:
        raise ValueError(f"no preference pair fits within max_length={cfg.max_length}")
    return kept


def trl_string_rows(rows: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, str]]:
    """``rows`` as TRL's standard (string) preference format: the prompt rendered with the chat template up to the
    generation prompt, each completion the assistant turn the template adds, exactly the strings our data module
    tokenizes (:func:`~omnimed.training.tokenize.format_conversation`). TRL tokenizes prompt + completion itself;
    given messages instead, it would also supervise the template's newline after the end-of-turn token."""
    from omnimed.training.tokenize import format_conversation

    out = []
    for row in rows:
        chosen = format_conversation(row["prompt"], row["chosen"], tokenizer)
        rejected = format_conversation(row["prompt"], row["rejected"], tokenizer)
        out.append({"prompt": chosen["prompt"], "chosen": chosen["completion"], "rejected": rejected["completion"]})
    return out


def pair_data_stats(cfg: DPOBenchConfig) -> dict[str, Any]:
    """How many pairs, their mean tokens (chosen + rejected), and the real-token fraction (real tokens / positions
    of the ``2 * batch_size`` rows) of our length-grouped pair batches, over an epoch and over the first ``warmup +
    steps`` batches (the ones both sides train on), against random-order batches padded to their longest. Model-free."""
    import torch

    from omnimed.bench.train_config import model_config
    from omnimed.bench.train_data import datamodule
    from omnimed.models.loading import load_tokenizer
    from omnimed.training.dpo_data import DPODataModule

    tokenizer = load_tokenizer(model_config(cfg))
    rows = preference_rows(tokenizer, cfg)
    dm = datamodule(rows, tokenizer, cfg, packing=False, module_cls=DPODataModule)
    ds = dm.train_dataset
    sizes = [(len(c), len(r)) for c, r in zip(ds["chosen_input_ids"], ds["rejected_input_ids"])]
    real = total = head_real = head_total = n_batches = 0
    for i, batch in enumerate(dm.train_dataloader()):
        r, t = int(batch["attention_mask"].sum()), batch["attention_mask"].numel()
        real, total, n_batches = real + r, total + t, n_batches + 1
        if i < cfg.total_steps:
            head_real, head_total = head_real + r, head_total + t
    perm = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    random_total = 0
    for b in range(0, len(perm), cfg.batch_size):
        members = [sizes[j] for j in perm[b : b + cfg.batch_size]]
        random_total += 2 * len(members) * max(max(s) for s in members)
    return {
        "pairs": len(sizes),
        "mean_pair_tokens": round(real / max(len(sizes), 1), 1),
        "batches_per_epoch": n_batches,
        "per_batch_padding": {"real_fraction_epoch": round(real_fraction(real, total), 4),
                              "real_fraction_timed_batches": round(real_fraction(head_real, head_total), 4)},
        "random_order_pad_to_longest": {"real_fraction_epoch": round(real_fraction(real, random_total), 4)},
    }

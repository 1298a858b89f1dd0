"""The shared data of ``omnimed-bench train``: the instruction rows both sides train on, our data module over them,
the order of its first-epoch batches (which TRL replays in matched mode), the set-up both side processes share,
and the model-free real-token fractions of our batching modes against padding baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omnimed.bench.train_config import TrainBenchConfig, model_config, task_config
from omnimed.bench.train_measure import real_fraction

if TYPE_CHECKING:
    from omnimed.training.data import SFTDataModule


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


def datamodule(
    rows: list[dict[str, Any]], tokenizer: Any, cfg: TrainBenchConfig, *, packing: bool,
    module_cls: type[SFTDataModule] | None = None,
) -> SFTDataModule:
    """Our ``SFTDataModule`` (or ``module_cls``, a subclass: ``DPODataModule``) over ``rows``, set up (in memory, no
    validation split, seed = ``cfg.seed``)."""
    from omnimed.training.config import DataConfig
    from omnimed.training.data import SFTDataModule

    data_cfg = DataConfig(batch_size=cfg.batch_size, num_workers=0, val_fraction=0.0, packing=packing,
                          shuffle_seed=cfg.seed)
    dm = (module_cls or SFTDataModule)(rows, tokenizer, data_cfg, task_config(cfg), cache_dir=None)
    dm.setup("fit")
    return dm


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
            "real_fraction_epoch": round(real_fraction(real, total), 4),
            "real_fraction_timed_batches": round(real_fraction(head_real, head_total), 4),
            "batches_per_epoch": n_batches,
            "real_tokens_per_epoch": real,
        }
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    real, total = sum(lengths), 0
    for b in range(0, len(perm), cfg.batch_size):
        batch_lengths = [lengths[j] for j in perm[b : b + cfg.batch_size]]
        total += max(batch_lengths) * len(batch_lengths)
    out["random_order_pad_to_longest"] = {"real_fraction_epoch": round(real_fraction(real, total), 4)}
    padded_to_max = len(lengths) * cfg.max_length
    out["pad_to_max_length"] = {"real_fraction_epoch": round(real_fraction(real, padded_to_max), 4)}
    out["mean_example_tokens"] = round(real / max(len(lengths), 1), 1)
    best = max(out["packing"]["real_fraction_epoch"], out["per_batch_padding"]["real_fraction_epoch"])
    out["meets_real_fraction_target"] = best >= cfg.target_real_fraction
    return out


def side_setup(
    cfg: TrainBenchConfig, rows: Callable[[Any, Any], list[dict[str, Any]]] = sft_rows
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """Thread count, model config, tokenizer and rows (``rows(tokenizer, cfg)``: :func:`sft_rows`, or the DPO
    bench's pairs): the set-up both side processes share."""
    import torch

    from omnimed.models.loading import load_tokenizer

    torch.set_num_threads(cfg.threads)
    mcfg = model_config(cfg)
    tokenizer = load_tokenizer(mcfg)
    return mcfg, tokenizer, rows(tokenizer, cfg)


def first_epoch_batches(loader: Any) -> list[list[int]]:
    """The dataset indices of every batch ``loader`` yields in its first epoch, in order (from its batch sampler, or
    from its sampler cut into ``batch_size`` chunks), without loading any data."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None:
        return [list(b) for b in batch_sampler]
    indices = list(loader.sampler)
    return [indices[i : i + loader.batch_size] for i in range(0, len(indices), loader.batch_size)]


def check_epoch(n_batches: int, cfg: TrainBenchConfig) -> None:
    """Fail early, with a hint, when one epoch has fewer batches than ``warmup + steps`` (a side would stop
    before its timed steps are done)."""
    if n_batches < cfg.total_steps:
        raise ValueError(
            f"one epoch has {n_batches} batches but warmup + steps = {cfg.total_steps}: use fewer steps, a smaller "
            f"batch size or a larger world (world_size)"
        )

"""The tables ``omnimed-bench`` prints for its side-by-side benchmarks (ours against TRL's or sentence-transformers'
trainer): a column per side's median run, a row per metric, then the ratios and checks of the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: "-" for None, yes / no for booleans, floats to ``digits`` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


SIDE_ROWS: list[tuple[str, str, int]] = [
    ("real tokens/s", "tokens_per_s_real", 5),
    ("total tokens/s (incl. padding)", "tokens_per_s_total", 5),
    ("real tokens/s at median step time", "tokens_per_s_real_median_step", 5),
    ("mean step time (s)", "mean_step_s", 4),
    ("median step time (s)", "median_step_s", 4),
    ("CPU s per step (all threads)", "cpu_seconds_per_step", 4),
    ("real tokens per CPU s", "real_tokens_per_cpu_s", 5),
    ("real-token fraction (timed steps)", "real_fraction", 4),
    ("first-step loss", "first_step_loss", 7),
    ("peak RSS (MB)", "peak_rss_mb", 5),
    ("peak GPU memory allocated (MB)", "peak_gpu_allocated_mb", 5),
    ("peak GPU memory reserved (MB)", "peak_gpu_reserved_mb", 5),
    ("model TFLOP/s (6N + 12LdT a token)", "model_tflops", 4), ("MFU (llm-foundry)", "mfu", 3),
    ("RSS after model load (MB)", "rss_after_model_load_mb", 5),
    ("threads in loop", "threads", 4), ("setup (s)", "setup_s", 4),
]


def side_by_side(result: dict[str, Any], sides: tuple[str, ...], rows: Sequence[tuple[str, str, int]], *,
                 title: str, caption: str) -> Table:
    """A column per side present in ``result`` (its median run), a row per ``(label, key, digits)``."""
    table, present = Table(title=title, caption=caption), [s for s in sides if s in result]
    table.add_column("metric")
    for side in present:
        table.add_column(side, justify="right")
    for label, key, digits in rows:
        table.add_row(label, *(fmt(result[s].get(key), digits) for s in present))
    return table


def sides_table(result: dict[str, Any], title: str) -> Table:
    """Ours and TRL's median runs side by side (:data:`SIDE_ROWS`), then the comparison: the ratios ours/TRL, each
    repeat's ratio, the first-step loss check, peak RSS; the caption holds the hardware and load."""
    cfg, hw = result["config"], result["hardware"]
    device = (f"{hw['gpu']} ({cfg['precision']}, {cfg['strategy']}); " if cfg.get("accelerator") == "cuda"
              and hw.get("gpu") else "")
    table = side_by_side(result, ("ours", "trl"), SIDE_ROWS, title=title, caption=(
        f"{device}{hw['cpu_model']}, {hw['usable_cores']} usable cores, torch {hw['versions']['torch']}, trl "
        f"{hw['versions']['trl']}, lightning {hw['versions']['lightning']}; load avg before {hw['load_average']} "
        f"after {hw.get('load_average_after')}"))
    comp = result.get("comparison")
    if comp:
        table.add_section()
        table.add_row("ours / TRL real tokens/s", fmt(comp["ratio_tokens_per_s_real"]),
                      f"target >= {cfg['target_ratio']}: {fmt(comp['meets_ratio_target'])}")
        table.add_row("ours / TRL total tokens/s", fmt(comp["ratio_tokens_per_s_total"]), "")
        table.add_row("ours / TRL real tokens/s (median step)", fmt(comp["ratio_tokens_per_s_real_median_step"]), "")
        table.add_row("ours / TRL real tokens per CPU s", fmt(comp["ratio_real_tokens_per_cpu_s"]), "")
        if len(result.get("ratios_per_repeat", [])) > 1:
            table.add_row("ratio per repeat", ", ".join(map(str, result["ratios_per_repeat"])), "")
        rss_goal = (f"; ours <= {cfg['target_peak_rss_mb']:,.0f} MB: {fmt(comp['meets_peak_rss_target'])}"
                    if "meets_peak_rss_target" in comp else "")
        table.add_row("ours / TRL peak RSS", fmt(comp["ratio_peak_rss"]),
                      f"not higher: {fmt(comp.get('peak_rss_not_higher'))}{rss_goal}")
        if "ratio_peak_gpu_allocated" in comp:
            table.add_row("ours / TRL peak GPU memory allocated", fmt(comp["ratio_peak_gpu_allocated"]),
                          f"not higher: {fmt(comp.get('peak_gpu_not_higher'))}")
        table.add_row("first-step loss |diff|", fmt(comp.get("first_step_loss_abs_diff"), 3),
                      f"match: {fmt(comp.get('first_step_loss_match'))}, same first batch: "
                      f"{fmt(comp['same_first_batch'])}")
    return table


def _training(cfg: dict[str, Any]) -> str:
    return f"+ LoRA r{cfg['lora_r']}" if cfg["lora_r"] else "full fine-tuning"


def _head(cfg: dict[str, Any]) -> str:
    return f"our LM head {cfg.get('head_chunk_positions') or 'whole'}"


def train_table(result: dict[str, Any]) -> Table:
    """The side-by-side table of a ``bench_train`` result, with the real-token fractions of our batching."""
    cfg = result["config"]
    table = sides_table(result, (
        f"omnimed-bench train: {cfg['model']} {_training(cfg)}, batch {cfg['batch_size']}, max_length "
        f"{cfg['max_length']}, {'packing' if cfg['packing'] else 'per-batch padding'}, {cfg['threads']} threads, "
        f"W={cfg['warmup']} N={cfg['steps']}, TRL order {cfg['trl_order']}, our micro-batch "
        f"{cfg.get('micro_batch_tokens') or 'whole'}, {_head(cfg)}"
    ))
    data = result["data"]
    table.add_section()
    table.add_row("real-token fraction / epoch: our packing", fmt(data["packing"]["real_fraction_epoch"]), "")
    table.add_row("  our per-batch padding (length-grouped)", fmt(data["per_batch_padding"]["real_fraction_epoch"]),
                  "")
    table.add_row("  random order, pad to longest", fmt(data["random_order_pad_to_longest"]["real_fraction_epoch"]),
                  "")
    table.add_row("  pad everything to max_length", fmt(data["pad_to_max_length"]["real_fraction_epoch"]),
                  f"target >= {cfg['target_real_fraction']}: {fmt(data['meets_real_fraction_target'])}")
    return table


def dpo_table(result: dict[str, Any]) -> Table:
    """The side-by-side table of a ``bench_dpo`` result, with the pairs and the real-token fraction of their
    batches."""
    cfg, data = result["config"], result["data"]
    table = sides_table(result, (
        f"omnimed-bench dpo: {cfg['model']} {_training(cfg)}, beta {cfg['beta']}, {cfg['batch_size']} pairs "
        f"per step ({2 * cfg['batch_size']} rows), max_length {cfg['max_length']}, {cfg['threads']} threads, "
        f"W={cfg['warmup']} N={cfg['steps']}, {cfg['repeats']} repeat(s), TRL reads our batches, {_head(cfg)}"
    ))
    table.add_section()
    table.add_row("pairs (mean tokens, chosen + rejected)", f"{data['pairs']} ({fmt(data['mean_pair_tokens'])})", "")
    table.add_row("real-token fraction / epoch: our length-grouped batches",
                  fmt(data["per_batch_padding"]["real_fraction_epoch"]), "")
    table.add_row("  random order, pad to longest", fmt(data["random_order_pad_to_longest"]["real_fraction_epoch"]),
                  "")
    return table

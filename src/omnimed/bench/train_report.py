"""The summary of ``omnimed-bench train`` (and ``dpo``): from every side's runs, the run with each side's median real tokens/s,
the ratios ours/TRL of those medians, the first-step loss check and the ratio of each repeat."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from omnimed.bench.train_config import SIDES, TrainBenchConfig


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def compare(ours: dict[str, Any], trl: dict[str, Any], cfg: TrainBenchConfig) -> dict[str, Any]:
    """Ratios ours/TRL (tokens/s, step time, tokens per CPU second, peak RSS, peak GPU memory on a GPU), the
    first-step loss check (within ``cfg.loss_atol`` or ``cfg.loss_rtol``), whether TRL saw our first batch, whether
    the real tokens/s ratio meets ``target_ratio``, whether our peak RSS (and GPU memory) is no higher than
    TRL's and whether our peak RSS is within ``target_peak_rss_mb`` where the bench sets one."""
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
        out["first_step_loss_match"] = diff <= max(cfg.loss_atol, cfg.loss_rtol * max(abs(a), abs(b), 1e-12))
    out["same_first_batch"] = bool(trl.get("first_batch_identical_to_ours"))
    out["meets_ratio_target"] = out["ratio_tokens_per_s_real"] >= cfg.target_ratio
    out["peak_rss_not_higher"] = ours["peak_rss_mb"] <= trl["peak_rss_mb"]
    if cfg.target_peak_rss_mb is not None:
        out["meets_peak_rss_target"] = ours["peak_rss_mb"] <= cfg.target_peak_rss_mb
    if ours.get("peak_gpu_allocated_mb") and trl.get("peak_gpu_allocated_mb"):
        out["ratio_peak_gpu_allocated"] = round(ours["peak_gpu_allocated_mb"] / trl["peak_gpu_allocated_mb"], 3)
        out["peak_gpu_not_higher"] = ours["peak_gpu_allocated_mb"] <= trl["peak_gpu_allocated_mb"]
    return out


def summarise_runs(runs: list[dict[str, Any]], cfg: TrainBenchConfig) -> dict[str, Any]:
    """Pick each side's median run and compare the sides.

    Returns ``{side: run}`` for every side in ``cfg.sides`` (the run whose real tokens/s is closest to that side's
    median: one real run rather than a blend of several, so all its numbers belong together) and, when both sides
    ran, ``comparison`` (:func:`compare` of the two median runs) and ``ratios_per_repeat`` (real tokens/s ours/TRL
    of each repeat, to show the spread the medians hide).
    """
    result: dict[str, Any] = {}
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
    return result

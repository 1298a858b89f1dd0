"""Compare runs side by side: local run folders (``metrics.json``), W&B offline runs (read back with
``wandb leet inspect``) or, online, a W&B project's runs selected by group and tags.

A run folder and the W&B offline run it logged (``<folder>/wandb/offline-run-*``) are one run, listed once. A local
folder's group and tags come from its W&B run when it has one, else from the run's resolved Hydra config
(``.hydra/config.yaml``: ``logger.group``, else ``experiment``, else the task's default group; ``logger.tags`` plus
the tags the evaluation tasks add), so ``--group`` / ``--tags`` select local runs as they select W&B ones."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunRecord:
    name: str
    origin: str  # the folder or W&B path it was read from
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # metric -> (step, value), logged
    config: dict[str, Any] = field(default_factory=dict)  # the run's resolved config, flattened (``task.lr``)


def _add_point(history: dict[str, list[tuple[float, float]]], item: dict[str, Any], step: float) -> None:
    for key, value in item.items():
        if isinstance(value, (int, float)) and not key.startswith("_") and key not in ("epoch", "step") \
                and not key.startswith("trainer/"):
            history.setdefault(key, []).append((step, float(value)))


def csv_history(folder: Path) -> dict[str, list[tuple[float, float]]]:
    """The metrics a run logged step by step to CSV (Lightning's ``metrics.csv`` under its folder)."""
    import csv

    history: dict[str, list[tuple[float, float]]] = {}
    for path in sorted(folder.rglob("metrics.csv")):
        with path.open() as fh:
            for row in csv.DictReader(fh):
                values = {k: float(v) for k, v in row.items() if k and v not in (None, "")}
                if "step" in values:
                    _add_point(history, values, values["step"])
    return history


def _numbers(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not k.startswith("_")}


def _flat(d: dict[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """Nested metrics as ``a/b`` keys (how they are logged to W&B); with ``sep="."`` a config as dotted keys
    (``task.lr``, the way overrides name them)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + sep, sep))
        else:
            out[key] = v
    return out


def hydra_config(folder: Path) -> dict[str, Any] | None:
    """A run folder's resolved Hydra config (``.hydra/config.yaml``); None without a readable one."""
    import yaml

    path = folder / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return None
    return cfg if isinstance(cfg, dict) else {}


def local_runs(paths: list[Path]) -> list[RunRecord]:
    """Every run under ``paths``, once: a run folder (one holding ``metrics.json``, merged with the W&B offline run
    logged inside it) or a W&B offline run outside any run folder."""
    from omnimed.evaluation.identity import group_and_tags

    out: list[RunRecord] = []
    for root in paths:
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such folder")
        folders: dict[Path, RunRecord] = {}
        for metrics in sorted(root.rglob("metrics.json")):
            folder = metrics.parent
            name = str(folder.relative_to(root)) if folder != root else root.name
            cfg = hydra_config(folder)
            # the W&B group and tags by the evaluators' own rule; a folder without a Hydra config has neither
            group, tags = group_and_tags(cfg) if cfg is not None else (None, [])
            folders[folder.resolve()] = RunRecord(name, str(folder), group=group, tags=tags,
                                                  metrics=_numbers(_flat(json.loads(metrics.read_text()))),
                                                  history=csv_history(folder), config=_flat(cfg or {}, sep="."))
        loose: list[RunRecord] = []
        for wandb_file in sorted(root.rglob("offline-run-*/run-*.wandb")):
            run = offline_wandb_run(wandb_file)
            owner = next((folders[d] for d in wandb_file.resolve().parents if d in folders), None)
            if owner is None:
                loose.append(run)
                continue
            # the same run: W&B knows its name, group and tags; metrics.json is what the run wrote
            owner.name = run.name or owner.name
            owner.group = run.group or owner.group
            owner.tags = list(dict.fromkeys([*run.tags, *owner.tags]))
            owner.metrics = {**run.metrics, **owner.metrics}
            owner.history = owner.history or run.history
        out.extend([*folders.values(), *loose])
    return out


def offline_wandb_run(path: Path) -> RunRecord:
    """An offline W&B run's name, group, tags, summary metrics and history, read with ``wandb leet inspect``."""
    exe = Path(sys.executable).parent / "wandb"
    res = subprocess.run([str(exe), "leet", "inspect", "--summary", "--json", str(path)], capture_output=True,
                         text=True, check=True)
    data = json.loads(res.stdout)
    config = data.get("config") or {}
    records = subprocess.run([str(exe), "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    history: dict[str, list[tuple[float, float]]] = {}
    for line in records:
        if '"type":"history"' in line:
            item = json.loads(line)["history"]["item"]
            _add_point(history, item, float(item.get("trainer/global_step", item.get("_step", 0))))
    return RunRecord(data.get("name") or path.parent.name, str(path), group=config.get("group"),
                     tags=list(data.get("tags") or []), metrics=_numbers(data.get("summary") or {}),
                     history=history)


def online_runs(project: str, *, group: str | None, tags: list[str], entity: str | None = None) -> list[RunRecord]:
    """Runs of a W&B project (needs credentials), filtered on the server by group and tags."""
    import wandb

    filters: dict[str, Any] = {}
    if group:
        filters["group"] = group
    if tags:
        filters["tags"] = {"$all": tags}
    path = f"{entity}/{project}" if entity else project
    return [RunRecord(r.name, f"wandb:{path}/{r.id}", r.group, list(r.tags), _numbers(dict(r.summary)))
            for r in wandb.Api().runs(path, filters=filters)]


def select(runs: list[RunRecord], *, group: str | None, tags: list[str]) -> list[RunRecord]:
    return [r for r in runs if (group is None or r.group == group) and all(t in r.tags for t in tags)]


def sort_runs(runs: list[RunRecord], sort: str | None) -> list[RunRecord]:
    """``runs`` by the metric ``sort``, smallest first (``-metric``: largest first; runs without it last)."""
    if not sort:
        return list(runs)
    key, descending = sort.lstrip("-"), sort.startswith("-")
    return sorted(runs, key=lambda r: (key not in r.metrics, (-1 if descending else 1) * r.metrics.get(key, 0.0)))


def comparison_table(runs: list[RunRecord], metrics: list[str] | None = None, params: Sequence[str] = (),
                     sort: str | None = None) -> tuple[list[str], list[list]]:
    """Columns (the chosen config ``params``, then the chosen metrics or those every run has) and one row per
    run, sorted by ``sort`` (:func:`sort_runs`)."""
    if metrics is None:
        shared = set.intersection(*(set(r.metrics) for r in runs)) if runs else set()
        metrics = sorted(shared)
    runs = sort_runs(runs, sort)
    return [*params, *metrics], [[r.name, *[r.config.get(p) for p in params], *[r.metrics.get(m) for m in metrics]]
                                 for r in runs]


SEED = re.compile(r"(?:^|_)s\d+(?=_|$)")  # a run name's seed part: tiny_s0_lr1e-3, s0_lr1e-3
#: config keys that differ between the seeds of one setting without changing it
_NOT_SETTING = ("seed", "run_name")


def _setting(r: RunRecord) -> str:
    """What a run trained, seed aside: its config without seed, name, paths and logging (a run without a config:
    its name without ``_s<seed>``)."""
    if not r.config:
        return SEED.sub("", r.name)
    kept = {k: v for k, v in r.config.items()
            if k not in _NOT_SETTING and not k.startswith(("paths.", "logger.", "hydra."))}
    return json.dumps(kept, sort_keys=True, default=str)


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and the half-width of its 95% t-interval (None for a single value)."""
    from scipy import stats

    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return mean, float(stats.t.ppf(0.975, len(values) - 1) * sd / len(values) ** 0.5)


def over_seeds(runs: list[RunRecord]) -> list[RunRecord]:
    """Runs that differ only in their seed (their configs equal but for ``seed``; without a config, names equal but
    for the ``s<seed>`` part) as one record each, named after the first without its seed and config key: every
    metric's mean over the seeds, with ``<metric>/ci95`` (the half-width of its 95% t-interval) and ``seeds`` (how
    many); its history is the mean curve over the steps every seed logged, with a ``<metric>/ci95`` curve beside."""
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        groups.setdefault(_setting(r), []).append(r)
    out = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            out.append(RunRecord(first.name, first.origin, first.group, first.tags, {**first.metrics, "seeds": 1.0},
                                 first.history, first.config))
            continue
        name = re.sub(r"_[0-9a-f]{8}(-\d+)?$", "", SEED.sub("", first.name)).strip("_") or first.name
        metrics: dict[str, float] = {"seeds": float(len(members))}
        for m in set.intersection(*(set(r.metrics) for r in members)):
            metrics[m], ci = mean_ci95([r.metrics[m] for r in members])
            metrics[f"{m}/ci95"] = ci or 0.0
        history: dict[str, list[tuple[float, float]]] = {}
        for m in set.intersection(*(set(r.history) for r in members)):
            by_step = [dict(r.history[m]) for r in members]
            steps = sorted(set.intersection(*(set(h) for h in by_step)))
            stats_at = [(step, *mean_ci95([h[step] for h in by_step])) for step in steps]
            history[m] = [(step, mean) for step, mean, _ in stats_at]
            history[f"{m}/ci95"] = [(step, ci or 0.0) for step, _, ci in stats_at]
        out.append(RunRecord(f"{name} ({len(members)} seeds)", first.origin, first.group, first.tags, metrics,
                             history, first.config))
    return out


def plot(runs: list[RunRecord], metrics: list[str], path: Path) -> None:
    """One panel per metric, one point per run (with its seed interval where there is one) on an axis that
    spans the values, not from 0, each value written beside its point, labels never cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 0.4 * len(runs) + 1.5), squeeze=False,
                             sharey=True)
    names = [r.name for r in runs]
    for ax, metric in zip(axes[0], metrics):
        values = [r.metrics.get(metric, float("nan")) for r in runs]
        errors = [r.metrics.get(f"{metric}/ci95", 0.0) for r in runs]
        ax.errorbar(values, range(len(runs)), xerr=errors, fmt="o", color="#3b6ea5", capsize=3)
        for y, v in enumerate(values):
            if not math.isnan(v):
                ax.annotate(f"{v:.4g}", (v, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.margins(x=0.25, y=0.2)
        ax.set_title(metric, fontsize=8)
    axes[0][0].set_yticks(range(len(runs)), names, fontsize=7)
    axes[0][0].invert_yaxis()
    _save(fig, path)


def plot_curves(runs: list[RunRecord], metrics: list[str], path: Path) -> bool:
    """One panel per metric with each run's logged values against the training step (a seeds' mean with its 95%
    band); False (nothing written) when no run logged any of them step by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in metrics if any(len(r.history.get(m, ())) > 0 for r in runs)]
    if not metrics:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for r in runs:
            points = sorted(r.history.get(metric, ()))
            if points:
                steps, values = zip(*points)
                (line,) = ax.plot(steps, values, marker="." if len(points) < 30 else None, label=r.name)
                band = dict(r.history.get(f"{metric}/ci95", ()))  # seeds' mean: its 95% interval as a band
                if band and len(band) == len(steps):
                    ax.fill_between(steps, [v - band[s] for s, v in points], [v + band[s] for s, v in points],
                                    color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(3, len(labels)), frameon=False)
    fig.tight_layout(rect=(0, 0.08 + 0.03 * (len(labels) // 3), 1, 1))
    _save(fig, path)
    return True


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    from omnimed.data.artifacts import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)

"""Compare runs side by side: local run folders (``metrics.json``), W&B offline runs (read back with
``wandb leet inspect``) or, online, a W&B project's runs selected by group and tags.

A run folder and the W&B offline run it logged (``<folder>/wandb/offline-run-*``) are one run, listed once. A local
folder's group and tags come from its W&B run when it has one, else from the run's resolved Hydra config
(``.hydra/config.yaml``: ``logger.group``, else ``experiment``, else the task's default group; ``logger.tags`` plus
the tags the evaluation tasks add), so ``--group`` / ``--tags`` select local runs as they select W&B ones."""

from __future__ import annotations

import json
import subprocess
import sys
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


def _numbers(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not k.startswith("_")}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as ``a/b`` keys (how they are logged to W&B)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "/"))
        else:
            out[key] = v
    return out


def config_group_tags(folder: Path) -> tuple[str | None, list[str]]:
    """The W&B group and tags a run folder's run was given, from its Hydra config (``.hydra/config.yaml``) by the
    evaluators' own rule (:func:`omnimed.evaluation.identity.group_and_tags`). A folder without a Hydra config has
    neither."""
    import yaml

    from omnimed.evaluation.identity import group_and_tags

    path = folder / ".hydra" / "config.yaml"
    if not path.is_file():
        return None, []
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return None, []
    return group_and_tags(cfg if isinstance(cfg, dict) else {})


def local_runs(paths: list[Path]) -> list[RunRecord]:
    """Every run under ``paths``, once: a run folder (one holding ``metrics.json``, merged with the W&B offline run
    logged inside it) or a W&B offline run outside any run folder."""
    out: list[RunRecord] = []
    for root in paths:
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such folder")
        folders: dict[Path, RunRecord] = {}
        for metrics in sorted(root.rglob("metrics.json")):
            folder = metrics.parent
            name = str(folder.relative_to(root)) if folder != root else root.name
            group, tags = config_group_tags(folder)
            folders[folder.resolve()] = RunRecord(name, str(folder), group=group, tags=tags,
                                                  metrics=_numbers(_flat(json.loads(metrics.read_text()))))
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
        out.extend([*folders.values(), *loose])
    return out


def offline_wandb_run(path: Path) -> RunRecord:
    """An offline W&B run's name, group, tags and summary metrics, read with ``wandb leet inspect``."""
    exe = Path(sys.executable).parent / "wandb"
    res = subprocess.run([str(exe), "leet", "inspect", "--summary", "--json", str(path)], capture_output=True,
                         text=True, check=True)
    data = json.loads(res.stdout)
    config = data.get("config") or {}
    return RunRecord(data.get("name") or path.parent.name, str(path), group=config.get("group"),
                     tags=list(data.get("tags") or []), metrics=_numbers(data.get("summary") or {}))


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


def comparison_table(runs: list[RunRecord], metrics: list[str] | None = None) -> tuple[list[str], list[list]]:
    """Columns (the chosen metrics, or those every run has) and one row per run."""
    if metrics is None:
        shared = set.intersection(*(set(r.metrics) for r in runs)) if runs else set()
        metrics = sorted(shared)
    return metrics, [[r.name, *[r.metrics.get(m) for m in metrics]] for r in runs]


def plot(runs: list[RunRecord], metrics: list[str], path: Path) -> None:
    """One horizontal bar panel per metric, one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from omnimed.data.artifacts import atomic_path

    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 0.4 * len(runs) + 1.5), squeeze=False,
                             sharey=True)
    names = [r.name for r in runs]
    for ax, metric in zip(axes[0], metrics):
        ax.barh(range(len(runs)), [r.metrics.get(metric, float("nan")) for r in runs], color="#3b6ea5")
        ax.set_title(metric, fontsize=8)
    axes[0][0].set_yticks(range(len(runs)), names, fontsize=7)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)

"""The reproduced table as one W&B run in the table's group (job type ``table``): every cell with ours, the paper's
number, the delta, our interval and the run folder it came from, the plot, and each cell's number as a summary
metric (``ours/<row>/<column>``, ``paper/<row>/<column>``). A dashboard of the group then shows the table beside
the runs that made it, including cells read from a run another table made (whose own W&B run stays in that
table's group). It logs where the table's runs log: nothing unless their composed ``logger`` is ``wandb``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from omnimed.tables.manifest import TableManifest

#: the CSV's columns that hold numbers (the rest are names, statuses and folders)
NUMERIC = ("ours", "paper", "delta", "ci_low", "ci_high", "n")


def table_logger_settings(manifest: TableManifest, preset: str, launcher: str,
                          extra: list[str] | None = None) -> dict[str, Any]:
    """The ``logger`` section the table's first runnable row composes to at ``preset`` with ``extra`` and
    ``launcher`` (every run of the table shares it)."""
    from hydra import compose
    from omegaconf import OmegaConf

    from omnimed.tables.reproduce import (
        DEFAULT_TRAINING_SEED,
        LAUNCHER_GROUP,
        for_training_seed,
        plan_rows,
        split_launcher,
    )
    from omnimed.tables.resume import evaluate_configs

    launcher, extra = split_launcher(launcher, extra)
    plans = plan_rows(for_training_seed(manifest, DEFAULT_TRAINING_SEED), preset, extra)
    if not plans:
        return {"name": "none"}
    with evaluate_configs():
        cfg = compose("evaluate", overrides=[*plans[0].overrides, f"{LAUNCHER_GROUP}{launcher}"])
    return OmegaConf.to_container(cfg.logger, resolve=True)


def _number(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def log_table_run(manifest: TableManifest, preset: str, csv_path: Path, png_path: Path, save_dir: Path,
                  settings: dict[str, Any]) -> str | None:
    """Log the table written at ``csv_path`` / ``png_path`` as a ``table`` run of the table's group, under
    ``save_dir``; returns the W&B run folder, None where the runs do not log to W&B."""
    if settings.get("name") != "wandb":
        return None
    import wandb

    from omnimed.tracking import build_logger, close_logger

    with csv_path.open(newline="", encoding="utf-8") as fh:
        records = [{k: _number(v) if k in NUMERIC else v for k, v in r.items()} for r in csv.DictReader(fh)]
    logger = build_logger("wandb", save_dir=save_dir, project=settings.get("project") or "omnimed",
                          entity=settings.get("entity"), run_name=f"{manifest.group}-{preset}", group=manifest.group,
                          job_type="table", tags=[manifest.paper, manifest.table, preset], trainer=False)
    summary = {f"{side}/{r['row']}/{r['column']}": r[side] for r in records for side in ("ours", "paper")
               if r[side] is not None and r["method"]}  # the detectable-difference lines have no method
    logger.log_hyperparams({"manifest": manifest.model_dump(mode="json"), "preset": preset})
    columns = list(records[0]) if records else ["row"]
    logger.log_table("table", columns, [[r[c] for c in columns] for r in records])
    logger.log_metrics({"plot": wandb.Image(str(png_path)), **summary})
    return close_logger(logger)

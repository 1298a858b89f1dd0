"""The tail every evaluator shares: write the predictions and metrics into the run folder, then log them with the
run's lineage to the configured logger (W&B, CSV, TensorBoard) in the run's group, and close the logger so the next
job of an in-process sweep gets its own run."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omnimed.data.artifacts import atomic_path, atomic_write_json
from omnimed.tracking import CODE_FILE, code_version

log = logging.getLogger(__name__)

#: a W&B Table: name -> (columns, rows)
Tables = Mapping[str, tuple[Sequence[str], Sequence[Sequence[Any]]]]

#: what a failed run leaves in its folder instead of metrics.json: ``{"reason": ...}``, which a table cell shows
FAILED_FILE = "failed.json"

#: metrics a finished run defines but could not give a value, with why: ``{metric: reason}`` (a table cell shows it)
UNDEFINED_FILE = "undefined.json"


def start_run(output_dir: Path) -> None:
    """Clear the result files an earlier run left in ``output_dir`` (a reproduced table reuses its run folders), so
    a run that fails now never shows the earlier run's numbers; takes the code's version now, before it runs."""
    code_version()
    for name in ("metrics.json", FAILED_FILE, UNDEFINED_FILE, CODE_FILE):
        (output_dir / name).unlink(missing_ok=True)


def gate_failures(output_dir: Path, rows: Sequence[Mapping[str, Any]], errors: Sequence[str], *, what: str,
                  backend: str, max_share: float, unit: str) -> None:
    """Warn about the ``errors`` of failed backend calls within ``max_share`` of ``rows``; past it, write
    ``predictions.jsonl`` (each row with its ``error``, for the audit) and raise
    :class:`~omnimed.data.artifacts.RunFailed`, so no metrics are written."""
    from omnimed.data.artifacts import RunFailed, check_failures

    try:
        note = check_failures(errors, len(rows), what=what, backend=backend, max_share=max_share, unit=unit,
                              kept=f"each of the {unit}' errors is in {output_dir / 'predictions.jsonl'}")
    except RunFailed:
        write_predictions(output_dir / "predictions.jsonl", rows)
        raise
    if note:
        log.warning(note)


def record_failure(output_dir: Path, reason: str) -> None:
    """Leave ``failed.json`` with the one-line ``reason`` in the run folder of a run that failed."""
    atomic_write_json(output_dir / FAILED_FILE, {"reason": reason})


def write_predictions(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """One JSON line per prediction, written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def finish_run(cfg: Any, output_dir: Path, *, rows: Sequence[Mapping[str, Any]], metrics: Mapping[str, float],
               run_name: str, job_type: str, lineage: Mapping[str, Any], tables: Tables | None = None,
               files: Mapping[str, Any] | None = None) -> str | None:
    """Write ``predictions.jsonl``, ``metrics.json``, the code that computed them (:data:`CODE_FILE`) and ``files``
    (name -> JSON-able) into ``output_dir``; log the metrics, ``lineage`` and, on W&B, ``tables`` under
    ``cfg.run_name`` (else ``run_name``) in the run's group. Returns the logger's folder (None without a logger)."""
    from omegaconf import OmegaConf

    from omnimed.evaluation.identity import group_and_tags
    from omnimed.tracking import build_logger, close_logger, is_wandb, log_evaluation, log_lineage, use_models

    write_predictions(output_dir / "predictions.jsonl", rows)
    atomic_write_json(output_dir / CODE_FILE, code_version())
    atomic_write_json(output_dir / "metrics.json", dict(metrics))
    for name, obj in (files or {}).items():
        atomic_write_json(output_dir / name, obj)

    group, tags = group_and_tags(cfg)
    logger = build_logger(cfg.logger.name, save_dir=output_dir, project=cfg.logger.project,
                          run_name=cfg.run_name or run_name, group=group, job_type=cfg.logger.job_type or job_type,
                          tags=tags, entity=cfg.logger.entity, trainer=False)
    if logger is None:
        return None
    config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    log_lineage(logger, config, {"group": group, **lineage})
    logger.log_metrics(dict(metrics))
    if is_wandb(logger):
        for key, (columns, data) in (tables or {}).items():
            logger.log_table(key, columns=list(columns), data=[list(r) for r in data])
        models = use_models(logger, config)
        outputs = [output_dir / "predictions.jsonl", output_dir / "metrics.json", output_dir / CODE_FILE,
                   *(output_dir / n for n in files or {})]
        log_evaluation(logger, f"eval-{cfg.run_name or run_name}", outputs,
                       {"group": group, "job_type": cfg.logger.job_type or job_type, "models": models,
                        "metrics": dict(metrics)})  # nested: W&B allows 100 top-level keys, a retrieval run has more
    return close_logger(logger)

"""``omnimed-build``: run one data-construction stage of a method (``conf/stage/``, or any stage a registered method
declares).

    omnimed-build stage=<stage> backend=oracle                       # the world's oracle as teacher
    omnimed-build stage=<stage> backend=hf backend.model=checkpoints/<task>/<run>/hf

A finished stage (its folder holds manifest.json) is not redone; an interrupted one continues where it stopped.
A stage whose backend calls failed for more than ``max_failed_share`` of its items exits non-zero with one line
naming the backend and the first error, and writes no manifest. A stage built (not found already built) is a run of
the configured logger (W&B by default, job type ``build-<stage>``): its records are the run's dataset artifact, the
version a training run on them uses, and the trained models it used as teacher or critic are its inputs.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console, fail, one_line_errors
from omnimed.methods.stages import register_build_configs, run_stage

register_build_configs()


@hydra.main(config_path=conf_dir(), config_name="build", version_base="1.3")
@one_line_errors("omnimed-build")  # a bad value, path or stage folder: one line naming it, exit code 2
def main(cfg: DictConfig) -> None:
    from omnimed.cli.quiet import quiet_console
    from omnimed.data.artifacts import RunFailed
    from omnimed.generation.types import GenerationError

    quiet_console()
    obj = OmegaConf.to_object(cfg)
    try:
        result = run_stage(obj, log=console.print)
    except (RunFailed, GenerationError) as exc:  # the backend failed: one line, exit code 1, no manifest
        fail("omnimed-build", str(exc), code=1)
    logger_dir = None if result.reused else _track(obj, result)
    table = Table(title=f"omnimed-build: {obj.stage.name}" + (" (already built)" if result.reused else ""),
                  show_header=False)
    table.add_row("output", str(result.path))
    for key, value in result.counts.items():
        table.add_row(key, str(value))
    if logger_dir:
        table.add_row("logger files", logger_dir)
    console.print(table)


def _track(obj, result) -> str | None:
    """Record the built stage with the configured logger; returns the logger's folder (None for logger=none)."""
    from hydra.core.hydra_config import HydraConfig

    from omnimed.tracking import build_logger, close_logger, log_lineage, log_records, use_models

    name, lcfg = obj.stage.name, obj.logger
    logger = build_logger(lcfg.name, save_dir=HydraConfig.get().runtime.output_dir, project=lcfg.project,
                          run_name=result.path.name, group=lcfg.group or name, job_type=lcfg.job_type or f"build-{name}",
                          tags=[name, *lcfg.tags], entity=lcfg.entity, trainer=False)
    if logger is None:
        return None
    config = OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
    log_lineage(logger, config, {"output": str(result.path)})
    counts = {k: v for k, v in result.counts.items() if isinstance(v, (int, float))}
    logger.log_metrics(counts)
    use_models(logger, config)
    records = result.path / "records.jsonl"
    if records.is_file():
        log_records(logger, records, {"stage": name, "output": str(result.path), **counts})
    return close_logger(logger)


if __name__ == "__main__":
    main()

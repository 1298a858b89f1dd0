"""``omnimed-evaluate``: evaluation runs composed from ``conf/evaluate.yaml``; the task (``task=``) picks the runner
(:mod:`omnimed.evaluation.tasks`), the method (``pipeline=``) comes from the method registry.

    omnimed-evaluate task=retrieval                                   # the world's questions, knowledge=world_small
    omnimed-evaluate task=retrieval knowledge=realdata task.queries=pubmedqa task.split=null
    omnimed-evaluate task=qa pipeline=rag                             # retrieve, then read
    omnimed-evaluate task=world_calibration                           # the world's difficulty against its targets

A run whose backend calls failed for more than ``max_failed_share`` of its questions (or whose backend cannot be
called at all) writes no metrics.json: it leaves ``failed.json`` with the reason and exits non-zero.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from omnimed.cli.common import checks_task, conf_dir, console, fail, one_line_errors
from omnimed.evaluation.config import register_evaluate_configs

register_evaluate_configs()


@checks_task("evaluate")  # task=NAME of the other app, or of none: a clear message before Hydra composes
@hydra.main(config_path=conf_dir(), config_name="evaluate", version_base="1.3")
@one_line_errors("omnimed-evaluate")  # a bad value, path or dataset: one line naming it, exit code 2
def main(cfg: DictConfig) -> float | None:
    from pathlib import Path

    from omnimed.cli.quiet import quiet_console
    from omnimed.data.artifacts import RunFailed, check_max_failed_share
    from omnimed.evaluation.runner import record_failure, start_run
    from omnimed.evaluation.tasks import get_task
    from omnimed.generation.types import GenerationError

    quiet_console()
    obj = OmegaConf.to_object(cfg)
    task = get_task(obj.task.name)
    check_max_failed_share(obj.max_failed_share)
    out = Path(HydraConfig.get().runtime.output_dir)
    start_run(out)
    try:
        result = task.run(obj, out)
    except (RunFailed, GenerationError) as exc:  # backend calls failed: no score, one line, non-zero exit
        record_failure(out, str(exc))
        fail("omnimed-evaluate", str(exc), code=1)
    return task.report(result, obj, console)


if __name__ == "__main__":
    main()

"""``omnimed-evaluate``: evaluation runs composed from ``conf/evaluate.yaml``; the task (``task=``) picks the runner
(:mod:`omnimed.evaluation.tasks`), the method (``pipeline=``) comes from the method registry.

    omnimed-evaluate task=retrieval                                   # the world's questions, knowledge=world_small
    omnimed-evaluate task=retrieval knowledge=realdata task.queries=pubmedqa task.split=null
    omnimed-evaluate task=qa pipeline=rag                             # retrieve, then read
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from omnimed.cli.common import checks_task, conf_dir, console
from omnimed.evaluation.config import register_evaluate_configs

register_evaluate_configs()


@checks_task("evaluate")  # task=NAME of the other app, or of none: a clear message before Hydra composes
@hydra.main(config_path=conf_dir(), config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from omnimed.evaluation.tasks import get_task

    obj = OmegaConf.to_object(cfg)
    task = get_task(obj.task.name)
    result = task.run(obj, HydraConfig.get().runtime.output_dir)
    return task.report(result, obj, console)


if __name__ == "__main__":
    main()

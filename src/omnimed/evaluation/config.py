"""Structured configs of ``omnimed-evaluate`` (``conf/evaluate.yaml``) and their registration with Hydra: the root,
one schema per evaluation task (:mod:`.tasks`) and one per registered method's pipeline config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from omnimed.data.artifacts import MAX_FAILED_SHARE, PathsConfig
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.models.config import ModelConfig
from omnimed.tracking import LoggerConfig


@dataclass
class EvaluateConfig:
    """``task`` and ``pipeline`` are validated by their own group schemas; ``backend`` is the generation backend
    and ``model`` the model it serves (for ``backend=hf``)."""

    task: Any = MISSING
    pipeline: Any = None
    backend: Any = None
    model: ModelConfig = field(default_factory=ModelConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    experiment: Optional[str] = None
    run_name: Optional[str] = None
    seed: int = 0
    # the share of questions whose backend calls may fail (counted as wrong) before the run fails with no metrics
    max_failed_share: float = MAX_FAILED_SHARE


def register_evaluate_configs() -> None:
    """Schemas of ``omnimed-evaluate``: the root, ``<task>_task_schema`` per evaluation task and, per registered
    method, ``<name>_pipeline_schema`` and, when ``conf/pipeline/<name>.yaml`` does not exist, the option
    ``pipeline=<name>`` itself (its dataclass defaults), so a method needs no YAML file to be chosen."""
    from hydra.core.config_store import ConfigStore

    from omnimed.conf import register_option
    from omnimed.evaluation.tasks import EVAL_TASKS
    from omnimed.generation.factory import BackendConfig
    from omnimed.methods.registry import get_method, method_names

    cs = ConfigStore.instance()
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    for name, task in EVAL_TASKS.items():
        cs.store(group="task", name=f"{name}_task_schema", node=task.config)
    for name in method_names():
        register_option("pipeline", name, f"{name}_pipeline_schema", get_method(name).config)
    cs.store(group="knowledge", name="knowledge_schema", node=KnowledgeConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    cs.store(group="paths", name="paths_schema", node=PathsConfig)

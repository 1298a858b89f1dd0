"""Registers the structured configs with Hydra's ConfigStore: the root ``train_schema`` and one ``<group>_schema``
per group, which every YAML option of that group lists first in its defaults so Hydra validates it."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from omnimed.models.config import ModelConfig
from omnimed.training import config as tc

GROUP_SCHEMAS = {
    "task": tc.TaskConfig,
    "model": ModelConfig,
    "data": tc.DataConfig,
    "trainer": tc.TrainerConfig,
    "strategy": tc.StrategyConfig,
    "logger": tc.LoggerConfig,
    "paths": tc.PathsConfig,
    "debug": tc.DebugConfig,
}


def register_evaluate_configs() -> None:
    """Schemas of ``omnimed-evaluate`` and ``omnimed-index``: the roots, ``knowledge`` and the evaluation tasks."""
    from omnimed.evaluation import config as ec
    from omnimed.evaluation.critic import CriticAccuracyTaskConfig
    from omnimed.evaluation.qa import QATaskConfig
    from omnimed.generation.factory import BackendConfig
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.selfbiorag.inference import SelfBioRAGConfig
    from omnimed.pipelines.rag import PipelineConfig

    cs = ConfigStore.instance()
    cs.store(name="evaluate_schema", node=ec.EvaluateConfig)
    cs.store(name="index_schema", node=ec.IndexConfig)
    cs.store(group="knowledge", name="knowledge_schema", node=KnowledgeConfig)
    cs.store(group="task", name="retrieval_task_schema", node=ec.RetrievalTaskConfig)
    cs.store(group="task", name="qa_task_schema", node=QATaskConfig)
    cs.store(group="task", name="critic_accuracy_task_schema", node=CriticAccuracyTaskConfig)
    cs.store(group="pipeline", name="pipeline_schema", node=PipelineConfig)
    cs.store(group="pipeline", name="selfbiorag_pipeline_schema", node=SelfBioRAGConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    for group in ("logger", "paths"):
        cs.store(group=group, name=f"{group}_schema", node=GROUP_SCHEMAS[group])


def register_build_configs() -> None:
    """Schemas of ``omnimed-build``: the root and one per stage."""
    from omnimed.evaluation.config import BuildConfig
    from omnimed.generation.factory import BackendConfig
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.selfbiorag.critic_data import CriticDataConfig
    from omnimed.methods.selfbiorag.generator_data import GeneratorDataConfig

    cs = ConfigStore.instance()
    cs.store(name="build_schema", node=BuildConfig)
    cs.store(group="stage", name="selfbiorag_critic_data_schema", node=CriticDataConfig)
    cs.store(group="stage", name="selfbiorag_generator_data_schema", node=GeneratorDataConfig)
    cs.store(group="knowledge", name="knowledge_schema", node=KnowledgeConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    cs.store(group="paths", name="paths_schema", node=GROUP_SCHEMAS["paths"])


def register_train_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=tc.TrainConfig)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)

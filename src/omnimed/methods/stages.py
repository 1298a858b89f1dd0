"""``omnimed-build``: its root config, the context a stage runs in, and the registration of every registered
method's stage configs with Hydra. A stage itself lives in its method's package and is found in the registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from omnimed.data.artifacts import MAX_FAILED_SHARE, PathsConfig, StageResult, check_max_failed_share
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.models.config import ModelConfig
from omnimed.tracking import LoggerConfig


@dataclass
class BuildConfig:
    """``omnimed-build``: ``stage`` (validated by its own schema) run with ``backend`` (the teacher or critic),
    ``model`` (what ``backend=hf`` serves when ``backend.model`` is unset) and ``knowledge`` (the evidence);
    ``logger``: where a built stage is recorded (on W&B its records are a dataset artifact, its teacher an input).
    ``max_failed_share``: the share of the stage's items whose backend calls may fail (they are asked again by the
    next run) before the stage fails without a manifest."""

    stage: Any = MISSING
    backend: Any = None
    model: ModelConfig = field(default_factory=ModelConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    progress: bool = True
    max_failed_share: float = MAX_FAILED_SHARE


class StageContext:
    """What a stage may use, each built on first use: the run's backend (teacher, critic), the knowledge base; and
    ``max_failed``, the share of items whose calls may fail."""

    def __init__(self, cfg: BuildConfig, log: Callable[..., None] = print) -> None:
        self.cfg = cfg
        self.knowledge = cfg.knowledge
        self.root = Path(cfg.paths.root)
        self.progress = cfg.progress
        self.max_failed = cfg.max_failed_share
        self.log = log

    @cached_property
    def backend(self) -> Any:
        from omnimed.methods.backends import run_backend

        return run_backend(self.cfg.backend, model=self.cfg.model, knowledge=self.knowledge,
                           cache_root=self.cfg.paths.cache)

    @cached_property
    def knowledge_base(self) -> Any:
        from omnimed.knowledge.build import build_knowledge_base

        return build_knowledge_base(self.knowledge, self.root, progress=self.progress)


def select_questions(questions: str, knowledge: Any, *, split: str, kinds: Sequence[str] | None = None,
                     n: int | None = None, seed: int = 0) -> list[Any]:
    """A labelling stage's questions: the world's (``questions=world``, from the knowledge config's world) or a
    records file's multiple-choice questions of ``split`` and ``kinds`` (null: all kinds), ``n`` of them drawn
    with ``seed`` (null: all), in id order. Keys in errors are the stage's (``stage.split``, ...)."""
    import random

    from omnimed.data.records import MultipleChoiceQuestion

    if questions == "world":
        from omnimed.knowledge.corpus import world_of

        if knowledge.corpus != "world":
            raise ValueError(f"stage.questions=world reads the synthetic world's questions; knowledge="
                             f"{knowledge.name} has corpus={knowledge.corpus!r} "
                             "(or set stage.questions=<records path>)")
        pool = list(world_of(knowledge).questions)
    else:
        from omnimed.data.io import read_records

        pool = read_records(questions, MultipleChoiceQuestion)
    pool = [q for q in pool if q.split == split and (kinds is None or q.metadata.get("kind") in kinds)]
    if not pool:
        raise ValueError(f"stage.split={split!r}, stage.kinds={kinds}: no questions of {questions}")
    if n is not None and n < len(pool):
        pool = random.Random(seed).sample(pool, n)
    return sorted(pool, key=lambda q: q.id)


def run_stage(cfg: BuildConfig, log: Callable[..., None] = print) -> StageResult:
    """Run the registered stage ``cfg.stage.name`` names."""
    from omnimed.methods.registry import get_stage

    try:
        stage = get_stage(cfg.stage.name)
    except KeyError as exc:
        raise SystemExit(exc.args[0]) from None
    check_max_failed_share(cfg.max_failed_share)
    return stage.run(cfg.stage, StageContext(cfg, log))


def register_build_configs() -> None:
    """Schemas of ``omnimed-build``: the root, ``<stage>_schema`` for every registered stage and, when
    ``conf/stage/<stage>.yaml`` does not exist, the option ``stage=<stage>`` itself (its dataclass defaults)."""
    from hydra.core.config_store import ConfigStore

    from omnimed.conf import register_option
    from omnimed.generation.factory import BackendConfig
    from omnimed.methods.registry import get_stage, stage_names

    cs = ConfigStore.instance()
    cs.store(name="build_schema", node=BuildConfig)
    for name in stage_names():
        register_option("stage", name, f"{name}_schema", get_stage(name).config)
    cs.store(group="knowledge", name="knowledge_schema", node=KnowledgeConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    cs.store(group="paths", name="paths_schema", node=PathsConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)

"""Structured configs of ``omnimed-evaluate`` (``conf/evaluate.yaml``): the root and one schema per task kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from omnimed.knowledge.config import KnowledgeConfig
from omnimed.models.config import ModelConfig
from omnimed.training.config import LoggerConfig, PathsConfig


@dataclass
class RetrievalTaskConfig:
    """Score a knowledge base's retrieval methods on (query, gold passages) sets.

    ``queries``: ``world`` (the world's questions of ``split``; every gold source is queried, the graph with
    ``subject , question``) or ``pubmedqa`` (real PubMedQA question -> its abstract, in the research source;
    needs ``knowledge=realdata``). ``methods``: bm25 | dense | hybrid | hybrid+rerank | bm25+rerank | dense+rerank.
    """

    name: str = "retrieval"
    queries: str = "world"
    split: Optional[str] = "test"
    max_queries: Optional[int] = None
    methods: list[str] = field(default_factory=lambda: ["bm25", "dense", "hybrid", "hybrid+rerank"])
    k: int = 10
    ks: list[int] = field(default_factory=lambda: [1, 5, 10])


@dataclass
class EvaluateConfig:
    """``task`` (retrieval | qa) and ``pipeline`` are validated by their own group schemas; ``backend`` is the
    generation backend and ``model`` the model it serves (for ``backend=hf``)."""

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


@dataclass
class IndexConfig:
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    progress: bool = True


@dataclass
class BuildConfig:
    """``omnimed-build``: ``stage`` (validated by its own schema) run with ``backend`` (the teacher or critic),
    ``model`` (what ``backend=hf`` serves when ``backend.model`` is unset) and ``knowledge`` (the evidence)."""

    stage: Any = MISSING
    backend: Any = None
    model: ModelConfig = field(default_factory=ModelConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    progress: bool = True

"""``pipeline=rag``: the shared reader given the passages retrieved with the original question from the knowledge
base (every text source, fused by reciprocal rank)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnimed.data.records import Passage
from omnimed.methods.baselines import reader_data
from omnimed.methods.baselines.closed_book import ClosedBook, PipelineConfig, Question
from omnimed.methods.registry import Stage, register_method


def retrieve_evidence(kb: Any, questions: Sequence[Question], cfg: PipelineConfig) -> list[list[Passage]]:
    """The top ``cfg.top_k`` passages for each question across the configured sources (graph excluded: it takes
    ``term , question`` queries, which a plain question is not)."""
    sources = [s for s in (cfg.sources or kb.sources) if s != "graph"]
    unknown = [s for s in sources if s not in kb.sources]
    if unknown:
        raise ValueError(f"pipeline.sources: {unknown} not in knowledge base {kb.cfg.name} ({', '.join(kb.sources)})")
    return kb.search_sources([q.question for q in questions], cfg.top_k, sources=sources,
                             per_source_k=cfg.per_source_k, method=cfg.retriever)


@register_method
class RAG(ClosedBook):
    """Retrieve, then read. Its stage ``reader_data`` builds the reading exercises the miniature reader (the one
    this pipeline and the closed-book baseline read with) is trained on."""

    name = "rag"
    config = PipelineConfig
    stages = (Stage(reader_data.STAGE, reader_data.ReaderDataConfig, reader_data.run, calls_backend=False),)

    def needs_knowledge(self) -> bool:
        return True

    def evidence(self, questions: Sequence[Question], kb: Any) -> list[list[Passage]]:
        if kb is None:
            raise ValueError("pipeline=rag needs a knowledge base (knowledge=...)")
        return retrieve_evidence(kb, questions, self.cfg)

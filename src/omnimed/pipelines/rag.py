"""The two generic pipelines every paper compares against: the reader alone (``closed_book``) and the reader given
the passages retrieved with the original question from the knowledge base (``rag``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage

Question = MultipleChoiceQuestion | OpenQuestion


@dataclass
class PipelineConfig:
    """``name``: closed_book | rag. For ``rag``: each source in ``sources`` (None: every text source of the
    knowledge base) is searched with the question for ``per_source_k`` passages, the per-source lists are fused by
    reciprocal rank and the best ``top_k`` go to the reader."""

    name: str = "closed_book"
    top_k: int = 5
    per_source_k: int = 10
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    max_new_tokens: int = 512
    temperature: float = 0.0
    answer_mode: str = "generate"  # generate | logprob (see omnimed.pipelines.reader.Reader)


def retrieve_evidence(kb, questions: Sequence[Question], cfg: PipelineConfig) -> list[list[Passage]]:
    """The top ``cfg.top_k`` passages for each question across the configured sources (graph excluded: it takes
    ``term , question`` queries, which a plain question is not)."""
    sources = [s for s in (cfg.sources or kb.sources) if s != "graph"]
    unknown = [s for s in sources if s not in kb.sources]
    if unknown:
        raise ValueError(f"pipeline.sources: {unknown} not in knowledge base {kb.cfg.name} ({', '.join(kb.sources)})")
    return kb.search_sources([q.question for q in questions], cfg.top_k, sources=sources,
                             per_source_k=cfg.per_source_k, method=cfg.retriever)


@dataclass
class PipelineResult:
    outputs: list  # ReaderOutput per question
    evidence: list[list[Passage]] = field(default_factory=list)


def run_pipeline(cfg: PipelineConfig, reader, questions: Sequence[Question], kb=None) -> PipelineResult:
    """Answer ``questions`` with ``cfg.name``; multiple-choice and open questions may be mixed."""
    if cfg.name not in ("closed_book", "rag"):
        raise ValueError(f"pipeline={cfg.name!r} is not built; built pipelines: closed_book, rag")
    evidence: list[list[Passage]] = [[] for _ in questions]
    if cfg.name == "rag":
        if kb is None:
            raise ValueError("pipeline=rag needs a knowledge base (knowledge=...)")
        evidence = retrieve_evidence(kb, questions, cfg)
    outputs: list = [None] * len(questions)
    for kind, answer in (("mcq", reader.answer_mcq), ("open", reader.answer_open)):
        idx = [i for i, q in enumerate(questions) if isinstance(q, MultipleChoiceQuestion) == (kind == "mcq")]
        if idx:
            got = answer([questions[i] for i in idx], [evidence[i] for i in idx] if cfg.name == "rag" else None)
            for i, out in zip(idx, got):
                outputs[i] = out
    return PipelineResult(outputs, evidence)

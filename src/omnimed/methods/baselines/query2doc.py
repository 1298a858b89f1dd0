"""Omni-RAG's two unplanned query baselines (appendix D.3), as plans Omni-RAG searches and reads (retrieval per
query, reading and the plan statistics are its own):

- ``pipeline=original_question`` (MedRAG adapted to several sources): the question itself is the query of every text
  source, and the graph is queried with the medical terms an LM (the frozen planner: Qwen2.5-72B-Instruct-AWQ in the
  paper) finds in the question (Prompt E.5);
- ``pipeline=query2doc`` (Wang et al., 2023): the LM writes, for each text source, a passage of that source's kind
  that answers the question (E.6); the source's query is the question expanded by it (the question, repeated
  ``question_repeats`` times, then the pseudo-document: Query2Doc expands the query rather than replacing it, and
  the appendix says the pseudo-documents "enhance the original question"); the graph as in Original Question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnimed.data.records import Plan
from omnimed.generation.types import Request, SamplingParams
from omnimed.knowledge.plan import PlanParse, as_query
from omnimed.methods.omnirag import prompts
from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig, Planned
from omnimed.methods.registry import register_method


@dataclass
class OriginalQuestionConfig(OmniRAGConfig):
    """Omni-RAG's settings; the term extractor is the frozen planner (``planner_model``, ``planner_backend``)."""

    name: str = "original_question"


@dataclass
class Query2DocConfig(OmniRAGConfig):
    """Omni-RAG's settings; the writer is the frozen planner (``planner_model``, ``planner_backend``),
    ``planner_max_new_tokens`` its budget (E.6 asks for at most 200 words). ``question_repeats``: how many times the
    question precedes the pseudo-document in each query: 1 is Wang et al.'s expansion for a dense retriever (the
    paper's MedCPT; ``conf/pipeline/query2doc.yaml`` sets it), 5 theirs for BM25, 0 the pseudo-document alone (the
    field's default, what runs made before the knob did, so a table keeps those only where it asks for 0)."""

    name: str = "query2doc"
    planner_max_new_tokens: int = 320
    question_repeats: int = 0

    def __post_init__(self) -> None:
        if self.question_repeats < 0:
            raise ValueError(f"pipeline.question_repeats={self.question_repeats}: expected 0 (the pseudo-document "
                             "alone) or more (times the question precedes it)")


@register_method
class OriginalQuestion(OmniRAG):
    """The question as every text source's query; the question's terms for the graph."""

    name = "original_question"
    config = OriginalQuestionConfig
    stages = ()
    #: whether each text source's query is an LM's pseudo-document (Query2Doc) rather than the question
    pseudo_documents = False

    def plan(self, questions: Sequence[Any], planner: Any, sources: Sequence[str], kb: Any,
             seed: int) -> list[Planned]:
        asks: list[tuple[int, str]] = []  # (question index, source) per request
        requests: list[Request] = []
        queries: list[dict[str, list[str]]] = [{} for _ in questions]
        for i, q in enumerate(questions):
            for source in sources:
                if source != "graph" and not self.pseudo_documents:
                    queries[i][source] = [as_query(q.question)]
                    continue
                messages = (prompts.graph_terms_messages(q) if source == "graph"
                            else prompts.pseudo_document_messages(q, source))
                meta = {"task": "graph_terms" if source == "graph" else "pseudo_document", "question_id": q.id,
                        "source": source}
                asks.append((i, source))
                requests.append(Request(messages, meta))
        params = SamplingParams(max_new_tokens=self.cfg.planner_max_new_tokens, temperature=0.0, seed=seed)
        problems: list[list[str]] = [[] for _ in questions]
        errors: list[str | None] = [None for _ in questions]
        for (i, source), gens in zip(asks, planner.generate(requests, params)):
            gen = gens[0]
            if gen.error is not None:
                errors[i] = errors[i] or gen.error
                continue
            if source == "graph":
                terms = prompts.read_graph_terms(gen.text)
                found = [as_query(f"{term} , {questions[i].question}") for term in terms]
                if not found:
                    problems[i].append("no <term> tag in the graph terms reply (graph not searched)")
            else:
                doc = as_query(prompts.read_pseudo_document(gen.text))
                query = as_query(" ".join([questions[i].question] * self.cfg.question_repeats + [doc]))
                found = [query] if query else []
                if not doc:
                    problems[i].append(f"empty pseudo-document for {source}" + ("" if found else " (not searched)"))
            if found:
                queries[i][source] = found
        return [Planned(PlanParse(Plan(question_id=q.id, queries=qs), probs), err)
                for q, qs, probs, err in zip(questions, queries, problems, errors)]


@register_method
class Query2Doc(OriginalQuestion):
    """Pseudo-documents as queries, one per text source; the question's terms for the graph."""

    name = "query2doc"
    config = Query2DocConfig
    pseudo_documents = True

"""Retrieval evaluation: (query, gold passages) sets, runs of a knowledge base's methods, IR metrics via ranx.

Queries are scored per source: a question whose gold passages lie in the wiki and the graph is searched in the
wiki for its wiki gold and in the graph for its graph gold. Hits of chunks count for the passage they were cut
from (``Hit.doc_id``). Metrics: HIT@k (ranx ``hit_rate``), NDCG@k, recall@k and MRR, averaged over queries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion
from omnimed.knowledge.types import Hit

#: method name -> (retriever, rerank) of ``KnowledgeBase.search_batch``; ``graph`` = the concept store.
METHODS: dict[str, tuple[str, bool]] = {
    "bm25": ("bm25", False),
    "dense": ("dense", False),
    "hybrid": ("hybrid", False),
    "hybrid+rerank": ("hybrid", True),
    "bm25+rerank": ("bm25", True),
    "dense+rerank": ("dense", True),
}


@dataclass
class RetrievalQuery:
    """One query against one source with its gold passage ids (``term , question`` for the graph source)."""

    id: str
    source: str
    text: str
    gold: set[str] = field(default_factory=set)


def world_queries(
    questions: Iterable[MultipleChoiceQuestion | OpenQuestion], sources: Sequence[str], *, entity_names=None
) -> list[RetrievalQuery]:
    """One query per (question, gold source) among ``sources``; graph queries read ``<subject> , <question>``
    with the subject's name (``entity_names``: entity id -> name, from the world model)."""
    out: list[RetrievalQuery] = []
    for q in questions:
        by_source: dict[str, set[str]] = {}
        for pid in q.gold_passages:
            by_source.setdefault(pid.split(":", 1)[0], set()).add(pid)
        for source, gold in by_source.items():
            if source not in sources:
                continue
            text = q.question
            if source == "graph":
                subject = (entity_names or {}).get(q.metadata.get("subject", ""))
                if not subject:
                    continue
                text = f"{subject} , {q.question}"
            out.append(RetrievalQuery(f"{q.id}@{source}", source, text, gold))
    return out


def paired_queries(questions: Iterable[MultipleChoiceQuestion], source: str) -> list[RetrievalQuery]:
    """Questions whose ``gold_passages`` name passages of one source (PubMedQA question -> its abstract)."""
    return [RetrievalQuery(f"{q.id}@{source}", source, q.question, set(q.gold_passages)) for q in questions
            if q.gold_passages]


def run_method(kb, queries: Sequence[RetrievalQuery], method: str, k: int) -> dict[str, list[Hit]]:
    """Search every query with ``method`` (text sources) or the concept store (graph); hits by query id."""
    retriever, rerank = METHODS[method] if method in METHODS else (method, False)
    out: dict[str, list[Hit]] = {}
    by_source: dict[str, list[RetrievalQuery]] = {}
    for q in queries:
        by_source.setdefault(q.source, []).append(q)
    for source, qs in by_source.items():
        if source == "graph":
            results = kb.search_batch(source, [q.text for q in qs], k)
        else:
            results = kb.search_batch(source, [q.text for q in qs], k, method=retriever, rerank=rerank)
        out.update({q.id: hits for q, hits in zip(qs, results)})
    return out


def ir_metrics(
    queries: Sequence[RetrievalQuery], hits: dict[str, list[Hit]], ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """HIT@k, NDCG@k, recall@k and MRR over ``queries`` (ranx); chunk hits count once for their passage."""
    from ranx import Qrels, Run, evaluate

    qrels = {q.id: {doc: 1 for doc in q.gold} for q in queries if q.gold}
    run: dict[str, dict[str, float]] = {}
    for q in queries:
        scores: dict[str, float] = {}
        for h in hits.get(q.id, []):
            # ranks, not raw scores: methods' scores are on different scales and ranx sorts by score
            scores.setdefault(h.doc_id, 1.0 / h.rank)
        run[q.id] = scores or {"<none>": 0.0}
    names = [f"{m}@{k}" for k in ks for m in ("hit_rate", "ndcg", "recall")] + ["mrr"]
    values = evaluate(Qrels(qrels), Run(run), names, make_comparable=True)
    return {name.replace("hit_rate", "hit"): float(v) for name, v in values.items()}


def evaluate_methods(
    kb, queries: Sequence[RetrievalQuery], methods: Sequence[str], *, k: int = 10, ks: Sequence[int] = (1, 5, 10)
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[Hit]]]]:
    """Metrics per method (overall and ``<source>/<metric>``) and the hits behind them, for auditing."""
    metrics: dict[str, dict[str, float]] = {}
    all_hits: dict[str, dict[str, list[Hit]]] = {}
    text_queries = [q for q in queries if q.source != "graph"]
    for method in methods:
        hits = run_method(kb, text_queries, method, k)
        all_hits[method] = hits
        row: dict[str, Any] = {"queries": len(text_queries), **ir_metrics(text_queries, hits, ks)}
        for source in sorted({q.source for q in text_queries}):
            mine = [q for q in text_queries if q.source == source]
            row.update({f"{source}/{m}": v for m, v in ir_metrics(mine, hits, ks).items()})
        metrics[method] = row
    graph_queries = [q for q in queries if q.source == "graph"]
    if graph_queries and "graph" in kb.sources:
        hits = run_method(kb, graph_queries, "graph", k)
        all_hits["graph"] = hits
        metrics["graph"] = {"queries": len(graph_queries), **ir_metrics(graph_queries, hits, ks)}
    return metrics, all_hits

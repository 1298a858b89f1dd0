"""Retrieval evaluation: (query, gold passages) sets, runs of a knowledge base's methods, IR metrics via
ir-measures (pytrec_eval).

Queries are scored per source: a question whose gold passages lie in the wiki and the graph is searched in the
wiki for its wiki gold and in the graph for its graph gold. Hits of chunks count for the passage they were cut
from (``Hit.doc_id``). Metrics: HIT@k (``Success@k``), NDCG@k, recall@k and MRR, averaged over queries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.evaluation.datasets import RETRIEVAL_QUERIES, WORLD_KIND_QUERIES
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
class RetrievalTaskConfig:
    """Score a knowledge base's retrieval methods on (query, gold passages) sets.

    ``queries``: ``world`` (the world's questions of ``split``; every gold source is queried, the graph with
    ``subject , question``), ``world_<kind>`` (its MCQs of one question kind: ``world_treatment``), ``pubmedqa``
    (real PubMedQA question -> its abstract, in the research source; needs ``knowledge=realdata``), ``medquad``
    (real MedQuAD question -> the answer passages filed under it, in the wiki source; ``knowledge=realdata``;
    ``max_queries`` draws a seeded sample, since the file is ordered by collection) or ``bioasq`` (the BioASQ
    golden JSON at ``file``, any year's: each question's snippets are its relevant set and the union of every
    question's snippets is the corpus, a research-only knowledge base built for the file with the configured
    knowledge base's index settings).
    ``methods``: bm25 | dense | hybrid | hybrid+rerank | bm25+rerank | dense+rerank.
    ``candidates``: null searches each source's whole index; a number gives PolyEVAL's setting (PolyRAG section
    4.2), where every method ranks the same pool per question: its ``candidates`` first-stage passages across the
    text sources (``candidate_retriever``, null for the knowledge base's default) plus its gold text passages
    (:mod:`omnimed.knowledge.pools`); queries are then one per question, named ``<id>@pool``.
    """

    name: str = "retrieval"
    queries: str = "world"
    split: Optional[str] = "test"
    max_queries: Optional[int] = None
    methods: list[str] = field(default_factory=lambda: ["bm25", "dense", "hybrid", "hybrid+rerank"])
    k: int = 10
    ks: list[int] = field(default_factory=lambda: [1, 5, 10])
    candidates: Optional[int] = None
    candidate_retriever: Optional[str] = None
    file: Optional[str] = None


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
            if source == "graph":  # the name the question uses: an alias when the world gives it one
                subject = q.metadata.get("subject_name") or (entity_names or {}).get(q.metadata.get("subject", ""))
                if not subject:
                    continue
                text = f"{subject} , {q.question}"
            out.append(RetrievalQuery(f"{q.id}@{source}", source, text, gold))
    return out


def paired_queries(questions: Iterable[MultipleChoiceQuestion], source: str) -> list[RetrievalQuery]:
    """Questions whose ``gold_passages`` name passages of one source (PubMedQA question -> its abstract)."""
    return [RetrievalQuery(f"{q.id}@{source}", source, q.question, set(q.gold_passages)) for q in questions
            if q.gold_passages]


POOL = "pool"  # the source name of a question's query in a candidate-pool run


def pooled_queries(queries: Sequence[RetrievalQuery]) -> list[RetrievalQuery]:
    """One query per question over the text sources (its gold text passages together), for a pool run."""
    merged: dict[str, RetrievalQuery] = {}
    for q in queries:
        if q.source == "graph":
            continue
        qid = q.id.rsplit("@", 1)[0]
        merged.setdefault(qid, RetrievalQuery(f"{qid}@{POOL}", POOL, q.text)).gold |= q.gold
    return list(merged.values())


def candidate_pools(kb, queries: Sequence[RetrievalQuery], n: int, retriever: str | None = None
                    ) -> dict[str, list[Passage]]:
    """Each pooled query's candidates (:func:`omnimed.knowledge.pools.build_pools`), by query id."""
    from omnimed.knowledge.pools import build_pools

    found = build_pools(kb, [q.text for q in queries], [sorted(q.gold) for q in queries], n,
                        keys=[q.id for q in queries], retriever=retriever)
    return {q.id: pool for q, pool in zip(queries, found)}


def run_method(kb, queries: Sequence[RetrievalQuery], method: str, k: int, pipeline: Any = None,
               pools: dict[str, list[Passage]] | None = None) -> dict[str, list[Hit]]:
    """Search every query with ``method`` (text sources) or the concept store (graph); hits by query id.
    ``pipeline``: a registered method that ranks passages itself, used when ``method`` is its name; ``pools``:
    each query's candidate pool, which ``method`` then orders instead of searching (:func:`candidate_pools`)."""
    retriever, rerank = METHODS[method] if method in METHODS else (method, False)
    out: dict[str, list[Hit]] = {}
    if pools is not None:
        if pipeline is not None and method == pipeline.name:
            ranked = pipeline.retrieve(kb, POOL, [(q.id.rsplit("@", 1)[0], q.text) for q in queries], k,
                                       candidates=[pools[q.id] for q in queries])
            return {q.id: hits for q, hits in zip(queries, ranked)}
        from omnimed.knowledge.pools import PoolRanker

        ranker = PoolRanker(kb)
        if method.split("+")[0] in ("dense", "hybrid"):
            ranker.prefetch([pools[q.id] for q in queries])
        return {q.id: ranker.rank(q.text, pools[q.id], method, k) for q in queries}
    by_source: dict[str, list[RetrievalQuery]] = {}
    for q in queries:
        by_source.setdefault(q.source, []).append(q)
    for source, qs in by_source.items():
        if pipeline is not None and method == pipeline.name:
            results = pipeline.retrieve(kb, source, [(q.id.rsplit("@", 1)[0], q.text) for q in qs], k)
        elif source == "graph":
            results = kb.search_batch(source, [q.text for q in qs], k)
        else:
            results = kb.search_batch(source, [q.text for q in qs], k, method=retriever, rerank=rerank)
        out.update({q.id: hits for q, hits in zip(qs, results)})
    return out


def ir_metrics(
    queries: Sequence[RetrievalQuery], hits: dict[str, list[Hit]], ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """HIT@k, NDCG@k, recall@k and MRR over ``queries`` with gold passages (ir-measures on pytrec_eval); chunk
    hits count once for their passage, and a query with no hit scores 0."""
    import ir_measures
    from ir_measures import RR, R, Success, nDCG

    qrels = {q.id: {doc: 1 for doc in q.gold} for q in queries if q.gold}
    run: dict[str, dict[str, float]] = {}
    for q in queries:
        scores: dict[str, float] = {}
        for h in hits.get(q.id, []):
            # ranks, not raw scores: methods' scores are on different scales and the evaluator sorts by score
            scores.setdefault(h.doc_id, 1.0 / h.rank)
        run[q.id] = scores or {"<none>": 0.0}
    measures = {f"{name}@{k}": m @ k for k in ks for name, m in (("hit", Success), ("ndcg", nDCG), ("recall", R))}
    measures["mrr"] = RR
    values = ir_measures.calc_aggregate(list(measures.values()), qrels, run)
    return {name: float(values[m]) for name, m in measures.items()}


def evaluate_methods(
    kb, queries: Sequence[RetrievalQuery], methods: Sequence[str], *, k: int = 10, ks: Sequence[int] = (1, 5, 10),
    pipeline: Any = None, pools: dict[str, list[Passage]] | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[Hit]]]]:
    """Metrics per method (overall and ``<source>/<metric>``) and the hits behind them, for auditing;
    ``pipeline``, ``pools``: as :func:`run_method`."""
    metrics: dict[str, dict[str, float]] = {}
    all_hits: dict[str, dict[str, list[Hit]]] = {}
    text_queries = [q for q in queries if q.source != "graph"]
    for method in methods:
        hits = run_method(kb, text_queries, method, k, pipeline, pools)
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


# ------------------------------------------------------------------------------------------------- runner
@dataclass
class RetrievalResult:
    metrics: dict[str, dict[str, float]]
    output_dir: Any
    predictions: Any
    logger_dir: str | None = None


def load_queries(task, knowledge_cfg, kb) -> list[RetrievalQuery]:
    """The task's (query, gold) set: the world's questions of ``task.split`` or real PubMedQA pairs."""
    if task.queries == "world" or task.queries in WORLD_KIND_QUERIES:
        from omnimed.knowledge.corpus import world_of

        if knowledge_cfg.corpus != "world":
            raise ValueError(f"task.queries={task.queries} needs a world knowledge base; knowledge={knowledge_cfg.name}")
        world = world_of(knowledge_cfg)
        kind = WORLD_KIND_QUERIES.get(task.queries)
        questions = [q for q in ([*world.questions, *world.open_questions] if kind is None else world.questions)
                     if (task.split is None or q.split == task.split)
                     and (kind is None or q.metadata.get("kind") == kind)]
        names = {e.id: e.name for e in world.model.entities.values()}
        queries = world_queries(questions, kb.sources, entity_names=names)
    elif task.queries == "pubmedqa":
        from omnimed.data.loaders.pubmedqa_bioasq import load_pubmedqa
        from omnimed.knowledge.corpus import PUBMEDQA_FILE, realdata_root

        records = load_pubmedqa(realdata_root(knowledge_cfg) / PUBMEDQA_FILE)
        queries = paired_queries([r for r in records if isinstance(r, MultipleChoiceQuestion)], "research")
    elif task.queries == "medquad":
        queries = medquad_queries(kb, max_queries=task.max_queries)
    elif task.queries == "bioasq":
        from omnimed.data.loaders.pubmedqa_bioasq import load_bioasq

        records = load_bioasq(_bioasq_file(task), include_other=True)
        queries = paired_queries([r for r in records if not isinstance(r, Passage)], "research")
    else:
        raise ValueError(f"task.queries={task.queries!r}; expected one of {', '.join(RETRIEVAL_QUERIES)}")
    if not queries:
        raise ValueError(f"task.queries={task.queries} split={task.split}: no query has gold passages in "
                         f"the sources of {knowledge_cfg.name} ({', '.join(kb.sources)})")
    return queries[: task.max_queries] if task.max_queries else queries


def medquad_queries(kb, *, max_queries: int | None = None, seed: int = 0) -> list[RetrievalQuery]:
    """Real MedQuAD questions against the wiki source of ``knowledge=realdata``: each question text's relevant
    set is every answer passage filed under it (several sites answer "What is (are) X ?"); ``max_queries``
    draws a seeded sample of questions, since the file runs collection by collection."""
    import random

    if "wiki" not in kb.text_sources:
        raise ValueError(f"task.queries=medquad reads MedQuAD from the wiki source; knowledge={kb.cfg.name} has none "
                         "(use knowledge=realdata)")
    gold: dict[str, set[str]] = {}
    for p in kb.text_sources["wiki"].passages:
        question = str(p.metadata.get("question") or "").strip()
        if p.metadata.get("corpus") == "medquad" and question:
            gold.setdefault(question, set()).add(str(p.metadata.get("chunk_of", p.id)))
    texts = sorted(gold)
    if max_queries and max_queries < len(texts):
        texts = sorted(random.Random(seed).sample(texts, max_queries))
    return [RetrievalQuery(f"medquad-{i:05d}@wiki", "wiki", text, gold[text]) for i, text in enumerate(texts)]


def _bioasq_file(task) -> Path:
    if not task.file:
        raise ValueError("task.queries=bioasq reads a BioASQ golden JSON: set task.file=PATH")
    path = Path(task.file).expanduser()
    if not path.is_file():
        raise ValueError(f"task.file={task.file}: no such file (task.queries=bioasq expects a BioASQ golden JSON)")
    return path


def bioasq_knowledge(task, kcfg, root: Path):
    """A research-only knowledge config over the union of the snippets of the BioASQ file ``task.file``,
    written once as a record set under ``<root>/builds/bioasq/<file digest>`` and indexed with ``kcfg``'s
    settings (encoder, BM25, chunking)."""
    import dataclasses
    import hashlib

    from omnimed.data.io import save_record_set
    from omnimed.data.loaders.pubmedqa_bioasq import load_bioasq

    path = _bioasq_file(task)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    out = root / "builds" / "bioasq" / digest
    if not (out / "manifest.json").is_file():
        passages = [r for r in load_bioasq(path, include_other=True) if isinstance(r, Passage)]
        if not passages:
            raise ValueError(f"task.file={task.file}: no question has snippets; nothing to retrieve from")
        save_record_set(out, passages, extra={"from": str(path)})
    return dataclasses.replace(kcfg, name=f"bioasq-{path.stem}-{digest[:8]}", corpus="files",
                               sources=["research"], files={"research": [str(out)]})


def ranking_pipeline(cfg: Any) -> Any:
    """The run's pipeline when it names a registered method that ranks passages itself (PolyRAG), served by the
    run's backend and model (its judges) and caching in ``paths.cache``; else None."""
    from omnimed.methods.registry import build_method

    pipeline_cfg = cfg.get("pipeline") if hasattr(cfg, "get") else getattr(cfg, "pipeline", None)
    if pipeline_cfg is None or pipeline_cfg.name not in cfg.task.methods:
        return None
    method = build_method(pipeline_cfg)
    if not method.retrieves():
        raise ValueError(f"task.methods names {pipeline_cfg.name}, but pipeline={pipeline_cfg.name} does not rank "
                         "passages on its own")
    method.serve(cfg.backend, cfg.model)
    method.cache_root = cfg.paths.cache
    return method


def prediction_rows(queries: Sequence[RetrievalQuery], hits: dict[str, dict[str, list[Hit]]]) -> list[dict]:
    """One row per (method, query): the ranked passage ids with scores next to the gold, for auditing."""
    rows = []
    for method, per_query in hits.items():
        for q in queries:
            if q.id not in per_query:
                continue
            ranked = per_query[q.id]
            first = next((h.rank for h in ranked if h.doc_id in q.gold), None)
            rows.append({
                "method": method, "query_id": q.id, "source": q.source, "query": q.text,
                "gold": sorted(q.gold), "first_gold_rank": first,
                "hits": [{"id": h.passage.id, "doc_id": h.doc_id, "score": h.score, **h.extra} for h in ranked],
            })
    return rows


def run_retrieval_evaluation(cfg, output_dir) -> RetrievalResult:
    """``omnimed-evaluate task=retrieval``: build or reuse the indexes, score every method, write
    ``metrics.json`` and ``predictions.jsonl`` into ``output_dir`` and log both to the configured logger."""
    from omnimed.evaluation.runner import finish_run
    from omnimed.knowledge.build import build_knowledge_base

    task, kcfg = cfg.task, cfg.knowledge
    output_dir = Path(output_dir)
    pipeline = ranking_pipeline(cfg)
    unknown = [m for m in task.methods if m not in METHODS and (pipeline is None or m != pipeline.name)]
    if unknown:
        also = f", or {pipeline.name} (pipeline={pipeline.name})" if pipeline is not None else ""
        raise ValueError(f"task.methods: unknown {unknown}; expected some of {', '.join(METHODS)}{also}")
    if any(m.endswith("+rerank") for m in task.methods) and not kcfg.rerank.enabled:
        kcfg.rerank.enabled = True  # the comparison asks for it; the knowledge base's default stays as configured
    if task.queries == "bioasq":
        kcfg = bioasq_knowledge(task, kcfg, Path(cfg.paths.root))
    kb = build_knowledge_base(kcfg, Path(cfg.paths.root), progress=True)
    queries = load_queries(task, kcfg, kb)
    pools = None
    if task.candidates is not None:
        queries = pooled_queries(queries)
        pools = candidate_pools(kb, queries, task.candidates, task.candidate_retriever)
    metrics, hits = evaluate_methods(kb, queries, task.methods, k=task.k, ks=task.ks, pipeline=pipeline,
                                     pools=pools)

    flat = {f"{method}/{name}": value for method, row in metrics.items() for name, value in row.items()}
    rows = prediction_rows(queries, hits)
    logger_dir = finish_run(cfg, output_dir, rows=rows, metrics=flat,
                            run_name=f"retrieval-{kcfg.name}-{task.queries}", job_type="evaluate-retrieval",
                            lineage={"knowledge_dir": str(kb.directory), "queries": len(queries),
                                     "candidate_pool": task.candidates,
                                     "pool_size": (sum(map(len, pools.values())) / len(pools)) if pools else None},
                            tables=_tables(metrics, rows))
    return RetrievalResult(metrics, output_dir, output_dir / "predictions.jsonl", logger_dir)


def _tables(metrics: dict[str, dict[str, float]], rows: list[dict]) -> dict:
    """The method comparison and every prediction, as W&B Tables."""
    names = [n for n in next(iter(metrics.values())) if "/" not in n]
    return {
        "retrieval/comparison": (["method", *names], [[m, *[row.get(n) for n in names]] for m, row in metrics.items()]),
        "retrieval/predictions": (
            ["method", "query_id", "source", "query", "gold", "first_gold_rank", "top_ids"],
            [[r["method"], r["query_id"], r["source"], r["query"], ", ".join(r["gold"]), r["first_gold_rank"],
              ", ".join(h["doc_id"] for h in r["hits"])] for r in rows],
        ),
    }


SHOWN = ("queries", "hit@1", "hit@5", "hit@10", "ndcg@10", "recall@10", "mrr")


def report(result: RetrievalResult, cfg: Any, console: Any) -> float | None:
    """Print one row per retrieval method and where the files are; returns the best method's NDCG@10."""
    from rich import box
    from rich.table import Table

    # no vertical rules: the 8 columns fit 80 characters with every header whole (boxed, recall@10 was cut)
    table = Table(title=f"omnimed-evaluate: retrieval on {cfg.knowledge.name} ({cfg.task.queries})",
                  box=box.SIMPLE_HEAVY)
    table.add_column("method", no_wrap=True)
    for col in SHOWN:
        table.add_column(col, justify="right", min_width=len(col))
    for method, row in result.metrics.items():
        table.add_row(method, *[f"{row[c]:.0f}" if c == "queries" else f"{row.get(c, float('nan')):.3f}"
                                for c in SHOWN])
    console.print(table)
    console.print(f"metrics.json and predictions.jsonl in {result.output_dir}"
                  + (f"; logger files in {result.logger_dir}" if result.logger_dir else ""))
    best = max(result.metrics.values(), key=lambda r: r.get("ndcg@10", 0.0))
    return best.get("ndcg@10")

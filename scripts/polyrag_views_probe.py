"""Where PolyRAG's ranking finds or loses the gold passage in table 1's candidate pools, per view and per DBSCAN
``eps`` of the topic cover, on one world question kind.

Each question of ``kind`` in ``--split`` gets table 1's pool (its 15 first-stage passages across the text sources
plus its gold). Printed: the share of questions with a gold passage in the top 3 of BM25 / MiniLM / hybrid over the
pool, of each view alone, of y without the cover, and of y under the cover for each ``--eps`` (the paper does not
state DBSCAN's settings; choose them on ``--split dev``, report on test). Views are computed once per question.
Without judges R is the knowledge base encoder's cosine and S is absent; ``--relevance-judge`` /
``--supplement-judge`` (a trained judge's export) read them from the judge, served by the hf backend through the
call cache that ``omnimed-evaluate`` uses, so the pools a table's run already judged cost nothing; each judged view's
mean score per oracle relevance grade (A states the whole answer, D outdated or in passing, E unrelated) follows.

    .venv/bin/python scripts/polyrag_views_probe.py treatment policy 128 --split dev \\
        --utility-encoder checkpoints/utility_embed/polyrag-utility-embed-miniature/hf \\
        --relevance-judge checkpoints/polyrag_judge/polyrag-relevance-judge-miniature-open-kinds/hf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from omnimed.conf import load_option
from omnimed.evaluation.retrieval import candidate_pools, pooled_queries, world_queries
from omnimed.generation.factory import BackendConfig
from omnimed.knowledge.build import build_knowledge_base
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.knowledge.corpus import world_of
from omnimed.knowledge.pools import PoolRanker
from omnimed.knowledge.types import index_text
from omnimed.methods.polyrag.judges import oracle_grade
from omnimed.methods.polyrag.method import PolyRAG, PolyRAGConfig
from omnimed.methods.polyrag.mixture import ComposabilityConfig, select, topics

VIEWS = ("relevance", "utility", "supplement", "authority", "timeliness")


def _yaml(path: str, schema: type):
    node = OmegaConf.load(path)
    node.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", help="a multiple-choice question kind (treatment, ...), or open / open:<kind> for the "
                    "open questions (table 2)")
    ap.add_argument("domain")
    ap.add_argument("n", type=int)
    ap.add_argument("--split", default="test")
    ap.add_argument("--eps", default="0.02,0.035,0.05,0.075,0.1,0.15")
    ap.add_argument("--knowledge", default="conf/knowledge/world_table.yaml")
    ap.add_argument("--encoder", default="minilm-l6", help="the knowledge base's dense encoder (table 1's preset)")
    ap.add_argument("--utility-encoder", default=None)
    ap.add_argument("--relevance-judge", default=None, help="a relevance judge's export (default: the cosine)")
    ap.add_argument("--supplement-judge", default=None, help="a supplement judge's export (default: no S)")
    args = ap.parse_args()
    kcfg = _yaml(args.knowledge, KnowledgeConfig)
    kcfg.dense.encoder = args.encoder
    kb = build_knowledge_base(kcfg, Path("."), progress=False)
    world = world_of(kcfg)
    if args.kind.startswith("open"):  # the open questions (table 2), all kinds or one: open:<kind>
        kind = args.kind.partition(":")[2]
        questions = [q for q in world.open_questions
                     if q.split == args.split and (not kind or q.metadata.get("kind") == kind)]
    else:
        questions = [q for q in world.questions if q.split == args.split and q.metadata.get("kind") == args.kind]
    queries = pooled_queries(world_queries(questions, kb.sources))[: args.n]
    pools = candidate_pools(kb, queries, 15)
    cfg = _yaml("conf/pipeline/polyrag.yaml", PolyRAGConfig)
    cfg.domain, cfg.utility_encoder = args.domain, args.utility_encoder
    cfg.relevance_judge, cfg.supplement_judge = args.relevance_judge, args.supplement_judge
    cfg.composability.constraint = "none"  # y's own order; the cover is applied below per eps
    method = PolyRAG(cfg)
    method.serve(load_option("backend", "hf", BackendConfig), None)  # the judges' backend (unused without judges)
    encoder, ranker = method.utility_encoder(kb), PoolRanker(kb)
    eps_values = [float(e) for e in args.eps.split(",")]
    shown = [v for v in VIEWS if v != "supplement" or args.supplement_judge]  # S is 0 everywhere without a judge
    found: dict[str, list[bool]] = {}
    judged = [v for v, path in (("relevance", args.relevance_judge), ("supplement", args.supplement_judge)) if path]
    by_grade: dict[str, dict[str, list[float]]] = {v: {} for v in judged}  # judged view -> oracle's grade -> scores
    for rq in queries:
        pool = pools[rq.id]
        gold = [str(p.metadata.get("chunk_of", p.id)) in rq.gold for p in pool]

        def top3(order: list[int], gold: list[bool] = gold) -> bool:
            return any(gold[i] for i in order[:3])

        for name in ("bm25", "dense", "hybrid"):
            hits = ranker.rank(rq.text, pool, name, 3)
            found.setdefault(name, []).append(any(str(h.doc_id) in rq.gold for h in hits))
        question_id = rq.id.rsplit("@", 1)[0]
        ranked = method.rank(question_id, rq.text, pool, kb)
        by_id = {p.id: row for p, row in zip(ranked.passages, ranked.views)}
        rows = [by_id[p.id] for p in pool]
        for p, row in zip(pool, rows) if judged else ():
            grade = oracle_grade(world.oracle, question_id, p.id)
            for view in judged:
                by_grade[view].setdefault(grade, []).append(row[view])
        for view in (*shown, "y"):
            found.setdefault("y, no cover" if view == "y" else f"{view} alone", []).append(
                top3(sorted(range(len(pool)), key=lambda i, v=view: -rows[i][v])))
        embedded = method.embed_docs(encoder, pool, [index_text(p) for p in pool])  # cached by rank()
        y = [row["y"] for row in rows]
        for eps in eps_values:
            topic = topics(embedded, ComposabilityConfig(eps=eps, min_samples=cfg.composability.min_samples))
            found.setdefault(f"y, cover eps {eps}", []).append(top3(select(y, topic, 3, "cover")))
    print(f"{args.kind} ({args.domain}), {args.split}, {len(queries)} questions, gold in the top 3:")
    for key, values in found.items():
        print(f"  {key:22s} {100 * float(np.mean(values)):5.1f}")
    for view, grades in by_grade.items():  # what the judge gives each oracle grade (A the whole answer ... E unrelated)
        print(f"{view} judge, mean view score (rescaled within the pool) by the oracle's grade:")
        for grade, values in sorted(grades.items()):
            print(f"  {grade}  {float(np.mean(values)):.3f}  (n={len(values)})")


if __name__ == "__main__":
    main()

"""Where PolyRAG's ranking finds or loses the gold passage, per view, on one world question kind.

For each test question of ``kind`` (searched in its gold source, as table 1 queries it): is the gold among the
``candidates`` first-stage passages; is it in the first stage's top 3; and is it in the top 3 of PolyRAG's y, of
y without the topic cover, and of each view alone (strictly: ties with the 4th do not count). Prints shares.

    .venv/bin/python scripts/polyrag_views_probe.py treatment policy 200 \\
        --utility-encoder checkpoints/utility_embed/polyrag-utility-embed-miniature/hf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from omnimed.evaluation.retrieval import world_queries
from omnimed.knowledge.build import build_knowledge_base
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.knowledge.corpus import world_of
from omnimed.methods.polyrag.method import PolyRAG, PolyRAGConfig

VIEWS = ("relevance", "utility", "authority", "timeliness")


def _yaml(path: str, schema: type):
    node = OmegaConf.load(path)
    node.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind")
    ap.add_argument("domain")
    ap.add_argument("n", type=int)
    ap.add_argument("--knowledge", default="conf/knowledge/world_table.yaml")
    ap.add_argument("--utility-encoder", default=None)
    args = ap.parse_args()
    kcfg = _yaml(args.knowledge, KnowledgeConfig)
    kb = build_knowledge_base(kcfg, Path("."), progress=False)
    questions = [q for q in world_of(kcfg).questions if q.split == "test" and q.metadata.get("kind") == args.kind]
    queries = [q for q in world_queries(questions, kb.sources) if q.source != "graph"][: args.n]
    cfg = _yaml("conf/pipeline/polyrag.yaml", PolyRAGConfig)
    cfg.domain, cfg.utility_encoder = args.domain, args.utility_encoder
    method = PolyRAG(cfg)
    method._judges = {"polyrag_relevance": None, "polyrag_supplement": None}  # no judges: cosine R, no S
    found: dict[str, list[bool]] = {k: [] for k in ("in_candidates", "first_stage_top3", "y_top3", "y_no_cover_top3",
                                                    *VIEWS)}
    for rq in queries:
        cands = [h.passage for h in kb.search(rq.source, rq.text, cfg.candidates)]
        gold = [i for i, p in enumerate(cands) if str(p.metadata.get("chunk_of", p.id)) in rq.gold]
        found["in_candidates"].append(bool(gold))
        if not gold:
            for key in list(found)[1:]:
                found[key].append(False)
            continue
        gid = cands[gold[0]].id
        found["first_stage_top3"].append(gold[0] < 3)
        ranked = method.rank(rq.id.rsplit("@", 1)[0], rq.text, cands, kb)
        rows = {p.id: row for p, row in zip(ranked.passages, ranked.views)}
        found["y_top3"].append(gid in [p.id for p in ranked.passages[:3]])
        found["y_no_cover_top3"].append(gid in sorted(rows, key=lambda pid: -rows[pid]["y"])[:3])
        for view in VIEWS:
            values = sorted((row[view] for row in rows.values()), reverse=True)
            found[view].append(rows[gid][view] > values[3] if len(values) > 3 else True)
    print(args.kind, args.domain, len(queries), {k: round(float(np.mean(v)), 3) for k, v in found.items()})


if __name__ == "__main__":
    main()

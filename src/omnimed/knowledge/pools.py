"""Candidate pools: a fixed set of passages per query that several methods rank.

PolyEVAL (PolyRAG, section 4.2) pairs every query with the documents a multi-source search found for it (14.7 a
query) and scores each retriever by how it orders that set. A pool here is the knowledge base's first-stage search
across its text sources, plus the query's gold passages at positions drawn from a seed (so a ranker learns nothing
from where they sit). :class:`PoolRanker` orders a pool with the knowledge base's own methods: BM25 fitted on the
pool's texts (the pool is the corpus, as "BM25 over each query's candidate documents" reads), cosine of the dense
encoder, their reciprocal-rank fusion, and the cross-encoder on top of any of them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from omnimed.data.records import Passage
from omnimed.knowledge.fusion import reciprocal_rank_fusion
from omnimed.knowledge.sparse import BM25Index
from omnimed.knowledge.types import Hit, KnowledgeError, index_text

#: the orders :class:`PoolRanker` gives a pool (``+rerank`` variants need the knowledge base's reranker)
POOL_METHODS: tuple[str, ...] = ("bm25", "dense", "hybrid", "bm25+rerank", "dense+rerank", "hybrid+rerank")


def passage_table(kb: Any) -> dict[str, Passage]:
    """Every text passage of the knowledge base by id (a chunk also under the passage it was cut from)."""
    table: dict[str, Passage] = {}
    for index in kb.text_sources.values():
        for p in index.passages:
            table.setdefault(p.id, p)
            table.setdefault(str(p.metadata.get("chunk_of", p.id)), p)
    return table


def with_gold(candidates: Sequence[Passage], gold: Sequence[str], table: dict[str, Passage], key: str
              ) -> list[Passage]:
    """``candidates`` plus the ``gold`` passages (ids in ``table``) not among them, each inserted at a position
    drawn from ``key`` (appending them would tell a ranker or a student that the last passages are the good ones)."""
    have = {p.id for p in candidates} | {str(p.metadata.get("chunk_of", p.id)) for p in candidates}
    out = list(candidates)
    rng = random.Random(key)
    for pid in gold:
        if pid in have or pid not in table:
            continue
        out.insert(rng.randint(0, len(out)), table[pid])
        have.add(pid)
    return out


def build_pools(kb: Any, queries: Sequence[str], golds: Sequence[Sequence[str]], n: int, *,
                keys: Sequence[str], retriever: str | None = None) -> list[list[Passage]]:
    """Each query's pool: its ``n`` first-stage passages fused across the text sources (found with ``retriever``,
    null for the knowledge base's default) plus its gold passages, inserted at positions drawn from ``keys``."""
    if n < 1:
        raise KnowledgeError(f"a candidate pool needs at least 1 searched passage per query, got {n}")
    found = kb.search_sources(list(queries), n, sources=list(kb.text_sources), per_source_k=n, method=retriever)
    table = passage_table(kb)
    return [with_gold(c, gold, table, key) for c, gold, key in zip(found, golds, keys)]


class PoolRanker:
    """Orders candidate pools with the knowledge base's methods (:data:`POOL_METHODS`); passage embeddings are
    computed once per run (pools of related queries overlap)."""

    def __init__(self, kb: Any) -> None:
        self.kb = kb
        self._embedded: dict[str, np.ndarray] = {}

    def prefetch(self, pools: Sequence[Sequence[Passage]]) -> None:
        """Embed every pool's passages in one call (one cache lookup and write, not one per query)."""
        if self.kb.encoder is None:
            return
        unique = list({p.id: p for pool in pools for p in pool}.values())
        self._embedded.update(zip((p.id for p in unique),
                                  np.asarray(self.kb.embed_docs(self.kb.encoder, [index_text(p) for p in unique]))))

    def rank(self, query: str, pool: Sequence[Passage], method: str, k: int) -> list[Hit]:
        """The top ``k`` of ``pool`` for ``query`` by ``method``; every pool passage is ranked (none is dropped
        for sharing no term with the query, it just comes last)."""
        base, _, rerank = method.partition("+")
        if method not in POOL_METHODS:
            raise KnowledgeError(f"unknown pool ranking {method!r}; expected one of {', '.join(POOL_METHODS)}")
        if not pool:
            return []
        texts = [index_text(p) for p in pool]
        if base == "bm25":
            rows = self._bm25(query, texts)
        elif base == "dense":
            rows = self._dense(query, pool, texts)
        else:
            rows = [r for r, _ in reciprocal_rank_fusion([self._bm25(query, texts), self._dense(query, pool, texts)],
                                                          k=self.kb.cfg.fusion_k, top=len(pool))]
            rows = [(r, 1.0 / (i + 1)) for i, r in enumerate(rows)]
        if rerank:
            if self.kb.reranker is None:
                raise KnowledgeError(f"{method} needs the knowledge base's reranker (knowledge.rerank.enabled=true)")
            order = [r for r, _ in rows]
            rows = [(order[i], s) for i, s in self.kb.reranker.rerank(query, [texts[r] for r in order], len(order))]
        return [Hit(pool[row], float(score), rank, method, query) for rank, (row, score) in enumerate(rows[:k], 1)]

    def _bm25(self, query: str, texts: list[str]) -> list[tuple[int, float]]:
        cfg = self.kb.cfg.sparse  # the knowledge base's BM25 settings, fitted on the pool
        index = BM25Index.build(texts, method=cfg.method, k1=cfg.k1, b=cfg.b, stemmer=cfg.stemmer,
                                stopwords=cfg.stopwords)
        scored = index.search([query], len(texts))[0]
        seen = {row for row, _ in scored}
        return scored + [(row, 0.0) for row in range(len(texts)) if row not in seen]

    def _dense(self, query: str, pool: Sequence[Passage], texts: list[str]) -> list[tuple[int, float]]:
        encoder = self.kb.encoder
        if encoder is None:
            raise KnowledgeError(f"dense pool ranking needs a dense encoder; knowledge={self.kb.cfg.name} has none")
        todo = [i for i, p in enumerate(pool) if p.id not in self._embedded]
        if todo:
            for i, vec in zip(todo, self.kb.embed_docs(encoder, [texts[i] for i in todo])):
                self._embedded[pool[i].id] = np.asarray(vec)
        scores = np.stack([self._embedded[p.id] for p in pool]) @ np.asarray(encoder.encode_queries([query])[0])
        return sorted(((i, float(s)) for i, s in enumerate(scores)), key=lambda p: (-p[1], p[0]))

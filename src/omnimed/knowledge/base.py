"""``KnowledgeBase``: the one way the rest of omnimed searches the five sources.

Text sources (book, guideline, research, wiki) are searched with BM25, a dense index, or both fused by reciprocal
rank, optionally reranked; the graph source answers ``term , question`` queries from its SQLite concept store.
Omni-RAG plans (``<book>q0 ; q1</book>...``) are searched source by source with :meth:`KnowledgeBase.search_plan`.
Build or open one with :func:`omnimed.knowledge.build.build_knowledge_base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omnimed.data.records import Passage, Plan
from omnimed.knowledge.config import RETRIEVERS, KnowledgeConfig
from omnimed.knowledge.fusion import reciprocal_rank_fusion
from omnimed.knowledge.types import Hit, KnowledgeError, Ranking, index_text

METHODS: tuple[str, ...] = (*RETRIEVERS, "graph")


@dataclass
class SourceIndex:
    """One text source: its (chunked) passages, in row order, and the indexes over them."""

    source: str
    passages: list[Passage]
    bm25: Any = None  # BM25Index
    dense: Any = None  # FaissIndex | QdrantIndex
    info: dict[str, Any] = field(default_factory=dict)

    def methods(self) -> list[str]:
        have = [m for m, idx in (("bm25", self.bm25), ("dense", self.dense)) if idx is not None]
        return have + (["hybrid"] if len(have) == 2 else [])


@dataclass
class PlanSearch:
    """The hits of every query of a plan: ``hits[source][i]`` for the i-th query of that source."""

    plan: Plan
    problems: list[str]
    hits: dict[str, list[list[Hit]]]

    def passages(self) -> list[Hit]:
        """All hits, one per passage (its best), in source order then rank."""
        seen: set[str] = set()
        out: list[Hit] = []
        for per_query in self.hits.values():
            for hits in per_query:
                for hit in hits:
                    if hit.passage.id not in seen:
                        seen.add(hit.passage.id)
                        out.append(hit)
        return out


class KnowledgeBase:
    """Search any source of a built knowledge base; results carry scores and provenance (:class:`Hit`)."""

    def __init__(
        self,
        cfg: KnowledgeConfig,
        sources: dict[str, SourceIndex],
        *,
        graph: Any = None,
        encoder: Any = None,
        reranker: Any = None,
        directory: Any = None,
        embeddings: Any = None,
    ) -> None:
        self.cfg = cfg
        self.text_sources = sources
        self.graph = graph  # GraphStore | None
        self.encoder = encoder  # TextEncoder used by the dense indexes
        self.reranker = reranker
        self.directory = directory
        self.embeddings = embeddings  # EmbeddingCache | None: document vectors on disk, by encoder fingerprint

    def __repr__(self) -> str:
        return f"KnowledgeBase({self.cfg.name!r}, sources={self.sources})"

    @property
    def sources(self) -> list[str]:
        return [s for s in self.cfg.sources if s in self.text_sources or (s == "graph" and self.graph is not None)]

    # ------------------------------------------------------------------------------------------- search
    def search(
        self, source: str, query: str, k: int | None = None, *, method: str | None = None, rerank: bool | None = None
    ) -> list[Hit]:
        """The top ``k`` passages of ``source`` for ``query`` (for ``graph``: ``term , question``)."""
        return self.search_batch(source, [query], k, method=method, rerank=rerank)[0]

    def search_batch(
        self,
        source: str,
        queries: Sequence[str],
        k: int | None = None,
        *,
        method: str | None = None,
        rerank: bool | None = None,
    ) -> list[list[Hit]]:
        """``search`` for many queries at once: the query encoder and BM25 run batched."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; use search for one")
        k = self.cfg.k if k is None else k
        if k < 1:
            raise KnowledgeError(f"k must be >= 1, got {k}")
        if source == "graph":
            return self._graph_batch(queries, k)
        index = self._text_source(source)
        method = method or self.cfg.retriever
        if method not in index.methods():
            raise KnowledgeError(
                f"method {method!r} is not available for source {source!r}; built: {', '.join(index.methods())} "
                f"(knowledge.indexes decides which indexes are built)"
            )
        rerank = self.cfg.rerank.enabled if rerank is None else rerank
        if rerank and self.reranker is None:
            raise KnowledgeError("rerank requested but no reranker was built (set knowledge.rerank.enabled=true)")
        depth = max(k, self.cfg.rerank.candidates) if rerank else k
        rankings = self._rank(index, list(queries), depth, method)
        out = []
        for query, ranking in zip(queries, rankings):
            label = method
            if rerank and ranking:
                texts = [index_text(index.passages[row]) for row, _ in ranking]  # what BM25 / dense saw
                ranking = [(ranking[i][0], score) for i, score in self.reranker.rerank(query, texts, k)]
                label = f"{method}+rerank"
            out.append(
                [
                    Hit(index.passages[row], float(score), rank, label, query)
                    for rank, (row, score) in enumerate(ranking[:k], start=1)
                ]
            )
        return out

    def search_sources(
        self,
        queries: Sequence[str],
        k: int,
        *,
        sources: Sequence[str] | None = None,
        per_source_k: int | None = None,
        method: str | None = None,
    ) -> list[list[Passage]]:
        """The best ``k`` passages for each query across several text sources: each source is searched for
        ``per_source_k`` (default ``k``) and the lists are fused by reciprocal rank. ``sources``: default every text
        source (the graph takes ``term , question`` queries, which a plain query is not)."""
        names = list(sources) if sources is not None else list(self.text_sources)
        for name in names:
            self._text_source(name)  # unknown names fail here, listing the known ones
        per = {s: self.search_batch(s, list(queries), per_source_k or k, method=method) for s in names}
        out = []
        for i in range(len(queries)):
            lists = [per[s][i] for s in names]
            table = [h.passage for hits in lists for h in hits]
            rankings, offset = [], 0
            for hits in lists:
                rankings.append([(offset + r, h.score) for r, h in enumerate(hits)])
                offset += len(hits)
            out.append([table[row] for row, _ in reciprocal_rank_fusion(rankings, k=self.cfg.fusion_k, top=k)])
        return out

    def search_plan(self, plan: Plan | str, k: int | None = None, *, method: str | None = None) -> PlanSearch:
        """Search every query of an Omni-RAG plan in its source; a plan string is parsed as far as it is valid
        and its problems are returned (a source this base lacks is reported, not fatal). Anything else (None, a
        dict, ...) is a caller's mistake and raises TypeError naming what was expected."""
        problems: list[str] = []
        if not isinstance(plan, (Plan, str)):
            raise TypeError(
                f"search_plan expects a Plan or an Omni-RAG plan string ('<book>q0 ; q1</book>...'), "
                f"got {type(plan).__name__}"
            )
        if isinstance(plan, str):
            from omnimed.knowledge.plan import parse_plan

            parsed = parse_plan(plan)
            plan, problems = parsed.plan, list(parsed.problems)
        hits: dict[str, list[list[Hit]]] = {}
        for source in plan.sources_used():
            if source not in self.sources:
                problems.append(f"source {source!r} is not in knowledge base {self.cfg.name!r}; its queries were skipped")
                continue
            hits[source] = self.search_batch(source, plan.queries[source], k, method=method)
        return PlanSearch(plan, problems, hits)

    def embed_docs(self, encoder: Any, texts: Sequence[str]) -> Any:
        """Document vectors of ``texts`` by ``encoder`` (any encoder, not only the base's own), through the on-disk
        embedding cache when the base has one: a reranker's passages are then encoded once per encoder across
        runs (the base's own encoder finds every indexed passage there already)."""
        if self.embeddings is None:
            return encoder.encode_docs(list(texts))
        return self.embeddings.embed(encoder, list(texts))

    # ------------------------------------------------------------------------------------------- internals
    def _text_source(self, source: str) -> SourceIndex:
        if source not in self.text_sources:
            raise KnowledgeError(
                f"unknown source {source!r} for knowledge base {self.cfg.name!r}; known: {', '.join(self.sources)}"
            )
        return self.text_sources[source]

    def _rank(self, index: SourceIndex, queries: list[str], k: int, method: str) -> list[Ranking]:
        if method == "bm25":
            return index.bm25.search(queries, k)
        if method == "dense":
            return index.dense.search(self.encoder.encode_queries(queries), k)
        depth = max(k, self.cfg.fusion_depth)
        sparse = index.bm25.search(queries, depth)
        dense = index.dense.search(self.encoder.encode_queries(queries), depth)
        return [reciprocal_rank_fusion([s, d], k=self.cfg.fusion_k, top=k) for s, d in zip(sparse, dense)]

    def _graph_batch(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        from omnimed.knowledge.graph_text import parse_graph_query

        if self.graph is None:
            raise KnowledgeError(
                f"unknown source 'graph' for knowledge base {self.cfg.name!r}; known: {', '.join(self.sources)}"
            )
        scorer = self._relation_scorer()
        out = []
        for query in queries:
            term, question = parse_graph_query(query)
            hits = self.graph.query(
                term,
                question,
                k_relations=self.cfg.graph.k_relations,
                k_concepts=min(k, self.cfg.graph.k_concepts),
                scorer=scorer,
                query_text=query,
            )
            out.append([self._with_passage_id(h) for h in hits])
        return out

    def _relation_scorer(self):
        """How relation lines are ranked against the question (``knowledge.graph.scorer``); None = lexical."""
        kind = self.cfg.graph.scorer
        if kind == "lexical":
            return None
        if kind == "dense" and self.encoder is not None:
            def dense(question: str, texts: list[str]) -> list[float]:
                q = self.encoder.encode_queries([question])[0]
                return (self.encoder.encode_docs(texts) @ q).tolist()

            return dense
        if kind == "rerank" and self.reranker is not None:
            def rerank(question: str, texts: list[str]) -> list[float]:
                scores = dict(self.reranker.rerank(question, texts, len(texts)))
                return [scores[i] for i in range(len(texts))]

            return rerank
        raise KnowledgeError(
            f"knowledge.graph.scorer={kind!r} needs "
            + ("a dense index (knowledge.indexes)" if kind == "dense" else "knowledge.rerank.enabled=true"
               if kind == "rerank" else "one of lexical, dense, rerank")
        )

    def _with_passage_id(self, hit: Hit) -> Hit:
        """Point a graph hit at the corpus passage of its concept when there is one (the world's ``graph:...``
        passages), so retrieval metrics can score graph hits against gold passage ids."""
        concept = self.graph.concept(hit.passage.id)
        ref = next((x for x in (concept.xrefs if concept else []) if x.startswith("graph:")), None)
        if ref is None:
            return hit
        passage = hit.passage.model_copy(update={"metadata": {**hit.passage.metadata, "chunk_of": ref}})
        return Hit(passage, hit.score, hit.rank, hit.retriever, hit.query, hit.extra)

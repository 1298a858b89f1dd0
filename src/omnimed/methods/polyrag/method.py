"""PolyRAG as a registered method (``pipeline=polyrag``): each query's first-stage candidates are judged from five
views (relevance, utility, supplement, authority, timeliness: :mod:`.views`), mixed with the domain's weights
(Eq. 7) and the top k chosen under the composability constraint (Eq. 8, :mod:`.mixture`). As a QA pipeline the
frozen reader answers from the chosen passages; as a retrieval method (``omnimed-evaluate task=retrieval
task.methods=[polyrag] pipeline=polyrag``) it reranks each query's candidates, and every view's score of every
candidate is kept with the predictions for audit.

The relevance and supplement judges are LMs served by the run's kind of backend with their own model
(``relevance_judge`` / ``supplement_judge``: a trained judge's export, :mod:`.judge_data`); on ``backend=oracle``
the oracle judges exactly. Without a relevance judge R is the knowledge base encoder's cosine (Eq. 3's
"otherwise"); without a supplement judge S is 0 for every passage (the view drops out). The utility view is the
cosine of ``utility_encoder`` (the distilled embedder's export; null: the knowledge base's encoder), whose
embeddings also give the topics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from omnimed.data.records import Passage
from omnimed.knowledge.types import Hit, index_text
from omnimed.methods.answer import Answer
from omnimed.methods.baselines.closed_book import ClosedBook, PipelineConfig
from omnimed.methods.polyrag import judges, views
from omnimed.methods.polyrag.candidates import search_candidates, text_sources
from omnimed.methods.polyrag.judge_data import JudgeDataConfig, build_judge_data
from omnimed.methods.polyrag.mixture import (
    ComposabilityConfig,
    ViewWeights,
    check_composability,
    mix,
    select,
    topics,
    weights_for,
)
from omnimed.methods.polyrag.utility import UtilityConfig, build_utilities
from omnimed.methods.registry import Stage, register_method


@dataclass
class PolyRAGConfig(PipelineConfig):
    """``candidates``: first-stage passages per query (PolyEVAL: 14.7), found with ``retriever`` across ``sources``
    (null: every text source); ``top_k``: passages kept (the paper's tables: 3); ``domain``: inquiry | policy |
    care, whose paper weights apply unless ``weights`` names its own (view -> weight); ``drop_views``: views whose
    weight is set to 0 (the view ablation); ``normalize``: rescale R, U
    and S to [0, 1] within each query's candidates; ``utility_encoder``, ``relevance_judge``,
    ``supplement_judge``: see the module doc; ``authority``, ``timeliness``, ``composability``: :mod:`.views`,
    :mod:`.mixture`."""

    name: str = "polyrag"
    top_k: int = 3
    candidates: int = 15
    domain: str = "inquiry"
    weights: ViewWeights = field(default_factory=ViewWeights)
    drop_views: list[str] = field(default_factory=list)
    normalize: bool = True
    utility_encoder: Optional[str] = None
    relevance_judge: Optional[str] = None
    supplement_judge: Optional[str] = None
    authority: views.AuthorityConfig = field(default_factory=views.AuthorityConfig)
    timeliness: views.TimelinessConfig = field(default_factory=views.TimelinessConfig)
    composability: ComposabilityConfig = field(default_factory=ComposabilityConfig)


def _utility(cfg: UtilityConfig, ctx: Any) -> Any:
    return build_utilities(cfg, teacher=ctx.backend, kb=ctx.knowledge_base, knowledge=ctx.knowledge,
                           root=str(ctx.root), progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed)


def _judge_data(cfg: JudgeDataConfig, ctx: Any) -> Any:
    return build_judge_data(cfg, teacher=ctx.backend, kb=ctx.knowledge_base, knowledge=ctx.knowledge,
                            root=str(ctx.root), progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed)


@dataclass
class Ranked:
    """One query's candidates in PolyRAG's order, each with its view scores, y and topic."""

    passages: list[Passage]
    views: list[dict[str, float]]


@register_method
class PolyRAG(ClosedBook):
    """PolyRAG (section 3) with a frozen reader."""

    name = "polyrag"
    config = PolyRAGConfig
    stages = (
        Stage("polyrag_utility", UtilityConfig, _utility),
        Stage("polyrag_judge_data", JudgeDataConfig, _judge_data),
    )

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.weights = weights_for(cfg.domain, cfg.weights)
        unknown = [v for v in cfg.drop_views if v not in views.VIEWS]
        if unknown:
            raise ValueError(f"pipeline.drop_views={list(cfg.drop_views)}: {unknown} are not views; views are "
                             f"{', '.join(views.VIEWS)}")
        self.weights.update({v: 0.0 for v in cfg.drop_views})
        views.check_views(cfg.authority, cfg.timeliness)
        check_composability(cfg.composability)
        if cfg.top_k < 1 or cfg.candidates < cfg.top_k:
            raise ValueError(f"pipeline.top_k={cfg.top_k}, pipeline.candidates={cfg.candidates}: expected "
                             "1 <= top_k <= candidates")
        self._served: tuple[Any, Any] | None = None
        self._judges: dict[str, Any] = {}
        self._utility_encoder: Any = None
        self._embedded: dict[int, dict[str, np.ndarray]] = {}
        self._query_vectors: dict[int, dict[str, np.ndarray]] = {}

    def needs_knowledge(self) -> bool:
        return True

    def serve(self, backend_cfg: Any, model: Any, role: str = "generator") -> tuple[Any, Any]:
        self._served = (backend_cfg, model)  # the judges are served by the same kind of backend
        return backend_cfg, model

    # ------------------------------------------------------------------------------------------- views
    def judge(self, task: str, kb: Any) -> Any:
        """The backend serving a judge (``relevance_judge`` / ``supplement_judge``), the oracle on
        ``backend=oracle``; None when the judge is not configured."""
        from omnimed.methods.backends import run_backend

        if task in self._judges:
            return self._judges[task]
        if self._served is None:
            raise RuntimeError("pipeline=polyrag: serve() names the run's backend before the judges are asked")
        backend_cfg, model = self._served
        path = self.cfg.relevance_judge if task == judges.RELEVANCE_TASK else self.cfg.supplement_judge
        if backend_cfg.name != "oracle" and path is None:
            self._judges[task] = None
            return None
        if backend_cfg.name != "oracle":
            backend_cfg = dataclasses.replace(backend_cfg, model=path)
        self._judges[task] = run_backend(backend_cfg, model=model, knowledge=kb.cfg,
                                         cache_root=self.cache_root)
        return self._judges[task]

    def utility_encoder(self, kb: Any) -> Any:
        if self._utility_encoder is None:
            if self.cfg.utility_encoder is None:
                self._utility_encoder = kb.encoder
            else:
                from omnimed.knowledge.encoders import TextEncoder
                from omnimed.models.config import named_model_config

                self._utility_encoder = TextEncoder(named_model_config(self.cfg.utility_encoder))
            if self._utility_encoder is None:
                raise ValueError(f"pipeline=polyrag needs an encoder: knowledge={kb.cfg.name} has no dense index; "
                                 "set pipeline.utility_encoder")
        return self._utility_encoder

    def embed_docs(self, encoder: Any, passages: Sequence[Passage], texts: Sequence[str], kb: Any = None
                   ) -> np.ndarray:
        """Passage embeddings, each computed once per encoder in this run (queries' candidates overlap) and, with
        ``kb``, read from or added to its on-disk embedding cache (the next run, an ablation row, reuses them)."""
        cache = self._embedded.setdefault(id(encoder), {})
        todo = [i for i, p in enumerate(passages) if p.id not in cache]
        if todo:
            missing = [texts[i] for i in todo]
            vectors = kb.embed_docs(encoder, missing) if kb is not None else encoder.encode_docs(missing)
            for i, vec in zip(todo, vectors):
                cache[passages[i].id] = vec
        return np.stack([cache[p.id] for p in passages])

    def prefetch(self, kb: Any, passages: Sequence[Passage], queries: Sequence[str] = ()) -> None:
        """Embed many queries' candidates, and the queries, in one call per encoder (the utility encoder, and the
        knowledge base's when it gives R) before ranking them one query at a time: one cache lookup and one write,
        and one batched query encoding, not one of each a query."""
        unique = list({p.id: p for p in passages}.values())
        encoders = [self.utility_encoder(kb)]
        if self.judge(judges.RELEVANCE_TASK, kb) is None and kb.encoder is not None:
            encoders.append(kb.encoder)
        texts = [index_text(p) for p in unique]
        todo = list(dict.fromkeys(queries))
        for encoder in encoders:
            self.embed_docs(encoder, unique, texts, kb)
            if todo:
                self._query_vectors.setdefault(id(encoder), {}).update(zip(todo, encoder.encode_queries(todo)))

    def query_vector(self, encoder: Any, query: str) -> np.ndarray:
        """``encoder``'s vector of ``query`` (batched ahead by :meth:`prefetch`, else encoded now)."""
        cached = self._query_vectors.get(id(encoder), {})
        return cached[query] if query in cached else encoder.encode_queries([query])[0]

    def rank(self, question_id: str, query: str, passages: Sequence[Passage], kb: Any) -> Ranked:
        """The candidates in PolyRAG's order with every view's score (see the module doc)."""
        if not passages:
            return Ranked([], [])
        texts = [index_text(p) for p in passages]
        encoder = self.utility_encoder(kb)
        q = self.query_vector(encoder, query)
        embedded = self.embed_docs(encoder, passages, texts, kb)
        scores: dict[str, list[float]] = {"utility": (embedded @ q).tolist()}
        for view, task in (("relevance", judges.RELEVANCE_TASK), ("supplement", judges.SUPPLEMENT_TASK)):
            judge = self.judge(task, kb)
            if judge is not None:
                scores[view] = judges.judge_scores(judge, task, question_id, query, passages)
            elif view == "relevance":
                rel = kb.encoder or encoder
                scores[view] = (self.embed_docs(rel, passages, texts, kb) @ self.query_vector(rel, query)).tolist()
            else:
                scores[view] = [0.0] * len(passages)
        if self.cfg.normalize:
            scores = {v: views.minmax(s) if v != "supplement" or any(s) else s for v, s in scores.items()}
        scores["authority"] = [views.authority(p, self.cfg.authority) for p in passages]
        scores["timeliness"] = views.timeliness(passages, self.cfg.timeliness)
        y = mix(scores, self.weights)
        topic = topics(np.asarray(embedded), self.cfg.composability)
        order = select(y.tolist(), topic, self.cfg.top_k, self.cfg.composability.constraint)
        rows = [{**{v: round(float(scores[v][i]), 6) for v in views.VIEWS}, "y": round(float(y[i]), 6),
                 "topic": topic[i]} for i in order]
        return Ranked([passages[i] for i in order], rows)

    # ------------------------------------------------------------------------------------------- retrieval
    def retrieve(self, kb: Any, source: str, queries: Sequence[tuple[str, str]], k: int, *,
                 candidates: Sequence[Sequence[Passage]] | None = None) -> list[list[Hit]]:
        """For the retrieval task: each (question id, query) searched in ``source`` for ``candidates`` passages
        (or given its pool of ``candidates``), reranked; hits carry every view's score in ``extra``."""
        if candidates is None:
            found = kb.search_batch(source, [text for _, text in queries], self.cfg.candidates,
                                    method=self.cfg.retriever)
            candidates = [[h.passage for h in hits] for hits in found]
        self.prefetch(kb, [p for pool in candidates for p in pool], [text for _, text in queries])
        out = []
        for (qid, text), pool in zip(queries, candidates):
            ranked = self.rank(qid, text, pool, kb)
            out.append([Hit(p, row["y"], rank, "polyrag", text, extra={"views": row})
                        for rank, (p, row) in enumerate(zip(ranked.passages[:k], ranked.views), start=1)])
        return out

    # ------------------------------------------------------------------------------------------- QA
    def ranked(self, questions: Sequence[Any], kb: Any) -> list[Ranked]:
        """Each question's candidates (searched with the question across ``sources``) in PolyRAG's order."""
        if kb is None:
            raise ValueError("pipeline=polyrag needs a knowledge base (knowledge=...)")
        sources = text_sources(kb, self.cfg.sources, "pipeline.sources")
        found = search_candidates(kb, [q.question for q in questions], self.cfg.candidates, sources=sources,
                                  method=self.cfg.retriever)
        self.prefetch(kb, [p for cands in found for p in cands], [q.question for q in questions])
        return [self.rank(q.id, q.question, cands, kb) for q, cands in zip(questions, found)]

    def evidence(self, questions: Sequence[Any], kb: Any) -> list[list[Passage]]:
        return [r.passages[: self.cfg.top_k] for r in self.ranked(questions, kb)]

    def answer(self, questions: Sequence[Any], backend: Any, kb: Any, *, seed: int,
               evidence: Sequence[Sequence[Passage]] | None = None) -> list[Answer]:
        """The reader's answers from the top ``top_k``; each answer keeps its passages' view scores."""
        if evidence is not None:
            return super().answer(questions, backend, kb, seed=seed, evidence=evidence)
        ranked = self.ranked(questions, kb)
        answers = super().answer(questions, backend, kb, seed=seed,
                                 evidence=[r.passages[: self.cfg.top_k] for r in ranked])
        return [dataclasses.replace(a, extras={**a.extras, "polyviews": r.views[: self.cfg.top_k],
                                               "candidates": len(r.passages)})
                for a, r in zip(answers, ranked)]

"""``omnimed-bench polyview``: the latency of PolyRAG scoring one query's candidates with every view, per query (the
paper reports about 200 ms a query on one L20 GPU).

The synthetic world's test questions (distinct texts) are the queries; each gets its ``candidates`` (default 15)
first-stage passages from a BM25 knowledge base over the world (built in a temporary folder, fused across the text
sources as ``pipeline=polyrag`` searches them). :class:`~omnimed.methods.polyrag.method.PolyRAG`, configured as
``conf/pipeline/polyrag.yaml`` (authority table, timeliness, DBSCAN composability), then ranks each query's
candidates through :meth:`~omnimed.methods.polyrag.method.PolyRAG.rank` with all five views on:

- relevance and supplement: two LM judges served by the ``hf`` backend (``conf/backend/hf.yaml``, its call cache
  off so every score is a forward pass; :func:`~omnimed.methods.polyrag.judges.judge_scores` reads
  ``next_token_logprobs``). Their weights do not change the latency, so by default the base ``smollm2-135m`` stands
  in for both trained judges (``relevance_judge`` / ``supplement_judge``: a trained judge's export);
- utility: a sentence-transformers encoder (``minilm-l6``, or the distilled embedder's export);
- authority, timeliness (dates read from the text with dateparser), the mixture (Eq. 7) and the DBSCAN topics and
  cover selection (Eq. 8).

``warmup`` queries run first, untimed (models load and first calls settle there); then ``queries`` other queries
are timed one at a time, end to end through ``rank``. Every timed query is cold: PolyRAG's per-run passage
embedding cache and the dates-in-text cache are cleared before it, and no query repeats, so the judges' kept
prompt caches (which let a row continue a prompt scored before) never hold a timed row's prompt. Within one query
the hf backend still computes the prompt its 15 rows share once, as in every run.

Reported: milliseconds per query (median, p90, mean, min, max and every query's), the median time of each part
(the judges' and the encoder's calls, timed by wrappers around the very objects ``rank`` calls; authority,
timeliness, mixture, topics and selection by wrapping those functions for the run; ``other``: the rest of
``rank``), the threads, and ``goal_ms`` (200) with ``meets_goal``: the median at most the goal. A miss is
reported as it is, and the command still exits 0.

``arithmetic`` says whether the goal is within the hardware's reach at all: one more cold query ranked under
torch's ``FlopCounterMode`` gives the floating-point operations a query costs (the judges' forward passes are
nearly all of them), and the best of a few square fp32 matrix products on the judges' device gives the rate the
device reaches at its easiest arithmetic. Their quotient, ``floor_ms``, is a lower bound on a query's time with
these models on this device whatever the code around them does; ``goal_reachable`` is it at most the goal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: the parts of ``PolyRAG.rank`` timed separately, in the order ``rank`` runs them
PARTS = ("utility_encoder", "relevance_judge", "supplement_judge", "authority", "timeliness", "mixture", "topics",
         "selection")


@dataclass
class PolyviewBenchConfig:
    """``queries`` timed after ``warmup`` untimed ones, each with ``candidates`` passages from the world of
    ``world_size``; ``relevance_judge`` / ``supplement_judge``: a ``conf/model`` name or a trained judge's export
    served by the hf backend (``batch_size`` rows a forward pass, ``device``, ``dtype``: the backend's, None for the
    judges' own); ``utility_encoder``: a ``conf/model`` encoder name or an export folder; ``domain``: the paper's
    view weights; ``threads``: ``torch.set_num_threads`` (None: torch's default); ``goal_ms``: the latency goal for
    the median query."""

    queries: int = 20
    warmup: int = 2
    candidates: int = 15
    world_size: str = "small"
    world_seed: int = 0
    relevance_judge: str = "smollm2-135m"
    supplement_judge: str = "smollm2-135m"
    utility_encoder: str = "minilm-l6"
    domain: str = "inquiry"
    batch_size: int = 8
    device: str = "cpu"
    dtype: str | None = None
    threads: int | None = 2
    goal_ms: float = 200.0

    def validate(self) -> None:
        if self.queries < 1 or self.warmup < 0 or self.candidates < 1 or self.batch_size < 1:
            raise ValueError(f"queries={self.queries}, warmup={self.warmup}, candidates={self.candidates}, "
                             f"batch_size={self.batch_size}: expected queries >= 1, warmup >= 0, candidates >= 1 "
                             "and batch_size >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads}: expected >= 1")


class _Timed:
    """A judge backend or an encoder whose calls add their seconds to ``clock[part]``; everything else passes
    through to the wrapped object."""

    def __init__(self, inner: Any, part: str, clock: dict[str, float], methods: tuple[str, ...]) -> None:
        self._inner, self._part, self._clock, self._methods = inner, part, clock, methods

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in self._methods:
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self._clock[self._part] = self._clock.get(self._part, 0.0) + time.perf_counter() - start

        return timed


def _timing(fn: Callable[..., Any], part: str, clock: dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock[part] = clock.get(part, 0.0) + time.perf_counter() - start

    return timed


@contextlib.contextmanager
def _timed_views(method: Any, kb: Any, clock: dict[str, float]) -> Iterator[None]:
    """While open, every part of ``method.rank`` in :data:`PARTS` adds its seconds to ``clock``: the judges and
    the encoder ``rank`` asks for are wrapped in place, the module functions it calls are patched."""
    from unittest import mock

    from omnimed.methods.polyrag import judges, views
    from omnimed.methods.polyrag import method as method_module

    encoder = method.utility_encoder(kb)
    parts = {judges.RELEVANCE_TASK: "relevance_judge", judges.SUPPLEMENT_TASK: "supplement_judge"}
    served = {task: method.judge(task, kb) for task in parts}
    off = [parts[task] for task, judge in served.items() if judge is None]
    if off:
        raise ValueError(f"polyview: {', '.join(off)} not configured; every view must be on")
    with contextlib.ExitStack() as stack:
        stack.callback(method._judges.update, served)
        stack.callback(setattr, method, "_utility_encoder", encoder)
        method._utility_encoder = _Timed(encoder, "utility_encoder", clock, ("encode_queries", "encode_docs"))
        for task, part in parts.items():
            method._judges[task] = _Timed(served[task], part, clock, ("next_token_logprobs",))
        for owner, name, part in ((views, "authority", "authority"), (views, "timeliness", "timeliness"),
                                  (method_module, "mix", "mixture"), (method_module, "topics", "topics"),
                                  (method_module, "select", "selection")):
            stack.enter_context(mock.patch.object(owner, name, _timing(getattr(owner, name), part, clock)))
        yield


def _queries(world: Any, n: int) -> list[Any]:
    """The world's test questions with distinct texts (then its other questions, if the test split is short)."""
    seen: set[str] = set()
    out = []
    for q in sorted(world.questions, key=lambda q: q.split != "test"):
        if q.question not in seen:
            seen.add(q.question)
            out.append(q)
        if len(out) == n:
            break
    if len(out) < n:
        raise ValueError(f"the world has {len(out)} distinct questions; {n} are needed (queries + warmup)")
    return out


def _cold(method: Any) -> None:
    """Forget what an earlier query left: PolyRAG's per-run passage embeddings and the dates read from texts."""
    from omnimed.methods.polyrag import views

    method._embedded.clear()
    views._date_in_text.cache_clear()


def _matmul_gflops(device: str, size: int = 1024, repeats: int = 5) -> float:
    """The device's fp32 matrix-product rate, GFLOP/s: the best of ``repeats`` ``size``-cubed products."""
    import torch

    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b  # first call: kernels chosen, memory touched
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def _arithmetic(method: Any, kb: Any, question: Any, candidates: list[Any], cfg: PolyviewBenchConfig,
                ) -> dict[str, Any]:
    """The floating-point operations of one more cold query and the latency floor they set on this device."""
    from torch.utils.flop_counter import FlopCounterMode

    _cold(method)
    with FlopCounterMode(display=False) as counter:
        method.rank(question.id, question.question, candidates, kb)
    gflop = counter.get_total_flops() / 1e9
    rate = _matmul_gflops(cfg.device)
    floor_ms = 1000 * gflop / rate
    return {"question_id": question.id, "gflop_per_query": round(gflop, 3), "matmul_gflops": round(rate, 1),
            "floor_ms": round(floor_ms, 1), "goal_reachable": floor_ms <= cfg.goal_ms}


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q))


def bench_polyview(cfg: PolyviewBenchConfig | None = None, log: Callable[[str], None] | None = None,
                   **overrides: Any) -> dict[str, Any]:
    """Time ``PolyRAG.rank`` on ``cfg.queries`` cold queries with every view on; see the module doc."""
    import torch

    from omnimed.bench.retrieval import hardware
    from omnimed.conf import load_option
    from omnimed.generation.factory import BackendConfig
    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.knowledge.corpus import world_of
    from omnimed.methods.polyrag import judges, views
    from omnimed.methods.polyrag.candidates import search_candidates, text_sources
    from omnimed.methods.polyrag.method import PolyRAG, PolyRAGConfig

    cfg = dataclasses.replace(cfg or PolyviewBenchConfig(), **overrides)
    cfg.validate()
    say = log or (lambda _msg: None)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "hardware": hardware()}
    knowledge = KnowledgeConfig(name=f"world_{cfg.world_size}", world_size=cfg.world_size, world_seed=cfg.world_seed,
                                indexes=["bm25"], retriever="bm25")
    with tempfile.TemporaryDirectory(prefix="omnimed-bench-polyview-") as tmp:
        say(f"building a BM25 knowledge base over the {cfg.world_size} world")
        kb = build_knowledge_base(knowledge, tmp, progress=False)
        kb.embeddings = None  # cold: no passage vector comes from the on-disk cache either
        questions = _queries(world_of(knowledge), cfg.warmup + cfg.queries + 1)  # the last: arithmetic
        pipeline = dataclasses.replace(load_option("pipeline", PolyRAG.name, PolyRAGConfig), candidates=cfg.candidates,
                                       domain=cfg.domain, relevance_judge=cfg.relevance_judge,
                                       supplement_judge=cfg.supplement_judge, utility_encoder=cfg.utility_encoder)
        method = PolyRAG(pipeline)
        backend = dataclasses.replace(load_option("backend", "hf", BackendConfig), cache=False, device=cfg.device,
                                      dtype=cfg.dtype, batch_size=cfg.batch_size)
        method.serve(backend, None)
        found = search_candidates(kb, [q.question for q in questions], cfg.candidates,
                                  sources=text_sources(kb, pipeline.sources, "pipeline.sources"),
                                  method=pipeline.retriever)
        short = [(q.id, len(c)) for q, c in zip(questions, found) if len(c) != cfg.candidates]
        if short:
            raise RuntimeError(f"first-stage search found fewer than {cfg.candidates} candidates: {short[:5]}")
        result["setup_s"] = round(time.perf_counter() - started, 2)

        say(f"warm-up: {cfg.warmup} queries (loading the judges and the encoder)")
        t0 = time.perf_counter()
        for q, cands in zip(questions[: cfg.warmup], found[: cfg.warmup]):
            method.rank(q.id, q.question, cands, kb)
        if cfg.warmup == 0:  # load the models anyway: loading is not what is timed
            method.utility_encoder(kb)
            for task in ("polyrag_relevance", "polyrag_supplement"):
                method.judge(task, kb)
        result["warmup_s"] = round(time.perf_counter() - t0, 2)

        say(f"timing {cfg.queries} queries, {cfg.candidates} candidates each, caches cleared before each")
        per_query: list[dict[str, Any]] = []
        for q, cands in zip(questions[cfg.warmup:-1], found[cfg.warmup:-1]):
            clock: dict[str, float] = {}
            _cold(method)
            with _timed_views(method, kb, clock):
                start = time.perf_counter()
                ranked = method.rank(q.id, q.question, cands, kb)
                total = time.perf_counter() - start
            missing = sorted(set(views.VIEWS) - set(ranked.views[0])) if ranked.views else list(views.VIEWS)
            if missing or len(ranked.passages) != cfg.candidates:
                raise RuntimeError(f"rank({q.id}) gave {len(ranked.passages)} passages, views missing: {missing}")
            parts_ms = {p: round(1000 * clock.get(p, 0.0), 3) for p in PARTS}
            parts_ms["other"] = round(1000 * total - sum(parts_ms.values()), 3)
            per_query.append({"question_id": q.id, "ms": round(1000 * total, 3), "candidates": len(ranked.passages),
                              "views": sorted(set(ranked.views[0]) & set(views.VIEWS)), "parts_ms": parts_ms})
            say(f"  query {len(per_query)}/{cfg.queries} ({q.id}): {1000 * total:,.0f} ms")
        say("counting one more cold query's floating-point operations and the device's matrix-product rate")
        result["arithmetic"] = _arithmetic(method, kb, questions[-1], found[-1], cfg)

    ms = [r["ms"] for r in per_query]
    median = statistics.median(ms)
    parts = {p: round(statistics.median(r["parts_ms"][p] for r in per_query), 3) for p in (*PARTS, "other")}
    result.update(
        queries=len(per_query), warmup_queries=cfg.warmup, candidates_per_query=cfg.candidates,
        threads=torch.get_num_threads(), device=cfg.device, dtype=cfg.dtype,
        judges={"relevance": cfg.relevance_judge, "supplement": cfg.supplement_judge,
                "backend": "hf", "call_cache": False, "prefix_cache_mb": backend.prefix_cache_mb,
                "share_prefix": getattr(method._judges.get(judges.RELEVANCE_TASK), "share_prefix", None),
                "batch_size": backend.batch_size},
        utility_encoder=cfg.utility_encoder, cold=True,
        median_ms=round(median, 3), p90_ms=round(_percentile(ms, 90), 3), mean_ms=round(statistics.fmean(ms), 3),
        min_ms=round(min(ms), 3), max_ms=round(max(ms), 3),
        ms_per_candidate=round(median / cfg.candidates, 3),
        parts_median_ms=parts, parts_share=({p: round(v / median, 4) for p, v in parts.items()} if median else {}),
        goal_ms=cfg.goal_ms, meets_goal=median <= cfg.goal_ms, per_query=per_query,
        wall_s=round(time.perf_counter() - started, 1),
    )
    result["hardware"]["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return result

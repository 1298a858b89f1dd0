"""Omni-RAG as a registered method (``pipeline=omnirag``): a planner writes a source plan for each question
(Prompt E.7), every query is searched in its source, and the frozen reader answers from the documents found.

The reader is the run's backend and model; the planner is served by the same kind of backend with its own model:
``planner=frozen`` the untrained ``planner_model`` (the run's model when null), or a trained planner's export
named in ``checkpoints`` (``sft``, ``spo`` = SFT then DPO, ``dpo`` = DPO only, ``sft_neg`` = SFT on negative
plans, ``spo_ood`` = trained without the one source it is tested with: ``{source}`` in its path; ``trainable`` and
``rafe``: table 4's supervised baselines, SFT then DPO on queries labelled by the reader's accuracy gain or by a
rerank score instead of the judge LLM). On the oracle
backend the planner is the world's oracle planner (:mod:`.expert`). Plan text is parsed as far as it is valid;
what was dropped is counted per question (``plan_problems``), never a crash. Besides accuracy the method reports
its plans' statistics (tables 12 and 13, figure 7) and how often the plan's documents hold the gold passages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.records import SOURCE_KINDS, Passage, Plan
from omnimed.generation.types import Request, SamplingParams
from omnimed.knowledge.plan import PlanParse, format_plan, parse_plan
from omnimed.methods.answer import Answer
from omnimed.methods.omnirag import expert as _expert  # noqa: F401 (registers the oracle's Omni-RAG tasks)
from omnimed.methods.omnirag import prompts, statistics
from omnimed.methods.omnirag.explore import ExploreConfig, build_exploration
from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements
from omnimed.methods.omnirag.pairs import PairsConfig, build_pairs
from omnimed.methods.registry import Method, Stage, register_method


def _miniature(task: str, run: str) -> str:
    return f"${{paths.root}}/checkpoints/{task}/omnirag-miniature-{run}/hf"


@dataclass
class OmniRAGConfig:
    """``planner``: frozen or a key of ``checkpoints`` (sft | spo | dpo | sft_neg | spo_ood | trainable | rafe, or
    one a run adds); ``planner_model``: the frozen planner (a ``conf/model`` name, a folder or a hub id; null: the
    run's model); ``planner_backend``: the backend kind that serves the planner (hf, vllm, openai; null or the
    reader's kind: the reader's, with its settings; another kind runs with its defaults, cached; on
    ``backend=oracle`` a trained planner needs ``planner_backend=hf``, else the oracle plans); ``checkpoints``: each
    trained planner's export; ``sources``: what the planner is told it may search (null: every source of the
    knowledge base); ``drop_sources``: sources whose documents are removed before reading (table 6);
    ``per_query_k``: documents retrieved per query; ``top_k``: documents the reader reads, taken rank by rank across
    the plan's queries so every query contributes its best first; ``planner_batch_size``: plans written per batch
    on the hf backend (null: the backend's ``batch_size``). A step of CPU decoding reads every weight once whatever
    the batch, so 32 plans at once write 1.65x the tokens a second of 8 (SmolLM2-135M, 2 threads). ``read``: false
    plans and searches only, without running the reader (tables 12 and 13 report the plans' statistics only).
    ``open_first_source``: start the planner's reply with the first offered source's opening tag (``<book>``), so a
    planner that does not follow a prompt offering fewer sources than it was trained on still writes queries for
    the one offered (table 8 at miniature; the paper's planners follow the prompt, and the paper preset leaves it
    off)."""

    name: str = "omnirag"
    planner: str = "frozen"
    planner_model: Optional[str] = None
    planner_backend: Optional[str] = None
    checkpoints: dict[str, str] = field(default_factory=lambda: {
        "sft": _miniature("planner_sft", "planner-sft"), "spo": _miniature("planner_dpo", "planner-spo"),
        "dpo": _miniature("planner_dpo", "planner-dpo"), "sft_neg": _miniature("planner_sft", "planner-sft-neg"),
        "spo_ood": _miniature("planner_dpo", "planner-spo-ood-{source}"),
        "trainable": _miniature("planner_dpo", "planner-trainable"), "rafe": _miniature("planner_dpo", "planner-rafe")})
    sources: Optional[list[str]] = None
    drop_sources: list[str] = field(default_factory=list)
    per_query_k: int = 3
    top_k: int = 5
    retriever: Optional[str] = None
    planner_max_new_tokens: int = 256
    planner_batch_size: Optional[int] = 32
    max_new_tokens: int = 512
    temperature: float = 0.0
    answer_mode: str = "generate"
    read: bool = True
    open_first_source: bool = False


def _explore(cfg: ExploreConfig, ctx: Any) -> Any:
    return build_exploration(cfg, expert=ctx.backend, knowledge=ctx.knowledge, root=str(ctx.root),
                             progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed)


def _judge(cfg: JudgeConfig, ctx: Any) -> Any:
    return build_judgements(cfg, judge=ctx.backend, kb=ctx.knowledge_base, knowledge=ctx.knowledge,
                            root=str(ctx.root), progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed)


def _pairs(cfg: PairsConfig, ctx: Any) -> Any:
    return build_pairs(cfg, knowledge=ctx.knowledge, root=str(ctx.root), log=ctx.log)


@dataclass
class Planned:
    """A question's plan as a planning method made it: the parse of the planner's text (or a plan the method built
    itself, with no problems), the failed call's error (the plan is then empty), and the method's own extras (a
    loop's scores, ...), stored with the question's prediction."""

    parse: PlanParse
    error: Optional[str] = None
    extras: dict[str, Any] = field(default_factory=dict)


def interleave(per_query: Sequence[Sequence[Any]], top_k: int) -> list[Any]:
    """Hits taken rank by rank across the queries (each query's best first), one per document, at most
    ``top_k``."""
    seen: set[str] = set()
    out: list[Any] = []
    for rank in range(max((len(h) for h in per_query), default=0)):
        for hits in per_query:
            if rank < len(hits) and hits[rank].doc_id not in seen and len(out) < top_k:
                seen.add(hits[rank].doc_id)
                out.append(hits[rank])
    return out


@register_method
class OmniRAG(Method):
    """Omni-RAG's source planning (Chen et al., 2025) with a frozen reader."""

    name = "omnirag"
    config = OmniRAGConfig
    metric_names = frozenset({"plan/*", "words_per_query/*", "queries_per_source/*", "query_diversity/*"})
    stages = (
        Stage("omnirag_explore", ExploreConfig, _explore),
        Stage("omnirag_judge", JudgeConfig, _judge),
        Stage("omnirag_pairs", PairsConfig, _pairs, calls_backend=False),
    )
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self._served: tuple[Any, Any] | None = None

    def needs_knowledge(self) -> bool:
        return True

    def reads(self) -> bool:
        return self.cfg.read

    def serve(self, backend_cfg: Any, model: Any, role: str = "generator") -> tuple[Any, Any]:
        self._served = (backend_cfg, model)  # the planner is served by the same kind of backend
        return backend_cfg, model

    def serve_planner(self, kb: Any) -> Any:
        """The backend that serves the planner ``pipeline.planner`` names."""
        from omnimed.methods.backends import run_backend

        cfg = self.cfg
        if self._served is None:
            raise RuntimeError("pipeline=omnirag: serve() names the run's backend before answer()")
        backend_cfg, model = self._served
        if cfg.planner == "frozen":
            path = cfg.planner_model
        elif cfg.planner in cfg.checkpoints:
            path = cfg.checkpoints[cfg.planner]
            if "{source}" in path:  # one planner per held-out source (table 8's OOD planner)
                if not cfg.sources or len(cfg.sources) != 1:
                    raise ValueError(f"pipeline.checkpoints.{cfg.planner}={path}: {{source}} is the one source "
                                     f"available at test time; set pipeline.sources=[<source>] (got {cfg.sources})")
                path = path.replace("{source}", cfg.sources[0])
        else:
            raise ValueError(f"pipeline.planner={cfg.planner!r}: expected frozen or a key of pipeline.checkpoints "
                             f"({', '.join(cfg.checkpoints)}); a planner of your own: "
                             f"+pipeline.checkpoints.{cfg.planner}=<its export folder>")
        if cfg.planner_backend is not None and cfg.planner_backend != backend_cfg.name:
            from omnimed.generation.factory import BackendConfig

            # the planner backend's own defaults: memoised even beside the oracle reader, which caches nothing
            backend_cfg = BackendConfig(name=cfg.planner_backend, cache_dir=backend_cfg.cache_dir)
        if backend_cfg.name != "oracle":
            backend_cfg = dataclasses.replace(backend_cfg, model=path, batch_size=cfg.planner_batch_size
                                              or backend_cfg.batch_size)
        return run_backend(backend_cfg, model=model, knowledge=kb.cfg,
                           cache_root=self.cache_root)

    def write_plans(self, questions: Sequence[Any], planner: Any, sources: Sequence[str], seed: int) -> list[Any]:
        """Each question's plan text from the planner (greedy, Prompt E.7), or the call's error: what
        ``omnimed-bench plan`` times."""
        prefix = self.plan_prefix(sources)
        # one source offered and its tag opened: the reply ends where the tag closes (nothing after it is searched)
        closing = f"</{sources[0]}>" if prefix and len(sources) == 1 else ""
        params = SamplingParams(max_new_tokens=self.cfg.planner_max_new_tokens, temperature=0.0, seed=seed,
                                stop=(closing,) if closing else ())
        meta = {"assistant_prefix": prefix} if prefix else {}
        requests = [Request(prompts.planning_messages(q, sources),
                            {"task": "omnirag_plan", "question_id": q.id, **meta}) for q in questions]
        out = []
        for gens in planner.generate(requests, params):
            g = gens[0]
            if g.error is None and prefix:
                ended = closing and g.finish_reason == "stop" and closing not in g.text
                g = dataclasses.replace(g, text=prefix + g.text + (closing if ended else ""))
            out.append(g)
        return out

    def plan_prefix(self, sources: Sequence[str]) -> str:
        """What the planner's reply is started with: the first offered source's opening tag under
        ``open_first_source``, else nothing. The returned plan texts include it, and, when that is the only source
        offered, end at its closing tag (generation stops there)."""
        return f"<{sources[0]}>" if self.cfg.open_first_source and sources else ""

    def plan(self, questions: Sequence[Any], planner: Any, sources: Sequence[str], kb: Any,
             seed: int) -> list[Planned]:
        """Each question's plan: the planner's reply (:meth:`write_plans`), parsed as far as it is valid, and the
        reply itself (``plan_text`` in the predictions, so a later parser can read a finished run again). Baselines
        that plan otherwise (Query2Doc, Reflexion, SeRTS) override this and keep the rest."""
        return [Planned(parse_plan(g.text if g.error is None else "", question_id=q.id, sources=sources), g.error,
                        {"plan_text": g.text})
                for q, g in zip(questions, self.write_plans(questions, planner, sources, seed))]

    def search(self, kb: Any, plan: Plan) -> tuple[list[tuple[str, str, list[Any]]], list[str]]:
        """Every query of ``plan`` searched in its source (``per_query_k`` each; ``drop_sources`` left out):
        (source, query, hits) per query, and the search's problems (a source the knowledge base lacks, queries
        for a source ``sources`` does not make available: not searched)."""
        problems: list[str] = []
        if self.cfg.sources:
            barred = [s for s in plan.sources_used() if s not in self.cfg.sources]
            problems += [f"queries for {s} not searched: pipeline.sources={list(self.cfg.sources)}" for s in barred]
            plan = plan.model_copy(update={"queries": {s: qs for s, qs in plan.queries.items() if s not in barred}})
        found = kb.search_plan(plan, self.cfg.per_query_k, method=self.cfg.retriever)
        per_query = [(source, query, hits) for source, lists in found.hits.items()
                     if source not in self.cfg.drop_sources for query, hits in zip(plan.queries[source], lists)]
        return per_query, problems + found.problems

    def answer(self, questions: Sequence[Any], backend: Any, kb: Any, *, seed: int) -> list[Answer]:
        from omnimed.methods.baselines.closed_book import ClosedBook, PipelineConfig

        cfg = self.cfg
        sources = [s for s in (cfg.sources or kb.sources) if s in SOURCE_KINDS]
        plans = self.plan(questions, self.serve_planner(kb), sources, kb, seed)
        evidence: list[list[Passage]] = []
        extras: list[dict[str, Any]] = []
        for q, planned in zip(questions, plans):
            per_query, problems = self.search(kb, planned.parse.plan)
            retrieved = {h.doc_id for _, _, hits in per_query for h in hits}
            gold = set(q.gold_passages)
            shown = interleave([hits for _, _, hits in per_query], cfg.top_k)
            evidence.append([h.passage for h in shown])
            extras.append({"plan": format_plan(planned.parse.plan), "plan_queries": dict(planned.parse.plan.queries),
                           "plan_problems": planned.parse.problems + problems,
                           "planner_error": planned.error, "retrieved": sorted(retrieved),
                           "gold_recall": len(gold & retrieved) / len(gold) if gold else None,
                           "gold_shown": len(gold & {h.doc_id for h in shown}) / len(gold) if gold else None,
                           "named_by": q.metadata.get("named_by"), **planned.extras})
        if cfg.read:
            reader = ClosedBook(PipelineConfig(max_new_tokens=cfg.max_new_tokens,
                                               temperature=cfg.temperature, answer_mode=cfg.answer_mode))
            answers = reader.answer(questions, backend, None, seed=seed, evidence=evidence)
        else:  # plans and searches only: what would have been read, no prediction
            answers = [Answer(q.id, None, False, evidence=[p.id for p in shown])
                       for q, shown in zip(questions, evidence)]
        return [dataclasses.replace(a, extras={**a.extras, **x}, error=a.error or x["planner_error"])
                for a, x in zip(answers, extras)]

    def undefined_metrics(self, answers: Sequence[Answer]) -> dict[str, str]:
        return statistics.undefined_by_source([a.extras["plan_queries"] for a in answers])

    def metrics(self, answers: Sequence[Answer]) -> dict[str, float]:
        plans = [a.extras["plan_queries"] for a in answers]
        out: dict[str, float] = {
            "plan/malformed": sum(bool(a.extras["plan_problems"]) for a in answers) / max(1, len(answers)),
            "plan/problems": sum(len(a.extras["plan_problems"]) for a in answers) / max(1, len(answers)),
            "plan/queries": sum(len(qs) for p in plans for qs in p.values()) / max(1, len(plans)),
            **statistics.words_and_counts(plans),
            **{f"query_diversity/{s}": v for s, v in statistics.diversity_by_source(plans).items()},
        }
        for key in ("gold_recall", "gold_shown"):
            values = [a.extras[key] for a in answers if a.extras[key] is not None]
            if values:
                out[f"plan/{key}"] = sum(values) / len(values)
            # the world's questions say how they name their subject (its passages' name, an alias only the graph's
            # names entry links, a description): a planner can copy a name, not know an alias of an unseen subject
            by_group: dict[str, list[float]] = {}
            for a in answers:
                if a.extras[key] is not None and a.extras.get("named_by") is not None:
                    by_group.setdefault(a.extras["named_by"], []).append(a.extras[key])
            out.update({f"plan/{key}/named_by_{g}": sum(v) / len(v) for g, v in sorted(by_group.items())})
        return out

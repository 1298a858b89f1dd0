"""Stage ``omnirag_explore`` (Omni-RAG 4.2.1, Prompt E.3): an expert LLM writes ``n_queries`` varied queries for
every source of every training question.

The expert is the run's backend: the ``openai`` backend at a vLLM server with Qwen2.5-72B-Instruct-AWQ in the
paper preset; in miniature the world's oracle-guided explorer (:mod:`.expert`) or SmolLM2 (``backend=hf``). A
reply is parsed as far as it is valid (:func:`~omnimed.knowledge.plan.parse_exploration`); its queries become
:class:`~omnimed.data.records.SourceQuery` records, what was wrong with it is counted in the manifest, and so is
the diversity of each source's queries (Eq. 5, appendix A.1). An expert call that failed is asked again by the
next run; a rerun of a finished stage does nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import SOURCE_KINDS, MultipleChoiceQuestion, SourceQuery
from omnimed.generation.types import Request, SamplingParams
from omnimed.knowledge.plan import parse_exploration
from omnimed.methods.omnirag import prompts
from omnimed.methods.omnirag.statistics import DIVERSITY_ENCODER, diversity_by_source
from omnimed.methods.stages import select_questions

STAGE = "omnirag_explore"


@dataclass
class ExploreConfig:
    """``questions``: ``world`` (the knowledge config's world) or a records path of multiple-choice questions;
    ``split``: the questions' split (the paper explores its training + dev sets); ``n_questions``: at most this
    many, drawn with ``seed`` (null: all); ``n_queries``: queries per source (the paper: 6, where diversity
    peaks); ``sources``: the sources explored (``spo_ood`` leaves one out); ``kinds``: the world's question kinds
    to keep (null: all); ``diversity_encoder``: the ``conf/model`` encoder of Eq. 5 (null: no diversity in the
    manifest); ``out``: a fixed output folder (default ``builds/omnirag_explore/<settings key>``)."""

    name: str = STAGE
    questions: str = "world"
    split: str = "train"
    n_questions: Optional[int] = None
    n_queries: int = 6
    sources: list[str] = field(default_factory=lambda: list(SOURCE_KINDS))
    kinds: Optional[list[str]] = None
    seed: int = 0
    max_new_tokens: int = 768
    temperature: float = 0.0
    diversity_encoder: Optional[str] = DIVERSITY_ENCODER
    batch_size: int = 16
    out: Optional[str] = None


def check_sources(sources: Sequence[str], key: str) -> None:
    """Refuse a source list that names no source or an unknown one (``key`` names the config key)."""
    unknown = [s for s in sources if s not in SOURCE_KINDS]
    if unknown or not sources:
        raise ValueError(f"{key}={list(sources)}: expected some of {', '.join(SOURCE_KINDS)}")


def training_questions(cfg: Any, knowledge: Any) -> list[MultipleChoiceQuestion]:
    """The questions a stage explores (:func:`~omnimed.methods.stages.select_questions` with the stage's keys)."""
    return select_questions(cfg.questions, knowledge, split=cfg.split, kinds=cfg.kinds, n=cfg.n_questions,
                            seed=cfg.seed)


def build_exploration(cfg: ExploreConfig, *, expert: Any, knowledge: Any, root: str = ".", progress: bool = True,
                      log=print, max_failed: float = MAX_FAILED_SHARE) -> StageResult:
    """Run the stage (or reuse its finished output) with ``expert``, a generation backend."""
    check_sources(cfg.sources, "stage.sources")
    if cfg.n_queries < 1:
        raise ValueError(f"stage.n_queries={cfg.n_queries}: expected at least 1 query per source")
    stage = open_stage(STAGE, cfg, root=root, expert=getattr(expert, "model_id", str(expert)),
                       prompts=prompts.PROMPT_VERSION, knowledge=knowledge.name)
    if stage.finished():
        counts = stage.manifest()["explore_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['queries']} queries); nothing to do")
        return StageResult(stage.path, counts, True)
    questions = training_questions(cfg, knowledge)
    done = stage.start()
    todo = [q for q in questions if q.id not in done]
    log(f"{STAGE}: {len(questions)} questions, {len(done)} explored earlier, {len(todo)} to go -> {stage.path}")
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)

    def work(batch: Sequence[MultipleChoiceQuestion]) -> list[dict[str, Any] | Failed]:
        requests = [Request(prompts.exploration_messages(q, cfg.n_queries, cfg.sources),
                            {"task": STAGE, "question_id": q.id, "n_queries": cfg.n_queries}) for q in batch]
        out: list[dict[str, Any] | Failed] = []
        for q, gens in zip(batch, expert.generate(requests, params)):
            if gens[0].error is not None:
                out.append(Failed(q.id, gens[0].error))
                continue
            queries, problems = parse_exploration(gens[0].text, cfg.n_queries)
            unasked = [s for s in queries if s not in cfg.sources]
            problems += [f"<{s}> was not asked for (dropped)" for s in unasked]
            out.append({"id": q.id, "queries": {s: qs for s, qs in queries.items() if s in cfg.sources},
                        "problems": problems})
        return out

    failed = stage.process(todo, work, total=len(questions), backend=describe_backend(expert), max_failed=max_failed,
                           batch_size=cfg.batch_size, progress=progress, label=f"{STAGE}: expert queries")
    done = stage.start()
    explored = [done[q.id] for q in questions if q.id in done]
    records = [SourceQuery(id=f"{item['id']}:{source}:{j}", question_id=item["id"], source=source, query=query)
               for item in explored for source, qs in item["queries"].items() for j, query in enumerate(qs)]
    problems = Counter(p.split(" at char")[0].split(" (")[0] for item in explored for p in item["problems"])
    counts: dict[str, Any] = {
        "questions": len(explored), "queries": len(records),
        "replies_with_problems": sum(bool(item["problems"]) for item in explored),
        "problems": dict(problems.most_common(20)),
        **{f"queries/{s}": sum(r.source == s for r in records) for s in cfg.sources},
    }
    if failed:  # asked again by the next run
        counts["failed"] = len(failed)
    diversity = (diversity_by_source([item["queries"] for item in explored], encoder_name=cfg.diversity_encoder)
                 if cfg.diversity_encoder else {})
    counts.update({f"query_diversity/{s}": round(v, 4) for s, v in diversity.items()})
    stage.finish(records, failed=failed, explore_counts=counts)
    log(f"{STAGE}: {counts['queries']} queries for {counts['questions']} questions in {stage.path} "
        f"({counts['replies_with_problems']} replies parsed with problems; diversity "
        + ", ".join(f"{s} {v:.3f}" for s, v in diversity.items()) + ")")
    return StageResult(stage.path, counts, False)

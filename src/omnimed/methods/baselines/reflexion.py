"""``pipeline=reflexion``: Omni-RAG's Reflexion baseline (Shinn et al., 2023, as Hu et al., 2024 adapt it;
appendix D.3). The frozen planner writes a plan (Prompt E.7); the plan's documents are searched and reviewed by the
same LM, which scores them on an additive 0-5 rubric and suggests better queries (E.9); the planner then writes a
new plan given every earlier plan with its review (E.8). The loop ends at the maximum score or after
``max_iterations`` plans; the best-scored plan (the later one on a tie) is read. Retrieval, reading and the plan
statistics are Omni-RAG's.

:func:`review` (search, show, score) is shared with SeRTS (:mod:`.serts`), which searches a tree of such plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnimed.generation.types import Request, SamplingParams
from omnimed.knowledge.plan import PlanParse, format_plan, parse_plan
from omnimed.methods.answer import Answer
from omnimed.methods.omnirag import prompts
from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig, Planned, interleave
from omnimed.methods.omnirag.prompts import MAX_FEEDBACK_SCORE, Feedback
from omnimed.methods.registry import register_method


@dataclass
class ReflexionConfig(OmniRAGConfig):
    """Omni-RAG's settings (the planner and reviewer is the frozen planner: ``planner_model``,
    ``planner_backend``), ``max_iterations``: plans written at most (the paper: 8), ``feedback_max_new_tokens``:
    the review's budget (E.9 asks for at most 100 words and a score)."""

    name: str = "reflexion"
    max_iterations: int = 8
    feedback_max_new_tokens: int = 256


@dataclass
class Reviewed:
    """A plan, its review (None when the review call failed) and the failed call's error."""

    parse: PlanParse
    feedback: Feedback | None = None
    error: str | None = None


def review(method: OmniRAG, questions: Sequence[Any], parses: Sequence[PlanParse], planner: Any, kb: Any,
           sources: Sequence[str], seed: int) -> list[Reviewed]:
    """Each plan searched, the documents the reader would read (``top_k``, rank by rank across the queries) shown
    under their source and query, and scored by the planner LM (Prompt E.9): one greedy call per plan."""
    requests = []
    for q, parse in zip(questions, parses):
        per_query, _ = method.search(kb, parse.plan)
        shown = {h.doc_id for h in interleave([hits for _, _, hits in per_query], method.cfg.top_k)}
        found, seen = [], set()
        for source, query, hits in per_query:
            docs = [h for h in hits if h.doc_id in shown and h.doc_id not in seen]
            seen.update(h.doc_id for h in docs)
            found.append((source, query, [h.passage for h in docs]))
        requests.append(Request(prompts.feedback_messages(q, found, sources),
                                {"task": "omnirag_feedback", "question_id": q.id, "passage_ids": sorted(shown)}))
    params = SamplingParams(max_new_tokens=method.cfg.feedback_max_new_tokens, temperature=0.0, seed=seed)
    return [Reviewed(parse, None, gens[0].error) if gens[0].error is not None
            else Reviewed(parse, prompts.read_feedback(gens[0].text))
            for parse, gens in zip(parses, planner.generate(requests, params))]


def history_text(reviewed: Sequence[Reviewed]) -> str:
    """Earlier plans with their reviews, as E.8's feedback section shows them."""
    return "\n\n".join(f"## Plan {i}\n{format_plan(r.parse.plan)}\nScore: {r.feedback.score} of "
                       f"{MAX_FEEDBACK_SCORE}\nSuggestion: {r.feedback.suggestion or '(none)'}"
                       for i, r in enumerate(reviewed, start=1) if r.feedback is not None)


def plan_requests(questions: Sequence[Any], histories: Sequence[Sequence[Reviewed]],
                  sources: Sequence[str]) -> list[Request]:
    """The planner's next request per question: E.7 before any review, E.8 with the reviews so far after."""
    return [Request(prompts.revision_messages(q, history_text(h), sources) if h
                    else prompts.planning_messages(q, sources), {"task": "omnirag_plan", "question_id": q.id})
            for q, h in zip(questions, histories)]


def write_and_review(method: OmniRAG, questions: Sequence[Any], histories: Sequence[Sequence[Reviewed]],
                     planner: Any, kb: Any, sources: Sequence[str], params: SamplingParams,
                     seed: int) -> list[list[Reviewed]]:
    """``params.n`` new plans per question given its reviews so far (:func:`plan_requests`), each reviewed
    (:func:`review`); a plan whose call failed is not reviewed and carries the error."""
    gens = planner.generate(plan_requests(questions, histories, sources), params)
    flat = [(j, g, parse_plan(g.text if g.error is None else "", question_id=questions[j].id, sources=sources))
            for j, sampled in enumerate(gens) for g in sampled]
    ok = [(j, parse) for j, g, parse in flat if g.error is None]
    reviews = iter(review(method, [questions[j] for j, _ in ok], [parse for _, parse in ok], planner, kb, sources,
                          seed))
    out: list[list[Reviewed]] = [[] for _ in questions]
    for j, g, parse in flat:
        out[j].append(next(reviews) if g.error is None else Reviewed(parse, None, g.error))
    return out


def finished(r: Reviewed) -> bool:
    """Whether a loop ends at this plan: its call failed, or its review gave the maximum score."""
    return r.error is not None or (r.feedback is not None and r.feedback.score >= MAX_FEEDBACK_SCORE)


def chosen(reviewed: Sequence[Reviewed], extras: dict[str, Any] | None = None) -> Planned:
    """The best-scored reviewed plan (the later one on a tie), with the loop's record in its extras; a loop whose
    calls failed before any review carries the error."""
    scored = [(r.feedback.score, i) for i, r in enumerate(reviewed) if r.feedback is not None]
    error = next((r.error for r in reviewed if r.error is not None), None)
    record = {"loop_scores": [r.feedback.score if r.feedback else None for r in reviewed],
              "loop_feedback_problems": sum(len(r.feedback.problems) for r in reviewed if r.feedback),
              **(extras or {})}
    if not scored:
        return Planned(reviewed[-1].parse if reviewed else parse_plan(""), error or "no plan was reviewed",
                       {**record, "loop_chosen": None})
    best = max(scored)[1]
    return Planned(reviewed[best].parse, error, {**record, "loop_chosen": best})


def loop_metrics(answers: Sequence[Answer]) -> dict[str, float]:
    """Plans written per question, the share of loops that reached the maximum score, the chosen plan's score and
    the share of reviews that could not be read in full."""
    loops = [a.extras for a in answers if "loop_scores" in a.extras]
    if not loops:
        return {}
    scores = [s for x in loops for s in x["loop_scores"] if s is not None]
    picked = [x["loop_scores"][x["loop_chosen"]] for x in loops if x["loop_chosen"] is not None]
    return {"loop/plans": sum(len(x["loop_scores"]) for x in loops) / len(loops),
            "loop/reached_max": sum(MAX_FEEDBACK_SCORE in x["loop_scores"] for x in loops) / len(loops),
            "loop/chosen_score": sum(picked) / len(picked) if picked else 0.0,
            "loop/unreadable_reviews": sum(x["loop_feedback_problems"] > 0 for x in loops) / len(loops),
            "loop/mean_score": sum(scores) / len(scores) if scores else 0.0}


@register_method
class Reflexion(OmniRAG):
    """Plan, review, revise with every review so far; at most ``max_iterations`` plans."""

    name = "reflexion"
    config = ReflexionConfig
    stages = ()
    metric_names = OmniRAG.metric_names | {"loop/*"}

    def plan(self, questions: Sequence[Any], planner: Any, sources: Sequence[str], kb: Any,
             seed: int) -> list[Planned]:
        if self.cfg.max_iterations < 1:
            raise ValueError(f"pipeline.max_iterations={self.cfg.max_iterations}: expected at least 1")
        histories: list[list[Reviewed]] = [[] for _ in questions]
        done = [False] * len(questions)
        params = SamplingParams(max_new_tokens=self.cfg.planner_max_new_tokens, temperature=0.0, seed=seed)
        for _ in range(self.cfg.max_iterations):
            active = [i for i, d in enumerate(done) if not d]
            if not active:
                break
            written = write_and_review(self, [questions[i] for i in active], [histories[i] for i in active],
                                       planner, kb, sources, params, seed)
            for i, (r,) in zip(active, written):
                histories[i].append(r)
                done[i] = finished(r)
        return [chosen(h) for h in histories]

    def metrics(self, answers: Sequence[Answer]) -> dict[str, float]:
        return {**super().metrics(answers), **loop_metrics(answers)}


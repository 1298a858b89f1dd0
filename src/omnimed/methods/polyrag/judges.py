"""PolyRAG's relevance and supplement judges (Tables 4-5): a judge LM's probability of its label tokens is the view
score. The world's oracle answers both tasks exactly, which is what the judges' training data is built from
(:mod:`.judge_data`) and what pipelines on ``backend=oracle`` read:

* relevance grade from the oracle's passage utility: 5 (states the whole answer) -> A, 4 -> B, 3 (about the
  subject) -> C, 2 (outdated, or names the subject in passing) -> D, 1 -> E;
* supplement: Yes for a passage about the question's subject that does not state the whole answer (utility 3 or
  4), No otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from omnimed.data.records import Passage
from omnimed.generation.oracle import OracleBackend, Reply, register_task
from omnimed.generation.types import Request
from omnimed.methods.polyrag.prompts import (
    RELEVANCE_GRADES,
    RELEVANT_GRADES,
    SUPPLEMENT_LABELS,
    relevance_messages,
    supplement_messages,
)

RELEVANCE_TASK = "polyrag_relevance"
SUPPLEMENT_TASK = "polyrag_supplement"


def oracle_grade(oracle: Any, question: Any, passage: Any) -> str:
    return RELEVANCE_GRADES[5 - oracle.utility(question, passage)]


def oracle_supplement(oracle: Any, question: Any, passage: Any) -> str:
    return "Yes" if oracle.utility(question, passage) in (3, 4) else "No"


@register_task(RELEVANCE_TASK, ("question_id", "passage_id"))
def _relevance(b: OracleBackend, m: dict[str, Any]) -> Reply:
    grade = oracle_grade(b.oracle, b.question(m["question_id"]), m["passage_id"])
    return Reply(grade, grade)


@register_task(SUPPLEMENT_TASK, ("question_id", "passage_id"))
def _supplement(b: OracleBackend, m: dict[str, Any]) -> Reply:
    label = oracle_supplement(b.oracle, b.question(m["question_id"]), m["passage_id"])
    return Reply(label, label)


def _share(logprobs: dict[str, float], labels: Sequence[str], positive: Sequence[str]) -> float:
    """P(positive labels) / P(all labels), from next-token log-probs restricted to ``labels``."""
    top = max(logprobs[t] for t in labels)
    p = {t: math.exp(logprobs[t] - top) for t in labels}
    return sum(p[t] for t in positive) / sum(p.values())


def judge_scores(judge: Any, task: str, question_id: str, query: str, passages: Sequence[Passage]) -> list[float]:
    """Each passage's view score from ``judge`` (a backend): relevance P(A or B) over the five grades, supplement
    P(Yes) over Yes / No."""
    if task == RELEVANCE_TASK:
        build, labels, positive = relevance_messages, RELEVANCE_GRADES, RELEVANT_GRADES
    else:
        build, labels, positive = supplement_messages, SUPPLEMENT_LABELS, ("Yes",)
    requests = [Request(build(query, p), {"task": task, "question_id": question_id, "passage_id": p.id})
                for p in passages]
    return [_share(lp, labels, positive) for lp in judge.next_token_logprobs(requests, list(labels))]

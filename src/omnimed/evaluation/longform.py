"""Long-form answers scored statement by statement (PolyRAG section 5.2.1): each answer is cut into statements, a
judge labels every statement against the reference answer as correct, incorrect or not mentioned, and the shares
and counts of each label are averaged over answers, as the paper averages them per answer.

Metrics: ``statement_{correct,incorrect,not_mentioned,unparsed}_ratio`` (mean over answers that have at least one
statement), ``statement_{correct,incorrect,not_mentioned}_count`` (mean per answer, every answer counted),
``answers_without_statements`` (answers with nothing to judge: empty, or no usable answer); with
:func:`statement_intervals`, each share's and count's bootstrap 95% interval over questions (``<metric>_ci_low`` /
``_ci_high``), which the paper does not report and a table needs to tell two retrievers apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnimed.data.records import OpenQuestion
from omnimed.evaluation.metrics import (
    JUDGE_FAILED,
    STATEMENT_LABELS,
    UNPARSED,
    judge_statements,
    mean_interval,
    split_statements,
    statement_ratios,
)


def score_answers(questions: Sequence[OpenQuestion], answers: Sequence[str | None], judge,
                  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per answer: its statements, their labels and the judge's error when a call failed (``judge_error``); and
    the averaged metrics."""
    if len(questions) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(questions)} questions")
    per_answer: list[dict[str, Any]] = []
    for q, answer in zip(questions, answers):
        statements = split_statements(answer or "")
        labels = judge_statements(judge, q.reference_answer, statements, question=q.question, question_id=q.id)
        failed = next((x.removeprefix(JUDGE_FAILED) for x in labels if x.startswith(JUDGE_FAILED)), None)
        per_answer.append({"statements": statements, "labels": labels, "ratios": statement_ratios(labels),
                           "judge_error": failed})
    judged = [a for a in per_answer if a["statements"]]
    metrics: dict[str, float] = {"answers_without_statements": float(len(per_answer) - len(judged))}
    for label in (*STATEMENT_LABELS, UNPARSED):
        values = [a["ratios"][label] for a in judged]
        metrics[f"statement_{label}_ratio"] = sum(values) / len(values) if values else float("nan")
    for label in STATEMENT_LABELS:
        counts = [sum(x == label for x in a["labels"]) for a in per_answer]
        metrics[f"statement_{label}_count"] = sum(counts) / len(counts) if counts else float("nan")
    return per_answer, metrics


def statement_intervals(per_answer_by_seed: Sequence[Sequence[dict[str, Any]]], *, n_resamples: int = 1000,
                        seed: int = 0) -> dict[str, float]:
    """Bootstrap 95% intervals of the statement metrics with the question as the unit (:func:`score_answers`'s
    ``per_answer`` lists, one per seed, over the same questions): a question's share is its mean over the seeds
    whose answer had statements (questions without any are left out, as in the share itself), its count the mean
    over every seed."""
    out: dict[str, float] = {}
    for label in (*STATEMENT_LABELS, UNPARSED):
        shares = [[a["ratios"][label] for a in answers if a["statements"]] for answers in zip(*per_answer_by_seed)]
        values = [sum(s) / len(s) for s in shares if s]
        if values:
            low, high = mean_interval(values, n_resamples=n_resamples, seed=seed)
            out |= {f"statement_{label}_ratio_ci_low": low, f"statement_{label}_ratio_ci_high": high}
    for label in STATEMENT_LABELS:
        counts = [sum(sum(x == label for x in a["labels"]) for a in answers) / len(answers)
                  for answers in zip(*per_answer_by_seed)]
        if counts:
            low, high = mean_interval(counts, n_resamples=n_resamples, seed=seed)
            out |= {f"statement_{label}_count_ci_low": low, f"statement_{label}_count_ci_high": high}
    return out

"""Scores with their uncertainty: accuracy (binomial standard error, bootstrap 95% interval), mean and standard
deviation over seeds, per-class accuracy of reflective tokens, PolyRAG's statement-level ratios with a judge.
HIT@k / NDCG@k live in :mod:`omnimed.evaluation.retrieval` (``ir_metrics``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from omnimed.evaluation.retrieval import ir_metrics  # noqa: F401  (re-exported: one home for IR metrics)


@dataclass(frozen=True)
class AccuracyResult:
    value: float
    n: int
    stderr: float
    ci_low: float
    ci_high: float


def accuracy(correct: Sequence[bool], *, n_resamples: int = 1000, seed: int = 0,
             confidence: float = 0.95) -> AccuracyResult:
    """Fraction correct, its binomial standard error sqrt(p(1-p)/n), and scipy's percentile bootstrap interval.

    All-correct or all-wrong samples have no spread to resample; their interval is the point itself.
    """
    from scipy.stats import bootstrap

    x = np.asarray(correct, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("accuracy of zero examples")
    p = float(x.mean())
    stderr = math.sqrt(p * (1 - p) / n)
    if p in (0.0, 1.0) or n < 2:
        return AccuracyResult(p, n, stderr, p, p)
    ci = bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return AccuracyResult(p, n, stderr, float(ci.low), float(ci.high))


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof=1) over seeds; one seed has std 0."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        raise ValueError("mean of zero values")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def per_class_accuracy(gold: Sequence[str], pred: Sequence[str | None], classes: Sequence[str]) -> dict:
    """Accuracy per gold class (e.g. each Self-RAG token type's values), overall, and the confusion counts;
    a missing prediction (None) is wrong and counted under ``"<none>"``."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    out: dict = {"overall": float(np.mean([g == p for g, p in zip(gold, pred)])) if gold else float("nan"),
                 "n": len(gold), "per_class": {}, "confusion": {}}
    for c in classes:
        idx = [i for i, g in enumerate(gold) if g == c]
        out["per_class"][c] = {"accuracy": float(np.mean([pred[i] == c for i in idx])) if idx else None,
                               "n": len(idx)}
        row: dict[str, int] = {}
        for i in idx:
            key = pred[i] if pred[i] is not None else "<none>"
            row[key] = row.get(key, 0) + 1
        out["confusion"][c] = row
    return out


STATEMENT_LABELS = ("correct", "incorrect", "not_mentioned")
_LABEL = re.compile(r"<label>\s*([a-z_ ]+?)\s*</label>", re.IGNORECASE)


def split_statements(text: str) -> list[str]:
    """Sentences: split after '.', '!' or '?' followed by whitespace and a capital letter or digit (so 'e.g. x'
    and '2.5 mg' stay whole); empty pieces dropped."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z0-9])", text.strip())
    return [p.strip() for p in parts if p.strip()]


def parse_judge_label(text: str) -> str | None:
    m = _LABEL.findall(text)
    if not m:
        return None
    label = m[-1].strip().lower().replace(" ", "_")
    return label if label in STATEMENT_LABELS else None


def judge_statements(backend, reference: str, statements: Sequence[str], params=None) -> list[str]:
    """The judge's label for each statement; an unparseable reply is labelled ``unparsed`` (and counted)."""
    from omnimed.generation.types import Request, SamplingParams
    from omnimed.pipelines.prompts import statement_judge_messages

    requests = [Request(statement_judge_messages(reference, s), {"task": "judge_statement"}) for s in statements]
    gens = backend.generate(requests, params or SamplingParams(max_new_tokens=16))
    return [parse_judge_label(g[0].text) or "unparsed" for g in gens]


def statement_ratios(labels: Sequence[str]) -> dict[str, float]:
    """Shares of correct / incorrect / not-mentioned statements (PolyRAG), plus unparsed judge replies."""
    n = len(labels)
    out = {k: (sum(label == k for label in labels) / n if n else 0.0) for k in STATEMENT_LABELS}
    out["unparsed"] = sum(label not in STATEMENT_LABELS for label in labels) / n if n else 0.0
    out["n"] = float(n)
    return out

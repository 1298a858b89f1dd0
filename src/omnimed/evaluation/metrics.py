"""Scores with their uncertainty, for the papers' tables.

- :func:`accuracy`: fraction correct with its binomial standard error and a bootstrap 95% interval; missing
  answers count as wrong and are counted.
- :func:`mean_interval`: the bootstrap 95% interval of a mean of per-question values (accuracy's, a long-form
  answer's statement shares).
- :func:`mean_std`: mean and sample standard deviation of one score over seeds.
- :func:`per_class_accuracy`: accuracy per gold class with a confusion table (the critic's reflective tokens).
- :func:`split_statements`, :func:`judge_statements`, :func:`statement_ratios`: PolyRAG's long-form evaluation,
  the shares of an answer's statements a judge finds correct / incorrect / not mentioned in the reference.

HIT@k / NDCG@k / recall@k / MRR live in :mod:`omnimed.evaluation.retrieval` (``ir_metrics``, via ir-measures); the name
is re-exported here so that every metric can be imported from one place.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from omnimed.evaluation.retrieval import ir_metrics

__all__ = [
    "STATEMENT_LABELS", "UNPARSED", "AccuracyResult", "accuracy", "ir_metrics", "judge_statements", "mean_interval",
    "mean_std", "parse_judge_label", "per_class_accuracy", "split_statements", "statement_ratios",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ accuracy
@dataclass(frozen=True)
class AccuracyResult:
    """``value`` = correct / ``n``; ``stderr`` = sqrt(p(1-p)/n); ``[ci_low, ci_high]`` the bootstrap interval;
    ``missing``: examples without an answer (None), included in ``n`` as wrong."""

    value: float
    n: int
    stderr: float
    ci_low: float
    ci_high: float
    missing: int = 0

    def as_dict(self, prefix: str = "accuracy") -> dict[str, float]:
        """Flat metrics for a logger: ``accuracy``, ``accuracy_stderr``, ``accuracy_ci_low``, ..."""
        return {(prefix if k == "value" else f"{prefix}_{k}"): float(v) for k, v in asdict(self).items()}


def accuracy(correct: Sequence[bool | None], *, n_resamples: int = 1000, seed: int = 0,
             confidence: float = 0.95) -> AccuracyResult:
    """Accuracy of per-example outcomes; None means no answer came back (wrong, and counted in ``missing``).

    The interval is scipy's percentile bootstrap of the mean with a fixed ``seed``. When every example has the
    same outcome (or there is one example) resampling has no spread: the interval is the point itself rather
    than scipy's degenerate-sample warning and NaNs.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples}; expected at least 1")
    missing = sum(c is None for c in correct)
    x = np.asarray([bool(c) for c in correct], dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("accuracy of zero examples")
    p = float(x.mean())
    stderr = math.sqrt(p * (1 - p) / n)
    low, high = mean_interval(x, n_resamples=n_resamples, seed=seed, confidence=confidence)
    return AccuracyResult(p, n, stderr, low, high, missing)


def mean_interval(values: Sequence[float] | np.ndarray, *, n_resamples: int = 1000, seed: int = 0,
                  confidence: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of per-question ``values`` (scipy's ``bootstrap``, generator
    seeded with ``seed``). Values without spread (all equal, or fewer than two) give the mean itself as both ends,
    rather than scipy's degenerate-sample warning and NaNs."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("interval of zero values")
    if x.size < 2 or float(np.ptp(x)) == 0:
        return float(x.mean()), float(x.mean())
    from scipy.stats import bootstrap

    ci = bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                   vectorized=True, batch=max(1, 2_000_000 // x.size), rng=np.random.default_rng(seed))
    return float(ci.confidence_interval.low), float(ci.confidence_interval.high)


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation with ddof=1, count) of a score over seeds; one seed has std 0."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        raise ValueError("mean of zero values")
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else 0.0), len(v)


# --------------------------------------------------------------------------------------- per-class accuracy
def per_class_accuracy(gold: Sequence[str], pred: Sequence[str | None], classes: Sequence[str]) -> dict:
    """Accuracy of predicted labels per gold class, e.g. one reflective token type's values.

    Returns ``{"overall", "macro", "n", "missing", "per_class": {c: {"accuracy", "n"}}, "confusion": {gold:
    {pred: count}}}``. A None prediction is wrong and appears as ``"<none>"`` in the confusion table; a
    prediction outside ``classes`` is wrong and appears under its own name. ``macro`` averages the classes that
    have gold examples (a class with none has accuracy None); with no examples at all ``overall`` is NaN. A gold
    label outside ``classes`` is an error (usually a typo in the label set).
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    unknown = sorted({g for g in gold if g not in classes})
    if unknown:
        raise ValueError(f"gold labels {unknown} are not among the classes {list(classes)}")
    hits = [g == p for g, p in zip(gold, pred)]
    per_class: dict[str, dict] = {}
    confusion: dict[str, dict[str, int]] = {}
    for c in classes:
        idx = [i for i, g in enumerate(gold) if g == c]
        per_class[c] = {"accuracy": (sum(hits[i] for i in idx) / len(idx)) if idx else None, "n": len(idx)}
        row: dict[str, int] = {}
        for i in idx:
            key = pred[i] if pred[i] is not None else "<none>"
            row[key] = row.get(key, 0) + 1
        confusion[c] = row
    seen = [v["accuracy"] for v in per_class.values() if v["accuracy"] is not None]
    return {
        "overall": (sum(hits) / len(hits)) if hits else float("nan"),
        "macro": (sum(seen) / len(seen)) if seen else float("nan"),
        "n": len(gold),
        "missing": sum(p is None for p in pred),
        "per_class": per_class,
        "confusion": confusion,
    }


# ------------------------------------------------------------------------------------ statement evaluation
STATEMENT_LABELS: tuple[str, ...] = ("correct", "incorrect", "not_mentioned")
UNPARSED = "unparsed"

_LABEL = re.compile(r"<\s*label\s*>(.*?)<\s*/\s*label\s*>", re.IGNORECASE | re.DOTALL)
_ABBREVIATIONS = frozenset({"e.g", "i.e", "vs", "approx", "dr", "fig", "al", "cf", "mr", "mrs", "ms"})
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


def split_statements(text: str) -> list[str]:
    """An answer cut into sentences, the unit the judge labels.

    Rule: every line is its own piece (a leading bullet ``-``, ``*``, ``•`` or ``1.`` / ``1)`` is dropped), and a
    line is cut after ``.``, ``!`` or ``?`` (and any closing quote or bracket) when whitespace and then a capital
    letter, a digit or an opening quote/bracket follow, unless the word before the period is a common
    abbreviation (e.g., i.e., vs., approx., Dr., Fig., et al., cf.). So ``2.5 mg`` and ``e.g. alcohol`` stay whole.
    Pieces with no letter or digit are dropped.
    """
    out: list[str] = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip()
        if not line:
            continue
        start = 0
        for m in _BOUNDARY.finditer(line):
            before = line[start:m.start()].rstrip("\"')]")
            last_word = before.rsplit(None, 1)[-1].rstrip(".!?").lower() if before.split() else ""
            if before.endswith(".") and last_word in _ABBREVIATIONS:
                continue
            out.append(line[start:m.start()].strip())
            start = m.end()
        out.append(line[start:].strip())
    return [s for s in out if any(ch.isalnum() for ch in s)]


#: the label of a statement whose judge call failed, followed by the backend's error
JUDGE_FAILED = "failed: "


def parse_judge_label(text: str) -> str | None:
    """The verdict in the judge's last ``<label>`` tag (``not mentioned`` / ``not-mentioned`` read as
    ``not_mentioned``); a reply that is nothing but a verdict word also counts. None when neither is there."""
    found = _LABEL.findall(text or "")
    candidate = found[-1] if found else (text or "")
    label = re.sub(r"[\s\-]+", "_", candidate.strip().strip("\"'`*.").strip().lower())
    return label if label in STATEMENT_LABELS else None


def judge_statements(backend, reference: str, statements: Sequence[str], *, question: str | None = None,
                     question_id: str | None = None, params=None) -> list[str]:
    """The judge's verdict for each statement against ``reference``, in one backend call.

    A reply with no readable verdict is labelled ``"unparsed"``, a failed call ``"failed: <the backend's error>"``
    (which the ratios count as unparsed, and an evaluation counts as a failed call); both stay in the count (see
    :func:`statement_ratios`) and a warning names how many and the first reply.
    """
    from omnimed.evaluation.judge_prompt import statement_judge_messages
    from omnimed.generation.types import Request, SamplingParams

    if not statements:
        return []
    meta = {"task": "judge_statement", **({"question_id": question_id} if question_id else {})}
    requests = [Request(statement_judge_messages(reference, s, question),
                        {**meta, "statement_index": i, "statement": s}) for i, s in enumerate(statements)]
    gens = backend.generate(requests, params or SamplingParams(max_new_tokens=32))
    if len(gens) != len(requests):
        raise RuntimeError(f"judge backend returned {len(gens)} results for {len(requests)} statements")
    labels, bad = [], []
    for g in gens:
        first = g[0] if g else None
        label = parse_judge_label(first.text) if first is not None and not first.error else None
        if label is None:
            bad.append((first.error or first.text) if first is not None else "<no generation>")
        labels.append(label or (f"{JUDGE_FAILED}{first.error}" if first is not None and first.error else UNPARSED))
    if bad:
        log.warning("statement judge: %d of %d replies unreadable, first: %r", len(bad), len(labels), bad[0][:200])
    return labels


def statement_ratios(labels: Sequence[str]) -> dict[str, float]:
    """Shares of ``correct`` / ``incorrect`` / ``not_mentioned`` statements, plus ``unparsed`` (any other label),
    over all ``n`` labels, so the four shares sum to 1. With no statements the shares are NaN."""
    n = len(labels)
    counts = {k: sum(label == k for label in labels) for k in STATEMENT_LABELS}
    counts[UNPARSED] = n - sum(counts.values())
    out: dict[str, float] = {k: (v / n if n else float("nan")) for k, v in counts.items()}
    out["n"] = n
    return out

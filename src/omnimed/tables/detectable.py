"""How small a difference a reproduced column can tell apart: the half-width of the 95% interval of the paired (by
question) difference between two of its rows.

Two rows scored on the same questions differ only where they disagree: with ``n`` shared questions of which a share
``p`` are discordant (one row right, the other wrong), the paired difference has standard error ``sqrt(p / n)``
when the rows are about equally good, so a difference smaller than ``1.96 * sqrt(p / n)`` is within noise. A
column states this for the pair of its rows that disagree most, the bound that holds for every pair. A per-question
score that is a number (PolyRAG table 2's share of correct statements in each answer, a retrieval query's NDCG@k,
Omni-RAG table 10's LUQ uncertainty) takes the same form with ``p`` the mean squared per-question difference, which
for right / wrong outcomes is the discordant share.

:func:`paired_difference` is the interval of one pair's difference itself (a table's rows against its
``paired_against`` row): the mean per-question difference +- 1.96 standard errors.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from itertools import combinations
from pathlib import Path

Z95 = 1.959963984540054


def question_outcomes(run_dir: Path, metric: str) -> dict[str, bool | float] | None:
    """Per question (and seed), whether the run got it right, for an accuracy metric (``accuracy``, or
    ``<type>/accuracy`` of a critic run, read from the examples of that type) or a retrieval HIT@k
    (``<method>/hit@k``: a gold passage among the method's first k; rows of other methods skipped) or NDCG@k (each
    query's own, binary gold as the table's ir-measures scores it: :func:`_query_ndcg`); for a long-form
    statement metric (``statement_<label>_ratio`` / ``_count``) the answer's share or count of statements with that
    label (answers without statements have no share); for ``luq`` each sampled question's uncertainty; None for
    other metrics or a run without ``predictions.jsonl``."""
    path = run_dir / "predictions.jsonl"
    hit = re.fullmatch(r"(?:(.+)/)?hit@(\d+)", metric)
    ndcg = re.fullmatch(r"(?:(.+)/)?ndcg@(\d+)", metric)
    statement = re.fullmatch(r"statement_(correct|incorrect|not_mentioned)_(ratio|count)", metric)
    if hit:
        method, k = hit.group(1), int(hit.group(2))
        outcomes = ((row["query_id"], row["first_gold_rank"] is not None and row["first_gold_rank"] <= k)
                    for row in _rows(path)
                    if "first_gold_rank" in row and (method is None or row.get("method") == method))
    elif ndcg:
        method, k = ndcg.group(1), int(ndcg.group(2))
        outcomes = ((row["query_id"], _query_ndcg(row["hits"], row["gold"], k))
                    for row in _rows(path)
                    if row.get("gold") and "hits" in row and (method is None or row.get("method") == method))
    elif statement:
        label, kind = statement.groups()
        outcomes = ((f"{row.get('question_id')}#{row.get('seed', 0)}",
                     float(sum(x == label for x in row["labels"])) / (len(row["labels"]) if kind == "ratio" else 1))
                    for row in _rows(path) if "labels" in row and (row["labels"] or kind == "count"))
    elif metric == "luq":
        outcomes = ((f"{row.get('question_id')}#{row.get('seed', 0)}", float(row["luq"]))
                    for row in _rows(path) if row.get("luq") is not None)
    elif metric == "accuracy" or metric.endswith("/accuracy"):
        kind = None if metric == "accuracy" else metric.removesuffix("/accuracy")
        outcomes = ((f"{row.get('question_id', row.get('id'))}#{row.get('seed', 0)}", bool(row.get("correct")))
                    for row in _rows(path) if kind is None or row.get("type") == kind)
    else:
        return None
    return dict(outcomes) or None


def _query_ndcg(hits: Sequence[Mapping], gold: Sequence[str], k: int) -> float:
    """One query's NDCG@k with every gold passage of grade 1, on the ranking the table scored: a passage counts at
    the place of its first chunk (later chunks of it dropped), as :func:`~omnimed.evaluation.retrieval.ir_metrics`
    hands the run to ir-measures, so the queries' mean is the table's cell."""
    ranked = list(dict.fromkeys(h["doc_id"] for h in hits))[:k]
    wanted = set(gold)
    dcg = sum(1.0 / math.log2(i + 2) for i, doc in enumerate(ranked) if doc in wanted)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(wanted), k)))
    return dcg / ideal


def answer_skew(run_dir: Path) -> tuple[str, int, int] | None:
    """``(answer, count, total)``: the answer a QA run gave most often and to how many of its predictions, or
    ``"the last option"`` when more predictions pick the last of their question's options than any one letter (a
    reader answering by position on questions with four or five options spreads its letters over D and E). A reader
    that gives one answer, or one position, to nearly every question scores its base rate whatever it is shown, so no
    row can differ from another there; None for a run without predictions that carry one."""
    letters: Counter[str] = Counter()
    last = 0
    for row in _rows(run_dir / "predictions.jsonl"):
        if row.get("prediction") is None:
            continue
        letters[str(row["prediction"])] += 1
        last += str(row["prediction"]) == _last_option(row.get("output"))
    if not letters:
        return None
    answer, count = letters.most_common(1)[0]
    if last > count:
        answer, count = "the last option", last
    return answer, count, letters.total()


def _last_option(output: object) -> str | None:
    """The last option of a prediction's question, where its ``output`` is the reader's score per option (a JSON
    object keyed by letter, in the options' order); None for a generated answer."""
    try:
        scores = json.loads(output) if isinstance(output, str) else None
    except json.JSONDecodeError:
        return None
    return list(scores)[-1] if isinstance(scores, dict) and scores else None


def _rows(path: Path) -> Iterator[dict]:
    """The rows of a predictions file; none when it does not exist."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def detectable_difference(rows: Sequence[Mapping[str, bool | float]]) -> tuple[float, int] | None:
    """``(half-width, n)``: the 95% half-width of the paired difference (an accuracy as a share, 0-1, or the
    per-question score's own unit) for the pair of ``rows`` (each: question -> correct, or a number) that disagree
    most on their shared questions, and how many questions they share; None without two rows sharing a question."""
    best: tuple[float, int] | None = None
    for a, b in combinations(rows, 2):
        shared = a.keys() & b.keys()
        if not shared:
            continue
        n = len(shared)
        squared = sum((float(a[k]) - float(b[k])) ** 2 for k in shared) / n  # right / wrong: the discordant share
        half = Z95 * math.sqrt(squared / n)
        if best is None or half > best[0]:
            best = (half, n)
    return best


def paired_difference(a: Mapping[str, bool | float], b: Mapping[str, bool | float]) -> tuple[float, float, int] | None:
    """``(mean, half-width, n)`` of ``a`` minus ``b`` over their shared questions: the mean per-question difference
    and the 95% half-width 1.96 sd / sqrt(n) (sample sd); None when they share fewer than two questions."""
    shared = sorted(a.keys() & b.keys())
    n = len(shared)
    if n < 2:
        return None
    d = [float(a[k]) - float(b[k]) for k in shared]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return mean, Z95 * sd / math.sqrt(n), n

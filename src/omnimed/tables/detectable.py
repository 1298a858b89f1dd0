"""How small a difference a reproduced column can tell apart: the half-width of the 95% interval of the paired (by
question) accuracy difference between two of its rows.

Two rows scored on the same questions differ only where they disagree: with ``n`` shared questions of which a share
``p`` are discordant (one row right, the other wrong), the paired difference has standard error ``sqrt(p / n)``
when the rows are about equally good, so a difference smaller than ``1.96 * sqrt(p / n)`` is within noise. A
column states this for the pair of its rows that disagree most, the bound that holds for every pair.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from itertools import combinations
from pathlib import Path

Z95 = 1.959963984540054


def question_outcomes(run_dir: Path, metric: str) -> dict[str, bool] | None:
    """Per question (and seed), whether the run got it right, for an accuracy metric (``accuracy``, or
    ``<type>/accuracy`` of a critic run, read from the examples of that type) or a retrieval HIT@k
    (``<method>/hit@k``: a gold passage among the method's first k; rows of other methods skipped); None for other
    metrics or a run without ``predictions.jsonl``."""
    path = run_dir / "predictions.jsonl"
    hit = re.fullmatch(r"(?:(.+)/)?hit@(\d+)", metric)
    if hit:
        method, k = hit.group(1), int(hit.group(2))
        outcomes = ((row["query_id"], row["first_gold_rank"] is not None and row["first_gold_rank"] <= k)
                    for row in _rows(path)
                    if "first_gold_rank" in row and (method is None or row.get("method") == method))
    elif metric == "accuracy" or metric.endswith("/accuracy"):
        kind = None if metric == "accuracy" else metric.removesuffix("/accuracy")
        outcomes = ((f"{row.get('question_id', row.get('id'))}#{row.get('seed', 0)}", bool(row.get("correct")))
                    for row in _rows(path) if kind is None or row.get("type") == kind)
    else:
        return None
    return dict(outcomes) or None


def _rows(path: Path) -> Iterator[dict]:
    """The rows of a predictions file; none when it does not exist."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def detectable_difference(rows: Sequence[Mapping[str, bool]]) -> tuple[float, int] | None:
    """``(half-width, n)``: the 95% half-width of the paired accuracy difference (as a share, 0-1) for the pair of
    ``rows`` (each: question -> correct) that disagree most on their shared questions, and how many questions they
    share; None without two rows sharing a question."""
    best: tuple[float, int] | None = None
    for a, b in combinations(rows, 2):
        shared = a.keys() & b.keys()
        if not shared:
            continue
        n = len(shared)
        discordant = sum(a[k] != b[k] for k in shared) / n
        half = Z95 * math.sqrt(discordant / n)
        if best is None or half > best[0]:
            best = (half, n)
    return best

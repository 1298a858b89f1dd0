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
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path

Z95 = 1.959963984540054


def question_outcomes(run_dir: Path, metric: str) -> dict[str, bool] | None:
    """Per question (and seed), whether the run got it right, for an accuracy metric (``accuracy``, or
    ``<type>/accuracy`` of a critic run, read from the examples of that type) or a retrieval HIT@k
    (``<method>/hit@k``: a gold passage among the method's first k); None for other metrics or a run without
    ``predictions.jsonl``."""
    hit = re.fullmatch(r"(?:(.+)/)?hit@(\d+)", metric)
    if hit:
        return _hit_outcomes(run_dir / "predictions.jsonl", hit.group(1), int(hit.group(2)))
    if metric == "accuracy":
        kind = None
    elif metric.endswith("/accuracy"):
        kind = metric.removesuffix("/accuracy")
    else:
        return None
    path = run_dir / "predictions.jsonl"
    if not path.is_file():
        return None
    out: dict[str, bool] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if kind is not None and row.get("type") != kind:
                continue
            out[f"{row.get('question_id', row.get('id'))}#{row.get('seed', 0)}"] = bool(row.get("correct"))
    return out or None


def _hit_outcomes(path: Path, method: str | None, k: int) -> dict[str, bool] | None:
    """Per retrieval query: whether ``method``'s first gold passage ranks within ``k`` (rows of other methods
    skipped; ``method`` None: the file's only method)."""
    if not path.is_file():
        return None
    out: dict[str, bool] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if "first_gold_rank" not in row or (method is not None and row.get("method") != method):
                continue
            rank = row["first_gold_rank"]
            out[row["query_id"]] = rank is not None and rank <= k
    return out or None


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

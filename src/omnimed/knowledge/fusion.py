"""Merge rankings from several retrievers (e.g. BM25 and dense) over the same passage table."""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.knowledge.types import KnowledgeError, Ranking


def reciprocal_rank_fusion(
    rankings: Sequence[Ranking],
    k: int = 60,
    top: int | None = None,
    weights: Sequence[float] | None = None,
) -> Ranking:
    """Reciprocal rank fusion (Cormack et al., 2009): only ranks matter, so scores on different scales mix.

    A row's fused score is ``sum_i weights[i] / (k + rank_i)`` over the rankings that contain it, with 1-based
    ranks (a row's first position counts if a ranking repeats it). ``k`` damps the lead of the very first
    ranks. Equal fused scores keep the order of first appearance (ranking by ranking, best first). ``top``
    keeps only that many rows.
    """
    if k < 0:
        raise KnowledgeError(f"RRF k must be >= 0, got {k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    elif len(weights) != len(rankings):
        raise KnowledgeError(
            f"RRF got {len(weights)} weights for {len(rankings)} rankings; expected one each"
        )
    fused: dict[int, float] = {}  # insertion order = first appearance, used for ties
    for ranking, weight in zip(rankings, weights):
        seen: set[int] = set()
        for rank, (row, _score) in enumerate(ranking, start=1):
            if row not in seen:
                seen.add(row)
                fused[row] = fused.get(row, 0.0) + weight / (k + rank)
    merged = sorted(fused.items(), key=lambda item: -item[1])  # stable: ties stay in first-appearance order
    return merged if top is None else merged[:top]

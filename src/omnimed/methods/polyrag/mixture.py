"""PolyRAG's view mixture (section 3.3): y_d = a1 R + a2 U + a3 S + a4 A + a5 T (Eq. 7), and the top k chosen
under the composability constraint (Eq. 8): the topics of the chosen documents should cover the topics of all
candidates. Topics are DBSCAN clusters (scikit-learn) of the candidates' utility embeddings, as the paper does;
a DBSCAN noise point is a topic of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass

import numpy as np

from omnimed.methods.polyrag.views import VIEWS

#: the paper's weights per PolyEVAL domain (section 5.1.3), in VIEWS order: R, U, S, A, T
PAPER_WEIGHTS: dict[str, dict[str, float]] = {
    "inquiry": dict(zip(VIEWS, (0.35, 0.35, 0.1, 0.1, 0.1))),
    "policy": dict(zip(VIEWS, (0.35, 0.35, 0.1, 0.1, 0.1))),
    "care": dict(zip(VIEWS, (0.35, 0.35, 0.1, 0.2, 0.0))),
}
CONSTRAINTS = ("cover", "none")


@dataclass
class ComposabilityConfig:
    """``constraint``: cover (Eq. 8: every topic's best document before any topic's second) | none (plain top k by
    y); DBSCAN's ``eps`` (cosine distance) and ``min_samples`` over the candidates' utility embeddings. The paper
    states neither; eps 0.05 was the best of 0.02-0.15 on the world's dev questions of table 1's three kinds
    (``scripts/polyrag_views_probe.py --split dev``): wider clusters merge a passage with its near-namesakes, and
    the cover then keeps only one of them."""

    constraint: str = "cover"
    eps: float = 0.05
    min_samples: int = 2


@dataclass
class ViewWeights:
    """Eq. 7's weights a1..a5 by view (``pipeline.weights.utility=0.5`` or ``pipeline.weights={relevance: 0.2,
    ...}``): when any is set, the set ones are the weights (a view left null weighs 0); all null, the domain's."""

    relevance: float | None = None
    utility: float | None = None
    supplement: float | None = None
    authority: float | None = None
    timeliness: float | None = None


def weights_for(domain: str, weights: Mapping[str, float | None] | ViewWeights | None) -> dict[str, float]:
    """The view weights: those ``weights`` sets (each >= 0; a view not set weighs 0), else the paper's for
    ``domain``."""
    if is_dataclass(weights):
        weights = asdict(weights)
    weights = {v: w for v, w in (weights or {}).items() if w is not None}
    if weights:
        unknown = sorted(set(weights) - set(VIEWS))
        if unknown or any(w < 0 for w in weights.values()):
            raise ValueError(f"pipeline.weights={dict(weights)}: expected weights >= 0 for some of {', '.join(VIEWS)}")
        return {v: float(weights.get(v, 0.0)) for v in VIEWS}
    if domain not in PAPER_WEIGHTS:
        raise ValueError(f"pipeline.domain={domain!r}: expected one of {', '.join(PAPER_WEIGHTS)} (or set "
                         "pipeline.weights)")
    return dict(PAPER_WEIGHTS[domain])


def check_composability(cfg: ComposabilityConfig) -> None:
    if cfg.constraint not in CONSTRAINTS:
        raise ValueError(f"pipeline.composability.constraint={cfg.constraint!r}: expected one of {', '.join(CONSTRAINTS)}")
    if not cfg.eps > 0 or cfg.min_samples < 1:
        raise ValueError(f"pipeline.composability: eps={cfg.eps}, min_samples={cfg.min_samples}: expected eps > 0 "
                         "and min_samples >= 1")


def mix(views: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> np.ndarray:
    """Eq. 7 for every candidate (``views``: view name -> one score per candidate)."""
    n = len(next(iter(views.values())))
    y = np.zeros(n)
    for name, w in weights.items():
        if w:
            y += w * np.asarray(views[name], dtype=float)
    return y


def topics(embeddings: np.ndarray, cfg: ComposabilityConfig) -> list[int]:
    """DBSCAN topic of each candidate (normalised embeddings, cosine distance); noise points get topics of their
    own, numbered after the clusters."""
    from sklearn.cluster import DBSCAN

    if len(embeddings) == 0:
        return []
    labels = DBSCAN(eps=cfg.eps, min_samples=cfg.min_samples, metric="cosine").fit_predict(embeddings)
    nxt = int(labels.max()) + 1
    out = []
    for label in labels:
        if label < 0:
            out.append(nxt)
            nxt += 1
        else:
            out.append(int(label))
    return out


def select(y: Sequence[float], topic: Sequence[int], k: int, constraint: str) -> list[int]:
    """The candidates' order: under ``cover`` the first ``k`` are each topic's best by y (best topics first)
    while topics remain, then the best of the rest; the remainder follows by y. ``none``: all by y."""
    order = sorted(range(len(y)), key=lambda i: -y[i])
    if constraint == "none":
        return order
    first, seen = [], set()
    for i in order:
        if topic[i] not in seen and len(first) < k:
            seen.add(topic[i])
            first.append(i)
    chosen = set(first)
    rest = [i for i in order if i not in chosen]
    head = first + rest[: max(k - len(first), 0)]
    head.sort(key=lambda i: -y[i])
    return head + [i for i in rest if i not in head]

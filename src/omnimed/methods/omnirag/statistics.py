"""Plan statistics of Omni-RAG's appendices: query diversity per source (Eq. 5, mean pairwise cosine distance of
the encoded queries; A.1 and table 13), words per query (table 12), queries per source (figure 7) and how often
a plan's retrieved documents hold the gold passages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from omnimed.data.records import SOURCE_KINDS

#: the encoder of Eq. 5 in miniature (the paper does not name its encoder)
DIVERSITY_ENCODER = "minilm-l6"


@lru_cache(maxsize=2)
def encoder(name: str = DIVERSITY_ENCODER) -> Any:
    """A sentence encoder by ``conf/model`` name, loaded once per process."""
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.models.config import named_model_config

    return TextEncoder(named_model_config(name))


def diversity(queries: Sequence[str], vectors: np.ndarray | None = None, *, encoder_name: str = DIVERSITY_ENCODER
              ) -> float | None:
    """Eq. 5: the mean cosine distance over all pairs of ``queries`` (None for fewer than two)."""
    if len(queries) < 2:
        return None
    v = encoder(encoder_name).encode_queries(list(queries)) if vectors is None else vectors
    v = v / np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)
    sims = v @ v.T
    upper = np.triu_indices(len(queries), k=1)
    return float(np.mean(1.0 - sims[upper]))


def diversity_by_source(plans: Sequence[Mapping[str, Sequence[str]]], *, encoder_name: str = DIVERSITY_ENCODER
                        ) -> dict[str, float]:
    """Per source, the mean over plans of Eq. 5 (plans with fewer than two queries there are left out); every
    query is encoded once."""
    texts = sorted({q for plan in plans for qs in plan.values() for q in qs})
    if not texts:
        return {}
    vectors = dict(zip(texts, encoder(encoder_name).encode_queries(texts)))
    out: dict[str, float] = {}
    for source in SOURCE_KINDS:
        values = [diversity(qs, np.stack([vectors[q] for q in qs])) for plan in plans
                  if len(qs := list(plan.get(source, []))) >= 2]
        if values:
            out[source] = float(np.mean(values))
    return out


def words_and_counts(plans: Sequence[Mapping[str, Sequence[str]]]) -> dict[str, float]:
    """``words_per_query/<source>`` (mean words of the queries sent there) and ``queries_per_source/<source>``
    (mean queries per plan, 0 where a plan left the source out)."""
    out: dict[str, float] = {}
    for source in SOURCE_KINDS:
        sent = [q for plan in plans for q in plan.get(source, [])]
        out[f"queries_per_source/{source}"] = len(sent) / max(1, len(plans))
        if sent:
            out[f"words_per_query/{source}"] = float(np.mean([len(q.replace(",", " ").split()) for q in sent]))
    return out


def undefined_by_source(plans: Sequence[Mapping[str, Sequence[str]]]) -> dict[str, str]:
    """Why a per-source statistic above has no value: ``words_per_query/<source>`` where no plan sent a query
    there, ``query_diversity/<source>`` where no plan sent two."""
    out: dict[str, str] = {}
    for source in SOURCE_KINDS:
        if not any(plan.get(source) for plan in plans):
            out[f"words_per_query/{source}"] = f"none of the {len(plans)} plans sent a query to {source}"
        if not any(len(plan.get(source, [])) >= 2 for plan in plans):
            out[f"query_diversity/{source}"] = f"none of the {len(plans)} plans sent two queries to {source}"
    return out

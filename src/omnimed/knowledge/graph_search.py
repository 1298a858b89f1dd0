"""Graph search: match a term to concepts and answer Omni-RAG graph queries ``term , question`` (§5.1.2).

Omni-RAG answers a graph query with the definition of the concept the term names plus its one-hop relations,
reranked against the question (there may be thousands) and cut to the top 10. :func:`match_concepts` finds the
concept (exact names first, then full-text candidates), :func:`answer_graph_query` builds the hit and
:func:`graph_search` runs raw query strings; the lookups themselves are :class:`GraphStore`'s
(:mod:`omnimed.knowledge.graph_store`), which exposes the first two as ``store.match`` and ``store.query``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from omnimed.data.loaders.knowledge_graph import Concept
from omnimed.data.records import Passage
from omnimed.knowledge.graph_text import (
    content_terms,
    dice_overlap,
    lexical_scores,
    normalise_name,
    parse_graph_query,
)
from omnimed.knowledge.types import Hit, KnowledgeError

if TYPE_CHECKING:
    from omnimed.knowledge.graph_store import GraphStore

__all__ = ["DEFAULT_K_RELATIONS", "Scorer", "answer_graph_query", "graph_search", "match_concepts"]

DEFAULT_K_RELATIONS = 10
#: a scorer ranks relation lines against a question: ``scorer(question, lines) -> one score per line``
Scorer = Callable[[str, list[str]], Sequence[float]]


# ---------------------------------------------------------------------------------------------- term matching
def match_concepts(store: GraphStore, term: str, limit: int = 5) -> list[tuple[str, float]]:
    """Concepts the term names, best first, as ``(key, score)``.

    Exact matches of the normalised term come first: a concept key or primary name scores 1.0, a synonym
    0.95. Then full-text candidates (FTS5 with all words, else any word; a LIKE scan without FTS5) scored
    0.9 x the Dice overlap of stemmed words (x 0.95 for a synonym), keeping only names that cover more than
    half of the term's words. Equal scores go to the concept with a definition, then the better-connected
    one. A term matching nothing gives ``[]``.
    """
    if limit <= 0:
        return []
    scores: dict[str, float] = {}
    by_key = store.resolve(term.strip())
    if by_key is not None:
        scores[by_key] = 1.0
    norm = normalise_name(term)
    if norm:
        for key, is_primary in store.exact_names(norm):
            scores[key] = max(scores.get(key, 0.0), 1.0 if is_primary else 0.95)
    out = _ranked(store, scores, limit)
    if norm and len(out) < limit:
        out += _ranked(store, _fuzzy(store, norm, set(scores)), limit - len(out))
    return out


def _ranked(store: GraphStore, scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
    rich = store.richness(list(scores))
    ranked = sorted(scores, key=lambda k: (-scores[k], *(-v for v in rich.get(k, (0, 0))), k))
    return [(k, scores[k]) for k in ranked[:limit]]


def _fuzzy(store: GraphStore, norm: str, exclude: set[str]) -> dict[str, float]:
    """Scores of the full-text candidates of ``norm`` (see :func:`match_concepts`), best name per concept."""
    query = set(content_terms(norm)) or set(norm.split())
    best: dict[str, float] = {}
    for key, name, is_primary in store.name_candidates(norm):
        words = set(content_terms(name)) or set(name.split())
        if key in exclude or len(query & words) * 2 <= len(query):
            continue
        score = round(0.9 * dice_overlap(query, words) * (1.0 if is_primary else 0.95), 6)
        best[key] = max(best.get(key, 0.0), score)
    return best


# ---------------------------------------------------------------------------------------------- graph queries
def answer_graph_query(
    store: GraphStore,
    term: str,
    question: str = "",
    *,
    k_relations: int = DEFAULT_K_RELATIONS,
    scorer: Scorer | None = None,
    k_concepts: int = 1,
    query_text: str | None = None,
) -> list[Hit]:
    """Answer a graph query: the best-matching concept's definition plus its top relations for ``question``.

    Returns one :class:`Hit` per matched concept (``k_concepts``, default 1; ``[]`` for an unknown term). The
    passage (source "graph", id the concept key, title its name) reads the definition, then up to
    ``k_relations`` lines ``A | relation | B`` ranked by ``scorer(question, lines)`` (default
    :func:`lexical_scores`; plug in a dense encoder here), best first. Its metadata names the concept, the
    matched term, the match score and the chosen relations; the hit's score is the match score.
    """
    if k_relations < 0:
        raise KnowledgeError(f"k_relations must be >= 0, got {k_relations}")
    question = question.strip() or term
    hits = []
    for rank, (key, match_score) in enumerate(_informative_matches(store, term, k_concepts), start=1):
        passage = _passage(store, key, term, question, match_score, k_relations, scorer or lexical_scores)
        hits.append(
            Hit(
                passage=passage,
                score=match_score,
                rank=rank,
                retriever="graph",
                query=query_text if query_text is not None else _graph_query_text(term, question),
                extra={"term": term, "question": question},
            )
        )
    return hits


def _informative_matches(store: GraphStore, term: str, k: int) -> list[tuple[str, float]]:
    """The best ``k`` matches, those with a definition or relations before bare names (a reader gains
    nothing from a name alone, e.g. a Hetionet side effect without edges), each group by match score."""
    if k <= 0:
        return []
    matches = match_concepts(store, term, limit=k + 5)
    rich = store.richness([key for key, _ in matches])
    matches.sort(key=lambda m: not any(rich.get(m[0], (0, 0))))  # stable: keeps the score order
    return matches[:k]


def _passage(
    store: GraphStore,
    key: str,
    term: str,
    question: str,
    match_score: float,
    k_relations: int,
    scorer: Scorer,
) -> Passage:
    concept = store.concept(key)
    assert concept is not None
    links = store.links(key)
    lines = [k.line for k in links]
    scores = list(scorer(question, lines)) if links and k_relations else [0.0] * len(links)
    if len(scores) != len(links):
        raise KnowledgeError(
            f"graph scorer returned {len(scores)} scores for {len(links)} relations of {key!r}"
        )
    order = sorted(range(len(links)), key=lambda i: (-float(scores[i]), i))[:k_relations]
    body = [concept.definition] if concept.definition else []
    body += [lines[i] for i in order]
    text = "\n".join(body) or f"{concept.name} ({concept.kind})"
    return Passage(
        id=key,
        source="graph",
        title=concept.name,
        text=text,
        authority="; ".join(concept.sources) or None,
        url=_concept_url(concept),
        metadata={
            "concept_key": key,
            "concept_id": concept.id,
            "kind": concept.kind,
            "term": term,
            "question": question,
            "match_score": match_score,
            "synonyms": concept.synonyms,
            "xrefs": concept.xrefs,
            "sources": concept.sources,
            "relations": [
                [links[i].label, links[i].other, links[i].other_name, links[i].source, float(scores[i])]
                for i in order
            ],
            "n_relations": len(links),
        },
    )


def _graph_query_text(term: str, question: str) -> str:
    return term if question == term else f"{term} , {question}"


def _concept_url(concept: Concept) -> str | None:
    if concept.id.startswith("DOID:"):
        return "http://purl.obolibrary.org/obo/" + concept.id.replace(":", "_")
    return None


def graph_search(
    store: GraphStore,
    queries: Sequence[str],
    k: int = 1,
    *,
    k_relations: int = DEFAULT_K_RELATIONS,
    scorer: Scorer | None = None,
) -> list[list[Hit]]:
    """Run Omni-RAG graph queries (``term , question`` each) against ``store``: one hit list per query.

    ``k`` is the number of concepts per query (the paper uses 1: the concept the term names); each hit carries
    its concept's definition and top ``k_relations`` relations, and its ``query`` is the raw query text.
    """
    out = []
    for raw in queries:
        term, question = parse_graph_query(raw)
        if not term:
            out.append([])
            continue
        out.append(
            store.query(term, question, k_relations=k_relations, scorer=scorer, k_concepts=k, query_text=raw)
        )
    return out


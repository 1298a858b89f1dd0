"""The realdata graph (Disease Ontology + Hetionet) as "graph" :class:`~omnimed.data.records.Passage` records.

:func:`load_graph` parses both sources, merges them (a DO term and the Hetionet disease with the same DOID
become one concept) and :func:`graph_passages` writes one passage per concept: its definition followed by its
relations, capped and ordered so that treatments and class membership are not crowded out by hundreds of gene
associations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.hetionet import HETIONET_SOURCE, read_hetionet
from omnimed.data.loaders.knowledge_graph import Concept, KnowledgeGraph, Triple, merge_graphs
from omnimed.data.loaders.obo import DO_SOURCE, parse_obo
from omnimed.data.loaders.realdata_layout import DO_OBO, find_graph_dir, locate, reject_options
from omnimed.data.records import Passage

__all__ = ["graph_passages", "load_graph"]

#: relations written into one concept's passage unless ``max_relations`` says otherwise
DEFAULT_MAX_RELATIONS = 30


# ---------------------------------------------------------------------------------------------- graph passages
#: how a relation reads from its object's side ("metformin treats T2D" -> T2D "treated_by" metformin)
INVERSE_RELATIONS = {
    "is_a": "has_subtype",
    "treats": "treated_by",
    "palliates": "palliated_by",
    "resembles": "resembles",
    "associates": "associates",
    "binds": "bound_by",
    "upregulates": "upregulated_by",
    "downregulates": "downregulated_by",
    "localizes": "localization_of",
    "presents": "presented_by",
    "causes": "caused_by",
    "includes": "included_in",
    "expresses": "expressed_in",
    "participates": "has_participant",
    "interacts": "interacts",
    "covaries": "covaries",
    "regulates": "regulated_by",
}
#: relation groups first in a passage (clinically most telling); the rest follow alphabetically
RELATION_PRIORITY = (
    "is_a",
    "treated_by",
    "treats",
    "palliated_by",
    "palliates",
    "presents",
    "localizes",
    "localization_of",
    "resembles",
    "associates",
    "has_subtype",
    "causes",
    "binds",
    "bound_by",
)


#: links drawn per round-robin turn: treatments and class membership get a larger share of the cap
RELATION_WEIGHT = {"is_a": 2, "treated_by": 3, "treats": 3, "palliated_by": 2, "palliates": 2, "presents": 2}
_PRIORITY_RANK = {label: i for i, label in enumerate(RELATION_PRIORITY)}


def _inverse(relation: str) -> str:
    return INVERSE_RELATIONS.get(relation, f"{relation}_inverse")


@dataclass(frozen=True)
class _Link:
    """A relation seen from one concept: its label from that side, the other concept, the stated triple."""

    label: str
    other: str
    triple: Triple


def _links_by_concept(triples: list[Triple]) -> dict[str, list[_Link]]:
    links: dict[str, list[_Link]] = defaultdict(list)
    for t in triples:
        links[t.subject].append(_Link(t.relation, t.object, t))
        if t.object != t.subject:
            links[t.object].append(_Link(_inverse(t.relation), t.subject, t))
    return links


def _pick_links(links: list[_Link], sort_names: dict[str, str], cap: int) -> list[_Link]:
    """At most ``cap`` links in a deterministic order.

    Links are grouped by label (priority order, then alphabetical) and sorted by the other concept's name inside
    a group; groups are drawn from round-robin (``RELATION_WEIGHT`` links per turn) so treatments are not crowded
    out by hundreds of gene associations. The result is listed group by group, which reads better than the interleaving.
    """
    groups: dict[str, list[_Link]] = defaultdict(list)
    for link in links:
        groups[link.label].append(link)
    order = sorted(groups, key=lambda label: (_PRIORITY_RANK.get(label, len(_PRIORITY_RANK)), label))
    queues = [
        sorted(groups[label], key=lambda k: (sort_names.get(k.other, k.other), k.other)) for label in order
    ]
    quanta = [RELATION_WEIGHT.get(label, 1) for label in order]
    taken = [0] * len(queues)
    budget = cap
    while budget > 0 and any(n < len(q) for n, q in zip(taken, queues)):
        for i, q in enumerate(queues):
            step = min(quanta[i], len(q) - taken[i], budget)
            taken[i] += step
            budget -= step
    return [link for n, q in zip(taken, queues) for link in q[:n]]


_AUTHORITIES = {DO_SOURCE: "Disease Ontology", HETIONET_SOURCE: "Hetionet"}


def _concept_url(concept: Concept) -> str | None:
    if concept.id.startswith("DOID:"):
        return "http://purl.obolibrary.org/obo/" + concept.id.replace(":", "_")
    return None


def graph_passages(
    graph: KnowledgeGraph, *, max_relations: int = DEFAULT_MAX_RELATIONS, dates: dict[str, str] | None = None
) -> list[Passage]:
    """One "graph" passage per concept with a definition or relations, in key order.

    Text is the definition followed by up to ``max_relations`` triples "subject | relation | object" in the
    direction the source states them; metadata holds the concept id, kind, synonyms, xrefs and the chosen
    relations as ``[relation as seen from this concept, other key, other name]`` plus the total count.
    ``dates`` maps a source name to its release date (ISO), used as the passage date.
    """
    if max_relations < 0:
        raise ValueError(f"max_relations must be >= 0, got {max_relations}")
    names = {key: c.name for key, c in graph.concepts.items()}
    sort_names = {key: name.lower() for key, name in names.items()}
    links = _links_by_concept(graph.triples)
    dates = dates or {}
    out: list[Passage] = []
    for key in sorted(graph.concepts):
        concept = graph.concepts[key]
        mine = links.get(key, [])
        if not concept.definition and not mine:
            continue
        picked = _pick_links(mine, sort_names, max_relations)
        lines = [concept.definition] if concept.definition else []
        lines += [
            f"{names.get(k.triple.subject, k.triple.subject)} | {k.triple.relation} | "
            f"{names.get(k.triple.object, k.triple.object)}"
            for k in picked
        ]
        if not lines:  # relations exist but the cap is 0 and there is no definition
            continue
        out.append(
            Passage(
                id=key,
                source="graph",
                title=concept.name,
                text="\n".join(lines),
                date=next((dates[s] for s in concept.sources if dates.get(s)), None),
                authority="; ".join(_AUTHORITIES.get(s, s) for s in concept.sources) or None,
                url=_concept_url(concept),
                metadata={
                    "concept_id": concept.id,
                    "kind": concept.kind,
                    "synonyms": concept.synonyms,
                    "xrefs": concept.xrefs,
                    "alt_ids": concept.alt_ids,
                    "sources": concept.sources,
                    "relations": [[k.label, k.other, names.get(k.other, k.other)] for k in picked],
                    "n_relations": len(mine),
                },
            )
        )
    return out


def load_graph(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    max_relations: int = DEFAULT_MAX_RELATIONS,
    **options: Any,
) -> list[Passage]:
    """The realdata graph (Disease Ontology + Hetionet) as "graph" passages, one per concept.

    ``path`` is the ``graph/`` folder or the realdata root. DO terms and Hetionet diseases are matched by DOID
    (alt_ids included); DO gives definitions, synonyms and is_a, Hetionet the typed relations. See
    :func:`graph_passages` for the passage layout; ``max_relations`` caps the relations per concept.
    """
    reject_options(options, "load_graph")
    graph_dir = find_graph_dir(path)
    ontology = parse_obo(locate(graph_dir, DO_OBO), skip_invalid=skip_invalid, report=report)
    hetionet = read_hetionet(graph_dir, skip_invalid=skip_invalid, report=report)
    merged = merge_graphs(ontology, hetionet)
    dates = {DO_SOURCE: ontology.info["date"]} if ontology.info.get("date") else {}
    passages = graph_passages(merged, max_relations=max_relations, dates=dates)
    return passages

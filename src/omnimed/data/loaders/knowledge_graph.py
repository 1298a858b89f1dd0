"""The knowledge graph as plain data: concepts, typed triples between them, and the union of several graphs.

:func:`~omnimed.data.loaders.obo.parse_obo` (Disease Ontology) and
:func:`~omnimed.data.loaders.hetionet.read_hetionet` each return a :class:`KnowledgeGraph`;
:func:`merge_graphs` joins them so that the same disease is one concept. The knowledge base loads such a graph
into a database without going through passages (:mod:`omnimed.knowledge.graph_store`);
:mod:`~omnimed.data.loaders.graph_corpus` turns it into passages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Concept", "KnowledgeGraph", "Triple", "concept_key", "merge_graphs"]

@dataclass
class Concept:
    """A node of the knowledge graph: a disease, compound, gene, anatomy term, ...

    ``id`` is the native identifier (``DOID:9352``, ``DB00331``, ``3630`` for a gene); ``key`` adds the kind
    (``Disease::DOID:9352``), Hetionet's own scheme, and is what triples refer to (gene ids alone are ambiguous).
    """

    id: str
    kind: str
    name: str
    definition: str | None = None
    synonyms: list[str] = field(default_factory=list)
    xrefs: list[str] = field(default_factory=list)
    alt_ids: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """This concept's :func:`concept_key`."""
        return concept_key(self.kind, self.id)


@dataclass(frozen=True)
class Triple:
    """A typed relation between two concept keys, as its source states it (``subject relation object``)."""

    subject: str
    relation: str
    object: str
    source: str


@dataclass
class KnowledgeGraph:
    """Concepts by key, triples, alias keys (alternative ids -> primary key) and facts about the sources."""

    concepts: dict[str, Concept] = field(default_factory=dict)
    triples: list[Triple] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def concept_key(kind: str, cid: str) -> str:
    """The key triples use for a concept: ``Kind::id`` (``Disease::DOID:9352``)."""
    return f"{kind}::{cid}"


# ---------------------------------------------------------------------------------------------- merging
def _copy_concept(c: Concept) -> Concept:
    return Concept(
        c.id, c.kind, c.name, c.definition, list(c.synonyms), list(c.xrefs), list(c.alt_ids), list(c.sources)
    )


def _absorb(have: Concept, other: Concept, *, alias: str | None) -> None:
    """Merge ``other`` into ``have``: fill missing name/definition, unite lists, note ``alias`` as an alt_id."""
    have.name = have.name or other.name
    have.definition = have.definition or other.definition
    for attr in ("synonyms", "xrefs", "alt_ids", "sources"):
        mine = getattr(have, attr)
        mine.extend(v for v in getattr(other, attr) if v not in mine)
    if alias is not None and alias not in have.alt_ids:
        have.alt_ids.append(alias)


def merge_graphs(*graphs: KnowledgeGraph) -> KnowledgeGraph:
    """Union of graphs; the same key (after resolving every graph's aliases) is one concept.

    Earlier graphs win for name and definition, lists are united in order, duplicate triples dropped. Passing the
    ontology first makes a Disease Ontology term and the Hetionet disease with the same DOID (or one of its
    alt_ids) a single concept with DO's definition and Hetionet's relations.
    """
    aliases: dict[str, str] = {}
    for g in graphs:
        aliases.update(g.aliases)
    merged = KnowledgeGraph(aliases=aliases, info={"parts": [g.info for g in graphs]})

    def resolve(key: str) -> str:
        return aliases.get(key, key)

    copied: set[str] = set()  # keys whose merged concept is our own copy, safe to change
    for g in graphs:
        for key, concept in g.concepts.items():
            primary = resolve(key)
            have = merged.concepts.get(primary)
            if have is None and primary == key:
                merged.concepts[key] = concept  # shared until something must change it
                continue
            if have is None:  # known by an alias: file it under the primary id
                kind, _, cid = primary.partition("::")
                have = merged.concepts[primary] = Concept(cid, kind, concept.name)
            elif primary not in copied:
                have = merged.concepts[primary] = _copy_concept(have)
            copied.add(primary)
            _absorb(have, concept, alias=concept.id if primary != key else None)
    seen: set[tuple[str, str, str]] = set()
    for g in graphs:
        for t in g.triples:
            s, o = resolve(t.subject), resolve(t.object)
            if (s, t.relation, o) not in seen:
                seen.add((s, t.relation, o))
                merged.triples.append(Triple(s, t.relation, o, t.source))
    return merged

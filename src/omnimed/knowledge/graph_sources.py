"""The graphs the graph source serves: the real Disease Ontology + Hetionet graph and the synthetic world's.

Both come out as a :class:`~omnimed.data.loaders.knowledge_graph.KnowledgeGraph`, ready for
:meth:`omnimed.knowledge.graph_store.GraphStore.build`; parsing the real files is the corpora loaders' job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.hetionet import read_hetionet
from omnimed.data.loaders.knowledge_graph import Concept, KnowledgeGraph, Triple, concept_key, merge_graphs
from omnimed.data.loaders.obo import parse_obo

if TYPE_CHECKING:
    from omnimed.data.world import World

__all__ = ["WORLD_RELATIONS", "WORLD_SOURCE", "realdata_graph", "world_graph"]

#: the ``sources`` entry of world concepts; world triples carry ``"omnimed-world:<fact id>"`` as their source
WORLD_SOURCE = "omnimed-world"


def realdata_graph(
    graph_dir: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None
) -> KnowledgeGraph:
    """The real graph: Disease Ontology terms merged with Hetionet (DO first, so DO names and definitions win).

    ``graph_dir`` is the realdata ``graph/`` folder or the realdata root; parsing is the corpora loaders' job.
    """
    ontology = parse_obo(graph_dir, skip_invalid=skip_invalid, report=report)
    hetionet = read_hetionet(graph_dir, skip_invalid=skip_invalid, report=report)
    merged = merge_graphs(ontology, hetionet)
    merged.info["date"] = ontology.info.get("date")
    return merged


#: world fact relations that the graph source states, with the label render_graph writes for them
WORLD_RELATIONS = {
    "affects": "affects",
    "has_symptom": "has symptom",
    "has_finding": "has finding",
    "causal_gene": "associated gene",
    "member_of": "member of",
    "mechanism_of_action": "mechanism of action",
    "targets": "targets",
    "part_of": "part of",
}
#: entity types left out: issuers only sign guidelines, the graph never names them
_WORLD_SKIP_TYPES = frozenset({"issuer"})


def world_graph(world: World) -> KnowledgeGraph:
    """The synthetic world's graph source as a KnowledgeGraph, consistent with its graph passages.

    Every entity (but issuers) is a concept keyed ``type::id``, its aliases its synonyms (the world's synonym
    links: a question naming a disease by its abbreviation finds the concept); a concept with a graph passage takes that
    passage's first line ("Name: a disorder of the renal system.") as its definition and the passage id as an
    xref. Triples are the facts render_graph states between entities (:data:`WORLD_RELATIONS`, plus a pathway's
    "active in" system), labelled as render_graph labels them; each triple's source is
    ``"omnimed-world:<fact id>"`` so a hit can be traced back to the facts it states. Facts whose object is a
    literal (chromosome, half-life, ...) live in the definitions, as in the passages; guideline and trial facts
    stay in their own sources.
    """
    model = world.model
    keys = {
        eid: concept_key(e.type, eid) for eid, e in model.entities.items() if e.type not in _WORLD_SKIP_TYPES
    }
    first_lines: dict[str, tuple[str, str]] = {}
    for p in world.passages:
        if p.source == "graph" and p.metadata.get("about"):
            first_lines.setdefault(p.metadata["about"][0], (p.text.split("\n", 1)[0].strip(), p.id))
    concepts: dict[str, Concept] = {}
    for eid, key in keys.items():
        ent = model.entities[eid]
        definition, passage_id = first_lines.get(eid, (None, None))
        concepts[key] = Concept(
            id=eid,
            kind=ent.type,
            name=ent.name,
            definition=definition,
            synonyms=list(ent.aliases),
            xrefs=[passage_id] if passage_id else [],
            sources=[WORLD_SOURCE],
        )
    triples = [
        Triple(keys[f.subject], WORLD_RELATIONS[f.relation], keys[f.object], f"{WORLD_SOURCE}:{f.id}")
        for f in model.facts
        if f.relation in WORLD_RELATIONS and f.subject in keys and f.object in keys
    ]
    triples += [
        Triple(keys[pw.entity.id], "active in", keys[pw.system.id], f"{WORLD_SOURCE}:{pw.fact}")
        for pw in model.pathways
    ]
    info = {"source": WORLD_SOURCE, "seed": world.seed, "size": world.size, "fictional": True}
    return KnowledgeGraph(concepts=concepts, triples=triples, info=info)

"""Reader of Hetionet v1.0 as a :class:`~omnimed.data.loaders.knowledge_graph.KnowledgeGraph`.

Nodes come from Hetionet's node table (``id, name, kind`` with ids ``Kind::native``), edges from the
neo4j-import edge files of chizy7-HetioNet (header ``:START_ID(Kind)<TAB>:END_ID(Kind)``, the relation named
by the file). A malformed row raises :class:`RecordError` naming file, line and column; ``skip_invalid=True``
skips it instead and counts it in ``report.skipped``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, text_lines
from omnimed.data.loaders.knowledge_graph import Concept, KnowledgeGraph, Triple, concept_key
from omnimed.data.loaders.realdata_layout import HETIONET_EDGES, HETIONET_NODES, find_graph_dir, locate

__all__ = ["HETIONET_SOURCE", "read_hetionet"]

#: the source name of Hetionet concepts and triples
HETIONET_SOURCE = "hetionet"
_NEO4J_ID = re.compile(r"^:(START|END)_ID\((?P<kind>[^)]+)\)$")


def _iter_tsv(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, cells)`` for each non-blank line of a tab-separated file (CRLF or LF)."""
    for lineno, line in enumerate(text_lines(path, newline=""), start=1):
        line = line.rstrip("\r\n")
        if line.strip():
            yield lineno, line.split("\t")


def _read_nodes(path: Path, skip_invalid: bool, report: LoadReport | None) -> dict[str, Concept]:
    """Hetionet's node table ``id, name, kind`` with ids ``Kind::native``."""
    rows = _iter_tsv(path)
    first = next(rows, None)
    if first is None or [c.strip() for c in first[1][:3]] != ["id", "name", "kind"]:
        raise RecordError(path, first[0] if first else 1, None, "expected the header 'id<TAB>name<TAB>kind'")

    def convert(item: tuple[int, list[str]]) -> Concept:
        line, cells = item
        if len(cells) < 3:
            raise RecordError(
                path, line, None, f"expected 3 tab-separated columns (id, name, kind), got {len(cells)}"
            )
        key, name, kind = (c.strip() for c in cells[:3])
        node_kind, sep, cid = key.partition("::")
        if not sep or not cid:
            raise RecordError(path, line, "id", f"expected 'Kind::identifier', got {key!r}")
        if node_kind != kind:
            raise RecordError(path, line, "kind", f"expected {node_kind!r} (the id's prefix), got {kind!r}")
        if not name:
            raise RecordError(path, line, "name", "empty; expected the node's name")
        return Concept(id=cid, kind=kind, name=name, sources=[HETIONET_SOURCE])

    return {c.key: c for c in collect(rows, report, skip_invalid, convert)}


def _edge_relation(path: Path, start_kind: str) -> str:
    """The relation of a neo4j-import edge file from its name: ``Compound_Treats_Disease.tsv`` -> ``treats``."""
    stem = path.stem
    prefix = start_kind.replace(" ", "_") + "_"
    rest = stem[len(prefix) :] if stem.startswith(prefix) else stem.partition("_")[2]
    relation = rest.split("_", 1)[0].lower()
    if not relation:
        raise RecordError(path, None, None, "expected a file name 'Start_Relation_End.tsv'")
    return relation


def _edge_kinds(header: list[str]) -> tuple[str, str] | None:
    """The node kinds of a ``:START_ID(Kind)``, ``:END_ID(Kind)`` header; None when it is not one."""
    matches = [_NEO4J_ID.match(c) for c in header]
    if len(matches) != 2 or matches[0] is None or matches[1] is None:
        return None
    if (matches[0].group(1), matches[1].group(1)) != ("START", "END"):
        return None
    return matches[0].group("kind"), matches[1].group("kind")


def _read_edges(
    path: Path, concepts: dict[str, Concept], skip_invalid: bool, report: LoadReport | None
) -> list[Triple]:
    """One neo4j-import edge file (header ``:START_ID(Kind)<TAB>:END_ID(Kind)``) as triples between node keys."""
    rows = _iter_tsv(path)
    first = next(rows, None)
    header = [c.strip() for c in first[1][:2]] if first else []
    kinds = _edge_kinds(header)
    if kinds is None:
        line = first[0] if first else 1
        raise RecordError(path, line, ":START_ID", "expected the header ':START_ID(Kind)<TAB>:END_ID(Kind)'")
    start_kind, end_kind = kinds
    relation = _edge_relation(path, start_kind)

    def convert(item: tuple[int, list[str]]) -> Triple:
        line, cells = item
        if len(cells) < 2:
            raise RecordError(
                path, line, None, f"expected 2 tab-separated columns (start, end), got {len(cells)}"
            )
        ends = []
        for column, kind, cid in ((header[0], start_kind, cells[0]), (header[1], end_kind, cells[1])):
            key = concept_key(kind, cid.strip())
            if key not in concepts:
                raise RecordError(
                    path, line, column, f"unknown {kind} {cid.strip()!r}; expected an id of the node table"
                )
            ends.append(key)
        return Triple(ends[0], relation, ends[1], HETIONET_SOURCE)

    return collect(rows, report, skip_invalid, convert)


def read_hetionet(
    folder: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None
) -> KnowledgeGraph:
    """Hetionet v1.0 nodes and the neo4j-import edge files (chizy7-HetioNet) as concepts and triples.

    ``folder`` is the realdata ``graph/`` folder or the realdata root. Edges are read from every ``*.tsv`` of the
    edges folder in name order; an edge naming a node the node table lacks is a malformed record.
    """
    graph_dir = find_graph_dir(folder)
    nodes_path = locate(graph_dir, HETIONET_NODES)
    edges_dir = locate(graph_dir, HETIONET_EDGES, want_dir=True)
    concepts = _read_nodes(nodes_path, skip_invalid, report)
    triples: list[Triple] = []
    edge_files = sorted(edges_dir.glob("*.tsv"))
    for edge_file in edge_files:
        triples.extend(_read_edges(edge_file, concepts, skip_invalid, report))
    info = {"source": HETIONET_SOURCE, "nodes": str(nodes_path), "edge_files": [p.name for p in edge_files]}
    return KnowledgeGraph(concepts=concepts, triples=triples, info=info)

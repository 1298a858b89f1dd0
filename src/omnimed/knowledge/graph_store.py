"""The graph source's store: concepts, definitions and typed relations in one SQLite file (Omni-RAG §3.2).

Omni-RAG keeps UMLS/DrugBank definitions and relations in SQLite. :class:`GraphStore` builds such a file from
any :class:`~omnimed.data.loaders.knowledge_graph.KnowledgeGraph` (see :mod:`omnimed.knowledge.graph_sources`),
opens it read-only and looks concepts, names and one-hop relations up; matching a term and ranking relations
against a question is :mod:`omnimed.knowledge.graph_search`'s job.

The database holds four tables: ``concepts`` (one row per concept, lists as JSON), ``names`` (every name and
synonym, normalised, for matching; mirrored in an FTS5 table with the porter tokenizer when SQLite has FTS5),
``relations`` (subject key, relation, object key, source; indexed both ways) and ``aliases`` (alternative keys).
A build writes a temporary file in one transaction and renames it over the target, so a failed build never leaves
a half-written store and never damages an existing one.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from typing_extensions import Self

from omnimed.data.artifacts import atomic_path
from omnimed.data.loaders.graph_corpus import INVERSE_RELATIONS, RELATION_PRIORITY
from omnimed.data.loaders.knowledge_graph import Concept, KnowledgeGraph
from omnimed.knowledge.graph_search import DEFAULT_K_RELATIONS, Scorer, answer_graph_query, match_concepts
from omnimed.knowledge.graph_text import normalise_name
from omnimed.knowledge.types import Hit, KnowledgeError

__all__ = ["SCHEMA_VERSION", "GraphStore", "Link", "Neighbour", "inverse_relation"]

SCHEMA_VERSION = 1

# ---------------------------------------------------------------------------------------------- relations
#: inverse labels of the world's relations, as render_graph writes them from the object's side
WORLD_INVERSE_RELATIONS = {
    "affects": "affected by",
    "has symptom": "symptom of",
    "has finding": "finding of",
    "associated gene": "associated with",
    "member of": "has member",
    "mechanism of action": "mechanism of action of",
    "targets": "targeted by",
    "part of": "has part",
    "active in": "site of",
}
_PRIORITY = {label: i for i, label in enumerate(RELATION_PRIORITY)}


def inverse_relation(relation: str) -> str:
    """How ``relation`` reads from its object's side ("treats" -> "treated_by")."""
    if relation in INVERSE_RELATIONS:
        return INVERSE_RELATIONS[relation]
    if relation in WORLD_INVERSE_RELATIONS:
        return WORLD_INVERSE_RELATIONS[relation]
    return f"{relation}_inverse" if " " not in relation else f"inverse of {relation}"


class Neighbour(NamedTuple):
    """A one-hop relation seen from a concept: its label from that side, the other concept's key and name."""

    relation: str
    key: str
    name: str


class Link(NamedTuple):
    """A neighbour plus the triple as its source states it (for ``A | relation | B`` lines)."""

    label: str
    other: str
    other_name: str
    subject_name: str
    relation: str
    object_name: str
    source: str

    @property
    def line(self) -> str:
        """The triple as its source states it: ``subject | relation | object``."""
        return f"{self.subject_name} | {self.relation} | {self.object_name}"


# ---------------------------------------------------------------------------------------------- schema
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE concepts (
    key TEXT PRIMARY KEY, id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, definition TEXT,
    synonyms TEXT NOT NULL, xrefs TEXT NOT NULL, alt_ids TEXT NOT NULL, sources TEXT NOT NULL,
    degree INTEGER NOT NULL
);
CREATE TABLE names (
    rowid INTEGER PRIMARY KEY, norm TEXT NOT NULL, name TEXT NOT NULL, key TEXT NOT NULL, is_primary INTEGER NOT NULL
);
CREATE TABLE relations (subject TEXT NOT NULL, relation TEXT NOT NULL, object TEXT NOT NULL, source TEXT NOT NULL);
CREATE TABLE aliases (alias TEXT PRIMARY KEY, key TEXT NOT NULL);
"""
_INDEXES = """
CREATE INDEX names_norm ON names(norm);
CREATE INDEX relations_subject ON relations(subject);
CREATE INDEX relations_object ON relations(object);
"""
_FTS = "CREATE VIRTUAL TABLE names_fts USING fts5(norm, tokenize='porter unicode61 remove_diacritics 2')"
_FTS_CANDIDATES = 200


def _has_fts5(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("CREATE VIRTUAL TABLE temp._probe USING fts5(x)")
        conn.execute("DROP TABLE temp._probe")
        return True
    except sqlite3.OperationalError:
        return False


def _concept_rows(graph: KnowledgeGraph, degree: Counter[str]) -> Iterator[tuple[Any, ...]]:
    for key, c in graph.concepts.items():
        if not isinstance(c.name, str) or not c.name.strip():
            raise KnowledgeError(f"concept {key!r}: expected a non-empty name, got {c.name!r}")
        yield (
            key,
            c.id,
            c.kind,
            c.name.strip(),
            (c.definition or "").strip() or None,
            json.dumps(list(c.synonyms), ensure_ascii=False),
            json.dumps(list(c.xrefs), ensure_ascii=False),
            json.dumps(list(c.alt_ids), ensure_ascii=False),
            json.dumps(list(c.sources), ensure_ascii=False),
            degree[key],
        )


def _name_rows(graph: KnowledgeGraph) -> Iterator[tuple[str, str, str, int]]:
    for key, c in graph.concepts.items():
        seen: set[str] = set()
        for i, name in enumerate([c.name, *c.synonyms]):
            norm = normalise_name(name or "")
            if norm and norm not in seen:
                seen.add(norm)
                yield norm, name.strip(), key, int(i == 0)


def _resolved_triples(graph: KnowledgeGraph) -> tuple[list[tuple[str, str, str, str]], int]:
    """Triples with alias keys resolved and duplicates dropped; those naming an unknown concept are counted."""
    resolve = graph.aliases.get
    rows: list[tuple[str, str, str, str]] = []
    seen: set[tuple[str, str, str]] = set()
    dangling = 0
    for t in graph.triples:
        s, o = resolve(t.subject, t.subject), resolve(t.object, t.object)
        if s not in graph.concepts or o not in graph.concepts:
            dangling += 1
        elif (s, t.relation, o) not in seen:
            seen.add((s, t.relation, o))
            rows.append((s, t.relation, o, t.source))
    return rows, dangling


def _write_graph(
    conn: sqlite3.Connection, graph: KnowledgeGraph, meta: dict[str, Any] | None, use_fts: bool | None
) -> None:
    """Fill an empty database with ``graph``, schema and indexes included, in one transaction."""
    fts = _has_fts5(conn) if use_fts is None else use_fts
    relations, dangling = _resolved_triples(graph)
    degree: Counter[str] = Counter()
    for s, _, o, _ in relations:
        degree[s] += 1
        if o != s:
            degree[o] += 1
    aliases = [
        (a, k) for a, k in graph.aliases.items() if k in graph.concepts and a not in graph.concepts
    ]
    info = {
        "schema_version": SCHEMA_VERSION,
        "fts": fts,
        "n_concepts": len(graph.concepts),
        "n_relations": len(relations),
        "n_definitions": sum(bool((c.definition or "").strip()) for c in graph.concepts.values()),
        "dangling_relations": dangling,
        "graph_info": graph.info,
        "user": meta or {},
    }
    conn.execute("BEGIN")  # everything, schema included, in one transaction
    for statement in filter(str.strip, _SCHEMA.split(";")):
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO concepts VALUES (?,?,?,?,?,?,?,?,?,?)", _concept_rows(graph, degree)
    )
    conn.executemany(
        "INSERT INTO names (norm, name, key, is_primary) VALUES (?,?,?,?)", _name_rows(graph)
    )
    conn.executemany("INSERT INTO relations VALUES (?,?,?,?)", relations)
    conn.executemany("INSERT INTO aliases VALUES (?,?)", aliases)
    for statement in filter(str.strip, _INDEXES.split(";")):
        conn.execute(statement)
    if fts:
        conn.execute(_FTS)
        conn.execute("INSERT INTO names_fts (rowid, norm) SELECT rowid, norm FROM names")
    info["n_names"] = conn.execute("SELECT COUNT(*) FROM names").fetchone()[0]
    conn.executemany(
        "INSERT INTO meta VALUES (?,?)",
        [(k, json.dumps(v, ensure_ascii=False, default=str)) for k, v in info.items()],
    )
    conn.execute("COMMIT")


# ---------------------------------------------------------------------------------------------- the store
class GraphStore:
    """A read-only view of one graph database file; build one with :meth:`GraphStore.build`.

    ``match`` finds concepts by name, ``neighbours`` lists one-hop relations in both directions, and ``query``
    answers an Omni-RAG graph query with one :class:`Hit` (definition plus the relations ranked against the
    question; both implemented in :mod:`omnimed.knowledge.graph_search`). Safe to share between threads for
    reading.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, meta: dict[str, Any]) -> None:
        self._conn = conn
        self.path = path
        self.meta = meta
        self.has_fts = bool(meta.get("fts"))

    # ------------------------------------------------------------------ build / open
    @classmethod
    def build(
        cls,
        graph: KnowledgeGraph,
        path: str | Path,
        *,
        meta: dict[str, Any] | None = None,
        use_fts: bool | None = None,
    ) -> GraphStore:
        """Write ``graph`` to a new database at ``path`` (replacing any old one atomically) and open it.

        Everything is written to a temporary file next to ``path`` in one transaction, then renamed over it: a
        failure leaves the old file as it was and no partial file behind. ``meta`` (JSON-serialisable) is stored
        with the counts; ``use_fts=None`` uses FTS5 when SQLite has it, ``False`` forces the LIKE fallback.
        Triples naming a concept the graph lacks are dropped and counted in ``meta["dangling_relations"]``.
        """
        path = Path(path)
        with atomic_path(path) as tmp:  # an empty file: sqlite3 takes it as a new database
            conn = sqlite3.connect(tmp, isolation_level=None)  # transactions are ours
            try:
                _write_graph(conn, graph, meta, use_fts)
            finally:
                conn.close()
        return cls.open(path)

    @classmethod
    def open(cls, path: str | Path) -> GraphStore:
        """Open a store read-only; a missing or foreign file raises :class:`KnowledgeError` naming ``path``."""
        path = Path(path)
        if not path.is_file():
            raise KnowledgeError(
                f"graph store {path} does not exist; build it with GraphStore.build(graph, path)"
            )
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        try:
            meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise KnowledgeError(f"graph store {path} is not a graph database ({exc})") from None
        if meta.get("schema_version") != SCHEMA_VERSION:
            conn.close()
            raise KnowledgeError(
                f"graph store {path} has schema version {meta.get('schema_version')!r}; expected {SCHEMA_VERSION}"
                " (rebuild it)"
            )
        return cls(conn, path, meta)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.meta["n_concepts"])

    def __repr__(self) -> str:
        counts = f"concepts={self.meta['n_concepts']}, relations={self.meta['n_relations']}"
        return f"GraphStore({str(self.path)!r}, {counts})"

    # ------------------------------------------------------------------ lookups
    def resolve(self, key: str) -> str | None:
        """The primary key of ``key`` (itself, or the concept an alternative id stands for); None if unknown."""
        if self._conn.execute("SELECT 1 FROM concepts WHERE key = ?", (key,)).fetchone():
            return key
        row = self._conn.execute("SELECT key FROM aliases WHERE alias = ?", (key,)).fetchone()
        return row[0] if row else None

    def concept(self, key: str) -> Concept | None:
        """The concept stored under ``key`` (alternative ids resolved), or None."""
        primary = self.resolve(key)
        if primary is None:
            return None
        row = self._conn.execute(
            "SELECT id, kind, name, definition, synonyms, xrefs, alt_ids, sources FROM concepts WHERE key = ?",
            (primary,),
        ).fetchone()
        cid, kind, name, definition, synonyms, xrefs, alt_ids, sources = row
        return Concept(
            cid,
            kind,
            name,
            definition,
            json.loads(synonyms),
            json.loads(xrefs),
            json.loads(alt_ids),
            json.loads(sources),
        )

    def degree(self, key: str) -> int:
        """How many relations touch ``key`` (both directions); 0 for an unknown key."""
        primary = self.resolve(key)
        return self.richness([primary])[primary][1] if primary else 0

    def richness(self, keys: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``key -> (has a definition, number of relations)``: what a concept has to offer a reader."""
        out: dict[str, tuple[int, int]] = {}
        keys = list(dict.fromkeys(keys))
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            sql = f"SELECT key, definition IS NOT NULL, degree FROM concepts WHERE key IN ({','.join('?' * len(chunk))})"
            out.update((k, (int(d), int(n))) for k, d, n in self._conn.execute(sql, chunk))
        return out

    def exact_names(self, norm: str) -> list[tuple[str, int]]:
        """``(key, is_primary)`` of every name whose normalised form is ``norm``."""
        sql = "SELECT key, is_primary FROM names WHERE norm = ?"
        return [(key, int(is_primary)) for key, is_primary in self._conn.execute(sql, (norm,))]

    def name_candidates(self, norm: str) -> list[tuple[str, str, int]]:
        """``(key, normalised name, is_primary)`` rows sharing words with ``norm``: all words, else any word."""
        tokens = norm.split()
        for joiner in (" AND ", " OR "):
            if self.has_fts:
                expr = joiner.join(f'"{t}"' for t in tokens)
                sql = (
                    "SELECT n.key, n.norm, n.is_primary FROM names_fts JOIN names n ON n.rowid = names_fts.rowid "
                    "WHERE names_fts MATCH ? ORDER BY bm25(names_fts) LIMIT ?"
                )
                rows = self._conn.execute(sql, (expr, _FTS_CANDIDATES)).fetchall()
            else:  # word-prefix LIKE scan: slower, but works on any SQLite
                where = joiner.join(["(' ' || norm) LIKE ?"] * len(tokens))
                sql = f"SELECT key, norm, is_primary FROM names WHERE {where} ORDER BY length(norm), rowid LIMIT ?"
                rows = self._conn.execute(sql, (*[f"% {t}%" for t in tokens], _FTS_CANDIDATES)).fetchall()
            if rows:
                return rows
        return []

    def links(self, key: str) -> list[Link]:
        """Every relation touching ``key`` in both directions, in a fixed order (priority, label, name, key)."""
        sql = """
            SELECT r.relation, r.object, s.name, o.name, r.source, 0
              FROM relations r JOIN concepts s ON s.key = r.subject JOIN concepts o ON o.key = r.object
             WHERE r.subject = ?
            UNION ALL
            SELECT r.relation, r.subject, s.name, o.name, r.source, 1
              FROM relations r JOIN concepts s ON s.key = r.subject JOIN concepts o ON o.key = r.object
             WHERE r.object = ? AND r.subject != r.object
        """
        links = []
        for relation, other, s_name, o_name, source, inverse in self._conn.execute(sql, (key, key)):
            label, other_name = (inverse_relation(relation), s_name) if inverse else (relation, o_name)
            links.append(Link(label, other, other_name, s_name, relation, o_name, source))
        links.sort(
            key=lambda k: (_PRIORITY.get(k.label, len(_PRIORITY)), k.label, k.other_name.lower(), k.other)
        )
        return links

    def neighbours(self, key: str) -> list[Neighbour]:
        """One-hop relations of ``key`` in both directions as ``(relation seen from it, other key, other name)``."""
        primary = self.resolve(key)
        if primary is None:
            return []
        return [Neighbour(k.label, k.other, k.other_name) for k in self.links(primary)]

    # ------------------------------------------------------------------ search (omnimed.knowledge.graph_search)
    def match(self, term: str, limit: int = 5) -> list[tuple[str, float]]:
        """Concepts the term names, best first, as ``(key, score)``; see
        :func:`~omnimed.knowledge.graph_search.match_concepts` for the scores."""
        return match_concepts(self, term, limit)

    def query(
        self,
        term: str,
        question: str = "",
        *,
        k_relations: int = DEFAULT_K_RELATIONS,
        scorer: Scorer | None = None,
        k_concepts: int = 1,
        query_text: str | None = None,
    ) -> list[Hit]:
        """Answer a graph query: the best-matching concept's definition plus its top relations for ``question``;
        see :func:`~omnimed.knowledge.graph_search.answer_graph_query`."""
        return answer_graph_query(
            self,
            term,
            question,
            k_relations=k_relations,
            scorer=scorer,
            k_concepts=k_concepts,
            query_text=query_text,
        )

"""The graph source: concepts, definitions and typed relations in one SQLite file (Omni-RAG §3.2, §5.1.2).

Omni-RAG keeps UMLS/DrugBank definitions and relations in SQLite and answers a graph query ``term , question``
with the definition of the concept the term names plus its one-hop relations, reranked against the question
(there may be thousands) and cut to the top 10. :class:`GraphStore` does the same for any
:class:`~omnimed.data.loaders.corpora.KnowledgeGraph`: the real Disease Ontology + Hetionet graph
(:func:`realdata_graph`) or the synthetic world's graph (:func:`world_graph`).

The database holds four tables: ``concepts`` (one row per concept, lists as JSON), ``names`` (every name and
synonym, normalised, for matching; mirrored in an FTS5 table with the porter tokenizer when SQLite has FTS5),
``relations`` (subject key, relation, object key, source; indexed both ways) and ``aliases`` (alternative keys).
A build writes a temporary file in one transaction and renames it over the target, so a failed build never leaves
a half-written store and never damages an existing one.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from typing_extensions import Self

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.corpora import (
    INVERSE_RELATIONS,
    RELATION_PRIORITY,
    Concept,
    KnowledgeGraph,
    Triple,
    concept_key,
    merge_graphs,
    parse_obo,
    read_hetionet,
)
from omnimed.data.records import Passage
from omnimed.knowledge.types import Hit, KnowledgeError

if TYPE_CHECKING:
    from omnimed.data.world import World

__all__ = [
    "WORLD_RELATIONS",
    "WORLD_SOURCE",
    "GraphStore",
    "Neighbour",
    "graph_search",
    "inverse_relation",
    "lexical_scores",
    "normalise_name",
    "parse_graph_query",
    "realdata_graph",
    "world_graph",
]

SCHEMA_VERSION = 1
DEFAULT_K_RELATIONS = 10
#: the ``sources`` entry of world concepts; world triples carry ``"omnimed-world:<fact id>"`` as their source
WORLD_SOURCE = "omnimed-world"
#: a scorer ranks relation lines against a question: ``scorer(question, lines) -> one score per line``
Scorer = Callable[[str, list[str]], Sequence[float]]

# ---------------------------------------------------------------------------------------------- text helpers
_NON_WORD = re.compile(r"[\W_]+")
_POSSESSIVE = re.compile(r"['’]s\b")
_STOPWORD_TEXT = (
    "a an the of in on at to for from by with and or not no is are was were be been being what which who "
    "whom whose how why when where does do did done this that these those it its their there than then "
    "into about as can could would should may might most more any all some each other such one"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def normalise_name(text: str) -> str:
    """Lower-case, accents stripped, possessive ``'s`` dropped, every run of non-word characters one space.

    "Alzheimer's Disease" and "alzheimer disease" normalise alike, which is what exact name matching compares.
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = _POSSESSIVE.sub("", text.lower())
    return " ".join(_NON_WORD.sub(" ", text).split())


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer  # PyStemmer: a declared dependency (also used by bm25s)

    return Stemmer.Stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(token: str) -> str:
    stem = _stemmer().stemWord(token)
    # "treatment" should meet "treats" / "treated_by"; snowball keeps the -ment
    return stem[:-4] if stem.endswith("ment") and len(stem) > 7 else stem


def _terms(text: str) -> list[str]:
    """Stemmed content tokens of ``text`` (stop words dropped), for scoring only."""
    return [_stem(t) for t in normalise_name(text).split() if t not in _STOPWORDS]


def lexical_scores(question: str, texts: list[str], *, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """BM25 of each text against ``question``, with the texts themselves as the collection.

    The default relation scorer: cheap, deterministic, and enough to put "X | has symptom | Y" first for "which
    symptoms does X cause?". Tokens are stemmed (snowball) and stop words dropped; a text sharing no term scores 0.
    """
    query = set(_terms(question))
    docs = [_terms(t) for t in texts]
    if not query or not docs:
        return [0.0] * len(docs)
    n = len(docs)
    avg_len = sum(len(d) for d in docs) / n or 1.0
    df = Counter(term for d in docs for term in set(d) if term in query)
    idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    out = []
    for d in docs:
        tf = Counter(term for term in d if term in idf)
        norm = k1 * (1.0 - b + b * len(d) / avg_len)
        out.append(sum(idf[t] * f * (k1 + 1.0) / (f + norm) for t, f in tf.items()))
    return out


def _dice(a: set[str], b: set[str]) -> float:
    return 2.0 * len(a & b) / (len(a) + len(b)) if a and b else 0.0


def parse_graph_query(text: str) -> tuple[str, str]:
    """Split an Omni-RAG graph query ``term , question`` at its first comma into ``(term, question)``.

    Without a comma (or with one side empty) the whole text serves as both term and question, so a bare term
    still finds its concept and ranks relations by the term itself.
    """
    term, sep, question = (part.strip() for part in text.partition(","))
    whole = " ".join(text.split())
    if not sep:
        return whole, whole
    term, question = " ".join(term.split()), " ".join(question.split())
    return term or question, question or term


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


class _Link(NamedTuple):
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


# ---------------------------------------------------------------------------------------------- the store
class GraphStore:
    """A read-only view of one graph database file; build one with :meth:`GraphStore.build`.

    ``match`` finds concepts by name, ``neighbours`` lists one-hop relations in both directions, and ``query``
    answers an Omni-RAG graph query with one :class:`Hit` (definition plus the relations ranked against the
    question). Safe to share between threads for reading.
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        conn = sqlite3.connect(tmp, isolation_level=None)  # transactions are ours
        try:
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
            conn.close()
            os.replace(tmp, path)
        except BaseException:
            conn.close()
            tmp.unlink(missing_ok=True)
            raise
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
        return self._richness([primary])[primary][1] if primary else 0

    def _richness(self, keys: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``key -> (has a definition, number of relations)``: what a concept has to offer a reader."""
        out: dict[str, tuple[int, int]] = {}
        keys = list(dict.fromkeys(keys))
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            sql = f"SELECT key, definition IS NOT NULL, degree FROM concepts WHERE key IN ({','.join('?' * len(chunk))})"
            out.update((k, (int(d), int(n))) for k, d, n in self._conn.execute(sql, chunk))
        return out

    def match(self, term: str, limit: int = 5) -> list[tuple[str, float]]:
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
        by_key = self.resolve(term.strip())
        if by_key is not None:
            scores[by_key] = 1.0
        norm = normalise_name(term)
        if norm:
            sql = "SELECT key, is_primary FROM names WHERE norm = ?"
            for key, is_primary in self._conn.execute(sql, (norm,)):
                scores[key] = max(scores.get(key, 0.0), 1.0 if is_primary else 0.95)
        out = self._ranked(scores, limit)
        if norm and len(out) < limit:
            out += self._ranked(self._fuzzy(norm, set(scores)), limit - len(out))
        return out

    def _ranked(self, scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
        rich = self._richness(list(scores))
        ranked = sorted(scores, key=lambda k: (-scores[k], *(-v for v in rich.get(k, (0, 0))), k))
        return [(k, scores[k]) for k in ranked[:limit]]

    def _candidates(self, norm: str) -> list[tuple[str, str, int]]:
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

    def _fuzzy(self, norm: str, exclude: set[str]) -> dict[str, float]:
        """Scores of the full-text candidates of ``norm`` (see :meth:`match`), best name per concept."""
        query = set(_terms(norm)) or set(norm.split())
        best: dict[str, float] = {}
        for key, name, is_primary in self._candidates(norm):
            words = set(_terms(name)) or set(name.split())
            if key in exclude or len(query & words) * 2 <= len(query):
                continue
            score = round(0.9 * _dice(query, words) * (1.0 if is_primary else 0.95), 6)
            best[key] = max(best.get(key, 0.0), score)
        return best

    def _links(self, key: str) -> list[_Link]:
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
            links.append(_Link(label, other, other_name, s_name, relation, o_name, source))
        links.sort(
            key=lambda k: (_PRIORITY.get(k.label, len(_PRIORITY)), k.label, k.other_name.lower(), k.other)
        )
        return links

    def neighbours(self, key: str) -> list[Neighbour]:
        """One-hop relations of ``key`` in both directions as ``(relation seen from it, other key, other name)``."""
        primary = self.resolve(key)
        if primary is None:
            return []
        return [Neighbour(k.label, k.other, k.other_name) for k in self._links(primary)]

    # ------------------------------------------------------------------ graph queries
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
        for rank, (key, match_score) in enumerate(self._informative_matches(term, k_concepts), start=1):
            passage = self._passage(key, term, question, match_score, k_relations, scorer or lexical_scores)
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

    def _informative_matches(self, term: str, k: int) -> list[tuple[str, float]]:
        """The best ``k`` matches, those with a definition or relations before bare names (a reader gains
        nothing from a name alone, e.g. a Hetionet side effect without edges), each group by match score."""
        if k <= 0:
            return []
        matches = self.match(term, limit=k + 5)
        rich = self._richness([key for key, _ in matches])
        matches.sort(key=lambda m: not any(rich.get(m[0], (0, 0))))  # stable: keeps the score order
        return matches[:k]

    def _passage(
        self, key: str, term: str, question: str, match_score: float, k_relations: int, scorer: Scorer
    ) -> Passage:
        concept = self.concept(key)
        assert concept is not None
        links = self._links(key)
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


# ---------------------------------------------------------------------------------------------- graph builders
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

    Every entity (but issuers) is a concept keyed ``type::id``; a concept with a graph passage takes that
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

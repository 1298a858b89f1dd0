"""Loaders that turn the real knowledge corpora into :class:`~omnimed.data.records.Passage` records.

One loader per knowledge-source kind, each reading the file layout of ``shared/realdata`` (see its MANIFEST.md):

* ``load_book``      OpenStax *Anatomy & Physiology 2e* sections (JSONL)             -> source "book"
* ``load_guideline`` National Guideline Clearinghouse summaries (JSONL)               -> source "guideline"
* ``load_wiki``      MedQuAD consumer-health answers (JSONL)                           -> source "wiki"
* ``load_graph``     Hetionet nodes + edges (TSV) and the Disease Ontology (OBO)      -> source "graph"

Every loader takes the file itself or any folder above it in the realdata layout (the realdata root, the kind
folder, the repository folder, ...). A malformed record raises :class:`RecordError` naming file, line and field;
``skip_invalid=True`` skips it instead and counts it in ``report.skipped``. Records that are well formed but carry
no text (an empty section or answer) are never errors: they are left out and counted in
``report.excluded["empty text"]`` either way.

The graph part also exposes plain dataclasses (:class:`Concept`, :class:`Triple`, :class:`KnowledgeGraph`) through
:func:`parse_obo` and :func:`read_hetionet`, so the knowledge base can be loaded into a database without going
through passages.
"""

from __future__ import annotations

import datetime
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, iter_jsonl
from omnimed.data.records import Passage

__all__ = [
    "Concept",
    "DateEvent",
    "KnowledgeGraph",
    "Triple",
    "concept_key",
    "graph_passages",
    "load_book",
    "load_graph",
    "load_guideline",
    "load_realdata",
    "load_wiki",
    "merge_graphs",
    "parse_ngc_date",
    "parse_obo",
    "read_hetionet",
]

# ---------------------------------------------------------------------------------------------- realdata layout
#: where each corpus lives, relative to the realdata root
BOOK_FILE = "book/osbooks-anatomy-physiology/derived/ap2e_sections.jsonl"
GUIDELINE_FILE = "guideline/national-guideline-clearinghouse/derived/ngc_summaries.jsonl"
WIKI_FILE = "wiki/MedQuAD/derived/medquad_with_answers.jsonl"
GRAPH_DIR = "graph"
#: relative to the graph folder
HETIONET_NODES = "hetionet/hetnet/tsv/hetionet-v1.0-nodes.tsv"
HETIONET_EDGES = "chizy7-HetioNet/data/edges"
DO_OBO = "HumanDiseaseOntology/src/ontology/doid.obo"

DEFAULT_MAX_RELATIONS = 30
#: the LoadReport.excluded reason for records without text (an empty section or answer)
EMPTY_TEXT = "empty text"


def _locate(path: str | Path, layout: str, *, want_dir: bool = False) -> Path:
    """Find ``layout`` (a path relative to some root) from ``path``: the target itself or any folder above it.

    ``path / tail`` is tried for every tail of ``layout``, longest first, so the realdata root, the kind folder,
    the repository folder and the file's own folder all work.
    """
    path = Path(path)
    parts = Path(layout).parts
    if not want_dir and path.is_file():
        return path
    if path.is_dir():
        for i in range(len(parts)):
            candidate = path.joinpath(*parts[i:])
            if candidate.is_dir() if want_dir else candidate.is_file():
                return candidate
        if want_dir and path.name == parts[-1]:
            return path
    raise FileNotFoundError(f"{path}: expected {layout!r} (or a folder on the way to it) here; not found")


def _graph_dir(path: str | Path) -> Path:
    """The realdata ``graph/`` folder, given it or the realdata root."""
    path = Path(path)
    if (path / GRAPH_DIR).is_dir() and not (path / Path(HETIONET_NODES).parts[0]).exists():
        return path / GRAPH_DIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: expected the realdata graph folder (or the realdata root); not a folder"
        )
    return path


# ---------------------------------------------------------------------------------------------- raw field access
class _Row:
    """One raw JSON object with its file and line; typed accessors raise RecordError naming all three."""

    def __init__(self, path: Path, line: int, obj: Any):
        if not isinstance(obj, dict):
            raise RecordError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
        self.path, self.line, self.obj = path, line, obj

    def error(self, key: str | None, message: str) -> RecordError:
        return RecordError(self.path, self.line, key, message)

    def text(self, key: str, *, required: bool = True) -> str:
        """The string at ``key``; a missing/null optional field reads as ``""``."""
        value = self.obj.get(key)
        if value is None:
            if required:
                what = "missing" if key not in self.obj else "null"
                raise self.error(key, f"{what}; expected a string")
            return ""
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {type(value).__name__}")
        return value

    def ident(self, key: str = "id") -> str:
        """A required non-empty identifier."""
        value = self.text(key).strip()
        if not value:
            raise self.error(key, "empty; expected a non-empty identifier")
        return value

    def string_list(self, key: str) -> list[str]:
        """A list of strings, also accepting its string spellings: ``"[]"``, ``'["C1", "C2"]'``, ``"C1, C2"``."""
        value = self.obj.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            inner = value.strip().removeprefix("[").removesuffix("]")
            return [
                tok.strip().strip("'\"") for tok in re.split(r"[,\s]+", inner) if tok.strip().strip("'\"")
            ]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v.strip() for v in value if v.strip()]
        raise self.error(key, f"expected a list of strings (or its string form), got {value!r}"[:200])

    def extras(self, known: Iterable[str]) -> dict[str, Any]:
        """Fields the loader does not map itself, kept in metadata so nothing is lost."""
        known = set(known)
        return {k: v for k, v in self.obj.items() if k not in known}


def _exclude_empty(report: LoadReport | None) -> None:
    """Count a well-formed record that has nothing to retrieve: left out by design, not invalid."""
    if report is not None:
        report.exclude(EMPTY_TEXT)


def _passage(row: _Row, **data: Any) -> Passage:
    """Build a Passage; a value the record type rejects becomes a RecordError at the source line."""
    return Passage.from_dict(data, path=str(row.path), line=row.line)


def _clean_lines(text: str) -> str:
    """Trim each line and drop blank ones (NGC text pads headings with spaces). Splits on ``\\n`` only."""
    return "\n".join(s for s in (line.strip() for line in text.split("\n")) if s)


def _load_jsonl(
    path: Path,
    convert: Callable[[_Row], Passage | None],
    skip_invalid: bool,
    report: LoadReport | None,
) -> list[Passage]:
    """Read a JSONL corpus line by line (``iter_jsonl``) and convert each object with ``convert``.

    Lines of invalid JSON are errors like bad fields: with ``skip_invalid`` they are skipped and counted.
    """
    rows = iter_jsonl(path, skip_invalid=skip_invalid, report=report)
    return collect(rows, report, skip_invalid, lambda item: convert(_Row(path, *item)))


# ---------------------------------------------------------------------------------------------- book
def load_book(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None, **options: Any
) -> list[Passage]:
    """OpenStax A&P sections ``{id, module, unit, chapter, module_title, section_title, text}`` -> "book" passages.

    Title is "module title — section title", parent is the module (the textbook page the section belongs to),
    authority is OpenStax. Sections with empty text are left out, counted in ``report.excluded``.
    """
    _no_options(options, "load_book")
    file = _locate(path, BOOK_FILE)

    def convert(row: _Row) -> Passage | None:
        pid, module = row.ident(), row.ident("module")
        text = row.text("text").strip()
        if not text:
            _exclude_empty(report)
            return None
        module_title = row.text("module_title", required=False).strip()
        section_title = row.text("section_title", required=False).strip()
        parts = [module_title] if module_title == section_title else [module_title, section_title]
        title = " — ".join(t for t in parts if t)
        metadata = {
            "corpus": "openstax-anatomy-physiology-2e",
            "unit": row.text("unit", required=False),
            "chapter": row.text("chapter", required=False),
            "module_title": module_title,
            "section_title": section_title,
            **row.extras({"id", "module", "unit", "chapter", "module_title", "section_title", "text"}),
        }
        return _passage(
            row,
            id=pid,
            source="book",
            title=title,
            text=text,
            authority="OpenStax",
            parent_id=module,
            metadata=metadata,
        )

    return _load_jsonl(file, convert, skip_invalid, report)


# ---------------------------------------------------------------------------------------------- guideline
_MONTHS = {
    m: i
    for i, names in enumerate(
        (
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ),
        start=1,
    )
    for m in names
}
_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
#: "2013", "2013 Nov", "2013 Nov 5", "2013 Oct-Dec" (a range keeps its first month), "Aug 2010"
_NGC_DATE = re.compile(
    rf"(?P<y>\d{{4}})(?:\s+(?P<m>{_MONTH})(?:\s*-\s*{_MONTH})?(?:\s+(?P<d>\d{{1,2}}))?)?"
    rf"|(?P<m2>{_MONTH})\s+(?P<y2>\d{{4}})",
    re.IGNORECASE,
)
#: events whose date is the date of the text's version (reaffirmed/addenda leave the summary as it was)
_VERSION_EVENTS = ("released", "revised", "updated")


@dataclass(frozen=True)
class DateEvent:
    """One dated event of a guideline's history, e.g. ``DateEvent("revised", "2013-08")``."""

    event: str
    date: str


def _iso_date(match: re.Match[str]) -> str | None:
    """ISO ``YYYY[-MM[-DD]]`` of one ``_NGC_DATE`` match; None for an impossible day such as Feb 30."""
    year = int(match["y"] or match["y2"])
    month_name = match["m"] or match["m2"]
    if month_name is None:
        return f"{year:04d}"
    month = _MONTHS[month_name.lower().rstrip(".")]
    if match["d"] is None:
        return f"{year:04d}-{month:02d}"
    try:
        return datetime.date(year, month, int(match["d"])).isoformat()
    except ValueError:
        return None


def _dates_in(clause: str) -> list[str]:
    """All dates in ``clause`` (``"2014 Jul 20 and 2016 May 10"``); empty if any part is not a date."""
    clause = clause.strip()
    pos, dates = 0, []
    for match in _NGC_DATE.finditer(clause):
        between = clause[pos : match.start()].strip(" ,")
        if between not in ("", "and"):
            return []
        iso = _iso_date(match)
        if iso is None:
            return []
        dates.append(iso)
        pos = match.end()
    return dates if clause[pos:].strip() == "" else []


def parse_ngc_date(raw: str) -> list[DateEvent] | None:
    """Parse an NGC ``date_released`` string into its dated events, strictly; None if the release date is unreadable.

    Handles "2013 Nov", "2013 Nov 5", "2014 Apr-Jun", "2011 May (revised 2013 Aug)",
    "1998 (revised 2008; reaffirmed 2013)", "2010 Aug 10; addenda released 2014 Jul 20 and 2016 May 10".
    Follow-up clauses that do not read as "<event words> <dates>" are left out (the raw string is kept by callers).
    """
    head, _, tail = raw.strip().partition("(")
    head, _, rest = head.partition(";")
    released = _dates_in(head)
    if len(released) != 1:
        return None
    events = [DateEvent("released", released[0])]
    clauses = re.split(r"[;()]", rest + ";" + tail)
    for clause in clauses:
        match = re.match(r"\s*([A-Za-z][A-Za-z ]*?)\s+(?=\d|" + _MONTH + r"\s+\d)", clause, re.IGNORECASE)
        if not match:
            continue
        event = match.group(1).lower()
        for iso in _dates_in(clause[match.end() :]):
            events.append(DateEvent(event, iso))
    return events


def _version_date(events: list[DateEvent]) -> str:
    """The date of the version the summary describes: the latest release, revision or update."""
    return max((e.date for e in events if e.event in _VERSION_EVENTS), default=events[0].date)


def _developers(raw: str) -> list[dict[str, str]]:
    """NGC developer lines "Organisation - Type" (the name itself may contain " - ") as name/type dicts."""
    out = []
    for line in raw.split("\n"):
        line = line.strip()
        if line:
            name, sep, kind = line.rpartition(" - ")
            out.append({"name": name, "type": kind} if sep else {"name": line, "type": ""})
    return out


def load_guideline(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None, **options: Any
) -> list[Passage]:
    """NGC summaries ``{id, title, source, recommendations, date_released, developer, ...}`` -> "guideline" passages.

    Text is the major recommendations; date is the version's date (latest release/revision) as ISO, None with
    the raw string kept in metadata when it does not parse; authority is the first developing organisation.
    Summaries with empty recommendations are left out, counted in ``report.excluded``.
    """
    _no_options(options, "load_guideline")
    file = _locate(path, GUIDELINE_FILE)
    mapped = {
        "id",
        "title",
        "recommendations",
        "date_released",
        "developer",
        "source",
        "category",
        "specialty",
    }

    def convert(row: _Row) -> Passage | None:
        pid, title = row.ident(), row.text("title").strip()
        text = _clean_lines(row.text("recommendations"))
        if not text:
            _exclude_empty(report)
            return None
        raw_date = row.text("date_released", required=False).strip()
        events = parse_ngc_date(raw_date) if raw_date else None
        developers = _developers(row.text("developer", required=False))
        metadata: dict[str, Any] = {
            "corpus": "national-guideline-clearinghouse",
            "citation": row.text("source", required=False),
            "date_released": raw_date,
            "date_history": [[e.event, e.date] for e in events or []],
            "developers": developers,
            "category": _clean_lines(row.text("category", required=False)).split("\n"),
            "specialty": _clean_lines(row.text("specialty", required=False)).split("\n"),
            **row.extras(mapped),
        }
        for key in ("category", "specialty"):
            metadata[key] = [v for v in metadata[key] if v]
        return _passage(
            row,
            id=pid,
            source="guideline",
            title=title,
            text=text,
            date=_version_date(events) if events else None,
            authority=developers[0]["name"] if developers else None,
            metadata=metadata,
        )

    return _load_jsonl(file, convert, skip_invalid, report)


# ---------------------------------------------------------------------------------------------- wiki
def load_wiki(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None, **options: Any
) -> list[Passage]:
    """MedQuAD ``{id, doc_id, source, url, focus, cui, semantic_type, qtype, question, answer}`` -> "wiki" passages.

    Title is the focus (the question when the focus is empty), text the answer, parent the source document,
    authority the publishing site (CancerGov, GHR, ...). MedQuAD reuses ids across (and within) its collections,
    so a repeated id gets a ``#2``, ``#3`` ... suffix in file order; the raw id stays in metadata.
    Empty answers are left out, counted in ``report.excluded``.
    """
    _no_options(options, "load_wiki")
    file = _locate(path, WIKI_FILE)
    seen: dict[str, int] = defaultdict(int)
    mapped = {"id", "doc_id", "source", "url", "focus", "cui", "semantic_type", "qtype", "question", "answer"}

    def convert(row: _Row) -> Passage | None:
        raw_id = row.ident()
        answer = row.text("answer").strip()
        question = row.text("question", required=False).strip()
        cui, semantic_type = row.string_list("cui"), row.string_list("semantic_type")
        if not answer:
            _exclude_empty(report)
            return None
        seen[raw_id] += 1
        pid = raw_id if seen[raw_id] == 1 else f"{raw_id}#{seen[raw_id]}"
        metadata = {
            "corpus": "medquad",
            "medquad_id": raw_id,
            "question": question,
            "qtype": row.text("qtype", required=False),
            "cui": cui,
            "semantic_type": semantic_type,
            **row.extras(mapped),
        }
        return _passage(
            row,
            id=pid,
            source="wiki",
            title=row.text("focus", required=False).strip() or question,
            text=answer,
            authority=row.text("source", required=False).strip() or None,
            url=row.text("url", required=False).strip() or None,
            parent_id=row.text("doc_id", required=False).strip() or None,
            metadata=metadata,
        )

    return _load_jsonl(file, convert, skip_invalid, report)


# ---------------------------------------------------------------------------------------------- graph structures
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
    return f"{kind}::{cid}"


# ---------------------------------------------------------------------------------------------- OBO
DO_SOURCE = "disease-ontology"
HETIONET_SOURCE = "hetionet"
_OBO_ESCAPES = {"n": "\n", "t": "\t", "W": " "}
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")


@dataclass
class _Stanza:
    kind: str
    line: int
    tags: list[tuple[int, str | None, str]]  # (line, tag or None when the line is not "tag: value", value)


def _obo_unescape(text: str) -> str:
    return _UNESCAPE.sub(lambda m: _OBO_ESCAPES.get(m.group(1), m.group(1)), text)


def _obo_quoted(path: Path, line: int, tag: str, value: str) -> str:
    """The leading quoted string of a def/synonym value, unescaped (``\\"``, ``\\\\``, ``\\n``, ...)."""
    match = _QUOTED.match(value)
    if not match:
        raise RecordError(
            path, line, tag, f'expected a quoted string "..." (closed, with \\" escapes), got {value!r}'
        )
    return _obo_unescape(match.group(1))


def _obo_token(path: Path, line: int, tag: str, value: str) -> str:
    """The first token of an id-like value, dropping trailing modifiers and ``! comments``."""
    token = value.split(maxsplit=1)[0] if value.strip() else ""
    if not token or token.startswith("!"):
        raise RecordError(path, line, tag, "empty; expected an identifier such as DOID:4")
    return token


def _obo_stanzas(path: Path, header: dict[str, str]) -> Iterator[_Stanza]:
    """The stanzas ([Term], [Typedef], ...) of an OBO file; header tags before the first one go into ``header``."""
    with open(path, encoding="utf-8") as fh:
        current: _Stanza | None = None
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line or line.startswith("!"):
                continue
            if line.startswith("[") and line.endswith("]"):
                if current is not None:
                    yield current
                current = _Stanza(line[1:-1], lineno, [])
                continue
            tag, sep, value = line.partition(":")
            if current is None:
                if sep:
                    header.setdefault(tag.strip(), value.strip())
            else:
                current.tags.append((lineno, tag.strip() if sep else None, value.strip()))
        if current is not None:
            yield current


@dataclass
class _Term:
    """A parsed [Term]: its concept and the ids of its is_a parents."""

    concept: Concept
    parents: list[str]


def _obo_term(path: Path, stanza: _Stanza) -> _Term | None:
    """A non-obsolete [Term] stanza as a Disease concept with its is_a parents; None when obsolete."""
    values: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for line, tag, value in stanza.tags:
        if tag is None:
            raise RecordError(
                path, line, None, f"expected 'tag: value' inside [{stanza.kind}], got {value!r}"
            )
        values[tag].append((line, value))
    if any(v.strip().lower().startswith("true") for _, v in values.get("is_obsolete", [])):
        return None
    for tag in ("id", "name"):
        if not values.get(tag):
            raise RecordError(path, stanza.line, tag, f"missing; a [Term] needs '{tag}: ...'")
    line, raw_id = values["id"][0]
    cid = _obo_token(path, line, "id", raw_id)
    line, raw_name = values["name"][0]
    name = _obo_unescape(re.split(r"(?<!\\)\s!", raw_name, maxsplit=1)[0]).strip()
    if not name:
        raise RecordError(path, line, "name", "empty; expected the term's name")
    definition = None
    if values.get("def"):
        line, raw_def = values["def"][0]
        definition = _obo_quoted(path, line, "def", raw_def).strip() or None
    synonyms = [_obo_quoted(path, ln, "synonym", v).strip() for ln, v in values.get("synonym", [])]
    concept = Concept(
        id=cid,
        kind="Disease",
        name=name,
        definition=definition,
        synonyms=[s for s in synonyms if s],
        xrefs=[_obo_token(path, ln, "xref", v) for ln, v in values.get("xref", [])],
        alt_ids=[_obo_token(path, ln, "alt_id", v) for ln, v in values.get("alt_id", [])],
        sources=[DO_SOURCE],
    )
    return _Term(concept, [_obo_token(path, ln, "is_a", v) for ln, v in values.get("is_a", [])])


def parse_obo(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None
) -> KnowledgeGraph:
    """Parse a Disease Ontology OBO file: one Disease concept per non-obsolete [Term], ``is_a`` triples.

    ``path`` is the .obo file or a folder above it in the realdata layout. Definitions and synonyms are OBO
    quoted strings with backslash escapes; ``alt_id`` values become aliases of the primary key. Other stanzas
    ([Typedef]) are ignored; obsolete terms are counted in ``info["obsolete"]``.
    """
    file = _locate(path, f"{GRAPH_DIR}/{DO_OBO}")
    header: dict[str, str] = {}
    graph = KnowledgeGraph(info={"source": DO_SOURCE, "path": str(file), "obsolete": 0})

    def convert(stanza: _Stanza) -> _Term | None:
        if stanza.kind != "Term":
            return None
        term = _obo_term(file, stanza)
        if term is None:
            graph.info["obsolete"] += 1
        return term

    for term in collect(_obo_stanzas(file, header), report, skip_invalid, convert):
        concept = term.concept
        graph.concepts[concept.key] = concept
        for alt in concept.alt_ids:
            graph.aliases[concept_key("Disease", alt)] = concept.key
        for parent in term.parents:
            graph.triples.append(Triple(concept.key, "is_a", concept_key("Disease", parent), DO_SOURCE))
    version = re.search(r"\d{4}-\d{2}-\d{2}", header.get("data-version", ""))
    graph.info["date"] = version.group(0) if version else None
    return graph


# ---------------------------------------------------------------------------------------------- Hetionet
_NEO4J_ID = re.compile(r"^:(START|END)_ID\((?P<kind>[^)]+)\)$")


def _iter_tsv(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, cells)`` for each non-blank line of a tab-separated file (CRLF or LF)."""
    with open(path, encoding="utf-8", newline="") as fh:
        for lineno, line in enumerate(fh, start=1):
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
    graph_dir = _graph_dir(folder)
    nodes_path = _locate(graph_dir, HETIONET_NODES)
    edges_dir = _locate(graph_dir, HETIONET_EDGES, want_dir=True)
    concepts = _read_nodes(nodes_path, skip_invalid, report)
    triples: list[Triple] = []
    edge_files = sorted(edges_dir.glob("*.tsv"))
    for edge_file in edge_files:
        triples.extend(_read_edges(edge_file, concepts, skip_invalid, report))
    info = {"source": HETIONET_SOURCE, "nodes": str(nodes_path), "edge_files": [p.name for p in edge_files]}
    return KnowledgeGraph(concepts=concepts, triples=triples, info=info)


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
    _no_options(options, "load_graph")
    graph_dir = _graph_dir(path)
    ontology = parse_obo(_locate(graph_dir, DO_OBO), skip_invalid=skip_invalid, report=report)
    hetionet = read_hetionet(graph_dir, skip_invalid=skip_invalid, report=report)
    merged = merge_graphs(ontology, hetionet)
    dates = {DO_SOURCE: ontology.info["date"]} if ontology.info.get("date") else {}
    passages = graph_passages(merged, max_relations=max_relations, dates=dates)
    return passages


# ---------------------------------------------------------------------------------------------- everything
CORPUS_LOADERS: dict[str, Callable[..., list[Passage]]] = {
    "book": load_book,
    "guideline": load_guideline,
    "wiki": load_wiki,
    "graph": load_graph,
}


def load_realdata(
    root: str | Path,
    *,
    skip_invalid: bool = False,
    reports: dict[str, LoadReport] | None = None,
    max_relations: int = DEFAULT_MAX_RELATIONS,
) -> dict[str, list[Passage]]:
    """All four corpora of a realdata folder (book, guideline, wiki, graph) keyed by source kind.

    ``reports``, when given, receives one LoadReport per kind. PubMedQA ("research") is loaded by
    ``loaders.benchmarks``.
    """
    root = Path(root)
    out: dict[str, list[Passage]] = {}
    for kind, loader in CORPUS_LOADERS.items():
        report = LoadReport()
        options = {"max_relations": max_relations} if kind == "graph" else {}
        target = root / GRAPH_DIR if kind == "graph" else root
        out[kind] = loader(target, skip_invalid=skip_invalid, report=report, **options)
        if reports is not None:
            reports[kind] = report
    return out


def _no_options(options: dict[str, Any], loader: str) -> None:
    """Loaders share one signature; an option a loader does not know is a mistake worth saying."""
    if options:
        raise TypeError(f"{loader}() got unexpected options {sorted(options)}")

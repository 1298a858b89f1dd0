"""The Disease Ontology's OBO file as a :class:`~omnimed.data.loaders.knowledge_graph.KnowledgeGraph`.

One Disease concept per non-obsolete ``[Term]`` (definition, synonyms, xrefs, alt_ids as aliases) and one
``is_a`` triple per parent. A malformed stanza raises :class:`RecordError` naming file, line and tag;
``skip_invalid=True`` skips it instead and counts it in ``report.skipped``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, text_lines
from omnimed.data.loaders.knowledge_graph import Concept, KnowledgeGraph, Triple, concept_key
from omnimed.data.loaders.realdata_layout import DO_OBO, GRAPH_DIR, locate

__all__ = ["DO_SOURCE", "parse_obo"]

#: the source name of Disease Ontology concepts and triples
DO_SOURCE = "disease-ontology"
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
    current: _Stanza | None = None
    for lineno, raw in enumerate(text_lines(path), start=1):
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
    file = locate(path, f"{GRAPH_DIR}/{DO_OBO}")
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

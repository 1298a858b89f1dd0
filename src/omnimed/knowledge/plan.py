"""Omni-RAG source plans as text: parse a planner's output leniently, format a plan canonically.

The planner writes one tag per knowledge source with 0 to 3 queries separated by ``;`` (Omni-RAG, Prompts E.2 and
E.7; an empty tag means the source is not used)::

    <book>q0 ; q1</book><guideline></guideline><research>q0</research><wiki></wiki><graph>term , question</graph>

Graph queries are ``term , question``; the plan keeps them whole (the graph source splits them, see
:func:`omnimed.knowledge.graph_text.parse_graph_query`). Model output is often slightly off, so
:func:`parse_plan` never raises: it keeps every part that is valid and lists what was wrong, with character
offsets, in ``PlanParse.problems`` (which a trainer can also use as a format signal).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from omnimed.data.records import MAX_QUERIES_PER_SOURCE, SOURCE_KINDS, Plan

__all__ = ["PlanParse", "as_query", "format_plan", "format_queries", "parse_exploration", "parse_plan"]

#: anything that looks like an XML-ish tag: ``<book>``, ``</ wiki >``, ``<think>``
_TAG = re.compile(r"<\s*(/?)\s*([A-Za-z_][\w-]*)\s*>")
_SNIPPET = 40


@dataclass(frozen=True)
class PlanParse:
    """The valid part of a plan text and what was wrong with the rest (empty when the text was well formed)."""

    plan: Plan
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "...")


def _queries(source: str, content: str, start: int, problems: list[str],
             max_queries: int = MAX_QUERIES_PER_SOURCE) -> list[str]:
    """The queries of one tag's content: split at ``;``, whitespace collapsed, empties dropped, at most
    ``max_queries`` (3 at inference; exploration asks for exactly n)."""
    if not content.strip():
        return []
    queries: list[str] = []
    for i, raw in enumerate(content.split(";"), start=1):
        query = " ".join(raw.split())
        if not query:
            problems.append(f"empty query {i} dropped in <{source}> at char {start}")
            continue
        if source == "graph" and "," not in query:
            problems.append(
                f"graph query {_snippet(query)} in <graph> at char {start} has no comma between term and"
                " question (used as both)"
            )
        queries.append(query)
    if len(queries) > max_queries:
        problems.append(
            f"more than {max_queries} queries for {source} ({len(queries)} given at char {start}; "
            f"kept the first {max_queries})"
        )
        queries = queries[:max_queries]
    return queries


class _Scanner:
    """One pass over the text: tags open and close, text is routed to the open source or reported as stray."""

    def __init__(self, text: str, max_queries: int = MAX_QUERIES_PER_SOURCE) -> None:
        self.text = text
        self.max_queries = max_queries
        self.problems: list[str] = []
        self.queries: dict[str, list[str]] = {}
        self.open: str | None = None  # the source tag being read
        self.open_at = 0
        self.ignored = False  # the open tag is a duplicate: read past its content
        self.parts: list[str] = []

    def run(self) -> None:
        pos = 0
        while pos < len(self.text):
            tag = _TAG.search(self.text, pos)
            end = tag.start() if tag else len(self.text)
            self.add_text(pos, end)
            if tag is None:
                break
            pos = self.handle(tag)
        if self.open is not None:
            self.problems.append(
                f"unclosed <{self.open}> at char {self.open_at} (kept its text up to the end)"
            )
            self.finish()

    def add_text(self, start: int, end: int) -> None:
        chunk = self.text[start:end]
        if self.open is not None:
            self.parts.append(chunk)
        elif chunk.strip():
            lead = len(chunk) - len(chunk.lstrip())
            self.problems.append(f"text outside tags ignored at char {start + lead}: {_snippet(chunk)}")

    def handle(self, tag: re.Match[str]) -> int:
        """Act on one tag; returns where scanning continues."""
        closing, name, at = bool(tag.group(1)), tag.group(2).lower(), tag.start()
        shown = f"<{'/' if closing else ''}{tag.group(2)}>"
        if name not in SOURCE_KINDS:
            return self.unknown(tag, shown, closing)
        if closing:
            if self.open is None:
                self.problems.append(f"stray {shown} at char {at} ignored (no open tag)")
            else:
                if self.open != name:
                    self.problems.append(
                        f"<{self.open}> at char {self.open_at} closed by {shown} at char {at}"
                    )
                self.finish()
            return tag.end()
        if self.open is not None:
            self.problems.append(
                f"unclosed <{self.open}> at char {self.open_at} (ended by {shown} at char {at})"
            )
            self.finish()
        self.ignored = name in self.queries
        if self.ignored:
            self.problems.append(f"duplicate tag {shown} at char {at} ignored (kept the first <{name}>)")
        self.open, self.open_at, self.parts = name, at, []
        return tag.end()

    def unknown(self, tag: re.Match[str], shown: str, closing: bool) -> int:
        """An unknown tag: inside a source only its markup is dropped; outside, the whole element is."""
        at = tag.start()
        if self.open is not None or closing:
            self.problems.append(f"unknown tag {shown} at char {at} ignored")
            return tag.end()
        close = re.compile(rf"<\s*/\s*{re.escape(tag.group(2))}\s*>", re.IGNORECASE).search(
            self.text, tag.end()
        )
        if close is None:
            self.problems.append(f"unknown tag {shown} at char {at} ignored")
            return tag.end()
        self.problems.append(f"unknown tag {shown} at char {at} ignored with its content")
        return close.end()

    def finish(self) -> None:
        assert self.open is not None
        if not self.ignored:
            start = self.open_at
            self.queries[self.open] = _queries(self.open, "".join(self.parts), start, self.problems,
                                               self.max_queries)
        self.open, self.ignored, self.parts = None, False, []


def _scan(text: str, max_queries: int,
          offered: Sequence[str] = SOURCE_KINDS) -> tuple[dict[str, list[str]], list[str]]:
    """The queries per source tag of ``text`` (sources in canonical order) and what was wrong with the rest; a
    source not ``offered`` is not missing when its tag is."""
    scanner = _Scanner(text, max_queries)
    scanner.run()
    problems = scanner.problems
    if not scanner.queries:
        problems.append("no source tags found" if text.strip() else "empty plan text")
    else:
        missing = [s for s in SOURCE_KINDS if s in offered and s not in scanner.queries]
        if missing:
            problems.append("missing tags (sources unused): " + ", ".join(f"<{s}>" for s in missing))
    return {s: scanner.queries[s] for s in SOURCE_KINDS if s in scanner.queries}, problems


def parse_plan(text: str, *, question: str = "", question_id: str = "",
               sources: Sequence[str] = SOURCE_KINDS) -> PlanParse:
    """Read a plan from planner output; never raises on what a model writes.

    Valid parts are kept: each known tag gives its source's queries (split at ``;``, whitespace collapsed, the
    first 3 kept); an empty tag gives an unused source (``[]``); a source without a tag is left out of
    ``plan.queries``. Everything else is reported in ``problems`` with its character offset: unknown tags
    (an unknown element outside the source tags is skipped whole, e.g. ``<think>...</think>``), unclosed or
    mismatched tags (the text read so far is kept), duplicate tags (the first wins), empty queries, more than 3
    queries, text outside tags, graph queries without a comma, and missing tags of the ``sources`` the planner was
    offered (all five by default; table 8 offers one).
    """
    if not isinstance(text, str):
        return PlanParse(
            Plan(question=question, question_id=question_id), [f"expected text, got {type(text).__name__}"]
        )
    queries, problems = _scan(text, MAX_QUERIES_PER_SOURCE, sources)
    return PlanParse(Plan(question=question, question_id=question_id, queries=queries), problems)


def parse_exploration(text: str, n: int) -> tuple[dict[str, list[str]], list[str]]:
    """An expert's exploration reply (Omni-RAG 4.2.1: exactly ``n`` queries for every source), read as leniently
    as :func:`parse_plan`: the valid queries per source (at most ``n``) and the problems, including each source
    that got fewer than ``n``."""
    if not isinstance(text, str):
        return {}, [f"expected text, got {type(text).__name__}"]
    queries, problems = _scan(text, n)
    problems += [f"{len(qs)} queries for {s} (expected {n})" for s, qs in queries.items() if len(qs) < n]
    return queries, problems


def as_query(text: str) -> str:
    """Free text (a pseudo-document, a question) made one plan query: ``;`` and angle brackets, which plan text
    reserves, become spaces (a search ignores them anyway), whitespace collapsed."""
    return " ".join(re.sub(r"[;<>]", " ", text).split())


def format_queries(queries: dict[str, list[str]], *, all_sources: bool = False, sep: str = "") -> str:
    """Queries per source as plan text: one tag per source in the order book, guideline, research, wiki, graph,
    queries joined by `` ; `` with whitespace collapsed. Sources absent from ``queries`` get no tag unless
    ``all_sources`` (then an empty tag, as the Omni-RAG prompt asks); ``sep`` goes between tags. A query containing
    ``;`` or tag markup cannot be written unambiguously and raises ``ValueError``."""
    if sep.strip():
        raise ValueError(f"sep must be whitespace, got {sep!r}")
    tags = []
    for source in SOURCE_KINDS:
        if source not in queries and not all_sources:
            continue
        written = [" ".join(q.split()) for q in queries.get(source, [])]
        for q in written:
            if ";" in q or _TAG.search(q):
                raise ValueError(
                    f"query {q!r} of {source} contains ';' or tag markup; it would not parse back"
                )
        tags.append(f"<{source}>{' ; '.join(written)}</{source}>")
    return sep.join(tags)


def format_plan(plan: Plan, *, all_sources: bool = False, sep: str = "") -> str:
    """The canonical text of a plan (:func:`format_queries` of its queries).
    ``parse_plan(format_plan(p)).plan == p`` for every plan with empty metadata, default question fields and
    whitespace-collapsed queries."""
    return format_queries(dict(plan.queries), all_sources=all_sources, sep=sep)

"""Loaders of the three text corpora of ``shared/realdata`` as :class:`~omnimed.data.records.Passage` records.

One loader per knowledge-source kind, each reading the file layout of ``shared/realdata`` (see its
MANIFEST.md):

* ``load_book``      OpenStax *Anatomy & Physiology 2e* sections (JSONL)             -> source "book"
* ``load_guideline`` National Guideline Clearinghouse summaries (JSONL)               -> source "guideline"
* ``load_wiki``      MedQuAD consumer-health answers (JSONL)                           -> source "wiki"

Every loader takes the file itself or any folder above it in the realdata layout (see
:mod:`~omnimed.data.loaders.realdata_layout`). A malformed record raises :class:`RecordError` naming file,
line and field; ``skip_invalid=True`` skips it instead and counts it in ``report.skipped``. Records that are
well formed but carry no text (an empty section or answer) are never errors: they are left out and counted in
``report.excluded["empty text"]`` either way. The graph is read by :mod:`~omnimed.data.loaders.graph_corpus`,
the PubMedQA abstracts ("research") by :func:`~omnimed.data.loaders.pubmedqa_bioasq.load_pubmedqa_corpus`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, iter_jsonl
from omnimed.data.loaders.ngc_dates import parse_ngc_date, version_date
from omnimed.data.loaders.realdata_layout import BOOK_FILE, GUIDELINE_FILE, WIKI_FILE, locate, reject_options
from omnimed.data.records import Passage

__all__ = ["EMPTY_TEXT", "load_book", "load_guideline", "load_wiki"]

#: the LoadReport.excluded reason for records without text (an empty section or answer)
EMPTY_TEXT = "empty text"


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
    reject_options(options, "load_book")
    file = locate(path, BOOK_FILE)

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
    reject_options(options, "load_guideline")
    file = locate(path, GUIDELINE_FILE)
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
            date=version_date(events) if events else None,
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
    reject_options(options, "load_wiki")
    file = locate(path, WIKI_FILE)
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

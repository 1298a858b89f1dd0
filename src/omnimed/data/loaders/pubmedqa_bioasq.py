"""Loaders of the biomedical-literature QA benchmarks PubMedQA and BioASQ, with their PubMed passages.

Both pair each question with the PubMed text that answers it: PubMedQA with its abstract, BioASQ with the
snippets its experts quoted. The loaders return the questions (yes/no(/maybe) as multiple choice) followed by
that text as ``research`` passages, each question's ``gold_passages`` naming its own, so the pairs serve
retrieval metrics too; :func:`load_pubmedqa_corpus` reads only the abstracts, as the research corpus kind.

They follow the benchmark-loader contract described in :mod:`omnimed.data.loaders`: a malformed record raises
:class:`RecordError` naming file, line and field, or with ``skip_invalid=True`` is skipped and counted in
``report``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect
from omnimed.data.loaders.record_fields import (
    as_object,
    build_record,
    collect_groups,
    publication_year,
    required_text,
    split_from_stem,
    type_name,
)
from omnimed.data.loaders.record_locations import At, read_json_with_lines
from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage, Record

__all__ = ["YES_NO", "YES_NO_MAYBE", "load_bioasq", "load_pubmedqa", "load_pubmedqa_corpus"]

YES_NO_MAYBE: dict[str, str] = {"A": "yes", "B": "no", "C": "maybe"}
YES_NO: dict[str, str] = {"A": "yes", "B": "no"}


# ----------------------------------------------------------------------------------------------- PubMedQA
def _pubmedqa_passage(pmid: str, raw: dict[str, Any], at: At) -> Passage:
    """The abstract of one PubMedQA entry: labelled sections joined (``BACKGROUND: ...``), one per line."""
    contexts = raw.get("CONTEXTS")
    if not isinstance(contexts, list) or not contexts or not all(isinstance(c, str) for c in contexts):
        raise at.error("CONTEXTS", f"expected a non-empty list of strings, got {type_name(contexts)}")
    labels = raw.get("LABELS") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise at.error("LABELS", f"expected a list of section labels, got {type_name(labels)}")
    if labels and len(labels) != len(contexts):
        raise at.error("LABELS", f"expected one label per context ({len(contexts)}), got {len(labels)}")
    labels = labels or [""] * len(contexts)
    text = "\n".join(f"{label}: {ctx}" if label else ctx for label, ctx in zip(labels, contexts))
    meshes = raw.get("MESHES") or []
    if not isinstance(meshes, list):
        raise at.error("MESHES", f"expected a list of MeSH terms, got {type_name(meshes)}")
    rec = {
        "id": f"pubmed/{pmid}",
        "source": "research",
        "title": f"PubMed {pmid}",
        "text": text,
        "date": publication_year(raw.get("YEAR"), at, "YEAR"),
        "url": f"https://pubmed.ncbi.nlm.nih.gov/{pmid}/",
        "metadata": {"pmid": pmid, "meshes": meshes, "section_labels": labels},
    }
    return build_record(Passage, rec, at, {"text": "CONTEXTS", "date": "YEAR"})


def _pubmedqa_question(
    pmid: str, raw: dict[str, Any], at: At, passage_id: str, split: str
) -> MultipleChoiceQuestion:
    """The yes/no/maybe question of one entry, its gold passage being the entry's abstract."""
    decision = required_text(raw, "final_decision", at).strip().lower()
    answer = next((letter for letter, text in YES_NO_MAYBE.items() if text == decision), None)
    if answer is None:
        raise at.error("final_decision", f"expected yes, no or maybe, got {raw['final_decision']!r}")
    skip = {"QUESTION", "CONTEXTS", "LABELS", "MESHES", "YEAR", "final_decision", "LONG_ANSWER"}
    metadata = {"pmid": pmid, "long_answer": raw.get("LONG_ANSWER"), "year": raw.get("YEAR")}
    metadata.update({k: v for k, v in raw.items() if k not in skip})
    rec = {
        "id": f"pubmedqa/{pmid}",
        "question": required_text(raw, "QUESTION", at),
        "options": dict(YES_NO_MAYBE),
        "answer": [answer],
        "dataset": "pubmedqa",
        "split": split,
        "gold_passages": [passage_id],
        "gold_sources": ["research"],
        "metadata": metadata,
    }
    return build_record(MultipleChoiceQuestion, rec, at, {"question": "QUESTION"})


def _iter_pubmedqa(path: Path) -> Iterator[tuple[str, dict[str, Any], At]]:
    data, lines = read_json_with_lines(path)
    as_object(data, At(path, 1), "an object {pmid: entry}")
    for pmid, raw in data.items():
        yield str(pmid), raw, At(path, lines.get((pmid,)), str(pmid))


def load_pubmedqa(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    split: str = "test",
) -> list[MultipleChoiceQuestion | Passage]:
    """Read PubMedQA ``ori_pqal.json`` (or ``test_set.json``): ``{pmid: {QUESTION, CONTEXTS[], LABELS[],
    MESHES[], YEAR, final_decision, LONG_ANSWER, ...}}``.

    Returns the questions (A yes / B no / C maybe, answer from ``final_decision``, ``id`` = ``pubmedqa/<pmid>``,
    ``LONG_ANSWER`` in metadata) followed by their abstracts as ``research`` passages (``id`` = ``pubmed/<pmid>``,
    see :func:`load_pubmedqa_corpus`). Each question's ``gold_passages`` is its abstract, which makes the pairs
    usable for retrieval metrics. An entry is valid only when both its question and its abstract are.
    """
    path = Path(path)

    def convert(item: tuple[str, Any, At]) -> list[Record]:
        pmid, raw, at = item
        raw = as_object(raw, at)
        passage = _pubmedqa_passage(pmid, raw, at)
        return [_pubmedqa_question(pmid, raw, at, passage.id, split), passage]

    records = collect_groups(_iter_pubmedqa(path), report, skip_invalid, convert)
    return [r for r in records if isinstance(r, MultipleChoiceQuestion)] + [
        r for r in records if isinstance(r, Passage)
    ]


def load_pubmedqa_corpus(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
) -> list[Passage]:
    """Read only the abstracts of a PubMedQA file (``ori_pqal.json``, ``ori_pqaa.json``, ``ori_pqau.json``) as
    ``research`` passages: the research corpus kind.

    ``text`` is the labelled sections joined one per line, ``title`` = ``PubMed <pmid>``, ``date`` = ``YEAR``,
    ``url`` = the PubMed page, MeSH terms in metadata. Question fields are not checked, so unlabelled files work.
    """
    path = Path(path)

    def convert(item: tuple[str, Any, At]) -> Passage:
        pmid, raw, at = item
        return _pubmedqa_passage(pmid, as_object(raw, at), at)

    return collect(_iter_pubmedqa(path), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- BioASQ
_PMID = re.compile(r"(\d+)/?$")


def _bioasq_snippet(raw: Any, at: At, name: str) -> Passage:
    """One BioASQ snippet as a research passage; its parent is the PubMed document it was cut from.

    The id is built from the document and the snippet's offsets (or a hash of its text) so that the same snippet
    quoted by several questions is one passage.
    """
    snip_at = At(at.path, at.line, at.field(name))
    raw = as_object(raw, snip_at)
    text = required_text(raw, "text", snip_at)
    document = required_text(raw, "document", snip_at).strip()
    match = _PMID.search(document)
    pmid = match.group(1) if match else None
    parent = f"pubmed/{pmid}" if pmid else document
    begin, end = raw.get("offsetInBeginSection"), raw.get("offsetInEndSection")
    if isinstance(begin, int) and isinstance(end, int):
        suffix = f"{raw.get('beginSection', 'abstract')}:{begin}-{end}"
    else:
        suffix = hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    rec = {
        "id": f"{parent}#{suffix}",
        "source": "research",
        "title": f"PubMed {pmid}" if pmid else "",
        "text": text,
        "url": f"https://pubmed.ncbi.nlm.nih.gov/{pmid}/" if pmid else document,
        "parent_id": parent,
        "metadata": {k: v for k, v in raw.items() if k != "text"},
    }
    return build_record(Passage, rec, snip_at)


def _bioasq_ideal(raw: dict[str, Any], at: At) -> str:
    ideal = raw.get("ideal_answer")
    if isinstance(ideal, list) and ideal and all(isinstance(x, str) for x in ideal):
        return ideal[0]
    if isinstance(ideal, str) and ideal.strip():
        return ideal
    raise at.error(
        "ideal_answer", f"expected a string or a non-empty list of strings, got {type_name(ideal)}"
    )


def _bioasq_yes_no(raw: dict[str, Any], at: At) -> str:
    exact = raw.get("exact_answer")
    if isinstance(exact, list) and len(exact) == 1:
        exact = exact[0]
    value = exact.strip().lower() if isinstance(exact, str) else None
    for letter, text in YES_NO.items():
        if value == text:
            return letter
    raise at.error("exact_answer", f"expected 'yes' or 'no' for a yesno question, got {exact!r}")


def load_bioasq(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    include_other: bool = False,
    split: str | None = None,
) -> list[MultipleChoiceQuestion | OpenQuestion | Passage]:
    """Read a BioASQ (Task B) golden JSON: ``{questions: [{id, type, body, documents[], snippets[{text, document,
    offsetInBeginSection, offsetInEndSection, beginSection, ...}], exact_answer, ideal_answer}]}``.

    ``yesno`` questions become MCQs (A yes, B no); other types (factoid, list, summary) are skipped by type: they
    are not invalid, but each is noted in ``report`` (field ``type``) so the count is visible. With
    ``include_other`` they are returned as :class:`OpenQuestion` with the first ideal answer as reference.
    Snippets become ``research`` passages (parent = ``pubmed/<pmid>``), deduplicated, and are each question's
    ``gold_passages``. Returns questions first, then passages.
    """
    path = Path(path)
    split = split or split_from_stem(path.stem)
    data, lines = read_json_with_lines(path, depth=2)
    data = as_object(data, At(path, 1), "an object {questions: [...]}")
    questions = data.get("questions")
    if not isinstance(questions, list):
        raise RecordError(
            path,
            lines.get(("questions",)),
            "questions",
            f"expected a list of questions, got {type_name(questions)}",
        )
    seen: set[str] = set()

    def convert(item: tuple[int, Any]) -> list[Record]:
        index, raw = item
        at = At(path, lines.get(("questions", index)), f"questions[{index}]")
        raw = as_object(raw, at)
        qid = required_text(raw, "id", at).strip()
        qtype = required_text(raw, "type", at).strip().lower()
        if qtype != "yesno" and not include_other:
            if report is not None:
                report.exclude(f"BioASQ {qtype or 'untyped'} questions (not yes/no; include_other=True keeps them)")
            return []
        snippets = raw.get("snippets") or []
        if not isinstance(snippets, list):
            raise at.error("snippets", f"expected a list, got {type_name(snippets)}")
        passages = [_bioasq_snippet(s, at, f"snippets[{j}]") for j, s in enumerate(snippets)]
        gold = list(dict.fromkeys(p.id for p in passages))
        metadata = {k: v for k, v in raw.items() if k not in ("id", "body", "snippets")}
        common = {
            "id": f"bioasq/{qid}",
            "question": required_text(raw, "body", at),
            "dataset": "bioasq",
            "split": split,
            "gold_passages": gold,
            "metadata": metadata,
        }
        if qtype == "yesno":
            answer = _bioasq_yes_no(raw, at)
            question: Record = build_record(
                MultipleChoiceQuestion,
                {**common, "options": dict(YES_NO), "answer": [answer], "gold_sources": ["research"]},
                at,
                {"question": "body"},
            )
        else:
            question = build_record(
                OpenQuestion,
                {**common, "reference_answer": _bioasq_ideal(raw, at)},
                at,
                {"question": "body", "reference_answer": "ideal_answer"},
            )
        new: list[Record] = []
        for passage in passages:  # a snippet quoted twice (here or by an earlier question) is one passage
            if passage.id not in seen:
                seen.add(passage.id)
                new.append(passage)
        return [question, *new]

    records = collect_groups(enumerate(questions), report, skip_invalid, convert)
    return [r for r in records if not isinstance(r, Passage)] + [r for r in records if isinstance(r, Passage)]

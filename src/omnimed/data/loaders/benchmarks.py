"""Loaders for public medical QA benchmarks in their published layouts.

Each ``load_*`` function reads one real layout (MIRAGE, MedQA, MedMCQA, MMLU, PubMedQA, BioASQ, Self-BioRAG
instructions, long-form QA, BioMedMCQs) and returns omnimed records. They share one contract:

* a malformed record raises :class:`RecordError` naming the file, the line (JSONL line, CSV row, or the line where
  the record starts in a whole-JSON file) and the field, and saying what was expected. In whole-JSON files the
  field path starts with the record's key (``medqa/0001.answer``, ``[12].gold``) so the record is named even
  where the line is ambiguous;
* with ``skip_invalid=True`` bad records are skipped and counted in ``report`` instead;
* JSONL is read line by line with :func:`iter_jsonl` (real files hold U+2028 inside strings).

Loader options are keyword-only; an unknown option is a ``TypeError`` rather than being silently ignored.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, iter_jsonl, read_json
from omnimed.data.records import (
    InstructionExample,
    MultipleChoiceQuestion,
    OpenQuestion,
    Passage,
    Record,
)

__all__ = [
    "MMLU_MEDICAL_SUBJECTS",
    "load_bioasq",
    "load_biomedmcqs",
    "load_longform",
    "load_medmcqa",
    "load_medqa",
    "load_mirage",
    "load_mmlu",
    "load_pubmedqa",
    "load_pubmedqa_corpus",
    "load_selfbiorag",
]

#: the six MMLU subjects that make up MMLU-Med (as used by MIRAGE)
MMLU_MEDICAL_SUBJECTS: tuple[str, ...] = (
    "anatomy",
    "clinical_knowledge",
    "college_biology",
    "college_medicine",
    "medical_genetics",
    "professional_medicine",
)
YES_NO_MAYBE: dict[str, str] = {"A": "yes", "B": "no", "C": "maybe"}
YES_NO: dict[str, str] = {"A": "yes", "B": "no"}
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_SPLIT_TOKENS = {
    "train": "train",
    "training": "train",
    "dev": "dev",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
}


# ----------------------------------------------------------------------------------------------- locations
@dataclass(frozen=True)
class _At:
    """Where a raw record lives: file, line (None when unknown) and, in whole-JSON files, its key."""

    path: Path
    line: int | None
    key: str | None = None

    def field(self, name: str | None) -> str | None:
        """The field path as reported: ``name``, or ``key.name`` when the record has a key."""
        if self.key is None:
            return name
        if name is None:
            return self.key
        return f"{self.key}{'' if name.startswith('[') else '.'}{name}"

    def error(self, name: str | None, message: str) -> RecordError:
        return RecordError(self.path, self.line, self.field(name), message)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# ----------------------------------------------------------------------------------------------- whole-JSON lines
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _LineCounter:
    """Turns increasing character offsets into 1-based line numbers without rescanning the text."""

    def __init__(self, text: str):
        self.text, self.pos, self.line = text, 0, 1

    def at(self, pos: int) -> int:
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _member_lines(text: str, depth: int = 1) -> dict[tuple[str | int, ...], int]:
    """Line of each member of a valid JSON document's top container, keyed by its path (key or list index).

    ``depth=2`` also maps the members of containers one level down (MIRAGE ``{dataset: {qid: ...}}``,
    BioASQ ``{questions: [...]}``). Only JSON whitespace is skipped, so U+2028 inside strings is harmless.
    """
    lines: dict[tuple[str | int, ...], int] = {}
    counter = _LineCounter(text)

    def skip(pos: int) -> int:
        return _WS.match(text, pos).end()  # type: ignore[union-attr]

    def scan(pos: int, prefix: tuple[str | int, ...], level: int) -> int:
        """Scan the container starting at ``pos``; return the position just after it."""
        opener = text[pos]
        if opener not in "[{":
            return _DECODER.raw_decode(text, pos)[1]
        closer = "}" if opener == "{" else "]"
        pos = skip(pos + 1)
        index = 0
        while text[pos] != closer:
            member_pos = pos
            key: str | int = index
            if opener == "{":
                key, pos = _DECODER.raw_decode(text, pos)
                pos = skip(skip(pos) + 1)  # the colon
            lines[(*prefix, key)] = counter.at(member_pos)
            if level < depth and text[pos] in "[{":
                pos = scan(pos, (*prefix, key), level + 1)
            else:
                pos = _DECODER.raw_decode(text, pos)[1]
            pos = skip(pos)
            if text[pos] == ",":
                pos = skip(pos + 1)
            index += 1
        return pos + 1

    start = skip(0)
    if start < len(text):
        scan(start, (), 1)
    return lines


def _read_json_with_lines(path: Path, depth: int = 1) -> tuple[Any, dict[tuple[str | int, ...], int]]:
    """The parsed document (errors name the file and line) plus the line of each top-level member."""
    data = read_json(path)
    return data, _member_lines(path.read_text(encoding="utf-8"), depth)


def _iter_list_or_jsonl(path: Path) -> Iterator[tuple[_At, Any]]:
    """Items of a file that is either a JSON list or JSONL (one object per line, whatever the suffix)."""
    with open(path, encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("["):
        data, lines = _read_json_with_lines(path)
        for i, obj in enumerate(data):
            yield _At(path, lines.get((i,)), f"[{i}]"), obj
    else:
        for lineno, obj in iter_jsonl(path):
            yield _At(path, lineno), obj


# ----------------------------------------------------------------------------------------------- field checks
def _as_object(obj: Any, at: _At, what: str = "a JSON object") -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise at.error(None, f"expected {what}, got {_type_name(obj)}")
    return obj


def _text(obj: dict[str, Any], name: str, at: _At, *, allow_empty: bool = False) -> str:
    """A required string field; numbers are accepted as text (some option columns hold bare numbers)."""
    if name not in obj:
        raise at.error(name, "missing; expected a string")
    value = obj[name]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise at.error(name, f"expected a string, got {_type_name(value)}")
    if not allow_empty and not value.strip():
        raise at.error(name, "expected a non-empty string")
    return value


def _optional_text(obj: dict[str, Any], name: str, at: _At) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise at.error(name, f"expected a string or null, got {_type_name(value)}")
    return value


def _letter_options(raw: Any, at: _At, name: str = "options") -> dict[str, str]:
    """Options as ``{letter: text}`` from a dict with letter keys or a list (lettered A, B, ...)."""
    if isinstance(raw, list):
        if len(raw) > len(_LETTERS):
            raise at.error(name, f"expected at most {len(_LETTERS)} options, got {len(raw)}")
        raw = dict(zip(_LETTERS, raw))
    elif isinstance(raw, dict):
        raw = {str(k).strip().upper(): v for k, v in raw.items()}
    else:
        raise at.error(
            name, f"expected a dict {{A: text, ...}} or a list of option texts, got {_type_name(raw)}"
        )
    options: dict[str, str] = {}
    for letter in raw:
        if len(letter) != 1 or letter not in _LETTERS:
            raise at.error(name, f"expected single-letter option keys A-Z, got {letter!r}")
        options[letter] = _text(raw, letter, _At(at.path, at.line, at.field(name)), allow_empty=True)
    if len(options) < 2:
        raise at.error(name, f"expected at least two options, got {len(options)}")
    return options


def _answer_letters(raw: Any, options: dict[str, str], at: _At, name: str = "answer") -> list[str]:
    """One or several answer letters from ``"B"``, ``"AC"``, ``"A,C"``, ``"A, C"`` or ``["A", "C"]``."""
    if isinstance(raw, str):
        letters = [c for c in re.sub(r"[\s,;/]+", "", raw).upper()]
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        letters = [x.strip().upper() for x in raw]
    else:
        raise at.error(name, f"expected option letter(s) like 'B', 'AC' or ['A', 'C'], got {_type_name(raw)}")
    if not letters:
        raise at.error(name, "expected at least one option letter, got none")
    for letter in letters:
        if letter not in options:
            raise at.error(name, f"expected option letter(s) among {sorted(options)}, got {raw!r}")
    return list(dict.fromkeys(letters))


def _year(value: Any, at: _At, name: str) -> str | None:
    """A publication year as an ISO ``YYYY`` string (None when unknown)."""
    if value is None or value == "":
        return None
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not re.fullmatch(r"\d{4}", text):
        raise at.error(name, f"expected a four-digit year or null, got {value!r}")
    return text


def _split_from_stem(stem: str, default: str = "test") -> str:
    """The split a file name announces (``train.jsonl``, ``dev_long.json``, ``training12b.json``)."""
    for token in re.split(r"[^a-z]+", stem.lower()):
        for prefix, split in _SPLIT_TOKENS.items():
            if token == prefix or (prefix == "train" and token.startswith("train")):
                return split
    return default


def _build(cls: type[Record], data: dict[str, Any], at: _At, renames: dict[str, str] | None = None) -> Any:
    """Validate a record; a failure names the source's field (via ``renames``) and the record's location."""
    try:
        return cls.from_dict(data, path=str(at.path), line=at.line)
    except RecordError as err:
        name = err.field
        if name and renames:
            head, dot, rest = name.partition(".")
            name = renames.get(head, head) + dot + rest
        raise at.error(name, err.message) from None


def _collect_groups(
    items: Iterable[Any],
    report: LoadReport | None,
    skip_invalid: bool,
    convert: Callable[[Any], list[Record]],
) -> list[Record]:
    """Like :func:`collect` for raw items that each yield several records; ``report.read`` counts records."""
    local = LoadReport()
    groups: list[Any] = collect(items, local, skip_invalid, convert)  # type: ignore[arg-type]
    records = [rec for group in groups for rec in group]
    if report is not None:
        report.read += len(records)
        report.skipped.extend(local.skipped)
        for reason, n in local.excluded.items():
            report.exclude(reason, n)
    return records


# ----------------------------------------------------------------------------------------------- MIRAGE
def load_mirage(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    datasets: Sequence[str] | None = None,
) -> list[MultipleChoiceQuestion]:
    """Read MIRAGE's ``benchmark.json``: ``{dataset: {qid: {question, options: {A: text, ...}, answer}}}``.

    ``dataset`` is one of medqa, medmcqa, pubmedqa, bioasq, mmlu. Each question becomes a
    :class:`MultipleChoiceQuestion` with ``dataset`` = the key, ``id`` = ``dataset/qid`` and ``split="test"``
    (MIRAGE is a test-only benchmark). ``datasets`` keeps only the named ones; naming a dataset the file lacks is a
    ``ValueError`` so a typo cannot silently yield an empty benchmark. Extra question keys go to ``metadata``.
    """
    path = Path(path)
    data, lines = _read_json_with_lines(path, depth=2)
    _as_object(data, _At(path, 1), "an object {dataset: {qid: question}}")
    wanted = list(data) if datasets is None else list(datasets)
    missing = [name for name in wanted if name not in data]
    if missing:
        raise ValueError(f"{path}: no dataset(s) {missing}; the file holds {sorted(data)}")

    def items() -> Iterator[tuple[_At, str, str, Any]]:
        for name in wanted:
            group = data[name]
            if not isinstance(group, dict):
                raise RecordError(
                    path,
                    lines.get((name,)),
                    name,
                    f"expected an object {{qid: question}}, got {_type_name(group)}",
                )
            for qid, raw in group.items():
                yield _At(path, lines.get((name, qid)), f"{name}/{qid}"), name, qid, raw

    def convert(item: tuple[_At, str, str, Any]) -> MultipleChoiceQuestion:
        at, name, qid, raw = item
        raw = _as_object(raw, at)
        options = _letter_options(raw.get("options"), at)
        rec = {
            "id": f"{name}/{qid}",
            "question": _text(raw, "question", at),
            "options": options,
            "answer": _answer_letters(raw.get("answer"), options, at),
            "dataset": name,
            "split": "test",
            "metadata": {k: v for k, v in raw.items() if k not in ("question", "options", "answer")},
        }
        return _build(MultipleChoiceQuestion, rec, at)

    return collect(items(), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- MedQA
def load_medqa(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    split: str | None = None,
) -> list[MultipleChoiceQuestion]:
    """Read MedQA (USMLE) JSONL: ``{question, options: {A..D|E}, answer: text, answer_idx: letter, meta_info,
    metamap_phrases}`` per line.

    The answer text must equal ``options[answer_idx]`` (ignoring surrounding whitespace): a mismatch means the
    file is corrupt and is an error on field ``answer``. ``id`` is ``medqa/<file stem>/<line>`` (the layout has no
    ids); ``split`` defaults to the one named by the file stem (train/dev/test), else ``test``.
    """
    path = Path(path)
    split = split or _split_from_stem(path.stem)

    def convert(item: tuple[int, Any]) -> MultipleChoiceQuestion:
        lineno, raw = item
        at = _At(path, lineno)
        raw = _as_object(raw, at)
        options = _letter_options(raw.get("options"), at)
        letter = _text(raw, "answer_idx", at).strip().upper()
        if letter not in options:
            raise at.error(
                "answer_idx", f"expected one of the option letters {sorted(options)}, got {letter!r}"
            )
        answer_text = _text(raw, "answer", at)
        if answer_text.strip() != options[letter].strip():
            raise at.error(
                "answer", f"expected the text of option {letter} ({options[letter]!r}), got {answer_text!r}"
            )
        metadata = {k: v for k, v in raw.items() if k not in ("question", "options", "answer", "answer_idx")}
        rec = {
            "id": f"medqa/{path.stem}/{lineno}",
            "question": _text(raw, "question", at),
            "options": options,
            "answer": [letter],
            "dataset": "medqa",
            "split": split,
            "metadata": metadata,
        }
        return _build(MultipleChoiceQuestion, rec, at)

    return collect(iter_jsonl(path, skip_invalid=skip_invalid, report=report), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- MedMCQA
_MEDMCQA_OPTIONS = {"A": "opa", "B": "opb", "C": "opc", "D": "opd"}


def _medmcqa_cop(raw: dict[str, Any], at: _At) -> str:
    """The answer letter from ``cop`` (1-4). Strings of one digit are accepted; 0 or 5 are not (a 0-based copy
    of the data would silently shift every answer)."""
    cop = raw.get("cop")
    if isinstance(cop, str) and cop.strip().isdigit():
        cop = int(cop)
    if isinstance(cop, bool) or not isinstance(cop, int) or not 1 <= cop <= 4:
        got = "nothing (unlabelled split?)" if cop is None else repr(cop)
        raise at.error("cop", f"expected the correct option number 1-4, got {got}")
    return "ABCD"[cop - 1]


def load_medmcqa(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    split: str | None = None,
) -> list[MultipleChoiceQuestion]:
    """Read MedMCQA JSON lines: ``{id, question, opa, opb, opc, opd, cop: 1-4, exp, subject_name, topic_name,
    choice_type}``.

    Options become A-D and ``cop`` the answer letter; a missing or out-of-range ``cop`` is an error on ``cop``
    (the published test split is unlabelled, so load it with ``skip_invalid`` or not at all). ``exp``,
    ``subject_name``, ``topic_name`` and ``choice_type`` are kept in ``metadata``. ``id`` is ``medmcqa/<id>``
    (``medmcqa/<stem>/<line>`` when the row has no id).
    """
    path = Path(path)
    split = split or _split_from_stem(path.stem)

    def convert(item: tuple[int, Any]) -> MultipleChoiceQuestion:
        lineno, raw = item
        at = _At(path, lineno)
        raw = _as_object(raw, at)
        options = {letter: _text(raw, key, at, allow_empty=True) for letter, key in _MEDMCQA_OPTIONS.items()}
        answer = _medmcqa_cop(raw, at)
        raw_id = raw.get("id")
        if raw_id is not None and not isinstance(raw_id, (str, int)):
            raise at.error("id", f"expected a string id, got {_type_name(raw_id)}")
        skip = {"id", "question", "cop", *_MEDMCQA_OPTIONS.values()}
        rec = {
            "id": f"medmcqa/{raw_id}" if raw_id not in (None, "") else f"medmcqa/{path.stem}/{lineno}",
            "question": _text(raw, "question", at),
            "options": options,
            "answer": [answer],
            "dataset": "medmcqa",
            "split": split,
            "metadata": {k: v for k, v in raw.items() if k not in skip},
        }
        return _build(MultipleChoiceQuestion, rec, at, {"options": "opa..opd"})

    return collect(iter_jsonl(path, skip_invalid=skip_invalid, report=report), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- MMLU
def _mmlu_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.rglob("*.csv"))
        if not files:
            raise FileNotFoundError(f"{path}: no MMLU .csv files in this folder")
        return files
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    return [path]


def _mmlu_subject_split(file: Path) -> tuple[str, str]:
    """``anatomy_val.csv`` -> ("anatomy", "val"); a name without a split suffix takes its folder's name."""
    subject, _, split = file.stem.rpartition("_")
    if subject and split in ("dev", "val", "test", "train"):
        return subject, split
    return file.stem, file.parent.name


def _iter_mmlu_rows(file: Path) -> Iterator[tuple[_At, list[str], str, str]]:
    """Rows of one MMLU CSV with their row number (rows may span lines: quoted newlines)."""
    subject, split = _mmlu_subject_split(file)
    with open(file, encoding="utf-8-sig", newline="") as fh:
        for row_number, row in enumerate(csv.reader(fh), start=1):
            if row:
                yield _At(file, row_number), row, subject, split


def _mmlu_question(item: tuple[_At, list[str], str, str], dataset: str) -> MultipleChoiceQuestion:
    at, row, subject, split = item
    if len(row) != 6:
        raise at.error(None, f"expected 6 CSV columns (question, A, B, C, D, answer), got {len(row)}")
    if not row[0].strip():
        raise at.error("question", "expected a non-empty question (column 1)")
    options = dict(zip("ABCD", row[1:5]))
    answer = row[5].strip().upper()
    if answer not in options:
        raise at.error("answer", f"expected an answer letter A-D (column 6), got {row[5]!r}")
    rec = {
        "id": f"{dataset}/{subject}/{split}/{at.line}",
        "question": row[0],
        "options": options,
        "answer": [answer],
        "dataset": dataset,
        "split": split,
        "metadata": {"subject": subject},
    }
    return _build(MultipleChoiceQuestion, rec, at)


def load_mmlu(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    medical_only: bool = False,
) -> list[MultipleChoiceQuestion]:
    """Read MMLU CSVs without header (``question, A, B, C, D, answer letter``).

    ``path`` is one CSV or a folder searched recursively for ``<subject>_<split>.csv`` (e.g. ``data/val``). The
    subject goes to ``metadata["subject"]`` and the split (dev/val/test) to ``split``. With ``medical_only`` only
    the six MMLU-Med subjects are read and the dataset is named ``mmlu_med`` (else ``mmlu``). Errors give the CSV
    row number as the line (a quoted newline makes a row span several file lines).
    """
    path = Path(path)
    dataset = "mmlu_med" if medical_only else "mmlu"
    files = _mmlu_files(path)
    if medical_only:
        files = [f for f in files if _mmlu_subject_split(f)[0] in MMLU_MEDICAL_SUBJECTS]

    def rows() -> Iterator[tuple[_At, list[str], str, str]]:
        for file in files:
            yield from _iter_mmlu_rows(file)

    return collect(rows(), report, skip_invalid, lambda item: _mmlu_question(item, dataset))


# ----------------------------------------------------------------------------------------------- PubMedQA
def _pubmedqa_passage(pmid: str, raw: dict[str, Any], at: _At) -> Passage:
    """The abstract of one PubMedQA entry: labelled sections joined (``BACKGROUND: ...``), one per line."""
    contexts = raw.get("CONTEXTS")
    if not isinstance(contexts, list) or not contexts or not all(isinstance(c, str) for c in contexts):
        raise at.error("CONTEXTS", f"expected a non-empty list of strings, got {_type_name(contexts)}")
    labels = raw.get("LABELS") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise at.error("LABELS", f"expected a list of section labels, got {_type_name(labels)}")
    if labels and len(labels) != len(contexts):
        raise at.error("LABELS", f"expected one label per context ({len(contexts)}), got {len(labels)}")
    labels = labels or [""] * len(contexts)
    text = "\n".join(f"{label}: {ctx}" if label else ctx for label, ctx in zip(labels, contexts))
    meshes = raw.get("MESHES") or []
    if not isinstance(meshes, list):
        raise at.error("MESHES", f"expected a list of MeSH terms, got {_type_name(meshes)}")
    rec = {
        "id": f"pubmed/{pmid}",
        "source": "research",
        "title": f"PubMed {pmid}",
        "text": text,
        "date": _year(raw.get("YEAR"), at, "YEAR"),
        "url": f"https://pubmed.ncbi.nlm.nih.gov/{pmid}/",
        "metadata": {"pmid": pmid, "meshes": meshes, "section_labels": labels},
    }
    return _build(Passage, rec, at, {"text": "CONTEXTS", "date": "YEAR"})


def _pubmedqa_question(
    pmid: str, raw: dict[str, Any], at: _At, passage_id: str, split: str
) -> MultipleChoiceQuestion:
    """The yes/no/maybe question of one entry, its gold passage being the entry's abstract."""
    decision = _text(raw, "final_decision", at).strip().lower()
    answer = next((letter for letter, text in YES_NO_MAYBE.items() if text == decision), None)
    if answer is None:
        raise at.error("final_decision", f"expected yes, no or maybe, got {raw['final_decision']!r}")
    skip = {"QUESTION", "CONTEXTS", "LABELS", "MESHES", "YEAR", "final_decision", "LONG_ANSWER"}
    metadata = {"pmid": pmid, "long_answer": raw.get("LONG_ANSWER"), "year": raw.get("YEAR")}
    metadata.update({k: v for k, v in raw.items() if k not in skip})
    rec = {
        "id": f"pubmedqa/{pmid}",
        "question": _text(raw, "QUESTION", at),
        "options": dict(YES_NO_MAYBE),
        "answer": [answer],
        "dataset": "pubmedqa",
        "split": split,
        "gold_passages": [passage_id],
        "gold_sources": ["research"],
        "metadata": metadata,
    }
    return _build(MultipleChoiceQuestion, rec, at, {"question": "QUESTION"})


def _iter_pubmedqa(path: Path) -> Iterator[tuple[str, dict[str, Any], _At]]:
    data, lines = _read_json_with_lines(path)
    _as_object(data, _At(path, 1), "an object {pmid: entry}")
    for pmid, raw in data.items():
        yield str(pmid), raw, _At(path, lines.get((pmid,)), str(pmid))


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

    def convert(item: tuple[str, Any, _At]) -> list[Record]:
        pmid, raw, at = item
        raw = _as_object(raw, at)
        passage = _pubmedqa_passage(pmid, raw, at)
        return [_pubmedqa_question(pmid, raw, at, passage.id, split), passage]

    records = _collect_groups(_iter_pubmedqa(path), report, skip_invalid, convert)
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

    def convert(item: tuple[str, Any, _At]) -> Passage:
        pmid, raw, at = item
        return _pubmedqa_passage(pmid, _as_object(raw, at), at)

    return collect(_iter_pubmedqa(path), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- BioASQ
_PMID = re.compile(r"(\d+)/?$")


def _bioasq_snippet(raw: Any, at: _At, name: str) -> Passage:
    """One BioASQ snippet as a research passage; its parent is the PubMed document it was cut from.

    The id is built from the document and the snippet's offsets (or a hash of its text) so that the same snippet
    quoted by several questions is one passage.
    """
    snip_at = _At(at.path, at.line, at.field(name))
    raw = _as_object(raw, snip_at)
    text = _text(raw, "text", snip_at)
    document = _text(raw, "document", snip_at).strip()
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
    return _build(Passage, rec, snip_at)


def _bioasq_ideal(raw: dict[str, Any], at: _At) -> str:
    ideal = raw.get("ideal_answer")
    if isinstance(ideal, list) and ideal and all(isinstance(x, str) for x in ideal):
        return ideal[0]
    if isinstance(ideal, str) and ideal.strip():
        return ideal
    raise at.error(
        "ideal_answer", f"expected a string or a non-empty list of strings, got {_type_name(ideal)}"
    )


def _bioasq_yes_no(raw: dict[str, Any], at: _At) -> str:
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
    split = split or _split_from_stem(path.stem)
    data, lines = _read_json_with_lines(path, depth=2)
    data = _as_object(data, _At(path, 1), "an object {questions: [...]}")
    questions = data.get("questions")
    if not isinstance(questions, list):
        raise RecordError(
            path,
            lines.get(("questions",)),
            "questions",
            f"expected a list of questions, got {_type_name(questions)}",
        )
    seen: set[str] = set()

    def convert(item: tuple[int, Any]) -> list[Record]:
        index, raw = item
        at = _At(path, lines.get(("questions", index)), f"questions[{index}]")
        raw = _as_object(raw, at)
        qid = _text(raw, "id", at).strip()
        qtype = _text(raw, "type", at).strip().lower()
        if qtype != "yesno" and not include_other:
            if report is not None:
                report.exclude(f"BioASQ {qtype or 'untyped'} questions (not yes/no; include_other=True keeps them)")
            return []
        snippets = raw.get("snippets") or []
        if not isinstance(snippets, list):
            raise at.error("snippets", f"expected a list, got {_type_name(snippets)}")
        passages = [_bioasq_snippet(s, at, f"snippets[{j}]") for j, s in enumerate(snippets)]
        gold = list(dict.fromkeys(p.id for p in passages))
        metadata = {k: v for k, v in raw.items() if k not in ("id", "body", "snippets")}
        common = {
            "id": f"bioasq/{qid}",
            "question": _text(raw, "body", at),
            "dataset": "bioasq",
            "split": split,
            "gold_passages": gold,
            "metadata": metadata,
        }
        if qtype == "yesno":
            answer = _bioasq_yes_no(raw, at)
            question: Record = _build(
                MultipleChoiceQuestion,
                {**common, "options": dict(YES_NO), "answer": [answer], "gold_sources": ["research"]},
                at,
                {"question": "body"},
            )
        else:
            question = _build(
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

    records = _collect_groups(enumerate(questions), report, skip_invalid, convert)
    return [r for r in records if not isinstance(r, Passage)] + [r for r in records if isinstance(r, Passage)]


# ----------------------------------------------------------------------------------------------- Self-BioRAG
def _selfbiorag_instances(raw: dict[str, Any], at: _At) -> list[dict[str, Any]]:
    instances = raw.get("instances")
    if isinstance(instances, dict):
        return [instances]
    if isinstance(instances, list) and instances and all(isinstance(x, dict) for x in instances):
        return instances
    raise at.error(
        "instances", f"expected {{input, output}} or a non-empty list of them, got {_type_name(instances)}"
    )


def load_selfbiorag(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
) -> list[InstructionExample]:
    """Read Self-BioRAG instruction files: one ``{id, name, instruction, instances: {input, output}}`` object per
    line, even when the file is named ``.json`` (a file that is one JSON list is read too).

    ``instances`` may be a list of ``{input, output}``: each becomes its own example, with id ``<id>/<i>``.
    ``dataset`` = ``name``; other top-level keys go to ``metadata``. A bad instance invalidates its whole line.
    """
    path = Path(path)

    def convert(item: tuple[_At, Any]) -> list[Record]:
        at, raw = item
        raw = _as_object(raw, at)
        raw_id = raw.get("id")
        if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or str(raw_id).strip() == "":
            raise at.error("id", f"expected a string id, got {_type_name(raw_id)}")
        instruction = _text(raw, "instruction", at)
        name = _optional_text(raw, "name", at) or ""
        metadata = {k: v for k, v in raw.items() if k not in ("id", "name", "instruction", "instances")}
        instances = _selfbiorag_instances(raw, at)
        examples: list[Record] = []
        for i, inst in enumerate(instances):
            field = "instances" if isinstance(raw["instances"], dict) else f"instances[{i}]"
            inst_at = _At(path, at.line, at.field(field))
            rec = {
                "id": str(raw_id) if len(instances) == 1 else f"{raw_id}/{i}",
                "instruction": instruction,
                "input": _text(inst, "input", inst_at, allow_empty=True),
                "output": _text(inst, "output", inst_at, allow_empty=True),
                "dataset": name,
                "metadata": {**metadata, **{k: v for k, v in inst.items() if k not in ("input", "output")}},
            }
            examples.append(_build(InstructionExample, rec, at))
        return examples

    return _collect_groups(_iter_list_or_jsonl(path), report, skip_invalid, convert)  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------- long-form QA
def load_longform(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    split: str | None = None,
    allow_missing_gold: bool = False,
) -> list[OpenQuestion]:
    """Read long-form QA (Omni-RAG ``train_long.json`` / ``dev_long.json``): a JSON list of ``{id, question, gold,
    name, ...}``.

    Each item becomes an :class:`OpenQuestion` with ``reference_answer`` = ``gold`` and ``dataset`` = ``name``
    (liveqa, medicationqa, expertqa; ``longform`` when absent); other keys go to ``metadata``. Errors give the line
    where the item starts and the list index in the field path (``[12].gold``). JSONL is accepted too.

    A null or empty ``gold`` is an error by default (the published files hold a few); ``allow_missing_gold``
    keeps such questions with ``reference_answer=""`` and ``metadata["missing_gold"] = True``, for uses that need
    no reference (judge-based or human evaluation).
    """
    path = Path(path)
    split = split or _split_from_stem(path.stem)

    def convert(item: tuple[_At, Any]) -> OpenQuestion:
        at, raw = item
        raw = _as_object(raw, at)
        metadata = {k: v for k, v in raw.items() if k not in ("id", "question", "gold", "name")}
        gold = raw.get("gold")
        if allow_missing_gold and (gold is None or (isinstance(gold, str) and not gold.strip())):
            gold, metadata["missing_gold"] = "", True
        else:
            gold = _text(raw, "gold", at)
        rec = {
            "id": _text(raw, "id", at),
            "question": _text(raw, "question", at),
            "reference_answer": gold,
            "dataset": _optional_text(raw, "name", at) or "longform",
            "split": split,
            "metadata": metadata,
        }
        return _build(OpenQuestion, rec, at, {"reference_answer": "gold"})

    return collect(_iter_list_or_jsonl(path), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- BioMedMCQs
def load_biomedmcqs(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
    split: str | None = None,
) -> list[MultipleChoiceQuestion]:
    """Read BioMedMCQs: ``{id, level, question, options, answer}`` items in a JSON list or JSONL.

    ``options`` is a dict ``{A: text}`` or a list (lettered A, B, ...); ``answer`` holds one or several letters
    (``"A"``, ``"AC"``, ``"A,C"``, ``["A", "C"]``), each of which must name an option. ``level`` and other keys go
    to ``metadata``; ``id`` is ``biomedmcqs/<id>`` (``biomedmcqs/<stem>/<line or index>`` when absent).
    """
    path = Path(path)
    split = split or _split_from_stem(path.stem)

    def convert(item: tuple[_At, Any]) -> MultipleChoiceQuestion:
        at, raw = item
        raw = _as_object(raw, at)
        options = _letter_options(raw.get("options"), at)
        raw_id = raw.get("id")
        fallback = at.key.strip("[]") if at.key else str(at.line)
        rec = {
            "id": f"biomedmcqs/{raw_id}"
            if raw_id not in (None, "")
            else f"biomedmcqs/{path.stem}/{fallback}",
            "question": _text(raw, "question", at),
            "options": options,
            "answer": _answer_letters(raw.get("answer"), options, at),
            "dataset": "biomedmcqs",
            "split": split,
            "metadata": {k: v for k, v in raw.items() if k not in ("id", "question", "options", "answer")},
        }
        return _build(MultipleChoiceQuestion, rec, at)

    return collect(_iter_list_or_jsonl(path), report, skip_invalid, convert)

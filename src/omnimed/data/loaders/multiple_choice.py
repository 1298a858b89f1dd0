"""Loaders of the multiple-choice medical QA benchmarks: MIRAGE, MedQA, MedMCQA, MMLU and BioMedMCQs.

Each ``load_*`` function reads one published layout and returns
:class:`~omnimed.data.records.MultipleChoiceQuestion` records (options lettered A, B, ...; the answer as
letters).

They follow the benchmark-loader contract described in :mod:`omnimed.data.loaders`: a malformed record raises
:class:`RecordError` naming file, line and field, or with ``skip_invalid=True`` is skipped and counted in
``report``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect, iter_jsonl, text_lines
from omnimed.data.loaders.record_fields import (
    answer_letters,
    as_object,
    build_record,
    letter_options,
    required_text,
    split_from_stem,
    type_name,
)
from omnimed.data.loaders.record_locations import At, iter_list_or_jsonl, read_json_with_lines
from omnimed.data.records import MultipleChoiceQuestion

__all__ = [
    "MMLU_MEDICAL_SUBJECTS",
    "load_biomedmcqs",
    "load_medmcqa",
    "load_medqa",
    "load_mirage",
    "load_mmlu",
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
    data, lines = read_json_with_lines(path, depth=2)
    as_object(data, At(path, 1), "an object {dataset: {qid: question}}")
    wanted = list(data) if datasets is None else list(datasets)
    missing = [name for name in wanted if name not in data]
    if missing:
        raise ValueError(f"{path}: no dataset(s) {missing}; the file holds {sorted(data)}")

    def items() -> Iterator[tuple[At, str, str, Any]]:
        for name in wanted:
            group = data[name]
            if not isinstance(group, dict):
                raise RecordError(
                    path,
                    lines.get((name,)),
                    name,
                    f"expected an object {{qid: question}}, got {type_name(group)}",
                )
            for qid, raw in group.items():
                yield At(path, lines.get((name, qid)), f"{name}/{qid}"), name, qid, raw

    def convert(item: tuple[At, str, str, Any]) -> MultipleChoiceQuestion:
        at, name, qid, raw = item
        raw = as_object(raw, at)
        options = letter_options(raw.get("options"), at)
        rec = {
            "id": f"{name}/{qid}",
            "question": required_text(raw, "question", at),
            "options": options,
            "answer": answer_letters(raw.get("answer"), options, at),
            "dataset": name,
            "split": "test",
            "metadata": {k: v for k, v in raw.items() if k not in ("question", "options", "answer")},
        }
        return build_record(MultipleChoiceQuestion, rec, at)

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
    split = split or split_from_stem(path.stem)

    def convert(item: tuple[int, Any]) -> MultipleChoiceQuestion:
        lineno, raw = item
        at = At(path, lineno)
        raw = as_object(raw, at)
        options = letter_options(raw.get("options"), at)
        letter = required_text(raw, "answer_idx", at).strip().upper()
        if letter not in options:
            raise at.error(
                "answer_idx", f"expected one of the option letters {sorted(options)}, got {letter!r}"
            )
        answer_text = required_text(raw, "answer", at)
        if answer_text.strip() != options[letter].strip():
            raise at.error(
                "answer", f"expected the text of option {letter} ({options[letter]!r}), got {answer_text!r}"
            )
        metadata = {k: v for k, v in raw.items() if k not in ("question", "options", "answer", "answer_idx")}
        rec = {
            "id": f"medqa/{path.stem}/{lineno}",
            "question": required_text(raw, "question", at),
            "options": options,
            "answer": [letter],
            "dataset": "medqa",
            "split": split,
            "metadata": metadata,
        }
        return build_record(MultipleChoiceQuestion, rec, at)

    return collect(iter_jsonl(path, skip_invalid=skip_invalid, report=report), report, skip_invalid, convert)


# ----------------------------------------------------------------------------------------------- MedMCQA
_MEDMCQA_OPTIONS = {"A": "opa", "B": "opb", "C": "opc", "D": "opd"}


def _medmcqa_cop(raw: dict[str, Any], at: At) -> str:
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
    split = split or split_from_stem(path.stem)

    def convert(item: tuple[int, Any]) -> MultipleChoiceQuestion:
        lineno, raw = item
        at = At(path, lineno)
        raw = as_object(raw, at)
        options = {
            letter: required_text(raw, key, at, allow_empty=True) for letter, key in _MEDMCQA_OPTIONS.items()
        }
        answer = _medmcqa_cop(raw, at)
        raw_id = raw.get("id")
        if raw_id is not None and not isinstance(raw_id, (str, int)):
            raise at.error("id", f"expected a string id, got {type_name(raw_id)}")
        skip = {"id", "question", "cop", *_MEDMCQA_OPTIONS.values()}
        rec = {
            "id": f"medmcqa/{raw_id}" if raw_id not in (None, "") else f"medmcqa/{path.stem}/{lineno}",
            "question": required_text(raw, "question", at),
            "options": options,
            "answer": [answer],
            "dataset": "medmcqa",
            "split": split,
            "metadata": {k: v for k, v in raw.items() if k not in skip},
        }
        return build_record(MultipleChoiceQuestion, rec, at, {"options": "opa..opd"})

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


def _iter_mmlu_rows(file: Path) -> Iterator[tuple[At, list[str], str, str]]:
    """Rows of one MMLU CSV with their row number (rows may span lines: quoted newlines)."""
    subject, split = _mmlu_subject_split(file)
    rows = csv.reader(text_lines(file, encoding="utf-8-sig", newline=""))
    for row_number, row in enumerate(rows, start=1):
        if row:
            yield At(file, row_number), row, subject, split


def _mmlu_question(item: tuple[At, list[str], str, str], dataset: str) -> MultipleChoiceQuestion:
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
    return build_record(MultipleChoiceQuestion, rec, at)


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

    def rows() -> Iterator[tuple[At, list[str], str, str]]:
        for file in files:
            yield from _iter_mmlu_rows(file)

    return collect(rows(), report, skip_invalid, lambda item: _mmlu_question(item, dataset))


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
    split = split or split_from_stem(path.stem)

    def convert(item: tuple[At, Any]) -> MultipleChoiceQuestion:
        at, raw = item
        raw = as_object(raw, at)
        options = letter_options(raw.get("options"), at)
        raw_id = raw.get("id")
        fallback = at.key.strip("[]") if at.key else str(at.line)
        rec = {
            "id": f"biomedmcqs/{raw_id}"
            if raw_id not in (None, "")
            else f"biomedmcqs/{path.stem}/{fallback}",
            "question": required_text(raw, "question", at),
            "options": options,
            "answer": answer_letters(raw.get("answer"), options, at),
            "dataset": "biomedmcqs",
            "split": split,
            "metadata": {k: v for k, v in raw.items() if k not in ("id", "question", "options", "answer")},
        }
        return build_record(MultipleChoiceQuestion, rec, at)

    return collect(iter_list_or_jsonl(path), report, skip_invalid, convert)

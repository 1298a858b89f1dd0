"""Loader of long-form medical QA (Omni-RAG's LiveQA, MedicationQA, ExpertQA sets) as open questions.

Each item becomes an :class:`~omnimed.data.records.OpenQuestion` whose reference answer is the published gold
answer, for free-text evaluation.

They follow the benchmark-loader contract described in :mod:`omnimed.data.loaders`: a malformed record raises
:class:`RecordError` naming file, line and field, or with ``skip_invalid=True`` is skipped and counted in
``report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnimed.data.errors import LoadReport
from omnimed.data.io import collect
from omnimed.data.loaders.record_fields import (
    as_object,
    build_record,
    optional_text,
    required_text,
    split_from_stem,
)
from omnimed.data.loaders.record_locations import At, iter_list_or_jsonl
from omnimed.data.records import OpenQuestion

__all__ = ["load_longform"]


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
    split = split or split_from_stem(path.stem)

    def convert(item: tuple[At, Any]) -> OpenQuestion:
        at, raw = item
        raw = as_object(raw, at)
        metadata = {k: v for k, v in raw.items() if k not in ("id", "question", "gold", "name")}
        gold = raw.get("gold")
        if allow_missing_gold and (gold is None or (isinstance(gold, str) and not gold.strip())):
            gold, metadata["missing_gold"] = "", True
        else:
            gold = required_text(raw, "gold", at)
        rec = {
            "id": required_text(raw, "id", at),
            "question": required_text(raw, "question", at),
            "reference_answer": gold,
            "dataset": optional_text(raw, "name", at) or "longform",
            "split": split,
            "metadata": metadata,
        }
        return build_record(OpenQuestion, rec, at, {"reference_answer": "gold"})

    return collect(iter_list_or_jsonl(path), report, skip_invalid, convert)

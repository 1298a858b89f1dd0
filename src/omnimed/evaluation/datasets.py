"""Evaluation datasets by key: the miniature ones we ship or generate, and the papers' benchmarks read from files.

Miniature keys: ``world_mcq`` / ``world_open`` (the synthetic world's questions), ``pubmedqa_real``,
``mmlu_med_val`` and ``longform_real`` (the real small files under ``OMNIMED_REALDATA``). Paper keys (``medqa``,
``medmcqa``, ``mmlu_med``, ``pubmedqa``, ``bioasq``, ``liveqa``, ``medicationqa``, ``expertqa``, ``biomedmcqs``)
read ``<data_dir>/<key>`` with the matching loader, for users who have the benchmark files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omnimed.data.errors import LoadReport
from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion

log = logging.getLogger(__name__)

Question = MultipleChoiceQuestion | OpenQuestion

#: paper dataset key -> omnimed-data format that reads it
PAPER_FORMATS: dict[str, str] = {
    "medqa": "medqa",
    "medmcqa": "medmcqa",
    "mmlu_med": "mmlu",
    "pubmedqa": "pubmedqa",
    "bioasq": "bioasq",
    "liveqa": "longform",
    "medicationqa": "longform",
    "expertqa": "longform",
    "biomedmcqs": "biomedmcqs",
    "mirage": "mirage",
}
MINIATURE: tuple[str, ...] = ("world_mcq", "world_open", "pubmedqa_real", "mmlu_med_val", "longform_real")
REALDATA_FILES: dict[str, str] = {
    "pubmedqa_real": "research/pubmedqa/data/ori_pqal.json",
    "mmlu_med_val": "qa/mmlu-dev-val/data/val",
    "longform_real": "qa/omnirag-longform/dev_long.json",
}


@dataclass(frozen=True)
class DatasetRequest:
    """Where to read from: the world's seed and size, the realdata root, the folder of paper benchmarks."""

    key: str
    split: str | None = "test"
    limit: int | None = None
    world_seed: int = 0
    world_size: str = "small"
    realdata_root: str | None = None
    data_dir: str | None = None


def known_datasets() -> list[str]:
    return [*MINIATURE, *PAPER_FORMATS]


def load_eval_dataset(req: DatasetRequest) -> list[Question]:
    """The questions of ``req.key`` (``req.limit`` first ones); an unknown key lists the known ones."""
    loaders: dict[str, Callable[[DatasetRequest], list[Question]]] = {
        "world_mcq": lambda r: _world(r, "mcq"),
        "world_open": lambda r: _world(r, "open"),
        **{key: _realdata for key in REALDATA_FILES},
        **{key: _paper for key in PAPER_FORMATS},
    }
    if req.key not in loaders:
        raise ValueError(f"unknown dataset {req.key!r}; known: {', '.join(known_datasets())}")
    questions = loaders[req.key](req)
    if not questions:
        raise ValueError(f"dataset {req.key!r} (split={req.split}) has no questions")
    return questions[: req.limit] if req.limit else questions


def _world(req: DatasetRequest, kind: str) -> list[Question]:
    from omnimed.data.world import build_world

    world = build_world(req.world_seed, req.world_size)
    pool = world.questions if kind == "mcq" else world.open_questions
    return [q for q in pool if req.split is None or q.split == req.split]


def _questions(records) -> list[Question]:
    return [r for r in records if isinstance(r, (MultipleChoiceQuestion, OpenQuestion))]


def _realdata(req: DatasetRequest) -> list[Question]:
    from omnimed.data.formats import load_format

    root = req.realdata_root or os.environ.get("OMNIMED_REALDATA")
    if not root:
        raise ValueError(f"dataset {req.key!r} reads the real files: set OMNIMED_REALDATA (or realdata_root) to "
                         "../shared/realdata")
    path = Path(root) / REALDATA_FILES[req.key]
    fmt = {"pubmedqa_real": "pubmedqa", "mmlu_med_val": "mmlu", "longform_real": "longform"}[req.key]
    report = LoadReport()
    questions = _questions(load_format(fmt, path, skip_invalid=True, report=report))
    if report.skipped:  # e.g. one long-form dev item has no gold answer: it cannot be scored
        log.warning("dataset %s: skipped %d unusable record(s) of %s: %s", req.key, len(report.skipped), path,
                    "; ".join(f"line {s.line}: {s.message}" for s in report.skipped[:3]))
    return questions


def _paper(req: DatasetRequest) -> list[Question]:
    from omnimed.data.formats import load_format

    if not req.data_dir:
        raise ValueError(f"dataset {req.key!r} is a paper benchmark: set data_dir to the folder holding "
                         f"{req.key}/ (format {PAPER_FORMATS[req.key]})")
    path = Path(req.data_dir) / req.key
    if not path.exists():
        raise ValueError(f"dataset {req.key!r}: {path} does not exist (expected {PAPER_FORMATS[req.key]} files)")
    return _questions(load_format(PAPER_FORMATS[req.key], path))

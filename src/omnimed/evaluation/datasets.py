"""Evaluation datasets by key: the miniature ones we ship or generate, and the papers' benchmarks read from files.

Miniature keys: ``world_mcq`` / ``world_open`` (the synthetic world's questions), ``world_mcq_<kind>`` (one
question kind: diagnosis, treatment, mechanism, research_finding, examination, multi_hop, self_contained),
``world_mcq_<kind>+<kind>..`` (several kinds taken in turn, so any first n hold them in equal shares: a column whose
paper benchmark mixes questions that need retrieval with ones that do not),
``pubmedqa_real``,
``mmlu_med_val`` (the six MMLU-Med validation subjects) and one key per subject (``mmlu_anatomy_val`` ..
``mmlu_professional_medicine_val``), and ``longform_real`` (the real small files under ``OMNIMED_REALDATA``).

Paper keys read ``<data_dir>/<name>`` (a file or a folder, as its loader takes) with the matching loader, for
users who have the benchmark files: ``medqa``, ``medmcqa``, ``mmlu_med``, ``pubmedqa``, ``bioasq``, ``liveqa``,
``medicationqa``, ``expertqa``, ``biomedmcqs``, ``mirage``; ``mmlu_anatomy`` .. ``mmlu_professional_medicine``
(one subject of ``<data_dir>/mmlu_med``, by the subject the loader keeps in each record) and ``biomedmcqs_level1``
.. ``_level3`` (one level of ``<data_dir>/biomedmcqs``, by the ``level`` in each record's metadata: its number).

:data:`PENDING` names the papers' benchmarks that the shipped tables use but that no loader reads yet (SEER,
DDXPlus, MIMIC-IV-ED, MedDDx, PolyEval, Omni-RAG's pooled test set): a table reports their cells as missing, with
the reason, instead of running them. :func:`dataset_status` tells which keys a task knows; ``omnimed-reproduce``
checks every key of a table with it before anything runs.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.multiple_choice import MMLU_MEDICAL_SUBJECTS
from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion
from omnimed.data.world.questions import ALL_KINDS

log = logging.getLogger(__name__)

Question = MultipleChoiceQuestion | OpenQuestion


@dataclass(frozen=True)
class PaperDataset:
    """A paper benchmark: the omnimed-data ``format`` that reads ``<data_dir>/<source>`` (a file or a folder, as
    the loader takes), and optionally the ``(metadata field, value)`` a record must carry to belong to this key (one
    MMLU subject, one BioMedMCQs level)."""

    format: str
    source: str
    where: tuple[str, str] | None = None


#: paper dataset key -> omnimed-data format that reads ``<data_dir>/<key>``
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
#: every paper key: the whole-benchmark ones above plus per-subject and per-level views of one benchmark
PAPER_DATASETS: dict[str, PaperDataset] = {
    **{key: PaperDataset(fmt, key) for key, fmt in PAPER_FORMATS.items()},
    **{f"mmlu_{s}": PaperDataset("mmlu", "mmlu_med", ("subject", s)) for s in MMLU_MEDICAL_SUBJECTS},
    **{f"biomedmcqs_level{n}": PaperDataset("biomedmcqs", "biomedmcqs", ("level", str(n))) for n in (1, 2, 3)},
}
#: paper benchmarks a shipped table names that no loader reads yet -> why; their cells are reported missing
PENDING: dict[str, str] = {
    "seer": "SEER (Omni-RAG's clinical QA set) has no loader yet",
    "ddxplus": "DDXPlus (as Omni-RAG poses it) has no loader yet",
    "mimic_iv_ed": "MIMIC-IV-ED (as Omni-RAG poses it) has no loader yet",
    "omnirag_test_all": "Omni-RAG's pooled test set of 11 datasets has no loader yet",
    "medddx_basic": "MedDDx (Med-SRAF's differential-diagnosis MCQs) has no loader yet",
    "medddx_intermediate": "MedDDx (Med-SRAF's differential-diagnosis MCQs) has no loader yet",
    "medddx_expert": "MedDDx (Med-SRAF's differential-diagnosis MCQs) has no loader yet",
    "polyeval_care": "PolyEval (PolyRAG's benchmark) has no loader yet",
    "polyeval_inquiry": "PolyEval (PolyRAG's benchmark) has no loader yet",
    "polyeval_policy": "PolyEval (PolyRAG's benchmark) has no loader yet",
}
MMLU_VAL_SUBJECTS: dict[str, str] = {f"mmlu_{s}_val": s for s in MMLU_MEDICAL_SUBJECTS}
#: one key per world question kind (``world_mcq_research_finding``): distinct question sets for a table's columns
WORLD_KIND_KEYS: dict[str, str] = {f"world_mcq_{kind.replace(' ', '_').replace('-', '_')}": kind
                                   for kind in ALL_KINDS}
MINIATURE: tuple[str, ...] = ("world_mcq", *WORLD_KIND_KEYS, "world_open", "pubmedqa_real", "mmlu_med_val",
                              *MMLU_VAL_SUBJECTS, "longform_real")
#: the real MMLU sets have no training split: their demonstrations come from MMLU's dev split (5 per subject; the
#: paper uses MedPaLM's examples, drawn from it)
DEMONSTRATION_KEYS: dict[str, str] = {"mmlu_med_val": "mmlu_med_dev",
                                      **{key: key.removesuffix("_val") + "_dev" for key in MMLU_VAL_SUBJECTS}}
REALDATA_FILES: dict[str, str] = {
    "pubmedqa_real": "research/pubmedqa/data/ori_pqal.json",
    "mmlu_med_val": "qa/mmlu-dev-val/data/val",
    **{key: f"qa/mmlu-dev-val/data/val/{s}_val.csv" for key, s in MMLU_VAL_SUBJECTS.items()},
    "mmlu_med_dev": "qa/mmlu-dev-val/data/dev",
    **{DEMONSTRATION_KEYS[key]: f"qa/mmlu-dev-val/data/dev/{s}_dev.csv" for key, s in MMLU_VAL_SUBJECTS.items()},
    "longform_real": "qa/omnirag-longform/dev_long.json",
}
REALDATA_FORMATS: dict[str, str] = {
    "pubmedqa_real": "pubmedqa", "mmlu_med_val": "mmlu", **{key: "mmlu" for key in MMLU_VAL_SUBJECTS},
    "mmlu_med_dev": "mmlu", **{key: "mmlu" for key in DEMONSTRATION_KEYS.values()},
    "longform_real": "longform",
}
#: ``task.queries`` of ``task=retrieval`` (see :func:`omnimed.evaluation.retrieval.load_queries`)
#: one retrieval query set per world question kind with gold passages (``world_treatment``): distinct columns
WORLD_KIND_QUERIES: dict[str, str] = {f"world_{key.removeprefix('world_mcq_')}": kind
                                      for key, kind in WORLD_KIND_KEYS.items() if kind != "self-contained"}
RETRIEVAL_QUERIES: tuple[str, ...] = ("world", *WORLD_KIND_QUERIES, "pubmedqa", "medquad", "bioasq")


#: what a miniature key holds, for table headers and plots (a miniature column is labelled by its content, not by
#: the paper benchmark it stands in for)
_HOLDS: dict[str, str] = {
    "world_mcq": "world MCQs, all kinds",
    "world_open": "world open questions",
    "pubmedqa_real": "PubMedQA labelled (real)",
    "mmlu_med_val": "MMLU medical validation (real)",
    "longform_real": "Omni-RAG long-form dev (real)",
    "critic_dev": "critic dev split",
    "average": "mean of the other columns",
    **{key: f"world {kind} MCQs" for key, kind in WORLD_KIND_KEYS.items()},
    **{key: f"MMLU {s.replace('_', ' ')} validation (real)" for key, s in MMLU_VAL_SUBJECTS.items()},
}


_RETRIEVAL_HOLDS: dict[str, str] = {"world": "world question -> gold passage",
                                    "pubmedqa": "PubMedQA question -> its abstract (real)",
                                    "medquad": "MedQuAD question -> its answer passages (real)",
                                    "bioasq": "BioASQ question -> its gold snippets (task.file)",
                                    **{key: f"world {kind} question -> gold passage"
                                       for key, kind in WORLD_KIND_QUERIES.items()}}


def world_kinds(key: str) -> list[str] | None:
    """The question kinds of a mixed world key (``world_mcq_treatment+self_contained``), None for any other key;
    a part that is not a kind raises, naming the kinds."""
    if not key.startswith("world_mcq_") or "+" not in key:
        return None
    parts = key.removeprefix("world_mcq_").split("+")
    bad = [part for part in parts if f"world_mcq_{part}" not in WORLD_KIND_KEYS]
    if bad or len(set(parts)) < len(parts):
        raise ValueError(f"dataset {key!r}: {', '.join(bad) or 'a kind named twice'}; expected distinct kinds of "
                         f"{', '.join(k.removeprefix('world_mcq_') for k in WORLD_KIND_KEYS)} joined by '+'")
    return [WORLD_KIND_KEYS[f"world_mcq_{part}"] for part in parts]


def dataset_holds(key: str, task: str = "qa") -> str:
    """What the dataset ``key`` of ``task`` holds, in a few words (the key itself for a paper benchmark)."""
    if task == "qa" and (kinds := world_kinds(key)):
        return f"world {' + '.join(kinds)} MCQs in turn"
    return (_RETRIEVAL_HOLDS if task == "retrieval" else _HOLDS).get(key, key)


@dataclass(frozen=True)
class DatasetRequest:
    """Where to read from: the world's seed and size, the realdata root, the folder of paper benchmarks."""

    key: str
    split: str | None = "test"
    limit: int | None = None
    world_seed: int = 0
    world_size: str = "small"
    world_difficulty: Any = None  # the knowledge config's knobs: the questions' world is the knowledge base's
    realdata_root: str | None = None
    data_dir: str | None = None


def known_datasets(task: str = "qa") -> list[str]:
    """The dataset keys ``task`` can run: ``qa`` the keys of this module, ``retrieval`` its ``task.queries``;
    ``critic_accuracy`` names its set freely (the data come from ``task.data``): an empty list."""
    if task == "retrieval":
        return list(RETRIEVAL_QUERIES)
    if task == "critic_accuracy":
        return []
    return [*MINIATURE, *PAPER_DATASETS]


def dataset_status(task: str, key: str) -> tuple[str, str]:
    """``("known", "")``, ``("pending", why)`` (a paper benchmark no loader reads yet) or ``("unknown", what
    is known)`` for one dataset key of ``task``."""
    if task == "critic_accuracy" or key in known_datasets(task):
        return "known", ""
    if task == "qa":
        try:
            if world_kinds(key):
                return "known", ""
        except ValueError as exc:
            return "unknown", str(exc)
    if key in PENDING:
        return "pending", PENDING[key]
    return "unknown", f"known for task={task}: {', '.join(known_datasets(task))}"


def load_eval_dataset(req: DatasetRequest) -> list[Question]:
    """The questions of ``req.key`` (``req.limit`` first ones); an unknown key lists the known ones."""
    loaders: dict[str, Callable[[DatasetRequest], list[Question]]] = {
        "world_mcq": lambda r: _world(r, "mcq"),
        "world_open": lambda r: _world(r, "open"),
        **{key: (lambda r, kind=kind: _world(r, "mcq", kind)) for key, kind in WORLD_KIND_KEYS.items()},
        **{key: _realdata for key in REALDATA_FILES},
        **{key: _paper for key in PAPER_DATASETS},
    }
    if req.key in PENDING:
        raise ValueError(f"dataset {req.key!r}: {PENDING[req.key]}")
    if kinds := world_kinds(req.key):
        loaders[req.key] = lambda r: _in_turn([_world(r, "mcq", kind) for kind in kinds])
    if req.key not in loaders:
        raise ValueError(f"unknown dataset {req.key!r}; known: {', '.join(known_datasets())}")
    questions = loaders[req.key](req)
    if not questions:
        raise ValueError(f"dataset {req.key!r} (split={req.split}) has no questions")
    return questions[: req.limit] if req.limit else questions


def load_demonstrations(req: DatasetRequest) -> list[Question]:
    """Solved questions a method may show before each question of ``req``'s dataset: its training split (MMLU's
    dev split for the real MMLU sets); never a question of the split being evaluated."""
    if req.key in DEMONSTRATION_KEYS:
        return load_eval_dataset(replace(req, key=DEMONSTRATION_KEYS[req.key], split=None, limit=None))
    pool = [q for q in load_eval_dataset(replace(req, split=None, limit=None)) if q.split == "train"]
    if not pool:
        raise ValueError(f"dataset {req.key!r} has no training-split question to draw demonstrations from; "
                         "set pipeline.shots=0")
    return pool


def _world(req: DatasetRequest, kind: str, question_kind: str | None = None) -> list[Question]:
    from omnimed.knowledge.corpus import world_of

    world = world_of(SimpleNamespace(world_seed=req.world_seed, world_size=req.world_size,
                                     world_difficulty=req.world_difficulty))
    pool = world.questions if kind == "mcq" else world.open_questions
    return [q for q in pool if (req.split is None or q.split == req.split)
            and (question_kind is None or q.metadata.get("kind") == question_kind)]


def _in_turn(groups: list[list[Question]]) -> list[Question]:
    """One question of each group in turn (each group in its order) until the shortest runs out."""
    return [q for row in zip(*groups) for q in row]


def _questions(records) -> list[Question]:
    return [r for r in records if isinstance(r, (MultipleChoiceQuestion, OpenQuestion))]


def _realdata(req: DatasetRequest) -> list[Question]:
    from omnimed.data.formats import load_format

    root = req.realdata_root or os.environ.get("OMNIMED_REALDATA")
    if not root:
        raise ValueError(f"dataset {req.key!r} reads the real files: set OMNIMED_REALDATA (or realdata_root) to "
                         "../shared/realdata")
    path = Path(root) / REALDATA_FILES[req.key]
    fmt = REALDATA_FORMATS[req.key]
    report = LoadReport()
    questions = _questions(load_format(fmt, path, skip_invalid=True, report=report))
    if report.skipped:  # e.g. one long-form dev item has no gold answer: it cannot be scored
        log.warning("dataset %s: skipped %d unusable record(s) of %s: %s", req.key, len(report.skipped), path,
                    "; ".join(f"line {s.line}: {s.message}" for s in report.skipped[:3]))
    return questions


def _paper(req: DatasetRequest) -> list[Question]:
    from omnimed.data.formats import load_format

    spec = PAPER_DATASETS[req.key]
    if not req.data_dir:
        raise ValueError(f"dataset {req.key!r} is a paper benchmark: set data_dir to the folder holding "
                         f"{spec.source} (format {spec.format})")
    path = Path(req.data_dir) / spec.source
    if not path.exists():
        raise ValueError(f"dataset {req.key!r}: {path} does not exist (expected {spec.format} files)")
    questions = _questions(load_format(spec.format, path))
    if spec.where is None:
        return questions
    field, value = spec.where
    mine = [q for q in questions if _matches(q.metadata.get(field), value)]
    if not mine:
        seen = sorted({str(q.metadata.get(field)) for q in questions})
        raise ValueError(f"dataset {req.key!r}: no record of {path} has {field} = {value!r} (seen: "
                         f"{', '.join(seen[:12]) or 'none'})")
    return mine


def _matches(found: object, wanted: str) -> bool:
    """A record's metadata value against a key's: subjects exactly; levels by their number (1, "1", "Level 1",
    "level1" all mean level 1)."""
    if found is None:
        return False
    text = str(found).strip().lower()
    if wanted.isdigit():
        digits = re.findall(r"\d+", text)
        return len(digits) == 1 and int(digits[0]) == int(wanted)
    return text == wanted

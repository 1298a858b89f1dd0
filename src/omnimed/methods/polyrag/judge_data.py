"""Stage ``polyrag_judge_data`` (PolyRAG 5.1.3): labelled (query, passage) pairs for the relevance judge (Table 4,
grades A-E) or the supplement judge (Table 5, Yes / No), as SFT examples in TRL's conversational prompt-completion
format, the prompt exactly as the pipeline asks it (:mod:`.prompts`).

Pairs are each training question's first-stage candidates plus its gold passages (:mod:`.candidates`). The
teacher is the run's backend: the world's oracle in miniature (exact labels, :mod:`.judges`), or any LLM
(``backend=openai`` at a large model), whose reply must start with a label or the pair is dropped and counted.
``keep_per_label`` caps each label's pairs (the candidates are mostly unrelated passages: E / No), drawn with
``seed``. Progress is kept per question; a finished stage does nothing when rerun.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, PromptCompletion
from omnimed.generation.types import Request, SamplingParams
from omnimed.knowledge.pools import passage_table
from omnimed.methods.polyrag import prompts
from omnimed.methods.polyrag.candidates import (
    labelled_questions,
    labelling_windows,
    text_sources,
)
from omnimed.methods.polyrag.judges import RELEVANCE_TASK, SUPPLEMENT_TASK

STAGE = "polyrag_judge_data"
#: judge -> (oracle task, prompt builder, labels)
JUDGES = {
    "relevance": (RELEVANCE_TASK, prompts.relevance_messages, prompts.RELEVANCE_GRADES),
    "supplement": (SUPPLEMENT_TASK, prompts.supplement_messages, prompts.SUPPLEMENT_LABELS),
}


@dataclass
class JudgeDataConfig:
    """``judge``: relevance | supplement; ``questions``/``splits``/``kinds``/``n_questions``: as
    ``polyrag_utility`` (train for the judge's training, dev for its validation split); ``candidates``,
    ``sources``, ``retriever``: the first-stage search; ``keep_per_label``: at most this many pairs of each label
    (null: all); ``open_questions``: every open (long-form) question of the world's ``splits`` is labelled too,
    beside the ``n_questions`` multiple-choice ones (their pairs are what a long-form answer's retrieval is judged
    on: table 2), and ``keep_per_label`` applies to each kind of question on its own (the open questions' few
    unrelated pairs would otherwise be lost among the multiple-choice ones'); ``out``: a fixed output folder (default
    ``builds/polyrag_judge_data/<settings key>``)."""

    name: str = STAGE
    judge: str = "relevance"
    questions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train", "dev"])
    kinds: Optional[list[str]] = None
    n_questions: Optional[int] = None
    candidates: int = 15
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    keep_per_label: Optional[int] = None
    open_questions: bool = False
    seed: int = 0
    batch_size: int = 8
    out: Optional[str] = None


def read_label(text: str, labels: Sequence[str]) -> str | None:
    """The label a reply starts with (case ignored), else None."""
    head = text.strip().lower()
    return next((t for t in labels if head.startswith(t.lower())), None)


def build_judge_data(cfg: JudgeDataConfig, *, teacher: Any, kb: Any, knowledge: Any, root: str = ".",
                     progress: bool = True, log=print, max_failed: float = MAX_FAILED_SHARE) -> StageResult:
    """Run the stage (or reuse its finished output) with ``teacher``, a generation backend."""
    if cfg.judge not in JUDGES:
        raise ValueError(f"stage.judge={cfg.judge!r}: expected one of {', '.join(JUDGES)}")
    task, build, labels = JUDGES[cfg.judge]
    sources = text_sources(kb, cfg.sources, "stage.sources")
    stage = open_stage(STAGE, cfg, root=root, teacher=getattr(teacher, "model_id", str(teacher)),
                       prompts=prompts.PROMPT_VERSION, knowledge=knowledge.name)
    if stage.finished():
        counts = stage.manifest()["judge_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['examples']} pairs); nothing to do")
        return StageResult(stage.path, counts, True)
    questions = labelled_questions(cfg, knowledge)
    table = passage_table(kb)
    done = stage.start()
    todo = [q for q in questions if q.id not in done]
    log(f"{STAGE}: {cfg.judge} pairs of {len(questions)} questions, {len(done)} labelled earlier -> {stage.path}")
    params = SamplingParams(max_new_tokens=4, temperature=0.0, seed=cfg.seed)

    def work(batch: Sequence[MultipleChoiceQuestion]) -> list[dict[str, Any] | Failed]:
        out: list[dict[str, Any] | Failed] = []
        for q, passages in zip(batch, labelling_windows(kb, batch, cfg, sources=sources, table=table)):
            requests = [Request(build(q.question, p), {"task": task, "question_id": q.id, "passage_id": p.id})
                        for p in passages]
            gens = [g[0] for g in teacher.generate(requests, params)]
            errors = [g.error for g in gens if g.error is not None]
            if errors:
                out.append(Failed(q.id, errors[0]))
                continue
            out.append({"id": q.id, "pairs": [[p.id, read_label(g.text, labels)] for p, g in zip(passages, gens)]})
        return out

    failed = stage.process(todo, work, total=len(questions), backend=describe_backend(teacher),
                           max_failed=max_failed, batch_size=cfg.batch_size, progress=progress,
                           label=f"{STAGE}: {cfg.judge} labels")
    done = stage.start()
    records, counts = _records(cfg, questions, done, table, build)
    if failed:  # asked again by the next run
        counts["failed"] = len(failed)
    stage.finish(records, failed=failed, judge_counts=counts)
    log(f"{STAGE}: {counts['examples']} {cfg.judge} pairs in {stage.path} (labels {counts['labels']}; "
        f"{counts['unreadable']} unreadable replies dropped)")
    return StageResult(stage.path, counts, False)


def question_kind(q: MultipleChoiceQuestion | OpenQuestion) -> str:
    """What a pair's question asks about, as its judge's validation groups it (``data.val_group_by=kind``): the
    world's kind (``treatment``), ``open:<kind>`` for an open question, ``other`` outside a world."""
    kind = q.metadata.get("kind", "other")
    return f"open:{kind}" if isinstance(q, OpenQuestion) else kind


def _records(cfg: JudgeDataConfig, questions: Sequence[MultipleChoiceQuestion], done: dict[str, Any],
             table: dict[str, Any], build: Any) -> tuple[list[PromptCompletion], dict[str, Any]]:
    pairs = [(q, pid, label) for q in questions if q.id in done for pid, label in done[q.id]["pairs"]]
    unreadable = sum(label is None for _, _, label in pairs)
    by_label: dict[tuple[bool, str], list[Any]] = {}  # (open question, label) -> pairs
    for item in pairs:
        if item[2] is not None:
            by_label.setdefault((isinstance(item[0], OpenQuestion), item[2]), []).append(item)
    rng = random.Random(cfg.seed)
    kept = []
    for key in sorted(by_label):  # multiple-choice labels first: their draw is the same with open questions or not
        items = by_label[key]
        if cfg.keep_per_label is not None and len(items) > cfg.keep_per_label:
            items = rng.sample(items, cfg.keep_per_label)
        kept += items
    kept.sort(key=lambda item: (item[0].id, item[1]))
    records = [PromptCompletion(id=f"{cfg.judge}-{q.id}-{pid}", prompt=build(q.question, table[pid]),
                                completion=[{"role": "assistant", "content": label}],
                                metadata={"split": q.split, "question_id": q.id, "passage_id": pid, "label": label,
                                          "kind": question_kind(q)})
               for q, pid, label in kept]
    counts = {"examples": len(records), "questions": len(done), "unreadable": unreadable,
              "labels": dict(sorted(Counter(r.metadata["label"] for r in records).items())),
              "labels_before_cap": dict(sorted(Counter(label for _, _, label in pairs if label is not None).items()))}
    if cfg.open_questions:
        counts["open_question_labels"] = dict(sorted(Counter(
            label for q, _, label in kept if isinstance(q, OpenQuestion)).items()))
    return records, counts

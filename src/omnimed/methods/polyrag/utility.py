"""Stage ``polyrag_utility`` (PolyRAG 3.2, Eq. 4; appendix Table 3): a teacher's utility of every candidate passage
of a question, the labels the utility embedder is distilled from.

The utility of passage d for question q with gold answer a is the teacher's log-likelihood of a given q and d
minus its log-likelihood given q alone (``teacher=likelihood``: two ``score`` calls on any backend: hf, vllm, or
an OpenAI-compatible server that echoes prompt log-probs), so a passage that makes the answer likelier than
answering directly scores above 0 and one that misleads scores below. With the world's oracle as the backend
(``teacher=oracle``, what ``auto`` picks there) the utility is the world's exact one, asked through the backend
like any teacher call: 1.0 for a passage stating the whole answer down to 0.0 for an unrelated one
(:meth:`~omnimed.data.world.oracle.Oracle.utility_score`).

Candidates are the knowledge base's first-stage search for the question (``candidates`` of them, fused across the
text sources) plus the question's gold passages. Output: :class:`~omnimed.data.records.UtilityExample` records
(query, passages, teacher scores; ``metadata.split`` the question's split) and, per split, ``flag_<split>.jsonl``
in the layout FlagEmbedding's distillation reads (``query``, ``pos``, ``neg``, ``pos_scores``, ``neg_scores``:
the best-scored passages are ``pos``). Progress is kept per question: a killed run continues where it stopped, a
finished one does nothing when rerun.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omnimed.data.artifacts import (
    MAX_FAILED_SHARE,
    Failed,
    StageResult,
    atomic_write_text,
    describe_backend,
    open_stage,
)
from omnimed.data.records import MultipleChoiceQuestion, Passage, UtilityExample
from omnimed.generation.types import GenerationError, Request, SamplingParams
from omnimed.knowledge.pools import passage_table
from omnimed.knowledge.types import index_text
from omnimed.methods.polyrag import prompts
from omnimed.methods.polyrag.candidates import (
    labelled_questions,
    labelling_windows,
    text_sources,
)

STAGE = "polyrag_utility"
TEACHERS = ("auto", "likelihood", "oracle")


@dataclass
class UtilityConfig:
    """``questions``: ``world`` (the knowledge config's world) or a records path of multiple-choice questions;
    ``splits``: the questions' splits labelled (train to distil on, test to evaluate the embedder on);
    ``kinds``: the world's question kinds kept (null: all); ``n_questions``: at most this many per split, drawn
    with ``seed``; ``candidates``: first-stage passages per question (PolyEVAL: 14.7 a query); ``sources``: the
    text sources searched (null: all); ``retriever``: null for the knowledge base's default; ``add_gold``: the
    question's gold passages join its candidates; ``teacher``: auto | likelihood | oracle (module doc);
    ``out``: a fixed output folder (default ``builds/polyrag_utility/<settings key>``)."""

    name: str = STAGE
    questions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train", "test"])
    kinds: Optional[list[str]] = None
    n_questions: Optional[int] = None
    candidates: int = 15
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    add_gold: bool = True
    teacher: str = "auto"
    seed: int = 0
    batch_size: int = 8
    out: Optional[str] = None


def gold_text(question: MultipleChoiceQuestion) -> str:
    """The answer a teacher's likelihood is taken of: the gold option's text (all of them, for several)."""
    return "; ".join(question.options[a] for a in question.answer)


def teacher_kind(cfg: UtilityConfig, teacher: Any) -> str:
    """``likelihood`` or ``oracle``; the oracle teacher needs the world's oracle backend."""
    if cfg.teacher not in TEACHERS:
        raise ValueError(f"stage.teacher={cfg.teacher!r}: expected one of {', '.join(TEACHERS)}")
    is_oracle = getattr(teacher, "name", None) == "oracle"
    if cfg.teacher == "oracle" and not is_oracle:
        raise ValueError(f"stage.teacher=oracle needs backend=oracle (the world's exact utilities); the backend is "
                         f"{describe_backend(teacher)}: use stage.teacher=likelihood")
    if cfg.teacher == "likelihood" and is_oracle:
        raise ValueError("stage.teacher=likelihood with backend=oracle: the oracle gives no likelihoods; use "
                         "stage.teacher=oracle (or auto), or a model backend")
    return "oracle" if is_oracle else "likelihood"


def likelihood_utilities(teacher: Any, question: MultipleChoiceQuestion, passages: Sequence[Passage]) -> list[float]:
    """log P(answer | question, passage) - log P(answer | question), per passage, in one ``score`` call."""
    answer = " " + gold_text(question)
    requests = [Request(prompts.utility_with_passage(question.question, p),
                        {"task": STAGE, "question_id": question.id, "passage_id": p.id}) for p in passages]
    requests.append(Request(prompts.utility_without_passage(question.question),
                            {"task": STAGE, "question_id": question.id}))
    scores = teacher.score(requests, [answer] * len(requests))
    base = scores[-1]
    return [s - base for s in scores[:-1]]


_UTILITY_TOKEN = re.compile(r"\[Utility:([1-5])\]")


def oracle_utilities(teacher: Any, question: MultipleChoiceQuestion, passages: Sequence[Passage]) -> list[float]:
    """The world's utility of each passage, asked of the oracle backend (its ``passage_utility`` task, 1-5) and
    mapped to [0, 1]; a failed call raises :class:`~omnimed.generation.types.GenerationError`."""
    requests = [Request(prompts.utility_with_passage(question.question, p),
                        {"task": "passage_utility", "question_id": question.id, "passage_id": p.id}) for p in passages]
    out = []
    for gens in teacher.generate(requests, SamplingParams(max_new_tokens=8)):
        if gens[0].error is not None:
            raise GenerationError(gens[0].error)
        found = _UTILITY_TOKEN.search(gens[0].text)
        if found is None:
            raise GenerationError(f"no [Utility:1-5] in the oracle's reply {gens[0].text[:80]!r}")
        out.append((int(found.group(1)) - 1) / 4)
    return out


def build_utilities(cfg: UtilityConfig, *, teacher: Any, kb: Any, knowledge: Any, root: str = ".",
                    progress: bool = True, log=print, max_failed: float = MAX_FAILED_SHARE) -> StageResult:
    """Run the stage (or reuse its finished output) with ``teacher``, a generation backend."""
    if cfg.candidates < 1:
        raise ValueError(f"stage.candidates={cfg.candidates}: expected at least 1 passage per question")
    kind = teacher_kind(cfg, teacher)
    sources = text_sources(kb, cfg.sources, "stage.sources")
    stage = open_stage(STAGE, cfg, root=root, teacher=getattr(teacher, "model_id", str(teacher)),
                       prompts=prompts.PROMPT_VERSION, knowledge=knowledge.name, teacher_kind=kind)
    if stage.finished():
        counts = stage.manifest()["utility_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['examples']} questions); nothing to do")
        return StageResult(stage.path, counts, True)
    questions = labelled_questions(cfg, knowledge)
    table = passage_table(kb)
    done = stage.start()
    todo = [q for q in questions if q.id not in done]
    log(f"{STAGE}: {len(questions)} questions ({kind} teacher), {len(done)} labelled earlier, {len(todo)} to go "
        f"-> {stage.path}")

    def work(batch: Sequence[MultipleChoiceQuestion]) -> list[dict[str, Any] | Failed]:
        windows = labelling_windows(kb, batch, cfg, sources=sources, table=table, add_gold=cfg.add_gold)
        out: list[dict[str, Any] | Failed] = []
        for q, passages in zip(batch, windows):
            try:
                scores = (oracle_utilities if kind == "oracle" else likelihood_utilities)(teacher, q, passages)
            except GenerationError as exc:  # a failed teacher call: asked again by the next run
                out.append(Failed(q.id, str(exc)))
                continue
            out.append({"id": q.id, "passages": [p.id for p in passages], "scores": [float(s) for s in scores]})
        return out

    failed = stage.process(todo, work, total=len(questions), backend=describe_backend(teacher),
                           max_failed=max_failed, batch_size=cfg.batch_size, progress=progress,
                           label=f"{STAGE}: teacher utilities")
    done = stage.start()
    records = [utility_record(q, done[q.id], table) for q in questions if q.id in done]
    counts = _counts(records, failed)
    for split in cfg.splits:
        rows = [flag_row(r) for r in records if r.metadata["split"] == split]
        atomic_write_text(Path(stage.path) / f"flag_{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    stage.finish(records, failed=failed, utility_counts=counts)
    log(f"{STAGE}: {counts['examples']} questions, {counts['passages']} scored passages in {stage.path} "
        f"(mean {counts['candidates_per_question']:.1f} a question; gold best in {counts['gold_ranked_first']:.0%})")
    return StageResult(stage.path, counts, False)


def utility_record(question: MultipleChoiceQuestion, item: dict[str, Any], table: dict[str, Passage]) -> UtilityExample:
    return UtilityExample(
        id=question.id, query=question.question, passages=[table[pid] for pid in item["passages"]],
        teacher_scores=item["scores"],
        metadata={"split": question.split, "kind": question.metadata.get("kind"), "answer": gold_text(question),
                  "gold_passages": list(question.gold_passages)},
    )


def flag_row(record: UtilityExample) -> dict[str, Any]:
    """One line of FlagEmbedding's distillation data: the best-scored passages positive, the rest negative."""
    best = max(record.teacher_scores)
    pos = [i for i, s in enumerate(record.teacher_scores) if s == best]
    neg = [i for i in range(len(record.passages)) if i not in pos]
    text = [index_text(p) for p in record.passages]
    return {"query": record.query, "pos": [text[i] for i in pos], "neg": [text[i] for i in neg],
            "pos_scores": [record.teacher_scores[i] for i in pos], "neg_scores": [record.teacher_scores[i] for i in neg]}


def _counts(records: Sequence[UtilityExample], failed: Sequence[Failed]) -> dict[str, Any]:
    n_passages = sum(len(r.passages) for r in records)
    gold_first = [r for r in records if r.metadata["gold_passages"]]
    first = sum(r.passages[max(range(len(r.passages)), key=r.teacher_scores.__getitem__)].id in
                r.metadata["gold_passages"] for r in gold_first)
    counts: dict[str, Any] = {
        "examples": len(records), "passages": n_passages,
        "candidates_per_question": n_passages / max(len(records), 1),
        "gold_ranked_first": first / max(len(gold_first), 1),
        **{f"examples/{s}": n for s, n in Counter(r.metadata["split"] for r in records).items()},
    }
    if failed:
        counts["failed"] = len(failed)
    return counts

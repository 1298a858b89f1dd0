"""Stage ``reader_data``: training data for the miniature reader, the one the closed-book and RAG baselines (and
every paper's pipeline built on them) read with.

An untrained SmolLM2-135M cannot read: it answers near chance with the gold passage in front of it, so no table in
miniature could show what better evidence is worth. This stage turns the world's training questions into reading
exercises, each in TRL's conversational prompt-completion format:

- the prompt is exactly what :class:`~omnimed.methods.reader.Reader` sends at inference (its system message,
  numbered evidence, question, options and the ask), so training and evaluation see one wording;
- the completion is ``<answer>X</answer>``: what ``answer_mode=generate`` parses and what ``logprob`` mode reads
  the next token after;
- a question with gold passages is shown them among passages the RAG pipeline retrieves for it (gold removed), in
  shuffled order, ``passages`` in all: the reader learns to find the fact among near misses (twins, aliases,
  superseded recommendations) rather than to read the first passage;
- a self-contained question (the answer is computable from its text) is shown retrieved passages for
  ``self_contained_evidence_share`` of them and nothing for the others: retrieval there only adds noise, which the
  reader learns to set aside;
- with ``reply_layout_share`` > 0, that share of the questions a single passage can answer is also written as
  Self-BioRAG's generator reads evidence: the question as it asks it, the evidence inside the reply between
  ``<paragraph>`` markers (masked from the loss: preset ``reader_reply_miniature`` sets ``task.mask_spans``) and
  ``The answer is X: option.`` after it.
  A base LM reads evidence wherever it is shown; a reader trained on its own prompt alone answers by letter
  position when the evidence sits in its reply (measured: README, Self-BioRAG in miniature), so Self-BioRAG's
  generator, which starts from the reader, would have no reading skill to keep.

The world's splits are by subject, so a reader trained on ``train`` has seen none of the test questions' subjects:
what it learned is to read, not the answers.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from omnimed.data.artifacts import StageResult, open_stage
from omnimed.data.records import MultipleChoiceQuestion, Passage, PromptCompletion
from omnimed.methods import prompts

STAGE = "reader_data"


@dataclass
class ReaderDataConfig:
    """``split``: the world's split to draw questions from; ``n_examples``: at most this many (null: all);
    ``passages``: evidence passages per question with gold (gold + retrieved distractors); ``sources`` /
    ``retriever``: where and how distractors are retrieved (the RAG pipeline's knobs; null: its defaults);
    ``self_contained_evidence_share``: the share of self-contained questions shown retrieved passages;
    ``reply_layout_share``: the share of single-answer questions with at most one gold passage also written as an
    exercise in Self-BioRAG's reply layout (gold passage in the reply; a self-contained question's: a retrieved
    passage when it is shown them, else none); ``reply_shots``: solved training questions shown before each of those
    (chosen as ``pipeline.shots`` chooses them). The tables ask 3-shot, where a reader that practised zero-shot
    reads the reply at chance, but the generator trained from a 3-shot-practised reader read worse than the one
    trained from a zero-shot-practised reader (README, Self-BioRAG in miniature), so the default is 0;
    ``out``: a fixed output folder (default ``builds/reader_data/<settings key>``)."""

    name: str = STAGE
    split: str = "train"
    n_examples: Optional[int] = None
    passages: int = 3
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    self_contained_evidence_share: float = 0.5
    reply_layout_share: float = 0.0
    reply_shots: int = 0
    seed: int = 0
    out: Optional[str] = None


def _check(cfg: ReaderDataConfig) -> None:
    if cfg.passages < 1:
        raise ValueError(f"stage.passages={cfg.passages}: expected at least 1 (the gold passages need room)")
    for key in ("self_contained_evidence_share", "reply_layout_share"):
        if not 0 <= getattr(cfg, key) <= 1:
            raise ValueError(f"stage.{key}={getattr(cfg, key)}: expected a share between 0 and 1")
    if cfg.reply_shots < 0:
        raise ValueError(f"stage.reply_shots={cfg.reply_shots}: expected 0 or more solved questions")
    if cfg.n_examples is not None and cfg.n_examples < 1:
        raise ValueError(f"stage.n_examples={cfg.n_examples}: expected null (all) or a count >= 1")


def evidence_for(q: MultipleChoiceQuestion, retrieved: list[Passage], gold: dict[str, Passage], n: int,
                 rng: random.Random, show_retrieved: bool) -> list[Passage]:
    """The passages one training question is shown: its gold passages (all of them, even past ``n``: a multi-hop
    question needs each) topped up to ``n`` with retrieved non-gold ones, shuffled; for a question without gold,
    ``n`` retrieved passages when ``show_retrieved``, else none."""
    if not q.gold_passages:
        return retrieved[:n] if show_retrieved else []
    golds = [gold[pid] for pid in q.gold_passages]
    others = [p for p in retrieved if p.id not in q.gold_passages][: max(0, n - len(golds))]
    shown = golds + others
    rng.shuffle(shown)
    return shown


def reply_exercises(questions: list[MultipleChoiceQuestion], evidence: list[list[Passage]], gold: dict[str, Passage],
                    cfg: ReaderDataConfig) -> list[PromptCompletion]:
    """The exercises in Self-BioRAG's reply layout for ``reply_layout_share`` of the questions one passage can
    answer (one gold passage, or none for a self-contained question, which keeps the retrieved passage it was
    shown in the reader's layout, if any), each chosen by its own seeded draw, after ``reply_shots`` of the other
    questions as solved demonstrations."""
    from omnimed.methods.selfbiorag.inference import pick_demonstrations, reply_reading

    out = []
    shown = pick_demonstrations(questions, questions, cfg.reply_shots)
    for q, ev in zip(questions, evidence):
        if len(q.answer) != 1 or len(q.gold_passages) > 1:
            continue
        if random.Random(f"{cfg.seed}-reply-{q.id}").random() >= cfg.reply_layout_share:
            continue
        passage = gold[q.gold_passages[0]] if q.gold_passages else (ev[0] if ev else None)
        prompt, reply = reply_reading(q, passage, shown[q.id])
        out.append(PromptCompletion(id=f"reader-reply-{q.id}", prompt=prompt,
                                    completion=[{"role": "assistant", "content": reply}],
                                    metadata={"split": q.split, "question_id": q.id, "kind": q.metadata.get("kind", ""),
                                              "passage_ids": [passage.id] if passage else [], "layout": "reply",
                                              "gold_shown": int(bool(q.gold_passages))}))
    return out


def build_reader_data(cfg: ReaderDataConfig, *, kb: Any, world: Any, knowledge: Any, root: str = ".",
                      log=print) -> StageResult:
    """Run the stage (or reuse its finished output): ``kb`` retrieves the distractors, ``world`` (the knowledge
    config's world) holds the questions and their gold passages."""
    from omnimed.methods.baselines.closed_book import PipelineConfig
    from omnimed.methods.baselines.rag import retrieve_evidence
    from omnimed.methods.reader import Reader

    _check(cfg)
    stage = open_stage(STAGE, cfg, root=root, knowledge=dataclasses.asdict(knowledge),
                       prompts=prompts.PROMPT_VERSION)
    if stage.finished():
        counts = stage.manifest()["reader_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['examples']} examples); nothing to do")
        return StageResult(stage.path, counts, True)
    questions = [q for q in world.questions if q.split == cfg.split]
    if not questions:
        raise ValueError(f"stage.split={cfg.split!r}: the world ({knowledge.name}) has no questions in that split; "
                         "expected train, dev or test")
    stage.start()
    rng = random.Random(cfg.seed)
    if cfg.n_examples is not None and cfg.n_examples < len(questions):
        questions = sorted(rng.sample(questions, cfg.n_examples), key=lambda q: q.id)
    # top-up room: the gold passages are removed from what the RAG pipeline retrieves
    search = PipelineConfig(name="rag", top_k=cfg.passages + 3, sources=cfg.sources, retriever=cfg.retriever)
    retrieved = retrieve_evidence(kb, questions, search)
    gold = {p.id: p for p in world.passages}
    evidence = [evidence_for(q, found, gold, cfg.passages, random.Random(f"{cfg.seed}-{q.id}"),
                             rng.random() < cfg.self_contained_evidence_share)
                for q, found in zip(questions, retrieved)]
    requests = Reader(None, max_passages=max(map(len, evidence), default=0)).mcq_requests(questions, evidence)
    records = [PromptCompletion(id=f"reader-{q.id}", prompt=req.prompt,
                                completion=[{"role": "assistant", "content": f"<answer>{','.join(q.answer)}</answer>"}],
                                metadata={"split": q.split, "question_id": q.id, "kind": q.metadata.get("kind", ""),
                                          "passage_ids": req.meta["passage_ids"], "layout": "reader",
                                          "gold_shown": sum(p.id in q.gold_passages for p in ev)})
               for q, req, ev in zip(questions, requests, evidence)]
    reply = reply_exercises(questions, evidence, gold, cfg)
    records += reply
    counts = {
        "examples": len(records),
        "reply_layout": len(reply),
        "with_gold": sum(bool(q.gold_passages) for q in questions),
        "without_evidence": sum(not ev for ev in evidence),
        "mean_passages": round(sum(map(len, evidence)) / len(evidence), 3),
        "kinds": dict(sorted(Counter(r.metadata["kind"] for r in records).items())),
        "answer_letters": dict(sorted(Counter(",".join(q.answer) for q in questions).items())),
    }
    stage.finish(records, reader_counts=counts)
    log(f"{STAGE}: {counts['examples']} reading exercises in {stage.path}")
    return StageResult(stage.path, counts, False)


def run(stage_cfg: ReaderDataConfig, ctx: Any) -> StageResult:
    """``omnimed-build stage=reader_data knowledge=world_<size>``: the world of the knowledge config."""
    from omnimed.knowledge.corpus import world_of

    if ctx.knowledge.corpus != "world":
        raise ValueError(f"stage=reader_data reads the synthetic world's questions; knowledge={ctx.knowledge.name} "
                         f"has corpus={ctx.knowledge.corpus!r} (expected a world: knowledge=world_small, ...)")
    return build_reader_data(stage_cfg, kb=ctx.knowledge_base, world=world_of(ctx.knowledge),
                             knowledge=ctx.knowledge, root=str(ctx.root), log=ctx.log)

"""Stage ``omnirag_judge`` (Omni-RAG 4.2.2, Prompt E.4): every explored query is searched in its source, and a
judge LLM says whether the top ``k`` documents support the question's gold answer: the query is positive or
negative (eq. 1).

The judge is the run's backend (Qwen2.5-72B-Instruct-AWQ behind the ``openai`` backend in the paper preset; the
world's oracle in miniature, which judges exactly). Each judged query is kept with its verdict and the ids of the
documents it was judged on. ``signal`` swaps the judge for the supervised baselines' signals (appendix D.3):
``downstream`` (Trainable Planning) asks the backend, as a reader, to answer with the query's documents and
without them, and a query is positive when the documents turn a wrong answer right; ``rerank`` (RaFe) scores the
question against each document with the knowledge base's reranker, positive when the best score reaches
``rerank_threshold``. On a world knowledge base the manifest also gives each signal's agreement with the oracle's
exact verdict (accuracy, precision, recall, F1: the paper's table 9, with the oracle in the humans' place). Progress is kept per question (all its queries judged together): a killed run continues
with the questions not yet judged, a finished one does nothing when rerun, and the calls of a cached backend are
not repeated either way. A reply without a readable yes / no is dropped and counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import MultipleChoiceQuestion, SourceQuery
from omnimed.generation.types import Request, SamplingParams
from omnimed.methods.omnirag import prompts

STAGE = "omnirag_judge"
_VERDICT = re.compile(r"<\s*answer\s*>\s*(yes|no)\b", re.IGNORECASE)


@dataclass
class JudgeConfig:
    """``explore``: the ``omnirag_explore`` output folder; ``questions``: where its questions come from (``world``
    or the records path it used); ``k``: documents retrieved per query and judged (the paper reranks the top 10
    and judges the first half); ``retriever``: null for the knowledge base's default; ``signal``: llm |
    downstream | rerank (see the module doc); ``answer_mode``: how the ``downstream`` reader answers;
    ``rerank_threshold``: RaFe's (2.3, the paper's for MedCPT's cross-encoder: set it on dev for another
    reranker); ``out``: a fixed output folder (default ``builds/omnirag_judge/<settings key>``)."""

    name: str = STAGE
    explore: Optional[str] = None
    questions: str = "world"
    k: int = 5
    retriever: Optional[str] = None
    signal: str = "llm"
    answer_mode: str = "generate"
    rerank_threshold: float = 2.3
    max_new_tokens: int = 256
    batch_size: int = 8
    out: Optional[str] = None


#: what decides a query's verdict: the judge LLM (SPO), the reader's accuracy gain (Trainable Planning), the
#: reranker's score (RaFe)
SIGNALS = ("llm", "downstream", "rerank")


def read_verdict(text: str) -> str | None:
    """``positive`` / ``negative`` from the judge's last ``<answer>yes|no</answer>``; None when there is none."""
    found = _VERDICT.findall(text or "")
    return None if not found else ("positive" if found[-1].lower() == "yes" else "negative")


def questions_by_id(source: str, knowledge: Any) -> dict[str, MultipleChoiceQuestion]:
    """Every multiple-choice question of the world (``source=world``) or of a records file, by id."""
    if source == "world":
        from omnimed.knowledge.corpus import world_of

        return {q.id: q for q in world_of(knowledge).questions}
    from omnimed.data.io import read_records

    return {q.id: q for q in read_records(source, MultipleChoiceQuestion)}


def finished_folder(path: str | None, key: str, stage: str) -> Path:
    """The folder a stage reads (``key`` names the config key), which must hold a finished ``stage``."""
    if not path:
        raise ValueError(f"{key} is not set: point it at the output folder of stage={stage}")
    folder = Path(path)
    if not (folder / "manifest.json").is_file():
        raise FileNotFoundError(f"{key}={path}: no finished {stage} output there (no manifest.json); run "
                                f"omnimed-build stage={stage} first")
    return folder


def build_judgements(cfg: JudgeConfig, *, judge: Any, kb: Any, knowledge: Any, root: str = ".",
                     progress: bool = True, log=print, max_failed: float = MAX_FAILED_SHARE) -> StageResult:
    """Run the stage (or reuse its finished output): ``judge`` a generation backend, ``kb`` the knowledge base."""
    from omnimed.data.io import load_record_set, read_json

    folder = finished_folder(cfg.explore, "stage.explore", "omnirag_explore")
    if cfg.k < 1:
        raise ValueError(f"stage.k={cfg.k}: expected at least 1 document per query")
    if cfg.signal not in SIGNALS:
        raise ValueError(f"stage.signal={cfg.signal!r}: expected one of {', '.join(SIGNALS)}")
    if cfg.signal == "rerank" and kb.reranker is None:
        raise ValueError("stage.signal=rerank needs the knowledge base's reranker: knowledge.rerank.enabled=true")
    stage = open_stage(STAGE, cfg, root=root, judge=getattr(judge, "model_id", str(judge)),
                       explored=read_json(folder / "manifest.json")["fingerprint"], prompts=prompts.PROMPT_VERSION,
                       knowledge=knowledge.name)
    if stage.finished():
        counts = stage.manifest()["judge_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['positive']} positive / {counts['negative']} negative "
            "queries); nothing to do")
        return StageResult(stage.path, counts, True)
    explored = load_record_set(folder, SourceQuery)
    questions = questions_by_id(cfg.questions, knowledge)
    missing = sorted({r.question_id for r in explored} - set(questions))
    if missing:
        raise ValueError(f"stage.questions={cfg.questions}: {len(missing)} explored questions are not there "
                         f"(e.g. {missing[0]}); use the questions the exploration used")
    by_question: dict[str, list[SourceQuery]] = {}
    for r in explored:
        by_question.setdefault(r.question_id, []).append(r)
    done = stage.start()
    todo = [qid for qid in by_question if qid not in done]
    log(f"{STAGE}: {len(explored)} queries of {len(by_question)} questions, {len(done)} questions judged earlier, "
        f"{len(todo)} to judge -> {stage.path}")

    def work(batch: Sequence[str]) -> list[dict[str, Any] | Failed]:
        asked = [r for qid in batch for r in by_question[qid]]
        docs: dict[str, list[Any]] = {}
        for source in dict.fromkeys(r.source for r in asked):
            mine = [r for r in asked if r.source == source]
            for r, hits in zip(mine, kb.search_batch(source, [r.query for r in mine], cfg.k, method=cfg.retriever)):
                docs[r.id] = hits
        verdicts = VERDICTS[cfg.signal](cfg, asked, docs, questions, judge, kb)
        out: list[dict[str, Any] | Failed] = []
        for qid in batch:
            error = next((verdicts[r.id] for r in by_question[qid] if isinstance(verdicts[r.id], Failed)), None)
            out.append(Failed(qid, error.error) if error is not None else {"id": qid, "judged": {
                r.id: [verdicts[r.id], [h.doc_id for h in docs[r.id]]] for r in by_question[qid]}})
        return out

    failed = stage.process(todo, work, total=len(by_question), backend=describe_backend(judge), max_failed=max_failed,
                           batch_size=cfg.batch_size, progress=progress, label=f"{STAGE}: judged questions")
    done = stage.start()
    judged = [r.model_copy(update=dict(zip(("judgement", "passage_ids"), done[r.question_id]["judged"][r.id])))
              for r in explored if r.question_id in done]
    records = [r for r in judged if r.judgement is not None]
    verdicts = Counter(r.judgement for r in records)
    counts: dict[str, Any] = {
        "queries": len(judged), "positive": verdicts["positive"], "negative": verdicts["negative"],
        "dropped_unreadable": len(judged) - len(records),
        **{f"positive_share/{s}": round(sum(r.judgement == "positive" for r in records if r.source == s)
                                        / max(1, sum(r.source == s for r in records)), 4)
           for s in dict.fromkeys(r.source for r in records)},
    }
    if failed:  # asked again by the next run
        counts["failed"] = len(failed)
    if knowledge.corpus == "world":
        counts.update(agreement_with_oracle(records, knowledge))
    stage.finish(records, failed=failed, judge_counts=counts)
    log(f"{STAGE}: {counts['positive']} positive / {counts['negative']} negative queries in {stage.path} "
        f"({counts['dropped_unreadable']} replies without a yes / no dropped)")
    return StageResult(stage.path, counts, False)


Verdicts = dict[str, "str | None | Failed"]


def _llm(cfg: JudgeConfig, asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any],
         judge: Any, kb: Any) -> Verdicts:
    """The judge LLM's yes / no on each query's documents (Prompt E.4)."""
    requests = [Request(prompts.judge_messages(questions[r.question_id], [h.passage for h in docs[r.id]]),
                        {"task": STAGE, "question_id": r.question_id, "passage_ids": [h.doc_id for h in docs[r.id]]})
                for r in asked]
    replies = judge.generate(requests, SamplingParams(max_new_tokens=cfg.max_new_tokens))
    return {r.id: Failed(r.id, g[0].error) if g[0].error is not None else read_verdict(g[0].text)
            for r, g in zip(asked, replies)}


def _downstream(cfg: JudgeConfig, asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any],
                judge: Any, kb: Any) -> Verdicts:
    """Trainable Planning: positive when the reader is right with the query's documents and wrong without."""
    from omnimed.methods.reader import Reader

    reader = Reader(judge, params=SamplingParams(max_new_tokens=cfg.max_new_tokens), answer_mode=cfg.answer_mode)
    qids = list(dict.fromkeys(r.question_id for r in asked))
    alone = dict(zip(qids, reader.answer_mcq([questions[q] for q in qids])))
    helped = reader.answer_mcq([questions[r.question_id] for r in asked], [[h.passage for h in docs[r.id]] for r in asked])
    out: Verdicts = {}
    for r, with_docs in zip(asked, helped):
        error = with_docs.error or alone[r.question_id].error
        out[r.id] = (Failed(r.id, error) if error else
                     "positive" if with_docs.correct and not alone[r.question_id].correct else "negative")
    return out


def _rerank(cfg: JudgeConfig, asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any],
            judge: Any, kb: Any) -> Verdicts:
    """RaFe: positive when the reranker scores the question against the query's best document at least
    ``rerank_threshold``."""
    from omnimed.knowledge.types import index_text

    out: Verdicts = {}
    for r in asked:
        texts = [index_text(h.passage) for h in docs[r.id]]
        best = max((score for _, score in kb.reranker.rerank(prompts.question_text(questions[r.question_id]), texts,
                                                              len(texts))), default=float("-inf"))
        out[r.id] = "positive" if best >= cfg.rerank_threshold else "negative"
    return out


VERDICTS = {"llm": _llm, "downstream": _downstream, "rerank": _rerank}


def agreement_with_oracle(records: list[SourceQuery], knowledge: Any) -> dict[str, float]:
    """Accuracy, precision, recall and F1 of the stage's verdicts against the world oracle's on the same
    documents (the paper's table 9 with the oracle as the human reference; positive is the class scored)."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    from omnimed.knowledge.corpus import world_of

    if not records:
        return {}
    oracle = world_of(knowledge).oracle
    truth = [oracle.supports_in_part(r.question_id, r.passage_ids) for r in records]
    said = [r.judgement == "positive" for r in records]
    precision, recall, f1, _ = precision_recall_fscore_support(truth, said, average="binary", zero_division=0)
    return {"agreement/accuracy": round(float(accuracy_score(truth, said)), 4),
            "agreement/precision": round(float(precision), 4), "agreement/recall": round(float(recall), 4),
            "agreement/f1": round(float(f1), 4), "agreement/oracle_positive": sum(truth)}

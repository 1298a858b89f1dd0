"""Stage ``omnirag_judge`` (Omni-RAG 4.2.2, Prompt E.4): every explored query is searched in its source, and a
judge LLM says whether the top ``k`` documents support the question's gold answer: the query is positive or
negative (eq. 1).

The judge is the run's backend (Qwen2.5-72B-Instruct-AWQ behind the ``openai`` backend in the paper preset; the
world's oracle in miniature, which judges exactly). Each judged query is kept with its verdict and the ids of the
documents it was judged on. ``signal`` swaps the judge for the supervised baselines' signals (appendix D.3):
``downstream`` (Trainable Planning) asks the backend, as a reader, to answer with the query's documents and
without them, and a query is positive when the documents turn a wrong answer right; ``rerank`` (RaFe) scores the
question against each document with the reranker ``knowledge.rerank`` names (built for the signal even where the
knowledge base does not rerank its searches, so every signal judges the same documents), positive when the best
score reaches ``rerank_threshold``: given, or chosen as the paper chose its 2.3, "by trying on the development
set". On a world knowledge base the manifest also gives each signal's agreement with the oracle's exact verdict
(accuracy, precision, recall, F1: the paper's table 9, with the oracle in the humans' place). Progress is kept per
question (all its queries judged together): a killed run continues with the questions not yet judged, a finished
one does nothing when rerun, and the calls of a cached backend are not repeated either way. A reply without a
readable yes / no is dropped and counted.
"""

from __future__ import annotations

import functools
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
    ``rerank_threshold``: RaFe's (2.3, the paper's for MedCPT's cross-encoder), or null to choose it on a world
    as the paper did on its development set: the score that maximises F1 against the oracle's verdicts (the
    annotators' place) on the queries of the first ``threshold_dev_questions`` explored questions (they are then
    judged like the rest); ``out``: a fixed output folder (default ``builds/omnirag_judge/<settings key>``)."""

    name: str = STAGE
    explore: Optional[str] = None
    questions: str = "world"
    k: int = 5
    retriever: Optional[str] = None
    signal: str = "llm"
    answer_mode: str = "generate"
    rerank_threshold: Optional[float] = 2.3
    threshold_dev_questions: int = 100
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
    if cfg.signal == "rerank" and cfg.rerank_threshold is None and knowledge.corpus != "world":
        raise ValueError("stage.rerank_threshold=null chooses the threshold against the world oracle's verdicts, "
                         f"but knowledge={knowledge.name} is not a world: give the threshold (RaFe's 2.3 for "
                         "MedCPT's cross-encoder)")
    if cfg.signal == "rerank" and cfg.threshold_dev_questions < 1:
        raise ValueError(f"stage.threshold_dev_questions={cfg.threshold_dev_questions}: expected at least 1")
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

    kept: dict[str, list[Any]] = {}  # RaFe's development queries: retrieved for the threshold, judged later

    def retrieve(asked: list[SourceQuery], keep: bool = False) -> dict[str, list[Any]]:
        docs = {r.id: kept.pop(r.id) for r in asked if r.id in kept}
        needed = [r for r in asked if r.id not in docs]
        for source in dict.fromkeys(r.source for r in needed):
            mine = [r for r in needed if r.source == source]
            for r, hits in zip(mine, kb.search_batch(source, [r.query for r in mine], cfg.k, method=cfg.retriever)):
                docs[r.id] = hits
        if keep:
            kept.update(docs)
        return docs

    decide, extra = _decider(cfg, judge, kb, knowledge, by_question, questions, retrieve, log)

    def work(batch: Sequence[str]) -> list[dict[str, Any] | Failed]:
        asked = [r for qid in batch for r in by_question[qid]]
        docs = retrieve(asked)
        verdicts = decide(asked, docs, questions)
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
        "dropped_unreadable": len(judged) - len(records), **extra,
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


def _decider(cfg: JudgeConfig, judge: Any, kb: Any, knowledge: Any, by_question: dict[str, list[SourceQuery]],
             questions: dict[str, Any], retrieve: Any, log: Any) -> tuple[Any, dict[str, Any]]:
    """The function that gives a batch of queries their verdicts under ``cfg.signal``, and what the manifest
    should record about it (RaFe's reranker and threshold)."""
    if cfg.signal != "rerank":
        return functools.partial(VERDICTS[cfg.signal], cfg, judge=judge), {}
    from omnimed.knowledge.build import build_reranker

    reranker = kb.reranker if kb.reranker is not None else build_reranker(knowledge, getattr(kb, "encoder", None))
    threshold, extra = cfg.rerank_threshold, {"reranker": repr(reranker)}
    if threshold is None:
        dev = [r for qid in list(by_question)[:cfg.threshold_dev_questions] for r in by_question[qid]]
        docs = retrieve(dev, keep=True)
        scores = best_rerank_scores(reranker, dev, docs, questions, kb)
        oracle = _world_oracle(knowledge)
        truth = [oracle.supports_in_part(r.question_id, [h.doc_id for h in docs[r.id]]) for r in dev]
        threshold = choose_threshold([scores[r.id] for r in dev], truth)
        extra.update({"rerank_threshold_dev/questions": min(len(by_question), cfg.threshold_dev_questions),
                      "rerank_threshold_dev/queries": len(dev), "rerank_threshold_dev/positive": sum(truth)})
        log(f"{STAGE}: rerank threshold {threshold:.4f} chosen on {len(dev)} queries ({sum(truth)} positive)")
    extra["rerank_threshold"] = round(float(threshold), 6)
    return functools.partial(_rerank, reranker=reranker, threshold=float(threshold), kb=kb), extra


def choose_threshold(scores: Sequence[float], truth: Sequence[bool]) -> float:
    """The score threshold ``t`` at which ``score >= t`` agrees best with ``truth`` by F1 (the positive class is the
    rare one: accuracy alone would choose to call everything negative)."""
    import numpy as np
    from sklearn.metrics import precision_recall_curve

    if not any(truth):
        raise ValueError("no positive query among the development queries: the threshold cannot be chosen; raise "
                         "stage.threshold_dev_questions or give stage.rerank_threshold")
    finite = np.nan_to_num(np.asarray(scores, dtype=np.float64), neginf=-1e30)  # a query that found nothing
    precision, recall, thresholds = precision_recall_curve(np.asarray(truth, dtype=bool), finite)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(precision),
                   where=(precision + recall) > 0)[:-1]
    return float(thresholds[int(np.argmax(f1))])


def _world_oracle(knowledge: Any) -> Any:
    from omnimed.knowledge.corpus import world_of

    return world_of(knowledge).oracle


def _llm(cfg: JudgeConfig, asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any],
         judge: Any) -> Verdicts:
    """The judge LLM's yes / no on each query's documents (Prompt E.4)."""
    requests = [Request(prompts.judge_messages(questions[r.question_id], [h.passage for h in docs[r.id]]),
                        {"task": STAGE, "question_id": r.question_id, "passage_ids": [h.doc_id for h in docs[r.id]]})
                for r in asked]
    replies = judge.generate(requests, SamplingParams(max_new_tokens=cfg.max_new_tokens))
    return {r.id: Failed(r.id, g[0].error) if g[0].error is not None else read_verdict(g[0].text)
            for r, g in zip(asked, replies)}


def _downstream(cfg: JudgeConfig, asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any],
                judge: Any) -> Verdicts:
    """Trainable Planning: positive when the reader is right with the query's documents and wrong without. A
    question the reader answers right alone has no positive query, so its queries' documents are not read."""
    from omnimed.methods.reader import Reader

    reader = Reader(judge, params=SamplingParams(max_new_tokens=cfg.max_new_tokens), answer_mode=cfg.answer_mode)
    qids = list(dict.fromkeys(r.question_id for r in asked))
    alone = dict(zip(qids, reader.answer_mcq([questions[q] for q in qids])))
    out: Verdicts = {}
    for r in asked:
        first = alone[r.question_id]
        if first.error:
            out[r.id] = Failed(r.id, first.error)
        elif first.correct:
            out[r.id] = "negative"
    rest = [r for r in asked if r.id not in out]
    helped = reader.answer_mcq([questions[r.question_id] for r in rest],
                               [[h.passage for h in docs[r.id]] for r in rest]) if rest else []
    for r, with_docs in zip(rest, helped):
        out[r.id] = (Failed(r.id, with_docs.error) if with_docs.error else
                     "positive" if with_docs.correct else "negative")
    return out


def best_rerank_scores(reranker: Any, asked: list[SourceQuery], docs: dict[str, list[Any]],
                       questions: dict[str, Any], kb: Any = None) -> dict[str, float]:
    """RaFe's score of each query: the reranker's best score of the question against the query's documents
    (-inf for a query that found none). A bi-encoder's scores come from vectors: each question encoded once and
    each document read from ``kb``'s embedding cache, the cosines its ``rerank`` computes without encoding a
    document again for every query that found it (24,000 queries of 5 documents each in miniature)."""
    from omnimed.knowledge.rerank import BiEncoderReranker
    from omnimed.knowledge.types import index_text

    if isinstance(reranker, BiEncoderReranker) and kb is not None:
        return _cosine_scores(reranker.encoder, kb, asked, docs, questions)
    out: dict[str, float] = {}
    for r in asked:
        texts = [index_text(h.passage) for h in docs[r.id]]
        out[r.id] = max((score for _, score in reranker.rerank(prompts.question_text(questions[r.question_id]),
                                                                texts, len(texts))), default=float("-inf"))
    return out


def _cosine_scores(encoder: Any, kb: Any, asked: list[SourceQuery], docs: dict[str, list[Any]],
                   questions: dict[str, Any]) -> dict[str, float]:
    """:func:`best_rerank_scores` for a bi-encoder: the best cosine of each query's documents with its question."""
    import numpy as np
    from sklearn.preprocessing import normalize

    from omnimed.knowledge.types import index_text

    qids = list(dict.fromkeys(r.question_id for r in asked))
    qvec = dict(zip(qids, normalize(encoder.encode_queries([prompts.question_text(questions[q]) for q in qids]))))
    # keyed by text, not id: a graph hit's text (its concept's relations ranked for the query) differs per query
    texts = list(dict.fromkeys(index_text(h.passage) for r in asked for h in docs[r.id]))
    dvec = dict(zip(texts, normalize(np.asarray(kb.embed_docs(encoder, texts))) if texts else []))
    return {r.id: max((float(dvec[index_text(h.passage)] @ qvec[r.question_id]) for h in docs[r.id]),
                      default=float("-inf")) for r in asked}


def _rerank(asked: list[SourceQuery], docs: dict[str, list[Any]], questions: dict[str, Any], *, reranker: Any,
            threshold: float, kb: Any) -> Verdicts:
    """RaFe: positive when the question's best rerank score against the query's documents reaches ``threshold``."""
    scores = best_rerank_scores(reranker, asked, docs, questions, kb)
    return {r.id: "positive" if scores[r.id] >= threshold else "negative" for r in asked}


VERDICTS = {"llm": _llm, "downstream": _downstream}  # rerank: _decider binds its reranker and threshold


def agreement_with_oracle(records: list[SourceQuery], knowledge: Any) -> dict[str, float]:
    """Accuracy, precision, recall and F1 of the stage's verdicts against the world oracle's on the same
    documents (the paper's table 9 with the oracle as the human reference; positive is the class scored)."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    if not records:
        return {}
    oracle = _world_oracle(knowledge)
    truth = [oracle.supports_in_part(r.question_id, r.passage_ids) for r in records]
    said = [r.judgement == "positive" for r in records]
    precision, recall, f1, _ = precision_recall_fscore_support(truth, said, average="binary", zero_division=0)
    return {"agreement/accuracy": round(float(accuracy_score(truth, said)), 4),
            "agreement/precision": round(float(precision), 4), "agreement/recall": round(float(recall), 4),
            "agreement/f1": round(float(f1), 4), "agreement/oracle_positive": sum(truth)}

"""``omnimed-evaluate task=qa``: answer a dataset's questions with a pipeline and score them.

Every per-example prediction is saved (``predictions.jsonl`` and a W&B Table) so each number can be audited; a
reader output without a usable answer counts as wrong and is counted and shown. Multiple-choice accuracy comes with
its binomial standard error and a bootstrap 95% interval; with several seeds, the mean and standard deviation.

Several ``task.seeds`` (see :func:`seed_summary`): ``accuracy`` is the mean over seeds and ``accuracy/seed_<s>``
each seed's; the standard error and the bootstrap interval are those of that mean with the *question* as the unit
(each question's correctness averaged over the seeds, then resampled over questions), so repeated seeds of the same
questions never narrow the interval as if they were new questions. ``n`` is the number of questions (per seed),
``missing_answers`` the mean per seed (``missing_answers/seed_<s>`` each seed's count, ``missing_answers_total`` the
sum). With one seed this is exactly :func:`omnimed.evaluation.metrics.accuracy`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion
from omnimed.generation.factory import BackendConfig


@dataclass
class QATaskConfig:
    """``dataset``: a key of :mod:`omnimed.evaluation.datasets`; ``seeds``: sampling seeds (greedy decoding makes
    them identical; they matter with ``pipeline.temperature`` > 0)."""

    name: str = "qa"
    dataset: str = "world_mcq"
    split: Optional[str] = "test"
    limit: Optional[int] = None
    data_dir: Optional[str] = None
    seeds: list[int] = field(default_factory=lambda: [0])
    bootstrap_resamples: int = 1000
    # long-form (open) questions: the backend that labels each statement of an answer against the reference
    # (PolyRAG uses GPT-4: judge.name=openai judge.model=...); model null: the run's model
    judge: BackendConfig = field(default_factory=BackendConfig)


@dataclass
class QAResult:
    metrics: dict[str, float]
    output_dir: Path
    problems: dict[str, float]  # reason -> outputs without a usable answer per seed (the mean over several seeds)
    logger_dir: str | None = None


def _questions(cfg) -> list:
    from omnimed.evaluation.datasets import DatasetRequest, load_eval_dataset

    k = cfg.knowledge
    return load_eval_dataset(DatasetRequest(
        cfg.task.dataset, split=cfg.task.split, limit=cfg.task.limit,
        world_seed=k.world_seed, world_size=k.world_size, realdata_root=k.realdata_root, data_dir=cfg.task.data_dir,
    ))


def run_qa_evaluation(cfg, output_dir) -> QAResult:
    """Answer, score, save every prediction, log to the configured logger."""
    from omegaconf import OmegaConf

    from omnimed.data.io import atomic_path, atomic_write_json
    from omnimed.evaluation.identity import group_and_tags
    from omnimed.generation.factory import build_backend
    from omnimed.generation.types import SamplingParams
    from omnimed.pipelines.rag import run_pipeline
    from omnimed.pipelines.reader import Reader
    from omnimed.tracking import build_logger, close_logger, log_lineage

    output_dir = Path(output_dir)
    questions = _questions(cfg)
    longform = all(isinstance(q, OpenQuestion) for q in questions)
    if not longform and not all(isinstance(q, MultipleChoiceQuestion) for q in questions):
        raise ValueError(f"task.dataset={cfg.task.dataset}: mixes multiple-choice and open questions; a run scores "
                         "one kind (accuracy, or statement ratios for open answers)")
    selfbiorag = cfg.pipeline.name == "selfbiorag"
    if longform and selfbiorag:
        raise ValueError(f"task.dataset={cfg.task.dataset}: pipeline=selfbiorag answers multiple-choice questions; "
                         "use pipeline=closed_book or rag for open questions")
    kb = None
    if cfg.pipeline.name == "rag" or (selfbiorag and cfg.pipeline.retrieval != "never"):
        from omnimed.knowledge.build import build_knowledge_base

        kb = build_knowledge_base(cfg.knowledge, Path(cfg.paths.root), progress=True)
    world = None
    if cfg.backend.name == "oracle":
        from omnimed.knowledge.corpus import world_of

        world = world_of(cfg.knowledge)
    backend_cfg, model = cfg.backend, cfg.model
    if selfbiorag:
        backend_cfg, model = selfbiorag_model(cfg.pipeline.generator_model, backend_cfg, model)
    backend = build_backend(backend_cfg, model=model, world=world, cache_root=Path(cfg.paths.cache))
    judge = None
    if longform:
        from omnimed.evaluation.longform import score_answers

        judge = build_backend(cfg.task.judge, model=cfg.model, world=world, cache_root=Path(cfg.paths.cache))

    outcomes: dict[int, list[bool | None]] = {}  # seed -> per question: correct, wrong, or None (no answer)
    judged: dict[int, dict[str, float]] = {}  # seed -> long-form statement metrics
    rows: list[dict[str, Any]] = []
    problems: dict[str, float] = {}
    for seed in dict.fromkeys(cfg.task.seeds):  # a repeated seed would only repeat its run
        if selfbiorag:
            from omnimed.methods.selfbiorag.inference import SelfBioRAG

            answered = SelfBioRAG(cfg.pipeline, backend, kb).answer(questions)
            found = [(o.prediction, o.correct, o.problem, o.passage_ids, o.raw,
                      {"retrieved": o.retrieved, "p_retrieve": o.p_retrieve,
                       "candidates": [vars(c) for c in o.candidates]}) for o in answered]
        else:
            params = SamplingParams(max_new_tokens=cfg.pipeline.max_new_tokens,
                                    temperature=cfg.pipeline.temperature, seed=seed)
            result = run_pipeline(cfg.pipeline, Reader(backend, params=params, answer_mode=cfg.pipeline.answer_mode),
                                  questions, kb)
            found = [(o.prediction, o.correct, o.problem, [p.id for p in ev], o.raw, {})
                     for o, ev in zip(result.outputs, result.evidence)]
        outcomes[seed] = [None if f[0] is None else bool(f[1]) for f in found]
        if longform:
            per_answer, judged[seed] = score_answers(questions, [f[0] for f in found], judge)
            found = [(*f[:5], {**f[5], "statements": a["statements"], "labels": a["labels"]})
                     for f, a in zip(found, per_answer)]
        for q, (prediction, ok, problem, evidence, raw, extra) in zip(questions, found):
            if problem:
                problems[problem.split(":")[0]] = problems.get(problem.split(":")[0], 0) + 1
            rows.append({
                "seed": seed, "question_id": q.id,
                "gold": q.reference_answer if longform else q.answer, "prediction": prediction,
                "correct": bool(ok), "problem": problem, "evidence": evidence, "output": raw, **extra,
            })
    metrics = seed_summary(outcomes, n_resamples=cfg.task.bootstrap_resamples)
    if longform:  # open answers are judged, not right or wrong: drop accuracy, keep counts of missing answers
        metrics = {k: v for k, v in metrics.items() if not k.startswith("accuracy")}
        for key in next(iter(judged.values())):
            metrics[key] = sum(m[key] for m in judged.values()) / len(judged)
    if len(outcomes) > 1:  # per seed, like n and missing_answers
        problems = {reason: count / len(outcomes) for reason, count in problems.items()}
    if selfbiorag:
        metrics["retrieval_rate"] = sum(bool(r["retrieved"]) for r in rows) / max(1, len(rows))
        p = [r["p_retrieve"] for r in rows if r["p_retrieve"] is not None]
        if p:
            metrics["p_retrieve_mean"] = sum(p) / len(p)
    with atomic_path(output_dir / "predictions.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    atomic_write_json(output_dir / "metrics.json", metrics)

    group, tags = group_and_tags(cfg)
    logger = build_logger(
        cfg.logger.name, save_dir=output_dir, project=cfg.logger.project,
        run_name=cfg.run_name or f"{cfg.pipeline.name}-{cfg.task.dataset}", group=group,
        job_type=cfg.logger.job_type or "evaluate-qa", tags=tags, entity=cfg.logger.entity,
    )
    logger_dir = None
    if logger is not None:
        config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
        log_lineage(logger, config, {"group": group, "questions": len(questions)})
        logger.log_metrics(metrics)
        _log_predictions(logger, rows)
        logger_dir = close_logger(logger)
    return QAResult(metrics, output_dir, problems, logger_dir)


def seed_summary(outcomes: dict[int, Sequence[bool | None]], *, n_resamples: int = 1000,
                 confidence: float = 0.95) -> dict[str, float]:
    """Accuracy over several seeds of the same questions (``outcomes``: seed -> per question True / False / None
    for no answer, which counts as wrong).

    ``accuracy`` is the mean of the per-seed accuracies (``accuracy/seed_<s>``), ``accuracy_std`` their sample
    standard deviation. Its standard error and percentile-bootstrap interval treat the question as the unit: each
    question's correctness is averaged over the seeds and those averages are resampled over questions (the
    bootstrap's generator is seeded with the first seed). With one seed this equals
    :func:`omnimed.evaluation.metrics.accuracy` (binomial SE, the same interval). ``n`` is the number of questions
    (each seed answers all of them); ``missing_answers`` the mean per seed of outputs without an answer, next to
    each seed's count and the total.
    """
    import numpy as np

    from omnimed.evaluation.metrics import mean_std

    if not outcomes:
        raise ValueError("no seeds to summarise")
    seeds = list(outcomes)
    sizes = {len(v) for v in outcomes.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every seed must answer the same, non-empty set of questions; got sizes {sorted(sizes)}")
    grid = np.asarray([[bool(c) for c in outcomes[s]] for s in seeds], dtype=float)  # seeds x questions
    per_seed = grid.mean(axis=1)
    per_question = grid.mean(axis=0)
    n = per_question.size
    mean, std, _ = mean_std(per_seed.tolist())
    stderr = float(per_question.std()) / math.sqrt(n)  # ddof=0: with one seed, sqrt(p (1 - p) / n)
    low = high = mean
    if n >= 2 and float(np.ptp(per_question)) > 0:
        from scipy.stats import bootstrap

        ci = bootstrap((per_question,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                       method="percentile", vectorized=True, batch=max(1, 2_000_000 // n),
                       rng=np.random.default_rng(seeds[0]))
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    missing = {s: sum(c is None for c in outcomes[s]) for s in seeds}
    metrics = {
        "accuracy": mean, "accuracy_std": std, "seeds": float(len(seeds)),
        "accuracy_stderr": stderr, "accuracy_ci_low": low, "accuracy_ci_high": high,
        "n": float(n), "missing_answers": sum(missing.values()) / len(seeds),
        "missing_answers_total": float(sum(missing.values())),
    }
    if len(seeds) > 1:
        for s, value in zip(seeds, per_seed):
            metrics[f"accuracy/seed_{s}"] = float(value)
            metrics[f"missing_answers/seed_{s}"] = float(missing[s])
    return metrics


def selfbiorag_model(path: str | None, backend_cfg, model):
    """The backend config and model that serve a Self-BioRAG generator or critic: a trained checkpoint
    (``path``) as the backend's model, or else the run's model with the reflective tokens added (untrained rows,
    so its token probabilities can still be read)."""
    import dataclasses

    from omnimed.methods.selfbiorag.tokens import SPECIAL_TOKENS

    if path:
        return dataclasses.replace(backend_cfg, model=str(path)), model
    tokens = list(dict.fromkeys([*model.special_tokens, *SPECIAL_TOKENS]))
    return backend_cfg, dataclasses.replace(model, special_tokens=tokens)


def _log_predictions(logger, rows: list[dict[str, Any]]) -> None:
    from lightning.pytorch.loggers import WandbLogger

    if not isinstance(logger, WandbLogger):
        return
    cols = ["seed", "question_id", "gold", "prediction", "correct", "problem", "evidence", "output"]
    logger.log_table("qa/predictions", columns=cols,
                     data=[[json.dumps(r[c]) if isinstance(r[c], list) else r[c] for c in cols] for r in rows])

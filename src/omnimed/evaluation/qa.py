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

A backend call that failed (connection, timeout, server error; the reader's or the long-form judge's) is not a
missing answer: it counts as wrong and is counted apart, ``failed_generations`` (mean per seed). Past
``max_failed_share`` of the questions the run raises :class:`~omnimed.data.artifacts.RunFailed` after writing
``predictions.jsonl`` (each question's ``error``) and no metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omnimed.data.artifacts import describe_backend
from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion
from omnimed.evaluation.runner import UNDEFINED_FILE, finish_run, gate_failures
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
    # LUQ uncertainty (Omni-RAG table 10, omnimed.evaluation.luq): luq_samples answers per question sampled at
    # luq_temperature (the paper: 9 at 0.7; 0 = off), judged by luq_nli: an NLI classifier (hub id or folder),
    # exact (closed-form answers: the same option entails, another contradicts) or null, the run's backend asked
    # yes / no; luq_limit: sample the first luq_limit questions only (null: all; accuracy still reads every one);
    # luq_sampler: generate (the run's method answers again at luq_temperature) or options (each sample drawn from
    # the option letters' log-probabilities that pipeline.answer_mode=logprob read: a reader whose answer is the
    # letter alone, at no extra prompt)
    luq_samples: int = 0
    luq_temperature: float = 0.7
    luq_nli: Optional[str] = None
    luq_limit: Optional[int] = None
    luq_sampler: str = "generate"


@dataclass
class QAResult:
    metrics: dict[str, float]
    output_dir: Path
    problems: dict[str, float]  # reason -> outputs without a usable answer per seed (the mean over several seeds)
    logger_dir: str | None = None


def _request(cfg) -> Any:
    from omnimed.evaluation.datasets import DatasetRequest

    k = cfg.knowledge
    return DatasetRequest(cfg.task.dataset, split=cfg.task.split, limit=cfg.task.limit,
                          world_seed=k.world_seed, world_size=k.world_size, world_difficulty=k.world_difficulty,
                          realdata_root=k.realdata_root, data_dir=cfg.task.data_dir)


def run_qa_evaluation(cfg, output_dir) -> QAResult:
    """Answer with the method ``pipeline=`` names, score, save every prediction, log to the configured logger."""
    from omnimed.evaluation.datasets import load_demonstrations, load_eval_dataset
    from omnimed.methods.backends import run_backend
    from omnimed.methods.registry import build_method

    output_dir = Path(output_dir)
    request = _request(cfg)
    questions = load_eval_dataset(request)
    longform = all(isinstance(q, OpenQuestion) for q in questions)
    if not longform and not all(isinstance(q, MultipleChoiceQuestion) for q in questions):
        raise ValueError(f"task.dataset={cfg.task.dataset}: mixes multiple-choice and open questions; a run scores "
                         "one kind (accuracy, or statement ratios for open answers)")
    method = build_method(cfg.pipeline)
    method.cache_root = cfg.paths.cache
    if not method.reads() and (longform or cfg.task.luq_samples):
        raise ValueError(f"pipeline.read=false: pipeline={method.name} only plans and searches, so there are no "
                         "answers to judge (open questions) or to sample (task.luq_samples)")
    kind = "open" if longform else "mcq"
    if kind not in method.question_kinds:
        raise ValueError(f"task.dataset={cfg.task.dataset}: pipeline={method.name} answers "
                         f"{' and '.join(method.question_kinds)} questions, not {kind} ones")
    if method.shots():
        method.demonstrations = load_demonstrations(request)
    kb = None
    if method.needs_knowledge():
        from omnimed.knowledge.build import build_knowledge_base

        kb = build_knowledge_base(cfg.knowledge, Path(cfg.paths.root), progress=True)
    backend_cfg, model = method.serve(cfg.backend, cfg.model)
    backend = run_backend(backend_cfg, model=model, knowledge=cfg.knowledge, cache_root=cfg.paths.cache)
    judge = None
    if longform:
        from omnimed.evaluation.longform import score_answers, statement_intervals

        judge = run_backend(cfg.task.judge, model=cfg.model, knowledge=cfg.knowledge, cache_root=cfg.paths.cache)

    outcomes: dict[int, list[bool | None]] = {}  # seed -> per question: correct, wrong, or None (no answer)
    failures: dict[int, list[tuple[str, str]]] = {}  # seed -> (backend, error) per question whose call failed
    judged: dict[int, dict[str, float]] = {}  # seed -> long-form statement metrics
    judged_answers: dict[int, list[dict[str, Any]]] = {}  # seed -> each answer's statements and labels
    own: dict[int, dict[str, float]] = {}  # seed -> the method's own metrics
    undefined: dict[str, str] = {}  # own metrics without a value -> why (the first seed's reason)
    rows: list[dict[str, Any]] = []
    problems: dict[str, float] = {}
    for seed in dict.fromkeys(cfg.task.seeds):  # a repeated seed would only repeat its run
        answers = method.answer(questions, backend, kb, seed=seed)
        # a failed call is wrong, not a missing answer: failures are counted apart (failed_generations)
        outcomes[seed] = [None if a.prediction is None and a.error is None else bool(a.correct) for a in answers]
        own[seed] = method.metrics(answers)
        undefined = method.undefined_metrics(answers) | undefined
        extras = [dict(a.extras) for a in answers]
        if longform:
            per_answer, judged[seed] = score_answers(questions, [a.prediction for a in answers], judge)
            judged_answers[seed] = per_answer
            for extra, judgement in zip(extras, per_answer):
                extra.update(statements=judgement["statements"], labels=judgement["labels"])
        failures[seed] = []
        if cfg.task.luq_samples:
            own[seed].update(_luq(cfg, method, questions, answers, backend, kb, seed, extras, failures[seed]))
        for q, a, extra in zip(questions, answers, extras):
            error = a.error or extra.pop("judge_error", None)
            if error:  # the call failed: counted apart from answers that came back unreadable
                failures[seed].append((describe_backend(backend if a.error else judge), error))
            elif a.problem:
                problems[a.problem.split(":")[0]] = problems.get(a.problem.split(":")[0], 0) + 1
            rows.append({
                "seed": seed, "question_id": q.id,
                "gold": q.reference_answer if longform else q.answer, "prediction": a.prediction,
                "correct": bool(a.correct), "problem": a.problem, "evidence": a.evidence, "output": a.raw,
                "error": error, **extra,
            })
    failed = [f for seed in failures for f in failures[seed]]
    gate_failures(output_dir, rows, [e for _, e in failed], backend=failed[0][0] if failed else "",
                  what=f"pipeline={method.name} on task.dataset={cfg.task.dataset}", max_share=cfg.max_failed_share,
                  unit="questions")
    metrics = seed_summary(outcomes, n_resamples=cfg.task.bootstrap_resamples)
    if not method.reads():  # plans and searches only: no answer was asked for, so none is right, wrong or missing
        metrics = {k: v for k, v in metrics.items() if not k.startswith(("accuracy", "missing_answers"))}
    elif not longform:
        metrics |= accuracy_by_naming(questions, outcomes)
    metrics["failed_generations"] = len(failed) / len(failures)  # mean per seed, the judge's failed calls too
    if len(failures) > 1:
        metrics.update({f"failed_generations/seed_{seed}": float(len(f)) for seed, f in failures.items()})
    if longform:  # open answers are judged, not right or wrong: drop accuracy, keep counts of missing answers
        metrics = {k: v for k, v in metrics.items() if not k.startswith("accuracy")}
        for key in next(iter(judged.values())):
            metrics[key] = sum(m[key] for m in judged.values()) / len(judged)
        metrics |= statement_intervals(list(judged_answers.values()), n_resamples=cfg.task.bootstrap_resamples,
                                       seed=next(iter(judged_answers)))
    for key in next(iter(own.values())):  # the method's own metrics, averaged over seeds
        metrics[key] = sum(m[key] for m in own.values()) / len(own)
    if len(outcomes) > 1:  # per seed, like n and missing_answers
        problems = {reason: count / len(outcomes) for reason, count in problems.items()}

    undefined = {key: why for key, why in undefined.items() if key not in metrics}
    cols = ["seed", "question_id", "gold", "prediction", "correct", "problem", "evidence", "output"]
    table = [[json.dumps(r[c]) if isinstance(r[c], list) else r[c] for c in cols] for r in rows]
    logger_dir = finish_run(cfg, output_dir, rows=rows, metrics=metrics, run_name=f"{method.name}-{cfg.task.dataset}",
                            job_type="evaluate-qa", lineage={"questions": len(questions)},
                            tables={"qa/predictions": (cols, table)},
                            files={UNDEFINED_FILE: undefined} if undefined else None)
    return QAResult(metrics, output_dir, problems, logger_dir)


def sampling_method(cfg: Any) -> Any:
    """The run's method answering by sampling at ``task.luq_temperature`` (and generating its answer text, where the
    pipeline could read it from log-probabilities instead), for LUQ's samples."""
    import dataclasses

    from omnimed.methods.registry import build_method

    pipeline = cfg.pipeline
    if not hasattr(pipeline, "temperature"):
        raise ValueError(f"task.luq_samples={cfg.task.luq_samples}: pipeline={pipeline.name} has no temperature to "
                         "sample its answers at")
    changes = {"temperature": cfg.task.luq_temperature}
    if hasattr(pipeline, "answer_mode"):
        changes["answer_mode"] = "generate"
    pipeline = dataclasses.replace(pipeline, **changes)
    return build_method(pipeline)


def _luq(cfg: Any, method: Any, questions: Sequence[Any], answers: Sequence[Any], backend: Any, kb: Any, seed: int,
         extras: list[dict[str, Any]], failures: list[tuple[str, str]]) -> dict[str, float]:
    """``task.luq_samples`` sampled answers per question, their LUQ uncertainty in each question's extras (with the
    samples) and its mean as ``luq``, over the first ``task.luq_limit`` questions; a sample whose call failed is
    left out and counted among the failures."""
    from omnimed.evaluation.luq import luq, nli_judge, option_samples

    task = cfg.task
    if task.luq_limit is not None and task.luq_limit < 1:
        raise ValueError(f"task.luq_limit={task.luq_limit}: expected a positive number of questions, or null for all")
    if task.luq_sampler not in ("generate", "options"):
        raise ValueError(f"task.luq_sampler={task.luq_sampler!r}: expected generate or options")
    questions, answers = questions[:task.luq_limit], answers[:task.luq_limit]
    if task.luq_sampler == "options":
        if getattr(cfg.pipeline, "answer_mode", None) != "logprob":
            raise ValueError(f"task.luq_sampler=options draws from the option letters' log-probabilities, which "
                             f"pipeline.answer_mode=logprob reads; pipeline={method.name} has answer_mode="
                             f"{getattr(cfg.pipeline, 'answer_mode', None)}")
        letter_logprobs = [json.loads(a.raw) if a.error is None and a.raw else None for a in answers]
        samples = option_samples(letter_logprobs, task.luq_samples, task.luq_temperature, seed)
    else:
        samples = _generated_samples(cfg, method, questions, backend, kb, seed, failures)
    scores = luq(samples, nli_judge(task.luq_nli, backend))
    for extra, texts, score in zip(extras, samples, scores):
        extra.update(luq=score, luq_samples=texts)
    measured = [u for u in scores if u is not None]  # no luq at all when no question has two answers to compare
    return {**({"luq": sum(measured) / len(measured)} if measured else {}), "luq/n": float(len(measured))}


def _generated_samples(cfg: Any, method: Any, questions: Sequence[Any], backend: Any, kb: Any, seed: int,
                       failures: list[tuple[str, str]]) -> list[list[str]]:
    """Each question's answers from the run's method asked again ``task.luq_samples`` times at the sampling
    temperature; a failed call is left out and counted among ``failures``."""
    sampler = sampling_method(cfg)
    sampler.serve(cfg.backend, cfg.model)
    sampler.cache_root, sampler.demonstrations = cfg.paths.cache, method.demonstrations
    samples: list[list[str]] = [[] for _ in questions]
    for j in range(cfg.task.luq_samples):
        for texts, a in zip(samples, sampler.answer(questions, backend, kb, seed=seed * 1000 + j + 1)):
            if a.error is not None:
                failures.append((describe_backend(backend), a.error))
            else:
                texts.append(a.raw)
    return samples


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

    from omnimed.evaluation.metrics import mean_interval, mean_std

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
    low, high = mean_interval(per_question, n_resamples=n_resamples, seed=seeds[0], confidence=confidence)
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


def accuracy_by_naming(questions: Sequence[MultipleChoiceQuestion],
                       outcomes: dict[int, Sequence[bool | None]]) -> dict[str, float]:
    """``accuracy/named_by_<how>``: accuracy (the mean over seeds) of the questions grouped by how each names its
    subject (the world's ``metadata["named_by"]``: the passages' name, an alias only the graph links to it, a
    description). A retriever or planner can copy a name but cannot know an unseen alias, so the split tells a
    search that failed from a reader that did. Questions without the field (real datasets) add nothing."""
    groups: dict[str, list[float]] = {}
    for i, q in enumerate(questions):
        how = q.metadata.get("named_by")
        if how is not None:
            groups.setdefault(how, []).append(sum(bool(o[i]) for o in outcomes.values()) / len(outcomes))
    return {f"accuracy/named_by_{how}": sum(v) / len(v) for how, v in sorted(groups.items())}


def report(result: QAResult, cfg: Any, console: Any) -> float | None:
    """Print the run's accuracy (or statement ratios) and where its files are; returns the value a sweep
    optimises (accuracy, or the correct-statement ratio for open answers)."""
    from rich.table import Table

    m = result.metrics
    table = Table(title=f"omnimed-evaluate: {cfg.pipeline.name} on {cfg.task.dataset} ({cfg.backend.name})",
                  show_header=False)
    if "accuracy" in m:
        table.add_row("accuracy", f"{m['accuracy']:.4f}  [95% CI {m['accuracy_ci_low']:.4f}, "
                                  f"{m['accuracy_ci_high']:.4f}]  SE {m['accuracy_stderr']:.4f}")
        table.add_row("questions", f"{m['n']:.0f} x {m['seeds']:.0f} seed(s); std over seeds "
                                   f"{m['accuracy_std']:.4f}")
    elif "statement_correct_ratio" not in m:  # plans and searches only: the method's plan metrics
        table.add_row("questions", f"{m['n']:.0f} planned and searched, not answered (pipeline.read=false)")
        for key in sorted(k for k in m if k.startswith("plan/") and k.count("/") == 1):
            table.add_row(key, f"{m[key]:.4f}")
    else:  # open answers, judged statement by statement
        for label in ("correct", "incorrect", "not_mentioned", "unparsed"):
            count = m.get(f"statement_{label}_count")
            key = f"statement_{label}_ratio"
            ci = f" [95% CI {m[key + '_ci_low']:.3f}, {m[key + '_ci_high']:.3f}]" if key + "_ci_low" in m else ""
            table.add_row(f"statements {label}", f"{m[key]:.3f} of an answer{ci}"
                          + (f", {count:.2f} per answer" if count is not None else ""))
        table.add_row("questions", f"{m['n']:.0f} x {m['seeds']:.0f} seed(s); "
                                   f"{m['answers_without_statements']:.0f} answers without statements")
    if m.get("failed_generations"):
        table.add_row("failed backend calls", f"{m['failed_generations']:.0f} (wrong in the score; see "
                                              "predictions.jsonl's error)")
    if "missing_answers" in m:
        table.add_row("missing / malformed answers", f"{m['missing_answers']:.0f}" + (
            f"  ({', '.join(f'{k}: {v}' for k, v in result.problems.items())})" if result.problems else ""))
    table.add_row("outputs", f"{result.output_dir}/metrics.json, predictions.jsonl"
                  + (f"; logger: {result.logger_dir}" if result.logger_dir else ""))
    console.print(table)
    return m.get("accuracy", m.get("statement_correct_ratio"))

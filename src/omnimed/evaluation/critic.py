"""``omnimed-evaluate task=critic_accuracy``: a critic (or judge) LM's accuracy per label type on the dev split of
its labelled data, against the teacher's labels (Self-BioRAG Table 9). The label types and their tokens are the
method's (``pipeline=<name>``, a registered method that declares ``labels``); so is the critic model it serves.

A prediction is the critic's most likely token among the type's choices (its next-token distribution after the
critic instruction, restricted to them), which is what Table 9 scores. The critic's *free* first token is read too:
``<type>/outside_rate`` is the share of examples where greedy decoding would write something that is not one of the
type's tokens, the mispredictions a data stage filters out. ``<type>/majority`` is the share of the
most frequent teacher token, the accuracy of a critic that always says it; ``<type>/class/<token>`` and
``<type>/macro_accuracy`` break accuracy down by gold token, and ``confusion.json`` holds the confusion tables.

A type may pool judgements asked with different questions and choices (Self-BioRAG's retrieval column holds the
two-way RET of an instruction and the three-way RET of a sentence): such a record names its own ``judgement`` and
``choices`` in its metadata, and ``<type>/<judgement>/accuracy`` reports each apart.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from omnimed.data.artifacts import describe_backend
from omnimed.evaluation.runner import finish_run, gate_failures
from omnimed.models.layout import request_prompt


@dataclass
class CriticAccuracyTaskConfig:
    """``data``: a critic-data stage's output folder (records whose ``metadata['type']`` is a label type of the
    method); ``split``: which of its splits is scored; ``dataset``: the name of that set in tables and W&B (the
    column key of a manifest)."""

    name: str = "critic_accuracy"
    dataset: str = "critic_dev"
    data: str = MISSING
    split: str = "dev"
    limit: Optional[int] = None
    free_tokens: int = 4
    bootstrap_resamples: int = 1000


@dataclass
class CriticResult:
    metrics: dict[str, float]
    output_dir: Path
    logger_dir: str | None = None


def run_critic_evaluation(cfg, output_dir) -> CriticResult:
    from omnimed.data.io import read_records
    from omnimed.data.records import InstructionExample
    from omnimed.evaluation.metrics import accuracy, per_class_accuracy
    from omnimed.generation.types import Request, SamplingParams
    from omnimed.methods.backends import run_backend
    from omnimed.methods.registry import build_method

    output_dir = Path(output_dir)
    method = build_method(cfg.pipeline)
    choices_of = method.labels
    if not choices_of:
        raise ValueError(f"task=critic_accuracy: pipeline={method.name} has no critic label types; choose a method "
                         "whose critic predicts labels")
    folder = Path(cfg.task.data)
    jsonl = folder / "records.jsonl" if folder.is_dir() else folder
    if not jsonl.is_file():
        raise FileNotFoundError(f"task.data={cfg.task.data}: no critic data there (build it with omnimed-build "
                                f"stage=<{method.name}'s critic-data stage>)")
    examples = [e for e in read_records(jsonl, InstructionExample) if e.metadata.get("split") == cfg.task.split]
    bad = [e.id for e in examples if e.metadata.get("type") not in choices_of]
    if bad:
        raise ValueError(f"{jsonl}: examples {bad[:3]} have no label type of {method.name} in metadata['type'] "
                         f"({', '.join(choices_of)})")
    if cfg.task.limit:
        examples = examples[: cfg.task.limit]
    if not examples:
        raise ValueError(f"{jsonl}: no examples of split {cfg.task.split!r}")

    backend_cfg, model = method.serve(cfg.backend, cfg.model, role="critic")
    backend = run_backend(backend_cfg, model=model, knowledge=cfg.knowledge, cache_root=cfg.paths.cache)

    def judgement(e: InstructionExample) -> str:
        return e.metadata.get("judgement") or e.metadata["type"]

    def request(e: InstructionExample) -> Request:
        meta = {"task": judgement(e), "question_id": e.metadata.get("source_id", e.id)}
        return Request(request_prompt(e.instruction, e.input, cfg.model.prompt_layout), meta)

    # examples asked alike: (type, judgement, choices) -> examples
    asked: dict[tuple[str, str, tuple[str, ...]], list[InstructionExample]] = {}
    for e in examples:
        kind = e.metadata["type"]
        asked.setdefault((kind, judgement(e), tuple(e.metadata.get("choices") or choices_of[kind])), []).append(e)
    rows: list[dict[str, Any]] = []
    for (kind, judged, choices), items in sorted(asked.items(), key=lambda group: group[0]):
        reqs = [request(e) for e in items]
        scored = backend.next_token_logprobs(reqs, list(choices))
        free = backend.generate(reqs, SamplingParams(max_new_tokens=cfg.task.free_tokens))
        for e, lp, g in zip(items, scored, free):
            pred = max(choices, key=lambda t: lp.get(t, float("-inf")))
            rows.append({"id": e.id, "type": kind, "judgement": judged, "gold": e.output, "prediction": pred,
                         "correct": pred == e.output, "free": g[0].text, "error": g[0].error,
                         "free_valid": g[0].error is None and method.read_label(g[0].text, judged) is not None,
                         "logprobs": lp})
    errors = [r["error"] for r in rows if r["error"]]
    # a failed free generation is not an outside token: too many of them fail the run
    gate_failures(output_dir, rows, errors, what=f"critic of pipeline={method.name} on {jsonl}",
                  backend=describe_backend(backend), max_share=cfg.max_failed_share, unit="examples")

    metrics: dict[str, float] = {"n": float(len(rows)), "failed_generations": float(len(errors))}
    confusion: dict[str, dict] = {}
    overall = accuracy([r["correct"] for r in rows], n_resamples=cfg.task.bootstrap_resamples, seed=cfg.seed)
    metrics.update(overall.as_dict("accuracy"))
    for kind, choices in choices_of.items():
        mine = [r for r in rows if r["type"] == kind]
        if not mine:
            continue
        acc = accuracy([r["correct"] for r in mine], n_resamples=cfg.task.bootstrap_resamples, seed=cfg.seed)
        metrics.update(acc.as_dict(f"{kind}/accuracy"))
        metrics[f"{kind}/n"] = float(len(mine))
        judged = sorted({r["judgement"] for r in mine})
        for name in judged if len(judged) > 1 else ():
            part = [r["correct"] for r in mine if r["judgement"] == name]
            metrics[f"{kind}/{name}/accuracy"] = sum(part) / len(part)
            metrics[f"{kind}/{name}/n"] = float(len(part))
        freed = [r for r in mine if not r["error"]]
        metrics[f"{kind}/outside_rate"] = sum(not r["free_valid"] for r in freed) / max(1, len(freed))
        metrics[f"{kind}/majority"] = Counter(r["gold"] for r in mine).most_common(1)[0][1] / len(mine)
        tokens = tuple(dict.fromkeys(t for k, _, asked_choices in sorted(asked) if k == kind for t in asked_choices))
        per = per_class_accuracy([r["gold"] for r in mine], [r["prediction"] for r in mine], tokens)
        metrics[f"{kind}/macro_accuracy"] = per["macro"]
        for token, cell in per["per_class"].items():
            if cell["accuracy"] is not None:
                metrics[f"{kind}/class/{token}"] = cell["accuracy"]
        confusion[kind] = per["confusion"]

    cols = ["id", "type", "judgement", "gold", "prediction", "correct", "free"]
    logger_dir = finish_run(cfg, output_dir, rows=rows, metrics=metrics, run_name=f"critic-{cfg.task.dataset}",
                            job_type="evaluate-critic", lineage={"examples": len(rows), "critic": backend.model_id},
                            tables={"critic/predictions": (cols, [[r[c] for c in cols] for r in rows])},
                            # per type: gold token -> predicted token -> count
                            files={"confusion.json": confusion})
    return CriticResult(metrics, output_dir, logger_dir)


def report(result: CriticResult, cfg: Any, console: Any) -> float:
    """Print accuracy per label type (with its interval, the majority baseline and the outside-set rate) and where
    the files are; returns the overall accuracy."""
    from rich.table import Table

    from omnimed.methods.registry import get_method

    m = result.metrics
    table = Table(title=f"omnimed-evaluate: critic accuracy on {cfg.task.dataset} ({cfg.task.split})")
    for col in ("type", "n", "accuracy", "95% CI", "majority", "outside set"):
        table.add_column(col, justify="right" if col != "type" else "left")
    for kind in (*get_method(cfg.pipeline.name).labels, "all"):
        key = "accuracy" if kind == "all" else f"{kind}/accuracy"
        if key not in m:
            continue
        n = m["n"] if kind == "all" else m[f"{kind}/n"]
        table.add_row(kind, f"{n:.0f}", f"{m[key]:.3f}", f"[{m[key + '_ci_low']:.3f}, {m[key + '_ci_high']:.3f}]",
                      f"{m.get(f'{kind}/majority', float('nan')):.3f}",
                      f"{m.get(f'{kind}/outside_rate', float('nan')):.3f}")
    console.print(table)
    console.print(f"metrics.json and predictions.jsonl in {result.output_dir}"
                  + (f"; logger files in {result.logger_dir}" if result.logger_dir else ""))
    return m["accuracy"]

"""``omnimed-evaluate task=critic_accuracy``: a critic LM's accuracy per reflective-token type on the dev split of
the critic data, against the teacher's tokens (Self-BioRAG Table 9).

A prediction is the critic's most likely token among the type's choices (its next-token distribution after the
critic instruction, restricted to them), which is what Table 9 scores. The critic's *free* first token is read too:
``<type>/outside_rate`` is the share of examples where greedy decoding would write something that is not one of the
type's tokens, the mispredictions the generator-data stage filters out. ``<type>/majority`` is the share of the
most frequent teacher token, the accuracy of a critic that always says it; ``<type>/class/<token>`` and
``<type>/macro_accuracy`` break accuracy down by gold token, and ``confusion.json`` holds the confusion tables.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omnimed.methods.selfbiorag.tokens import CRITIC_CHOICES

#: Table 9's columns and the token type each one reads
TYPES = ("utility", "retrieval", "relevance", "support")


@dataclass
class CriticAccuracyTaskConfig:
    """``data``: a ``selfbiorag_critic_data`` output folder; ``split``: which of its splits is scored;
    ``dataset``: the name of that set in tables and W&B (the column key of a manifest)."""

    name: str = "critic_accuracy"
    dataset: str = "critic_dev"
    data: str = "${paths.root}/builds/selfbiorag-miniature/critic_data"
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
    from omegaconf import OmegaConf

    from omnimed.data.io import atomic_path, atomic_write_json, read_records
    from omnimed.data.records import InstructionExample
    from omnimed.evaluation.identity import group_and_tags
    from omnimed.evaluation.metrics import accuracy, per_class_accuracy
    from omnimed.evaluation.qa import selfbiorag_model
    from omnimed.generation.factory import build_backend
    from omnimed.generation.types import Request, SamplingParams
    from omnimed.methods.selfbiorag.tokens import read_choice
    from omnimed.tracking import build_logger, close_logger, log_lineage

    output_dir = Path(output_dir)
    folder = Path(cfg.task.data)
    jsonl = folder / "records.jsonl" if folder.is_dir() else folder
    if not jsonl.is_file():
        raise FileNotFoundError(f"task.data={cfg.task.data}: no critic data there (build it with omnimed-build "
                                "stage=selfbiorag_critic_data)")
    examples = [e for e in read_records(jsonl, InstructionExample) if e.metadata.get("split") == cfg.task.split]
    bad = [e.id for e in examples if e.metadata.get("type") not in CRITIC_CHOICES]
    if bad:
        raise ValueError(f"{jsonl}: examples {bad[:3]} have no critic type in metadata['type']")
    if cfg.task.limit:
        examples = examples[: cfg.task.limit]
    if not examples:
        raise ValueError(f"{jsonl}: no examples of split {cfg.task.split!r}")

    critic = getattr(cfg.pipeline, "critic_model", None) if cfg.pipeline.name == "selfbiorag" else None
    backend_cfg, model = selfbiorag_model(critic, cfg.backend, cfg.model)
    world = None
    if cfg.backend.name == "oracle":
        from omnimed.knowledge.corpus import world_of

        world = world_of(cfg.knowledge)
    backend = build_backend(backend_cfg, model=model, world=world, cache_root=Path(cfg.paths.cache))

    def request(e: InstructionExample) -> Request:
        meta = {"task": e.metadata["type"], "question_id": e.metadata.get("source_id", e.id)}
        return Request([{"role": "user", "content": e.instruction}], meta)

    rows: list[dict[str, Any]] = []
    for kind in TYPES:
        items = [e for e in examples if e.metadata["type"] == kind]
        if not items:
            continue
        choices = list(CRITIC_CHOICES[kind])
        reqs = [request(e) for e in items]
        scored = backend.next_token_logprobs(reqs, choices)
        free = backend.generate(reqs, SamplingParams(max_new_tokens=cfg.task.free_tokens))
        for e, lp, g in zip(items, scored, free):
            pred = max(choices, key=lambda t: lp.get(t, float("-inf")))
            rows.append({"id": e.id, "type": kind, "gold": e.output, "prediction": pred,
                         "correct": pred == e.output, "free": g[0].text,
                         "free_valid": g[0].error is None and read_choice(g[0].text, kind) is not None,
                         "logprobs": lp})

    metrics: dict[str, float] = {"n": float(len(rows))}
    confusion: dict[str, dict] = {}
    overall = accuracy([r["correct"] for r in rows], n_resamples=cfg.task.bootstrap_resamples, seed=cfg.seed)
    metrics.update(overall.as_dict("accuracy"))
    for kind in TYPES:
        mine = [r for r in rows if r["type"] == kind]
        if not mine:
            continue
        acc = accuracy([r["correct"] for r in mine], n_resamples=cfg.task.bootstrap_resamples, seed=cfg.seed)
        metrics.update(acc.as_dict(f"{kind}/accuracy"))
        metrics[f"{kind}/n"] = float(len(mine))
        metrics[f"{kind}/outside_rate"] = sum(not r["free_valid"] for r in mine) / len(mine)
        metrics[f"{kind}/majority"] = Counter(r["gold"] for r in mine).most_common(1)[0][1] / len(mine)
        per = per_class_accuracy([r["gold"] for r in mine], [r["prediction"] for r in mine], CRITIC_CHOICES[kind])
        metrics[f"{kind}/macro_accuracy"] = per["macro"]
        for token, cell in per["per_class"].items():
            if cell["accuracy"] is not None:
                metrics[f"{kind}/class/{token}"] = cell["accuracy"]
        confusion[kind] = per["confusion"]

    with atomic_path(output_dir / "predictions.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    atomic_write_json(output_dir / "metrics.json", metrics)
    atomic_write_json(output_dir / "confusion.json", confusion)  # per type: gold token -> predicted token -> count

    group, tags = group_and_tags(cfg)
    logger = build_logger(cfg.logger.name, save_dir=output_dir, project=cfg.logger.project,
                          run_name=cfg.run_name or f"critic-{cfg.task.dataset}", group=group,
                          job_type=cfg.logger.job_type or "evaluate-critic", tags=tags, entity=cfg.logger.entity)
    logger_dir = None
    if logger is not None:
        config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
        log_lineage(logger, config, {"group": group, "examples": len(rows), "critic": backend.model_id})
        logger.log_metrics(metrics)
        from lightning.pytorch.loggers import WandbLogger

        if isinstance(logger, WandbLogger):
            cols = ["id", "type", "gold", "prediction", "correct", "free"]
            logger.log_table("critic/predictions", columns=cols, data=[[r[c] for c in cols] for r in rows])
        logger_dir = close_logger(logger)
    return CriticResult(metrics, output_dir, logger_dir)

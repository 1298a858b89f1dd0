"""``omnimed-evaluate task=utility_ranking``: how well encoders rank held-out queries' passages by a teacher's
utility (PolyRAG's utility embedder against its base model).

Input: the utility examples of a labelling stage (``task.data``: a records folder or file of
:class:`~omnimed.data.records.UtilityExample`, e.g. the ``polyrag_utility`` stage's output) of ``task.split``.
Each encoder (``task.encoders``: ``conf/model`` names, folders or hub ids) ranks every query's passages by cosine.
The teacher's scores become graded relevance per query: rescaled to [0, 1] within the query and cut into
``levels`` steps (0 .. levels-1; the oracle's five utility levels map onto themselves). Metrics (ir-measures):
``<encoder>/hit@k``: the teacher's best passage is in the encoder's top k (Success with rel = the top level);
``<encoder>/ndcg@k`` on the graded levels. Encoder keys in metrics are their config names, or a folder's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

LEVELS = 5


@dataclass
class UtilityRankingTaskConfig:
    name: str = "utility_ranking"
    data: Optional[str] = None
    split: str = "test"
    encoders: list[str] = field(default_factory=lambda: ["minilm-l6"])
    ks: list[int] = field(default_factory=lambda: [1, 3, 5])
    max_queries: Optional[int] = None


@dataclass
class UtilityRankingResult:
    metrics: dict[str, float]
    output_dir: Any
    logger_dir: str | None = None


def graded(scores: Sequence[float], levels: int = LEVELS) -> list[int]:
    """Teacher scores as relevance levels 0 .. levels-1 within one query (all equal: all at the top level)."""
    lo, hi = min(scores), max(scores)
    if hi - lo < 1e-12:
        return [levels - 1] * len(scores)
    return [round((s - lo) / (hi - lo) * (levels - 1)) for s in scores]


def encoder_key(name: str) -> str:
    """A metrics key for an encoder: its config name, or the name of the folder (``.../<run>/hf`` -> run)."""
    path = Path(name)
    if path.exists():
        return path.parent.name if path.name == "hf" else path.name
    return name


def rank_metrics(records: Sequence[Any], ranked: dict[str, list[str]], ks: Sequence[int]) -> dict[str, float]:
    """HIT@k (the teacher's best in the top k) and NDCG@k over ``records`` for one encoder's rankings."""
    import ir_measures
    from ir_measures import Success, nDCG

    qrels = {r.id: {p.id: g for p, g in zip(r.passages, graded(r.teacher_scores))} for r in records}
    run = {qid: {pid: 1.0 / (i + 1) for i, pid in enumerate(order)} for qid, order in ranked.items()}
    measures = {f"{name}@{k}": m for k in ks for name, m in
                (("hit", Success(rel=LEVELS - 1) @ k), ("ndcg", nDCG @ k))}
    values = ir_measures.calc_aggregate(list(measures.values()), qrels, run)
    return {name: float(values[m]) for name, m in measures.items()}


def run_utility_ranking(cfg: Any, output_dir: Any) -> UtilityRankingResult:
    from omnimed.data.io import read_records
    from omnimed.data.records import UtilityExample
    from omnimed.evaluation.runner import finish_run
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.knowledge.types import index_text
    from omnimed.models.config import named_model_config

    task = cfg.task
    if not task.data:
        raise ValueError("task.data is not set: task=utility_ranking reads utility examples (the polyrag_utility "
                         "stage's folder or its records.jsonl)")
    path = Path(task.data)
    jsonl = path / "records.jsonl" if path.is_dir() else path
    if not jsonl.is_file():
        raise FileNotFoundError(f"task.data={task.data}: no records.jsonl there")
    records = [r for r in read_records(jsonl, UtilityExample) if r.metadata.get("split") == task.split]
    if task.max_queries:
        records = records[: task.max_queries]
    if not records:
        raise ValueError(f"task.data={task.data}: no utility examples of split {task.split!r}")
    output_dir = Path(output_dir)
    metrics: dict[str, float] = {"queries": float(len(records))}
    rows: list[dict[str, Any]] = []
    for name in task.encoders:
        encoder = TextEncoder(named_model_config(name))
        key = encoder_key(name)
        ranked: dict[str, list[str]] = {}
        for r in records:
            q = encoder.encode_queries([r.query])[0]
            cos = encoder.encode_docs([index_text(p) for p in r.passages]) @ q
            order = sorted(range(len(r.passages)), key=lambda i: -float(cos[i]))
            ranked[r.id] = [r.passages[i].id for i in order]
            rows.append({"encoder": key, "query_id": r.id, "ranked": ranked[r.id],
                         "teacher_best": r.passages[max(range(len(r.passages)), key=r.teacher_scores.__getitem__)].id})
        metrics.update({f"{key}/{m}": v for m, v in rank_metrics(records, ranked, task.ks).items()})
    logger_dir = finish_run(cfg, output_dir, rows=rows, metrics=metrics, run_name=f"utility-ranking-{task.split}",
                            job_type="evaluate-utility-ranking", lineage={"data": str(jsonl.resolve()),
                                                                         "queries": len(records)})
    return UtilityRankingResult(metrics, output_dir, logger_dir)


def report(result: UtilityRankingResult, cfg: Any, console: Any) -> float | None:
    """One row per encoder; returns the last encoder's NDCG at the largest k."""
    from rich.table import Table

    ks = list(cfg.task.ks)
    table = Table(title=f"omnimed-evaluate: utility ranking of {result.metrics['queries']:.0f} {cfg.task.split} queries")
    table.add_column("encoder")
    for k in ks:
        table.add_column(f"hit@{k}", justify="right")
        table.add_column(f"ndcg@{k}", justify="right")
    keys = [encoder_key(n) for n in cfg.task.encoders]
    for key in keys:
        table.add_row(key, *[f"{result.metrics[f'{key}/{m}@{k}']:.3f}" for k in ks for m in ("hit", "ndcg")])
    console.print(table)
    console.print(f"metrics.json and predictions.jsonl in {result.output_dir}"
                  + (f"; logger files in {result.logger_dir}" if result.logger_dir else ""))
    return result.metrics[f"{keys[-1]}/ndcg@{ks[-1]}"]

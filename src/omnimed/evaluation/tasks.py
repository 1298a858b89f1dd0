"""The evaluation tasks of ``omnimed-evaluate task=<name>``: each a runner with its config, its console report, the
metrics it writes (which the table manifests check a column against) and the override that picks its dataset."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from omnimed.evaluation import calibration, critic, qa, retrieval, utility_ranking


@dataclass(frozen=True)
class EvalTask:
    """``run(cfg, output_dir)`` -> a result; ``report(result, cfg, console)`` prints it and returns the value a
    sweep optimises; ``metrics``: fnmatch patterns of the metrics.json keys it writes (a retrieval run's
    ``<method>/<metric>`` is read as ``<metric>``); ``dataset_key``: the override that picks its dataset."""

    name: str
    config: type
    run: Callable[[Any, Any], Any]
    report: Callable[[Any, Any, Any], float | None]
    metrics: frozenset[str]
    dataset_key: str = "task.dataset"

    def produces(self, metric: str) -> bool:
        """Whether a run of this task writes ``metric``."""
        return any(fnmatchcase(metric, pattern) for pattern in self.metrics)


EVAL_TASKS: dict[str, EvalTask] = {
    t.name: t for t in (
        EvalTask("qa", qa.QATaskConfig, qa.run_qa_evaluation, qa.report,
                 frozenset({"accuracy", "statement_*_ratio", "statement_*_count", "luq", "luq/n"})),
        EvalTask("retrieval", retrieval.RetrievalTaskConfig, retrieval.run_retrieval_evaluation, retrieval.report,
                 frozenset({"hit@[0-9]*", "ndcg@[0-9]*", "recall@[0-9]*", "mrr"}), dataset_key="task.queries"),
        # a method's critic: accuracy overall and per label type (Self-BioRAG's four reflective-token types)
        EvalTask("critic_accuracy", critic.CriticAccuracyTaskConfig, critic.run_critic_evaluation, critic.report,
                 frozenset({"accuracy", "*/accuracy"})),
        # the synthetic world's difficulty against its targets; the world is the knowledge base's
        EvalTask("world_calibration", calibration.CalibrationTaskConfig, calibration.run_calibration,
                 calibration.report, frozenset({"*/hit@[0-9]*", "*/questions", "source/*", "reader/*", "recency/*",
                                                "targets/*"}), dataset_key="knowledge"),
        # encoders ranking held-out queries' passages by a teacher's utility (PolyRAG's distilled embedder)
        EvalTask("utility_ranking", utility_ranking.UtilityRankingTaskConfig, utility_ranking.run_utility_ranking,
                 utility_ranking.report, frozenset({"*/hit@[0-9]*", "*/ndcg@[0-9]*", "queries"}),
                 dataset_key="task.data"),
    )
}


def get_task(name: str) -> EvalTask:
    if name not in EVAL_TASKS:
        raise SystemExit(f"task={name}: no evaluation runner for it (available: {', '.join(EVAL_TASKS)})")
    return EVAL_TASKS[name]

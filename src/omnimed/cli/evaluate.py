"""``omnimed-evaluate``: evaluation runs composed from ``conf/evaluate.yaml``.

    omnimed-evaluate task=retrieval                                   # the world's questions, knowledge=world_small
    omnimed-evaluate task=retrieval knowledge=realdata task.queries=pubmedqa task.split=null
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import checks_task, conf_dir, console
from omnimed.cli.schema import register_evaluate_configs

register_evaluate_configs()

SHOWN = ("queries", "hit@1", "hit@5", "hit@10", "ndcg@10", "recall@10", "mrr")


def print_retrieval(result, title: str) -> None:
    table = Table(title=title)
    table.add_column("method", no_wrap=True)
    for col in SHOWN:
        table.add_column(col, justify="right")
    for method, row in result.metrics.items():
        table.add_row(method, *[f"{row[c]:.0f}" if c == "queries" else f"{row.get(c, float('nan')):.3f}"
                                for c in SHOWN])
    console.print(table)
    console.print(f"metrics.json and predictions.jsonl in {result.output_dir}"
                  + (f"; logger files in {result.logger_dir}" if result.logger_dir else ""))


@checks_task("evaluate")  # task=NAME of the other app, or of none: a clear message before Hydra composes
@hydra.main(config_path=conf_dir(), config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    obj = OmegaConf.to_object(cfg)
    output_dir = HydraConfig.get().runtime.output_dir
    if obj.task.name == "retrieval":
        from omnimed.evaluation.retrieval import run_retrieval_evaluation

        result = run_retrieval_evaluation(obj, output_dir)
        print_retrieval(result, f"omnimed-evaluate: retrieval on {obj.knowledge.name} ({obj.task.queries})")
        best = max(result.metrics.values(), key=lambda r: r.get("ndcg@10", 0.0))
        return best.get("ndcg@10")
    if obj.task.name == "qa":
        from omnimed.evaluation.qa import run_qa_evaluation

        result = run_qa_evaluation(obj, output_dir)
        m = result.metrics
        table = Table(title=f"omnimed-evaluate: {obj.pipeline.name} on {obj.task.dataset} ({obj.backend.name})",
                      show_header=False)
        if "accuracy" in m:
            table.add_row("accuracy", f"{m['accuracy']:.4f}  [95% CI {m['accuracy_ci_low']:.4f}, "
                                      f"{m['accuracy_ci_high']:.4f}]  SE {m['accuracy_stderr']:.4f}")
            table.add_row("questions", f"{m['n']:.0f} x {m['seeds']:.0f} seed(s); std over seeds "
                                       f"{m['accuracy_std']:.4f}")
        else:  # open answers, judged statement by statement
            for label in ("correct", "incorrect", "not_mentioned", "unparsed"):
                count = m.get(f"statement_{label}_count")
                table.add_row(f"statements {label}", f"{m[f'statement_{label}_ratio']:.3f} of an answer"
                              + (f", {count:.2f} per answer" if count is not None else ""))
            table.add_row("questions", f"{m['n']:.0f} x {m['seeds']:.0f} seed(s); "
                                       f"{m['answers_without_statements']:.0f} answers without statements")
        table.add_row("missing / malformed answers", f"{m['missing_answers']:.0f}"
                      + (f"  ({', '.join(f'{k}: {v}' for k, v in result.problems.items())})" if result.problems else ""))
        table.add_row("outputs", f"{result.output_dir}/metrics.json, predictions.jsonl"
                      + (f"; logger: {result.logger_dir}" if result.logger_dir else ""))
        console.print(table)
        return m.get("accuracy", m.get("statement_correct_ratio"))
    if obj.task.name == "critic_accuracy":
        from omnimed.evaluation.critic import TYPES, run_critic_evaluation

        result = run_critic_evaluation(obj, output_dir)
        m = result.metrics
        table = Table(title=f"omnimed-evaluate: critic accuracy on {obj.task.dataset} ({obj.task.split})")
        for col in ("type", "n", "accuracy", "95% CI", "majority", "outside set"):
            table.add_column(col, justify="right" if col != "type" else "left")
        for kind in (*TYPES, "all"):
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
    raise SystemExit(f"task={obj.task.name}: no evaluation runner for it (available: retrieval, qa, critic_accuracy)")


if __name__ == "__main__":
    main()

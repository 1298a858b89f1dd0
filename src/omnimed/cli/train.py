"""``omnimed-train``: train a model from the composed Hydra config (``conf/train.yaml``).

    omnimed-train                                   # the default job: SmolLM2-135M + LoRA on the world, CPU
    omnimed-train model=tiny-llama data=world_tiny  # seconds
    omnimed-train run_name=r1 ckpt_path=last        # resume run r1 from its last checkpoint
    omnimed-train -m task.lr=1e-4,3e-4 hydra/launcher=joblib   # a local sweep
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.table import Table

from omnimed.cli.common import checks_task, conf_dir, console, one_line_errors
from omnimed.training.config import register_train_configs

register_train_configs()


def print_summary(result) -> None:
    """The run's outputs and final metrics, titled with its run name (a sweep's jobs print one after another)."""
    table = Table(title=f"omnimed-train: done: {result.run_dir.name}", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # paths in full, folded at the console's width, never cut
    table.add_row("checkpoint", str(result.run_dir / "lightning" / "last.ckpt"))
    if result.hf_dir is not None:
        table.add_row("HF export", str(result.hf_dir))
    table.add_row("run directory", str(result.output_dir))
    if result.logger_dir:
        table.add_row("logger files", str(result.logger_dir))
    table.add_row("metrics.json", str(result.output_dir / "metrics.json"))
    if getattr(result, "profiler_report", None) is not None:
        table.add_row("profiler report", str(result.profiler_report))
    for key in sorted(result.metrics):
        table.add_row(key, f"{result.metrics[key]:.4g}")
    console.print(table)


@checks_task("train")  # task=NAME of the other app, or of none: a clear message before Hydra composes
@hydra.main(config_path=conf_dir(), config_name="train", version_base="1.3")
@one_line_errors("omnimed-train")  # an invalid value, a missing data.path, ...: one line naming the key, exit code 2
def main(cfg: DictConfig) -> float | None:
    from hydra.types import RunMode

    from omnimed.cli.quiet import quiet_console
    from omnimed.training.engine import train

    quiet_console()
    hc = HydraConfig.get()
    job_num = hc.job.num if hc.mode == RunMode.MULTIRUN else None  # sweep jobs get distinct default run names
    result = train(cfg, output_dir=hc.runtime.output_dir, job_num=job_num,
                   job_overrides=list(hc.overrides.task) if job_num is not None else ())
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print_summary(result)
    # the value an Optuna sweep minimises
    return result.metrics.get("val/loss", result.metrics.get("train/loss_last"))


if __name__ == "__main__":
    main()

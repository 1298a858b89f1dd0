"""``omnimed-build``: run one data-construction stage of a method (``conf/stage/``, or any stage a registered method
declares).

    omnimed-build stage=<stage> backend=oracle                       # the world's oracle as teacher
    omnimed-build stage=<stage> backend=hf backend.model=checkpoints/<task>/<run>/hf

A finished stage (its folder holds manifest.json) is not redone; an interrupted one continues where it stopped.
A stage whose backend calls failed for more than ``max_failed_share`` of its items exits non-zero with one line
naming the backend and the first error, and writes no manifest.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console, fail, one_line_errors
from omnimed.methods.stages import register_build_configs, run_stage

register_build_configs()


@hydra.main(config_path=conf_dir(), config_name="build", version_base="1.3")
@one_line_errors("omnimed-build")  # a bad value, path or stage folder: one line naming it, exit code 2
def main(cfg: DictConfig) -> None:
    from omnimed.cli.quiet import quiet_console
    from omnimed.data.artifacts import RunFailed
    from omnimed.generation.types import GenerationError

    quiet_console()
    obj = OmegaConf.to_object(cfg)
    try:
        result = run_stage(obj, log=console.print)
    except (RunFailed, GenerationError) as exc:  # the backend failed: one line, exit code 1, no manifest
        fail("omnimed-build", str(exc), code=1)
    table = Table(title=f"omnimed-build: {obj.stage.name}" + (" (already built)" if result.reused else ""),
                  show_header=False)
    table.add_row("output", str(result.path))
    for key, value in result.counts.items():
        table.add_row(key, str(value))
    console.print(table)


if __name__ == "__main__":
    main()

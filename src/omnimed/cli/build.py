"""``omnimed-build``: run one data-construction stage of a method (``conf/stage/``, or any stage a registered method
declares).

    omnimed-build stage=<stage> backend=oracle                       # the world's oracle as teacher
    omnimed-build stage=<stage> backend=hf backend.model=checkpoints/<task>/<run>/hf

A finished stage (its folder holds manifest.json) is not redone; an interrupted one continues where it stopped.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console
from omnimed.methods.stages import register_build_configs, run_stage

register_build_configs()


@hydra.main(config_path=conf_dir(), config_name="build", version_base="1.3")
def main(cfg: DictConfig) -> None:
    obj = OmegaConf.to_object(cfg)
    result = run_stage(obj, log=console.print)
    table = Table(title=f"omnimed-build: {obj.stage.name}" + (" (already built)" if result.reused else ""),
                  show_header=False)
    table.add_row("output", str(result.path))
    for key, value in result.counts.items():
        table.add_row(key, str(value))
    console.print(table)


if __name__ == "__main__":
    main()

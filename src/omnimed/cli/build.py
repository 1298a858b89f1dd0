"""``omnimed-build``: run one data-construction stage of a paper (``conf/stage/``).

    omnimed-build stage=selfbiorag_critic_data                          # the world's oracle labels critic data
    omnimed-build stage=selfbiorag_generator_data backend=hf backend.model=checkpoints/critic/<run>/hf

A finished stage (its folder holds manifest.json) is not redone; an interrupted one continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console
from omnimed.cli.schema import register_build_configs

register_build_configs()

STAGES = ("selfbiorag_critic_data", "selfbiorag_generator_data")


def _backend(cfg, knowledge):
    from omnimed.generation.factory import build_backend

    world = None
    if cfg.backend.name == "oracle":
        from omnimed.knowledge.corpus import world_of

        world = world_of(knowledge)
    return build_backend(cfg.backend, model=cfg.model, world=world, cache_root=Path(cfg.paths.cache))


def _knowledge_base(knowledge, root: Path, progress: bool):
    from omnimed.knowledge.build import build_knowledge_base

    return build_knowledge_base(knowledge, root, progress=progress)


def run_stage(cfg):
    """Run the stage ``cfg.stage.name`` names; returns its :class:`~omnimed.stages.StageResult`."""
    stage, knowledge, root = cfg.stage, cfg.knowledge, Path(cfg.paths.root)
    log = console.print
    if stage.name == "selfbiorag_critic_data":
        from omnimed.methods.selfbiorag.critic_data import build_critic_data

        kb = _knowledge_base(knowledge, root, cfg.progress) if stage.evidence_k else None
        return build_critic_data(stage, teacher=_backend(cfg, knowledge), kb=kb, knowledge=knowledge, root=str(root),
                                 progress=cfg.progress, log=log)
    if stage.name == "selfbiorag_generator_data":
        from omnimed.methods.selfbiorag.generator_data import build_generator_data

        kb = _knowledge_base(knowledge, root, cfg.progress)
        return build_generator_data(stage, critic=_backend(cfg, knowledge), kb=kb, knowledge=knowledge,
                                    root=str(root), progress=cfg.progress, log=log)
    raise SystemExit(f"stage={stage.name}: no such stage; stages: {', '.join(STAGES)}")


@hydra.main(config_path=conf_dir(), config_name="build", version_base="1.3")
def main(cfg: DictConfig) -> None:
    obj = OmegaConf.to_object(cfg)
    result = run_stage(obj)
    table = Table(title=f"omnimed-build: {obj.stage.name}" + (" (already built)" if result.reused else ""),
                  show_header=False)
    table.add_row("output", str(result.path))
    for key, value in result.counts.items():
        table.add_row(key, str(value))
    console.print(table)


if __name__ == "__main__":
    main()

"""``omnimed-data``: materialise the synthetic world, or convert a real benchmark/corpus file into records.

    omnimed-data world size=small seed=0 out=DIR
    omnimed-data convert format=NAME path=INPUT out=DIR [skip_invalid=true]

Both write ``DIR/records.jsonl``, the HF dataset ``DIR/hf`` and ``DIR/manifest.json`` (counts, fingerprint).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console, one_line_errors
from omnimed.data.world.difficulty import DifficultyConfig

COMMANDS = ("world", "convert")


@dataclass
class DataPaths:
    """``paths.root``, the key every omnimed command takes, so ``out=${paths.root}/...`` works here too (a table's
    prepare steps pass it)."""

    root: str = "."


@dataclass
class WorldCommand:
    size: str = "small"
    seed: int = 0
    out: str = MISSING
    paths: DataPaths = field(default_factory=DataPaths)
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)


@dataclass
class ConvertCommand:
    format: str = MISSING
    path: str = MISSING
    out: str = MISSING
    skip_invalid: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    paths: DataPaths = field(default_factory=DataPaths)


cs = ConfigStore.instance()
cs.store(name="data_world", node=WorldCommand)
cs.store(name="data_convert", node=ConvertCommand)


def _summary(title: str, out: Path, manifest: dict, seconds: float) -> None:
    table = Table(title=title)
    table.add_column("records")
    table.add_column("count", justify="right")
    for kind, n in manifest["counts"].items():
        table.add_row(kind, str(n))
    console.print(table)
    console.print(f"wrote [bold]{out}[/] in {seconds:.1f}s  fingerprint {manifest['fingerprint'][:16]}")


def run_world(cfg: WorldCommand) -> dict:
    from omnimed.data.world import build_world
    from omnimed.data.world.difficulty import world_knobs

    start = time.perf_counter()
    with console.status(f"building the synthetic world (size={cfg.size}, seed={cfg.seed})"):
        world = build_world(seed=cfg.seed, size=cfg.size, difficulty=world_knobs(cfg.difficulty))
    with console.status(f"writing {sum(world.counts().values())} records"):
        manifest = world.save(cfg.out)
    _summary("synthetic world", Path(cfg.out), manifest, time.perf_counter() - start)
    return manifest


def run_convert(cfg: ConvertCommand) -> dict:
    from omnimed.data.errors import LoadReport
    from omnimed.data.formats import load_format
    from omnimed.data.io import save_record_set

    start = time.perf_counter()
    report = LoadReport()
    with console.status(f"reading {cfg.path} as {cfg.format}"):
        records = load_format(
            cfg.format, cfg.path, skip_invalid=cfg.skip_invalid, report=report, **dict(cfg.options)
        )
    if not records:
        raise ValueError(f"{cfg.path}: no records read as format={cfg.format} ({report.summary()})")
    with console.status(f"writing {len(records)} records"):
        manifest = save_record_set(
            cfg.out,
            records,
            extra={
                "source": {"format": cfg.format, "path": str(Path(cfg.path).resolve())},
                "load_report": report.as_dict(),
            },
        )
    if report.n_skipped:
        console.print(f"[yellow]{report.summary()}[/]")
    _summary(f"{cfg.format} -> records", Path(cfg.out), manifest, time.perf_counter() - start)
    return manifest


def _hydra_app(command: str):
    runner = {"world": run_world, "convert": run_convert}[command]

    @hydra.main(config_path=conf_dir(), config_name=f"data_{command}", version_base="1.3")
    @one_line_errors(f"omnimed-data {command}")  # a bad path, file or record: one line naming it, exit code 2
    def app(cfg) -> None:
        runner(OmegaConf.to_object(cfg))

    return app


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        console.print(f"usage: omnimed-data {{{'|'.join(COMMANDS)}}} key=value ...  (see --help after the command)")
        sys.exit(2)
    command = sys.argv.pop(1)
    # a data command writes where `out` says; Hydra's own run folder is kept out of the way
    sys.argv[1:1] = ["hydra.run.dir=outputs/data/${now:%Y-%m-%d_%H-%M-%S}-${omnimed.pid:}", "hydra.job.chdir=false"]
    _hydra_app(command)()


if __name__ == "__main__":
    main()

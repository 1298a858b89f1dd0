"""``omnimed-index``: build, or reuse, the indexes of a knowledge base.

    omnimed-index                               # knowledge=world_small: BM25 + MiniLM/FAISS per source + graph
    omnimed-index knowledge=realdata            # the real files under OMNIMED_REALDATA
    omnimed-index knowledge=world_large knowledge.dense.index=hnsw
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from omnimed.cli.common import conf_dir, console, one_line_errors
from omnimed.knowledge.config import register_index_configs

register_index_configs()


def print_report(name: str, report: list[dict]) -> None:
    table = Table(title=f"omnimed-index: {name}")
    for col in ("source", "documents", "passages / concepts", "built now", "seconds"):
        table.add_column(col, no_wrap=True)
    table.add_column("directory", overflow="fold")
    for row in report:
        table.add_row(
            row["source"],
            str(row.get("documents", "")),
            str(row.get("passages", row.get("concepts", ""))),
            ", ".join(row["built"]) or "nothing (reused)",
            f"{row['seconds']:.1f}",
            row["directory"],
        )
    console.print(table)


@hydra.main(config_path=conf_dir(), config_name="index", version_base="1.3")
@one_line_errors("omnimed-index")  # a missing corpus, file or key: one line naming it, exit code 2
def main(cfg: DictConfig) -> None:
    from omnimed.cli.quiet import quiet_console
    from omnimed.knowledge.build import build_knowledge_base

    quiet_console()
    knowledge = OmegaConf.to_object(cfg.knowledge)
    report: list[dict] = []
    build_knowledge_base(knowledge, Path(cfg.paths.root), progress=cfg.progress, report=report)
    print_report(knowledge.name, report)


if __name__ == "__main__":
    main()

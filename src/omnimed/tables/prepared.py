"""When a table's prepared artifacts (the models and builds of its ``prepare`` steps) were made, and so which
finished runs still compute what a run would now: a run that finished before a model it reads was retrained is
stale, and one that finished before a model only other rows read is not."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from omnimed.tables.manifest import TableManifest

if TYPE_CHECKING:
    from omnimed.tables.reproduce import RowPlan


def artifact_root(extra: list[str] | None) -> Path:
    """Where prepared artifacts live: ``paths.root`` from the extra overrides, else the working directory."""
    for item in extra or []:
        if item.startswith("paths.root="):
            return Path(item.split("=", 1)[1])
    return Path(".")


def prepared_for_rows(manifest: TableManifest, preset: str, extra: list[str] | None,
                      plans: Sequence[RowPlan]) -> dict[str, float]:
    """Per row, when the newest prepared artifact it may read was made: the artifacts its overrides name, and
    those that no row names (a build or a model read through defaults counts for every row). A model that only
    other rows name (table 7's DPO-only planner) does not make this row's finished runs stale."""
    made = _artifact_times(manifest, preset, extra)
    named = {path: {plan.row.name for plan in plans if any(_names(o, path) for o in plan.overrides)} for path in made}
    return {plan.row.name: max((when for path, when in made.items() if not named[path] or plan.row.name in named[path]),
                               default=0.0) for plan in plans}


def _artifact_times(manifest: TableManifest, preset: str, extra: list[str] | None) -> dict[str, float]:
    root = artifact_root(extra)
    return {step.creates: (root / step.creates).stat().st_mtime for step in manifest.prepare.get(preset, [])
            if (root / step.creates).exists()}


def _names(override: str, path: str) -> bool:
    """``override``'s value holds the artifact path ``path`` whole (not as the prefix of a longer name)."""
    return re.search(rf"(?<![\w.-]){re.escape(path)}(?![\w.-])", override) is not None

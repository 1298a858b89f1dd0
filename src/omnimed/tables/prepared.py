"""A table's ``prepare`` steps (the models and builds its rows read): which steps the rows to run need, their
commands (composed before anything runs), and when their artifacts were made, so which finished runs still
compute what a run would now: a run that finished before a model it reads was retrained is stale, and one that
finished before a model only other rows read is not."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from omnimed.tables.manifest import ManifestError, PrepareStep, TableManifest

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
    """Per row, when the newest prepared artifact it may read was made: those of the steps it needs
    (:func:`steps_for_rows`: the artifacts its overrides name, those read through defaults, and what their steps
    read in turn). A model that only other rows name (table 7's DPO-only planner, table 8's planners trained
    without one source) does not make this row's finished runs stale."""
    made = _artifact_times(manifest, preset, extra)
    steps = manifest.prepare.get(preset, [])
    out = {}
    for plan in plans:
        need = steps_for_rows(manifest, preset, plans, {plan.row.name})
        out[plan.row.name] = max((made[s.creates] for s in steps if s.name in need and s.creates in made), default=0.0)
    return out


def steps_for_rows(manifest: TableManifest, preset: str, plans: Sequence[RowPlan], rows: set[str]) -> set[str]:
    """Names of the prepare steps ``rows`` need: those making an artifact the rows' overrides name, or one that no
    row and no step names (read through defaults, as a training preset reads its data), and, in turn, the steps
    whose artifacts a needed step's command names. So ``--rows`` on table 4's No Retrieval row trains none of the
    baselines' planners."""
    steps = manifest.prepare.get(preset, [])

    def named_by(texts: Sequence[str], step: PrepareStep) -> bool:
        folder = step.creates.removesuffix("/manifest.json")  # a build is named by its folder
        return any(_names(text, folder) or _names_by_pattern(text, folder) for text in texts)

    every_row = [o for plan in plans for o in plan.overrides]
    chosen = [o for plan in plans if plan.row.name in rows for o in plan.overrides]
    need = {s.name for s in steps if named_by(chosen, s) or (
        not named_by(every_row, s) and not any(named_by(other.command, s) for other in steps if other is not s))}
    grew = True
    while grew:
        more = {s.name for s in steps for user in steps if user.name in need and named_by(user.command, s)}
        grew, need = not more <= need, need | more
    return need


def _artifact_times(manifest: TableManifest, preset: str, extra: list[str] | None) -> dict[str, float]:
    root = artifact_root(extra)
    return {step.creates: (root / step.creates).stat().st_mtime for step in manifest.prepare.get(preset, [])
            if (root / step.creates).exists()}


def _names_by_pattern(text: str, path: str) -> bool:
    """``text`` names ``${paths.root}/<path>`` with a ``{field}`` the method fills in at run time (table 8's
    ``...-ood-{source}/hf`` names each held-out source's planner)."""
    for named in re.findall(r"\$\{paths\.root\}/([^\s'\",\]]+)", text):
        parts = re.split(r"(?<!\$)\{\w+\}", named)
        if len(parts) > 1 and re.fullmatch(r"[\w.-]+".join(map(re.escape, parts)), path):
            return True
    return False


def _names(override: str, path: str) -> bool:
    """``override``'s value holds the artifact path ``path`` whole (not as the prefix of a longer name)."""
    return re.search(rf"(?<![\w.-]){re.escape(path)}(?![\w.-])", override) is not None


def step_command(step: PrepareStep, extra: list[str] | None) -> list[str]:
    """The step's command with this environment's executable and the table's ``paths.root``."""
    root = [item for item in extra or [] if item.startswith("paths.root=")]
    return [str(Path(sys.executable).parent / step.command[0]), *step.command[1:], *root]


_COMPOSED: set[tuple[str, ...]] = set()  # prepare commands already composed in this process (tables share recipes)


def validate_prepare(manifest: TableManifest, preset: str, extra: list[str] | None) -> None:
    """Compose every prepare step that still has to run (its app's ``--cfg job``), so a bad one fails first."""
    root = artifact_root(extra)
    for step in manifest.prepare.get(preset, []):
        command = tuple(step_command(step, extra))
        if (root / step.creates).exists() or command in _COMPOSED:
            continue
        res = subprocess.run([*command, "--cfg", "job"], text=True, capture_output=True)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-6:]
            raise ManifestError(f"{manifest.group}: prepare step {step.name!r} does not compose: " + " | ".join(tail))
        _COMPOSED.add(command)


NOT_NEEDED = "not needed by the rows to run"


def rows_to_run(plans: list[RowPlan], preset: str, rows: Sequence[str]) -> set[str] | None:
    """The rows a table runs (None: every row): those ``--rows`` names, else every row but those whose manifest
    says why they are not run at ``preset`` (``not_run``); with the rows whose run they share."""
    asked = set(rows) or ({plan.row.name for plan in plans if not plan.row.not_run.get(preset)}
                          if any(plan.row.not_run.get(preset) for plan in plans) else set())
    if not asked:
        return None
    return {*asked, *(plan.same_as for plan in plans if plan.row.name in asked and plan.same_as)}

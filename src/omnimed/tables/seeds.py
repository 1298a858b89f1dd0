"""Training seeds of a reproduced table: which artifacts a seed names, which rows move with it, and the spread
of each cell over the seeds (``<table>.seeds.json``), stored so a later run states it and a seed measured in an
earlier session (on another machine, say) counts without its models."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from omnimed.tables.manifest import PrepareStep, TableManifest, fill_seed
from omnimed.tables.report import Cell, paired_cell

if TYPE_CHECKING:
    from omnimed.tables.reproduce import RowPlan


def mark_seed_independent_runs(plans_by_seed: dict[int, list[RowPlan]]) -> None:
    """Point each row of a later training seed whose runs compose to the same configs as a row's runs at an earlier
    seed at that run (``same_as_seed``): a baseline that reads no seeded model computes the same thing for every
    seed, so a spread over seeds runs it once."""
    first: dict[tuple, tuple[int, str]] = {}
    for seed, plans in plans_by_seed.items():
        for plan in plans:
            if plan.fingerprint and plan.same_as is None:
                earlier = first.setdefault(plan.fingerprint, (seed, plan.row.name))
                plan.same_as_seed = earlier if earlier[0] != seed else None


def for_training_seed(manifest: TableManifest, seed: int) -> TableManifest:
    """The manifest with ``{train_seed}`` and ``{seed_tag}`` filled in wherever they appear (a seeded recipe's
    command and ``creates``, the preset and row overrides that read its model), so one seed's training and the rows
    that read it use that seed's artifacts. A step that, filled in, repeats an earlier one (a recipe pinned to
    the seed the table trains with) is listed once."""
    text = fill_seed(manifest.model_dump_json(), seed)
    seeded = TableManifest.model_validate_json(text, context={"papers": {r.method for r in manifest.rows}})
    for preset, steps in seeded.prepare.items():
        distinct: dict[tuple, PrepareStep] = {}
        for step in steps:
            distinct.setdefault((tuple(step.command), step.creates), step)
        seeded.prepare[preset] = list(distinct.values())
    return seeded


def seed_spread(manifest: TableManifest, per_seed: dict[int, dict[str, dict[str, Cell]]], preset: str,
                ran_once: Sequence[str] = (), previous: dict | None = None) -> dict:
    """Our number per (row, column) for each training seed, for the record of how much trained rows move;
    ``ran_once``: the rows that read nothing trained with the seed (run at the first seed only). With a
    ``paired_against`` row, also each row's paired difference from it per seed (``paired``: [mean, half-width] or
    None), taken from ``previous`` (the stored spread) for a seed read back without its per-question outcomes."""
    values = {row.name: {col: [per_seed[s].get(row.name, {}).get(col, Cell()).ours for s in per_seed]
                         for col in manifest.columns} for row in manifest.rows}
    failed = [s for s, rows in per_seed.items() if any(c.status.startswith("failed") for r in rows.values()
                                                        for c in r.values())]
    out = {"preset": preset, "seeds": list(per_seed), "measured": date.today().isoformat(), "values": values,
           "ran_once": list(ran_once), "definitions": row_definitions(manifest, preset, ran_once), "failed": failed}
    if ref := manifest.paired_against:
        before = (previous or {}).get("paired", {})
        earlier = {seed: i for i, seed in enumerate((previous or {}).get("seeds", []))}

        def pair(seed: int, row: str, col: str) -> list[float] | None:
            cells = per_seed[seed]
            found = paired_cell(manifest, col, cells.get(ref, {}).get(col), cells.get(row, {}).get(col))
            if found is None and seed in earlier:
                stored = before.get(row, {}).get(col, [])
                return stored[earlier[seed]] if earlier[seed] < len(stored) else None
            return list(found) if found else None

        out["paired"] = {row.name: {col: [pair(s, row.name, col) for s in per_seed] for col in manifest.columns}
                         for row in manifest.rows if row.name != ref}
    return out


def row_definitions(manifest: TableManifest, preset: str, ran_once: Sequence[str] = ()) -> dict[str, str]:
    """A digest per row of what the manifest makes its runs at ``preset`` (the table's task, metrics, preset,
    datasets and column overrides, the row's own overrides and, unless the row reads nothing trained with the seed
    (``ran_once``), the prepare steps): a stored spread is stated only for rows whose definition is unchanged."""
    shared = {"table": manifest.model_dump(include={"task", "metric", "metrics", "column_overrides"}),
              "preset": manifest.presets.get(preset), "datasets": manifest.datasets.get(preset)}
    prepare = [step.model_dump() for step in manifest.prepare.get(preset, [])]
    out = {}
    for row in manifest.rows:
        own = {"row": row.model_dump(include={"method", "overrides", "column_overrides"}),
               "row_preset": row.preset_overrides.get(preset), "prepare": None if row.name in ran_once else prepare}
        out[row.name] = hashlib.sha256(json.dumps([shared, own], sort_keys=True).encode()).hexdigest()[:16]
    return out


def seed_independent_rows(plans_by_seed: dict[int, list[RowPlan]]) -> list[str]:
    """The rows that every later seed took from an earlier one (``same_as_seed``), with the rows that are their
    runs at this preset (``same_as``): their numbers cannot move with the training seed."""
    later = list(plans_by_seed.values())[1:]
    if not later:
        return []
    once: list[str] = []
    for plan in later[0]:
        if all(p.same_as_seed is not None for plans in later for p in plans if p.row.name == plan.row.name):
            once.append(plan.row.name)
        elif plan.same_as in once:
            once.append(plan.row.name)
    return once


def read_seed_spread(path: Path, manifest: TableManifest, preset: str) -> dict | None:
    """The stored spread over training seeds of this table at ``preset``, if one was measured, less the rows whose
    definition changed since (listed under ``changed``: their spread no longer describes them)."""
    if not path.is_file():
        return None
    spread = json.loads(path.read_text())
    if spread.get("preset") != preset:
        return None
    stored = spread.get("definitions", {})
    now = row_definitions(manifest, preset, spread.get("ran_once", []))
    kept = [name for name in spread["values"] if name in now and stored.get(name) == now[name]]
    changed = [name for name in spread["values"] if name in now and name not in kept]  # rows since removed: dropped
    spread["values"] = {name: spread["values"][name] for name in kept}
    spread["ran_once"] = [name for name in spread.get("ran_once", []) if name in kept]
    ref_kept = manifest.paired_against in kept  # a pair holds while both of its rows are defined as when measured
    spread["paired"] = {name: v for name, v in spread.get("paired", {}).items() if ref_kept and name in kept}
    return {**spread, "changed": changed}


def stored_seed_cells(spread: dict | None, manifest: TableManifest, seeds: Sequence[int],
                      main: int) -> dict[int, dict[str, dict[str, Cell]]]:
    """The seeds of ``seeds`` (the report's own ``main`` seed excepted: its table needs its predictions) whose
    numbers a stored spread (:func:`read_seed_spread`) already holds for every row of the table as defined now:
    a seed-spread run does not train and run them again, so a seed measured in an earlier session (on another
    machine, say) counts without its models. A seed with a failed cell is not among them: it runs again."""
    if not spread or spread.get("changed"):
        return {}
    runnable = [row.name for row in manifest.rows if row.status == "runnable"]
    if any(name not in spread["values"] for name in runnable):
        return {}
    out: dict[int, dict[str, dict[str, Cell]]] = {}
    for i, seed in enumerate(spread["seeds"]):
        if seed == main or seed not in seeds or seed in spread.get("failed", []):  # a failed run is measured again
            continue
        out[seed] = {name: {col: Cell(ours=values[i], status="measured" if values[i] is not None else "missing",
                                      run_dir=f"stored in {manifest.table}.seeds.json")
                            for col, values in spread["values"][name].items()} for name in runnable}
    return out

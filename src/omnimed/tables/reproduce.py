"""Run every row of a paper table: expand rows into ``omnimed-evaluate`` multiruns, collect, report.

Each runnable row becomes one Hydra multirun over the table's distinct datasets at the chosen preset (so
``hydra/launcher=submitit_slurm`` spreads a table over a cluster and ``joblib`` over local cores). Every run lands in
the table's W&B group. Before anything runs, every dataset key is checked (an unknown one stops the table, naming
the row and column; a paper benchmark that no loader reads yet leaves its cells missing, with the reason) and every
run's overrides are composed with the chosen launcher, so a bad row or launcher setting fails first, by name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from omnimed.data.artifacts import atomic_write_text
from omnimed.evaluation.datasets import dataset_status, known_datasets
from omnimed.evaluation.runner import FAILED_FILE, UNDEFINED_FILE
from omnimed.tables.detectable import answer_skew, detectable_difference, question_outcomes
from omnimed.tables.manifest import (
    AVERAGE,
    DEFAULT_TRAINING_SEED,
    ManifestError,
    Row,
    TableManifest,
    eval_tasks,
    runnable_methods,
    seed_tag,
)
from omnimed.tables.prepared import (
    NOT_NEEDED,
    artifact_root,
    prepared_for_rows,
    rows_to_run,
    step_command,
    steps_for_rows,
    validate_prepare,
)
from omnimed.tables.provenance import other_code
from omnimed.tables.report import Cell, Detectable, fill_averages, stored_name, write_report
from omnimed.tables.resume import (
    compose_run,
    evaluate_configs,
    finished_runs,
    run_config_text,
    stored_runs_today,
)
from omnimed.tables.seeds import (
    for_training_seed,
    mark_seed_independent_runs,
    read_seed_spread,
    seed_independent_rows,
    seed_spread,
    stored_seed_cells,
)
from omnimed.tables.stored import load_store, store_path, stored_cells, stored_run, write_store

MINIATURE = "miniature"
DEFAULT_LAUNCHER = "basic"
LAUNCHER_GROUP = "hydra/launcher="


@dataclass
class RowPlan:
    row: Row
    slug: str
    overrides: list[str]
    datasets: dict[str, list[str]] = field(default_factory=dict)  # dataset key -> the columns it fills
    # column -> its dataset key, for a column with its own overrides (the manifest's or the row's
    # column_overrides): run on its own, with those overrides (``column_extra``)
    alone: dict[str, str] = field(default_factory=dict)
    column_extra: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # column -> why it is not run (no loader for its data)
    # the row's own overrides composed last, where the preset sets one of the same keys: at miniature scale the
    # preset hides them, but a row naming an option that does not exist is wrong at every scale and must fail
    # validation (empty where no key is set twice: then the order changes nothing)
    row_last: list[str] = field(default_factory=list)
    # what the row's runs compute (set by validate(): each run's composed config, less what only names it); a row
    # with the same fingerprint as an earlier one is not run again: it takes that row's cells (``same_as``)
    fingerprint: tuple = ()
    same_as: str | None = None
    # under --training-seeds: (an earlier training seed, its row) whose run computes the same as this row's (a row
    # that reads no seeded artifact, such as a BM25 baseline): this seed takes that run's cells, not running it again
    same_as_seed: tuple[int, str] | None = None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "row"


def row_cell_status(row: Row) -> str:
    """What a row that does not run shows in its cells: ``external``, ``missing`` (method not built) or
    ``missing: <why>`` (its method is built but, e.g., its table's metric is not produced yet)."""
    if row.status != "missing" or row.method not in runnable_methods():
        return row.status
    return f"missing: {row.reason}"


def split_launcher(launcher: str, extra: list[str] | None) -> tuple[str, list[str]]:
    """The launcher to use and the extra overrides without it: ``hydra/launcher=X`` among the extra overrides is
    the same choice as ``--launcher X`` (given once, it is passed once); two different choices are an error."""
    rest, named = [], []
    for item in extra or []:
        (named if item.startswith(LAUNCHER_GROUP) else rest).append(item)
    choices = {item[len(LAUNCHER_GROUP):] for item in named}
    if launcher != DEFAULT_LAUNCHER:
        choices.add(launcher)
    if len(choices) > 1:
        raise ManifestError(f"two launchers given ({', '.join(sorted(choices))}): use --launcher once")
    return (choices.pop() if choices else launcher), rest


def plan_rows(manifest: TableManifest, preset: str, extra: list[str] | None = None) -> list[RowPlan]:
    """The runs of every runnable row: preset + row overrides, and which dataset fills which column."""
    if preset not in manifest.presets:
        raise ManifestError(f"{manifest.group}: no preset {preset!r}; presets: {sorted(manifest.presets)}")
    if preset not in manifest.datasets:
        raise ManifestError(f"{manifest.group}: no datasets for preset {preset!r}")
    plans, seen = [], set()
    for row in manifest.rows:
        if row.status != "runnable":
            continue
        name = slug(row.name)
        while name in seen:
            name += "-x"
        seen.add(name)
        # at miniature scale the preset wins (it stands a CPU model and corpus in for every production one);
        # at any other scale the row's own choices (its reader, its planner) win over the preset's defaults
        own = [*row.overrides, *row.preset_overrides.get(preset, [])]
        ordered = ([*own, *manifest.presets[preset]] if preset == MINIATURE
                   else [*manifest.presets[preset], *own])
        task = manifest.task_of(row)
        overrides = [f"task={task}", *ordered, *(extra or [])]
        others = {o.lstrip("+~").split("=", 1)[0] for o in [*manifest.presets[preset], *(extra or [])]}
        collide = any(o.lstrip("+~").split("=", 1)[0] in others for o in own)  # else the order changes nothing
        plan = RowPlan(row, name, overrides,
                       row_last=[f"task={task}", *manifest.presets[preset], *(extra or []), *own] if collide else [])
        for col in manifest.columns:
            key = manifest.datasets[preset][col]
            if key == AVERAGE:
                continue
            status, why = dataset_status(task, key)
            if status == "pending":
                plan.pending[col] = f"missing: dataset {key}: {why}"
            elif col in manifest.column_overrides or col in row.column_overrides:
                plan.alone[col] = key
                plan.column_extra[col] = [*manifest.column_overrides.get(col, []), *row.column_overrides.get(col, [])]
            else:  # known, or unknown: validate() stops the table on it, naming the row and column
                plan.datasets.setdefault(key, []).append(col)
        plans.append(plan)
    return plans


def dataset_key(task: str) -> str:
    """The override that picks a column's dataset in ``task``."""
    return eval_tasks()[task].dataset_key


def dataset_override(task: str, key: str) -> str:
    return f"{dataset_key(task)}={key}"


def sweeps(plan: RowPlan, manifest: TableManifest) -> list[tuple[str, dict[str, list[str]], list[str]]]:
    """The row's ``omnimed-evaluate -m`` runs: (the folder under the row's, dataset key -> its columns, extra
    overrides). The columns without overrides of their own share one sweep over their datasets (folder ""); a
    column with ``column_overrides`` (the table's or the row's) is its own run, in a folder named after it, shared
    by the columns with the same dataset and overrides (a HIT and an NDCG column of one run)."""
    out = [("", plan.datasets, [])] if plan.datasets else []
    runs: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for col, key in plan.alone.items():
        runs.setdefault((key, tuple(plan.column_extra[col])), []).append(col)
    out += [(slug(cols[0]), {key: cols}, list(extra)) for (key, extra), cols in runs.items()]
    return out


def check_datasets(plans: list[RowPlan], manifest: TableManifest) -> None:
    """Every dataset key a runnable row would run must be known to its task: an unknown one (a typo, a benchmark
    nobody registered) stops the table here, naming the row, the column and the keys that exist."""
    for plan in plans:
        task = manifest.task_of(plan.row)
        for key, columns in [*plan.datasets.items(), *((k, [c]) for c, k in plan.alone.items())]:
            if dataset_status(task, key)[0] == "unknown":
                listed = ", ".join([*known_datasets(task), AVERAGE])
                raise ManifestError(f"{manifest.group}: row {plan.row.name!r}, column {columns[0]!r}: unknown dataset "
                                    f"{key!r} for task={task}; known: {listed} ({AVERAGE}: the mean of the "
                                    "row's other columns)")


def run_overrides(plan: RowPlan, manifest: TableManifest, runs_dir: Path, launcher: str, datasets: str,
                  ordered: list[str] | None = None, folder: str = "", column: list[str] | None = None) -> list[str]:
    """The overrides of the row's ``omnimed-evaluate -m`` run over ``datasets`` (comma-separated keys): the
    row's own, a column's own (``column``, run in ``folder`` under the row's), the launcher (once), where its runs
    go and their W&B group. ``ordered`` replaces the row's own (validation composes the row's overrides last
    too)."""
    sweep_key = dataset_key(manifest.task_of(plan.row))
    return [
        *(plan.overrides if ordered is None else ordered),
        *(column or []),
        f"{sweep_key}={datasets}",
        f"{LAUNCHER_GROUP}{launcher}",
        f"hydra.sweep.dir={runs_dir / plan.slug / folder}",
        f"hydra.sweep.subdir=${{{sweep_key}}}",
        f"logger.group={manifest.group}",
        f"experiment={manifest.group}",
        f"run_name={plan.slug}{'-' + folder if folder else ''}-${{{sweep_key}}}",
    ]


def validate(plans: list[RowPlan], manifest: TableManifest, *, launcher: str = DEFAULT_LAUNCHER,
             runs_dir: Path | None = None) -> None:
    """Check every dataset key, then compose every (row, dataset) run now, Hydra's own config included, with the
    launcher it will run under (so ``hydra.launcher.*`` settings are checked against that launcher); a row naming
    an unknown option fails here, naming the row."""
    check_datasets(plans, manifest)
    runs_dir = runs_dir or Path("runs")
    composed: dict[tuple[str, ...], str] = {}  # a list is composed once (a quarter of the shipped tables' repeat)
    with evaluate_configs():
        for plan in plans:
            # a row whose every column waits for a loader runs nothing, but its overrides must still compose; the
            # dataset key is one string value (checked above), so one key per row shows whether the row composes
            runs = [(folder, datasets, key, extra) for folder, datasets, extra in sweeps(plan, manifest)
                    for key in list(datasets)[:1]] or [("", {}, None, [])]
            prints = []
            for folder, datasets, key, extra in runs:
                texts = []  # the run's own order first: what it computes
                for ordered in (plan.overrides, plan.row_last) if plan.row_last else (plan.overrides,):
                    overrides = (run_overrides(plan, manifest, runs_dir, launcher, key, ordered, folder, extra)
                                 if key else [*ordered, f"{LAUNCHER_GROUP}{launcher}"])
                    if tuple(overrides) not in composed:
                        composed[tuple(overrides)] = run_config_text(compose_run(
                            overrides, f"{manifest.group}: row {plan.row.name!r} does not compose with {overrides}"))
                    texts.append(composed[tuple(overrides)])
                if key:
                    prints.append((folder, tuple((k, tuple(v)) for k, v in datasets.items()), texts[0]))
            plan.fingerprint = tuple(prints)
    mark_shared_runs(plans)


def mark_shared_runs(plans: list[RowPlan]) -> None:
    """Point each row whose runs compose to the same configs as an earlier row's at that row (``same_as``): at
    miniature scale one model or encoder stands in for the paper's several (PolyRAG's GTE, BGE-M3 and jina rows
    are all MiniLM there), and running the same computation again would only cost time."""
    first: dict[tuple, RowPlan] = {}
    for plan in plans:
        if plan.fingerprint:
            earlier = first.setdefault(plan.fingerprint, plan)
            plan.same_as = earlier.row.name if earlier is not plan else None


def run_row(plan: RowPlan, manifest: TableManifest, runs_dir: Path, launcher: str, folder: str,
            datasets: dict[str, list[str]], column: list[str]) -> subprocess.CompletedProcess:
    """One Hydra multirun of the row over ``datasets`` with ``column``'s own overrides, in ``folder`` (one of
    :func:`sweeps`); each run writes ``<runs_dir>/<row>[/<folder>]/<dataset>/metrics.json``."""
    cmd = [str(Path(sys.executable).parent / "omnimed-evaluate"), "-m",
           *run_overrides(plan, manifest, runs_dir, launcher, ",".join(datasets), folder=folder, column=column)]
    return subprocess.run(cmd, check=False, text=True, capture_output=True)


def run_id(plan: RowPlan, folder: str, key: str) -> str:
    """A run's name in the table's stored cells: its folder under the table's runs."""
    return "/".join(part for part in (plan.slug, folder, key) if part)


def run_prepare(manifest: TableManifest, preset: str, runs_dir: Path, extra: list[str] | None, log=print,
                needed: set[str] | None = None) -> None:
    """Run the preset's prepare steps whose ``creates`` path is missing, in order (only those ``needed`` names,
    when given); output goes to a log file per step. A failing step stops the table, naming the step and its log."""
    root = artifact_root(extra)
    steps = manifest.prepare.get(preset, [])
    for i, step in enumerate(steps, start=1):
        target = root / step.creates
        if target.exists():
            log(f"prepare [{i}/{len(steps)}] {step.name}: done ({target})")
            continue
        if needed is not None and step.name not in needed:
            log(f"prepare [{i}/{len(steps)}] {step.name}: {NOT_NEEDED}")
            continue
        runs_dir.mkdir(parents=True, exist_ok=True)
        log_file = runs_dir / f"prepare-{slug(step.name)}.log"
        held = sorted(p.name for p in target.parent.iterdir()) if target.parent.is_dir() else []
        why = f" ({target.parent} holds {', '.join(held[:4])} but no {target.name}: an earlier run stopped first)"
        log(f"prepare [{i}/{len(steps)}] {step.name}: running{why if held else ''}, log in {log_file}")
        with log_file.open("w") as fh:
            res = subprocess.run(step_command(step, extra), stdout=fh, stderr=subprocess.STDOUT)
        if res.returncode != 0 or not target.exists():
            raise ManifestError(f"{manifest.group}: prepare step {step.name!r} failed (exit {res.returncode}; "
                                f"{target} {'missing' if not target.exists() else 'present'}); see {log_file}")


def sweep_failure(cell: Cell, run_dir: Path, reason: str) -> Cell:
    """A failed cell whose run left no reason of its own, given the failed sweep's: the run's own failure where the
    run started, else that the sweep stopped at another dataset's failure before reaching it (the reason is then that
    dataset's, and the cell says so)."""
    if cell.status != "failed" or not reason:
        return cell
    if run_dir.is_dir():
        return replace(cell, status=f"failed: {reason[:160]}")
    return replace(cell, status="failed: not reached; the sweep stopped at an earlier dataset's failure "
                                f"({reason[:160]})")


def read_cell(run_dir: Path, manifest: TableManifest, column: str) -> Cell:
    """Our number for one (run, column), on the paper's scale, and whether other code than today's computed it; a
    run without metrics.json is ``failed``, with the reason it left in failed.json; a metric the finished run could
    not give a value (its undefined.json says why) is ``undefined``, not a failure."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        failed = run_dir / FAILED_FILE
        reason = json.loads(failed.read_text()).get("reason", "") if failed.is_file() else ""
        return Cell(status=f"failed: {reason[:240]}" if reason else "failed", run_dir=str(run_dir))
    metrics = json.loads(path.read_text())
    key = manifest.metric_for(column)
    if key not in metrics:
        # a retrieval run reports "<method>/<metric>" (plus per-source and graph breakdowns): take the one method
        candidates = [k for k in metrics if k.count("/") == 1 and k.endswith("/" + key) and not k.startswith("graph/")]
        if len(candidates) != 1:
            undefined = run_dir / UNDEFINED_FILE  # the run finished, and says why it has no value
            why = json.loads(undefined.read_text()).get(key) if undefined.is_file() else None
            return Cell(status=f"undefined: {why}" if why else f"failed: no {key!r} in metrics.json",
                        run_dir=str(run_dir))
        key = candidates[0]
    s = manifest.scale_for(column)

    def scaled(name: str) -> float | None:
        return metrics[name] * s if name in metrics and metrics[name] is not None else None

    # a metric over part of the questions (LUQ's task.luq_limit) says how many: "<key>/n"
    return Cell(ours=metrics[key] * s, low=scaled(f"{key}_ci_low"), high=scaled(f"{key}_ci_high"),
                n=metrics.get(f"{key}/n", metrics.get("n")), status="measured", run_dir=str(run_dir),
                outcomes=question_outcomes(run_dir, key),
                skew=answer_skew(run_dir) if key == "accuracy" else None, other_code=other_code(run_dir) or "")


def column_resolution(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> Detectable:
    """Per column measured in two or more rows with a per-question score (accuracy, HIT@k, NDCG@k, a long-form
    statement share or count): its smallest detectable difference on the paper's scale
    (:func:`~omnimed.tables.detectable.detectable_difference`) and the questions it is paired on."""
    out: Detectable = {}
    for col in manifest.columns:
        rows = [c.outcomes for r in cells.values() if (c := r.get(col)) is not None and c.outcomes]
        found = detectable_difference(rows)
        if found is not None:
            out[col] = (found[0] * manifest.scale_for(col), found[1])
    return out


def _run_rows(manifest: TableManifest, plans: list[RowPlan], preset: str, runs_dir: Path, launcher: str,
              dry_run: bool, log, earlier: dict[int, dict[str, dict[str, Cell]]] | None = None,
              resume_after: dict[str, float] | None = None, finished_only: bool = False,
              only: set[str] | None = None, stored: dict[str, dict] | None = None,
              kept: dict[str, dict] | None = None, asked: set[str] | None = None) -> dict[str, dict[str, Cell]]:
    """Run every planned row (nothing on a dry run; only the kept runs' cells with ``finished_only``, and for the
    rows not in ``only`` when it is given, or the columns not in ``asked``) and collect its cells; rows that do not
    run say why.
    ``earlier``: the cells of the training seeds already run, for the rows marked ``same_as_seed``;
    ``resume_after``: per row, keep the runs that finished as they would run now after this time
    (:func:`finished_runs`, :func:`prepared_for_rows`), None to run everything again; ``stored``: the table's
    stored runs (run id -> run, :mod:`omnimed.tables.stored`), read for a row not run now whose runs this disk
    lacks; ``kept``: filled with every finished run the cells were read from (run id -> what to store)."""
    earlier = earlier or {}
    where = stored_name(manifest.table)

    def asks(cols: list[str]) -> bool:
        return asked is None or bool(asked & set(cols))

    cells: dict[str, dict[str, Cell]] = {}
    for row in manifest.rows:
        if row.status != "runnable":
            cells[row.name] = {c: Cell(status=row_cell_status(row)) for c in manifest.columns}
    for i, plan in enumerate(plans, start=1):
        if plan.same_as_seed is not None:
            seed, name = plan.same_as_seed
            log(f"[{i}/{len(plans)}] {plan.row.name}: the same run as {name!r} at training seed {seed} (it reads "
                "nothing trained with the seed), not run again")
            cells[plan.row.name] = dict(earlier[seed][name])
            continue
        if plan.same_as is not None:
            log(f"[{i}/{len(plans)}] {plan.row.name}: the same run as {plan.same_as!r} (its overrides compose to the "
                "same config at this preset), not run again")
            cells[plan.row.name] = {col: replace(cell, same_as=plan.same_as)
                                    for col, cell in cells[plan.same_as].items()}
            continue
        waiting = sorted({why for why in plan.pending.values()})
        row_read = finished_only or (only is not None and plan.row.name not in only)  # an interim report's row
        listed = [*plan.datasets.items(),
                  *((f"{key} ({', '.join(cols)}: {' '.join(extra)})", cols)
                    for folder, datasets, extra in sweeps(plan, manifest) if folder for key, cols in datasets.items())]
        shown = [label for label, cols in listed if row_read or asks(cols)]
        log(f"[{i}/{len(plans)}] {plan.row.name}: {', '.join(shown) or 'nothing to run'}"
            + (f" (not run: {'; '.join(w.removeprefix('missing: ') for w in waiting)})" if waiting else ""))
        cells[plan.row.name] = {col: Cell(status=why) for col, why in plan.pending.items()}
        if not (plan.datasets or plan.alone):
            if not dry_run:
                fill_averages(manifest, preset, cells[plan.row.name])
            continue
        for folder, datasets, extra in sweeps(plan, manifest):
            done = ({} if resume_after is None else finished_runs(
                runs_dir / plan.slug / folder, runs_dir.parent, datasets,
                lambda key: run_overrides(plan, manifest, runs_dir, launcher, key, folder=folder, column=extra),
                resume_after[plan.row.name]))
            for key, (run_dir, when) in done.items():
                elsewhere = "" if run_dir == runs_dir / plan.slug / folder / key else f" in {run_dir}"
                log(f"  {key}{' (' + folder + ')' if folder else ''}: kept, the run that finished "
                    f"{datetime.fromtimestamp(when):%Y-%m-%d %H:%M}{elsewhere} computes what this one would "
                    "(--rerun runs it again)" + (f"; but it was {note}" if (note := other_code(run_dir)) else ""))
            if dry_run:  # what a real run would keep is shown; nothing runs
                continue
            todo = {key: cols for key, cols in datasets.items() if key not in done}
            unasked = {key: cols for key, cols in todo.items() if row_read or not asks(cols)}
            if unasked:
                ids = {key: run_id(plan, folder, key) for key in unasked}
                standing = stored_runs_today(
                    {key: stored[ids[key]] for key in unasked if stored and ids[key] in stored},
                    lambda key: run_overrides(plan, manifest, runs_dir, launcher, key, folder=folder, column=extra))
                for key, entry in standing.items():
                    log(f"  {key}{' (' + folder + ')' if folder else ''}: read from {where}, where the run that "
                        f"finished {entry['finished'].replace('T', ' ')[:16]} was kept (its folder is not on this "
                        "disk; its config is today's)")
                    cells[plan.row.name].update(stored_cells(entry, where))
                    if kept is not None:
                        kept[ids[key]] = entry
                why = plan.row.not_run.get(preset) if only is not None and plan.row.name not in only else None
                status = (f"not run at {preset}: {why}" if why else "not run yet: " + (
                    "the table's run has not reached it" if finished_only else
                    f"not among the {'rows' if row_read else 'columns'} asked for"))
                cells[plan.row.name].update({col: Cell(status=status) for key in unasked if key not in standing
                                             for col in unasked[key]})
                todo = {key: cols for key, cols in todo.items() if key not in unasked}
                datasets = {key: cols for key, cols in datasets.items() if key in done or key in todo}
            res = (run_row(plan, manifest, runs_dir, launcher, folder, todo, extra) if todo
                   else subprocess.CompletedProcess([], 0))
            reason = ""
            if res.returncode != 0:
                errors = [line for line in (res.stderr or "").splitlines() if "Error" in line or "error:" in line]
                reason = errors[-1].strip() if errors else f"exit {res.returncode}"
                log(f"  failed{' (' + folder + ')' if folder else ''}: {reason}")
            for key, columns in datasets.items():
                run_dir = done[key][0] if key in done else runs_dir / plan.slug / folder / key
                for col in columns:
                    cells[plan.row.name][col] = sweep_failure(read_cell(run_dir, manifest, col), run_dir, reason)
                if kept is not None and (entry := stored_run(run_dir, {c: cells[plan.row.name][c] for c in columns})):
                    kept[run_id(plan, folder, key)] = entry
        if not dry_run:
            fill_averages(manifest, preset, cells[plan.row.name])
    return cells


def _kept_whole(manifest: TableManifest, plans: list[RowPlan], preset: str, runs_dir: Path, launcher: str,
                extra: list[str] | None, only: set[str] | None, stored: dict[str, dict],
                kept: dict[str, dict]) -> dict[str, dict[str, Cell]] | None:
    """The table's cells when every run of the rows to run finished as it would run now, on this disk or in the
    stored cells (then added to ``kept``), else None. A spread over training seeds measured over several sessions
    reads the table's own seed this way, as it reads a later seed from the stored spread: not trained or run again."""
    found: dict[str, dict] = {}
    cells = _run_rows(manifest, plans, preset, runs_dir, launcher, False, lambda _: None, None,
                      prepared_for_rows(manifest, preset, extra, plans), True, only, stored, found)
    if any(c.status.startswith("not run yet") for row in cells.values() for c in row.values()):
        return None
    kept.update(found)
    return cells


def reproduce(
    manifest: TableManifest,
    *,
    preset: str = "miniature",
    out_dir: Path,
    launcher: str = DEFAULT_LAUNCHER,
    extra: list[str] | None = None,
    dry_run: bool = False,
    training_seeds: Sequence[int] = (),
    rerun: bool = False,
    finished_only: bool = False,
    rows: Sequence[str] = (),
    columns: Sequence[str] = (),
    log=print,
) -> tuple[dict[str, dict[str, Cell]], dict[str, Path]]:
    """Run the table's runnable rows and write its report; returns the cells and the report paths. With
    ``training_seeds``, the seeded prepare steps train once per seed and every row runs against each seed's
    models: the report is the default seed's table (else the first seed's) with each cell's spread over the seeds,
    which is also stored (``<table>.seeds.json``, as each seed finishes) and stated by later single-seed runs of the
    table; a seed it already holds for the rows as defined now is read back, not run again. A run that already
    finished as it would run now, after the table's models were prepared, is kept (a stopped table resumes where
    it stopped) unless ``rerun``. ``finished_only``: run nothing, and write the report of the runs kept so far (a
    long table's interim view; one training seed). ``rows``: run only these rows (and the rows they share a run
    with), the others' cells read from their finished runs as in an interim report. ``columns``: run only these
    columns of the rows that run (a failed cell again, or a long row a column at a time); the others are read the
    same way."""
    if finished_only and (len(training_seeds) > 1 or rerun or dry_run or rows or columns):
        raise ManifestError("an interim report (--finished) runs nothing and reads one training seed's kept runs: it "
                            "does not combine with --rerun, --dry-run, --rows, --columns or several --training-seeds")
    if (rows or columns) and len(set(training_seeds)) > 1:
        raise ManifestError("--rows and --columns run part of one training seed's table; a seed spread needs every "
                            "cell: run --training-seeds without them")
    for flag, names, known in (("--rows", rows, [row.name for row in manifest.rows]),
                               ("--columns", columns, manifest.columns)):
        if unknown := [name for name in names if name not in known]:
            raise ManifestError(f"{manifest.paper} {manifest.table}: {flag} names {flag[2:]} the table does not "
                                f"have: {unknown}; its {flag[2:]}: {list(known)}")
    launcher, extra = split_launcher(launcher, extra)
    seeds = list(dict.fromkeys(training_seeds)) or [DEFAULT_TRAINING_SEED]
    main = DEFAULT_TRAINING_SEED if DEFAULT_TRAINING_SEED in seeds else seeds[0]
    seeds = [main, *(s for s in seeds if s != main)]  # the report's seed first: rows reading nothing seeded run in it
    runs = {}
    for seed in seeds:  # validate every seed's runs and steps before anything runs
        seeded = for_training_seed(manifest, seed)
        plans = plan_rows(seeded, preset, extra)
        runs_dir = out_dir / "runs" / f"{manifest.table}{seed_tag(seed)}"
        validate(plans, seeded, launcher=launcher, runs_dir=runs_dir)
        if not finished_only:  # an interim report runs no prepare step
            validate_prepare(seeded, preset, extra)
        runs[seed] = (seeded, plans, runs_dir)
    plans_by_seed = {seed: plans for seed, (_, plans, _) in runs.items()}
    mark_seed_independent_runs(plans_by_seed)
    spread_file = out_dir / f"{manifest.table}.seeds.json"
    previous = read_seed_spread(spread_file, manifest, preset) if len(seeds) > 1 else None
    stored = stored_seed_cells(previous, manifest, seeds, main)
    ran_once = seed_independent_rows(plans_by_seed)
    per_seed: dict[int, dict[str, dict[str, Cell]]] = dict(stored)
    cells_file = store_path(out_dir, manifest.table)
    stored_runs, kept = load_store(cells_file).get(preset, {}), {}
    for seed, (seeded, plans, runs_dir) in runs.items():
        if len(seeds) > 1:
            log(f"training seed {seed} ({seeds.index(seed) + 1}/{len(seeds)})")
        if seed in stored:
            log(f"  read from {spread_file}, where an earlier run stored it for the rows as defined now; not "
                "trained or run again (delete the file to measure every seed again)")
            continue
        only = rows_to_run(plans, preset, rows)
        ready = None
        if seed == main and len(seeds) > 1 and not rerun:  # a dry run says so too: it reads, runs nothing
            ready = _kept_whole(seeded, plans, preset, runs_dir, launcher, extra, only, stored_runs, kept)
            if ready is not None:
                log(f"  every run of the table is on this disk or in {cells_file.name}: not trained or run again")
        if ready is not None:
            per_seed[seed] = ready
        else:
            needed = steps_for_rows(seeded, preset, plans, only) if only is not None else None
            if dry_run:
                for step in seeded.prepare.get(preset, []):
                    log(f"prepare {step.name}: " + (f"{' '.join(step.command)} -> {step.creates}"
                                                    if needed is None or step.name in needed else NOT_NEEDED))
            elif not finished_only and any(plan.same_as_seed is None and (plan.datasets or plan.alone)
                                         and (only is None or plan.row.name in only) for plan in plans):
                run_prepare(seeded, preset, runs_dir, extra, log, needed=needed)
            resume_after = None if rerun else prepared_for_rows(seeded, preset, extra, plans)
            per_seed[seed] = _run_rows(seeded, plans, preset, runs_dir, launcher, dry_run, log, per_seed,
                                       resume_after, finished_only, only,
                                       *((stored_runs, kept) if seed == main else (None, None)),
                                       set(columns) or None)
        if len(seeds) > 1 and not dry_run:  # each seed is kept as soon as it is measured, in the seeds' order
            spread = seed_spread(manifest, {s: per_seed[s] for s in seeds if s in per_seed}, preset, ran_once,
                                 previous)
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(spread_file, json.dumps(spread, indent=1) + "\n")
    cells = per_seed[main]
    if dry_run:
        return cells, {}
    write_store(cells_file, preset, kept, [plan.slug for plan in runs[main][1]])
    if len(seeds) == 1:  # else the last write above holds every seed: the stored ones are in per_seed from the start
        spread = read_seed_spread(spread_file, manifest, preset)
    paths = write_report(manifest, cells, out_dir, preset, column_resolution(manifest, cells), spread)
    if len(seeds) > 1:
        paths["seeds"] = spread_file
    return cells, paths

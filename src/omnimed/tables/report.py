"""A paper table with our numbers beside the published ones: Markdown, CSV and a PNG plot.

Cells we did not measure stay empty and say why (``missing``: the method is not built yet; ``external``: a row we
do not run; ``failed``: the run broke). Nothing is filled with a number nobody measured. Each accuracy column states
the smallest difference its run can detect (:mod:`omnimed.tables.detectable`).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Optional

from omnimed.data.artifacts import atomic_path, atomic_write_text
from omnimed.tables.detectable import paired_difference
from omnimed.tables.manifest import AVERAGE, TableManifest


@dataclass
class Cell:
    """Our value for one (row, column), on the paper's scale, with its 95% interval when the metric has one."""

    ours: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: Optional[int] = None
    status: str = "missing"  # measured | missing | external | failed | undefined | not run
    run_dir: str = ""
    # per question (and seed): right or wrong, for an accuracy column (what the detectable difference is paired on)
    outcomes: Optional[dict[str, bool | float]] = field(default=None, repr=False)
    same_as: str = ""  # the row whose run this cell is (the two rows compose to the same config at this preset)
    # the answer (or option position) given most often, to how many, of how many predictions
    skew: Optional[tuple[str, int, int]] = None
    # set when the run was computed by other code than today's (omnimed.tables.provenance.other_code)
    other_code: str = ""
    stored: str = ""  # the day its run finished, when read from the table's stored cells (omnimed.tables.stored)


#: a cell whose run gives one answer (or one option position) to at least this share of its questions is reported as
#: measuring that answer's base rate (the miniature reader answering "maybe" to every PubMedQA question, or the last
#: option of every multi-hop question), not the row
SKEWED_SHARE = 0.9

#: column -> (the smallest difference it can detect, on the paper's scale; the questions it is paired on)
Detectable = dict[str, tuple[float, int]]
DETECTABLE_ROW = "smallest detectable difference"
EFFECT_ROW = "paper's effects (consecutive rows)"
DETECTABLE_NOTE = ("95% half-width of the paired (by question) difference between the two rows that disagree most "
                   "on the column's questions")


def column_holds(manifest: TableManifest, preset: str, column: str) -> str | None:
    """What a column holds at ``preset`` when a stand-in fills it (the miniature's world questions in place of
    MedQA): None where the column is the paper's own dataset."""
    from omnimed.evaluation.datasets import dataset_holds

    if preset == "paper":
        return None
    runnable = [r for r in manifest.rows if r.status == "runnable"]
    task = manifest.task_of(runnable[0]) if runnable else (manifest.task or "qa")
    return dataset_holds(manifest.datasets.get(preset, {}).get(column, column), task)


def paper_effects(manifest: TableManifest) -> dict[str, tuple[float, float]]:
    """Per column, the smallest and largest published difference between consecutive rows we run (an ablation
    table changes one thing per row): what a reproduction must be able to detect to show the paper's effects."""
    out: dict[str, tuple[float, float]] = {}
    rows = [r for r in manifest.rows if r.status == "runnable"]
    for col in manifest.columns:
        values = [r.published.get(col) for r in rows]
        diffs = [abs(b - a) for a, b in pairwise(values) if a is not None and b is not None]
        if diffs:
            out[col] = (min(diffs), max(diffs))
    return out


#: an unmeasured cell's reason longer than this, given in more than one cell, is written once under the Markdown
#: table, each cell naming its note
NOTE_AFTER_CHARS = 80


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _short(status: str, notes: dict[str, int], repeated: set[str]) -> str:
    """A cell's reason as the Markdown table shows it: in full, or, when long and ``repeated``, its kind (what stands
    before the first colon) and the number of the note under the table that gives it (the CSV keeps every reason in
    every cell)."""
    if len(status) <= NOTE_AFTER_CHARS or status not in repeated:
        return status
    number = notes.setdefault(status, len(notes) + 1)
    return f"{status.split(':', 1)[0]} (note {number})"


def table_rows(manifest: TableManifest, cells: dict[str, dict[str, Cell]],
               detectable: Detectable | None = None) -> list[dict[str, object]]:
    """One flat record per (row, column): the CSV's lines; then one per column with its smallest detectable
    difference (row ``smallest detectable difference``)."""
    out = []
    for row in manifest.rows:
        for col in manifest.columns:
            status = row.status if row.status != "runnable" else "not run"
            cell = cells.get(row.name, {}).get(col) or Cell(status=status)
            paper = row.published.get(col)
            delta = None if cell.ours is None or paper is None else cell.ours - paper
            out.append({
                "row": row.name, "method": row.method, "column": col, "ours": cell.ours, "paper": paper,
                "delta": delta, "ci_low": cell.low, "ci_high": cell.high, "n": cell.n, "status": cell.status,
                "run_dir": cell.run_dir, "same_run_as": cell.same_as,
            })
    for col, (value, n) in (detectable or {}).items():
        out.append({"row": DETECTABLE_ROW, "method": "", "column": col, "ours": value, "paper": None, "delta": None,
                    "ci_low": None, "ci_high": None, "n": n, "status": DETECTABLE_NOTE, "run_dir": "",
                    "same_run_as": ""})
    return out


def shared_runs(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> list[list[str]]:
    """Groups of rows whose cells come from one run (the first row of each group ran it), in table order."""
    groups: dict[str, list[str]] = {}
    for row in manifest.rows:
        first = next((c.same_as for c in cells.get(row.name, {}).values() if c.same_as), "")
        if first:
            groups.setdefault(first, [first]).append(row.name)
    return list(groups.values())


def _grid_row(name: str, parts: list[str]) -> str:
    """One markdown row of a row x column table: the row's name, then a cell per column."""
    return f"| {name} | " + " | ".join(parts) + " |"


def _grid(manifest: TableManifest, body: list[str]) -> list[str]:
    """A markdown table with a row per line of ``body`` (:func:`_grid_row`) and the manifest's columns: the shape
    of the spread and paired tables under a report."""
    return [_grid_row("row", list(manifest.columns)), "|---|" + "---|" * len(manifest.columns), *body]


def spread_lines(manifest: TableManifest, spread: dict) -> list[str]:
    """The spread of our numbers over training seeds (``seed_spread`` of a ``--training-seeds`` run): per row and
    column, the range and the sample standard deviation."""
    import statistics

    seeds = ", ".join(map(str, spread["seeds"]))
    if len(spread["seeds"]) < 2:  # a seed-spread run stopped after its first seed: nothing to spread yet
        return ["", f"Spread over training seeds: only seed {seeds} measured so far ({spread['measured']}); "
                "`omnimed-reproduce <table> --training-seeds ...` measures the rest (a seed stored here is not trained "
                "again unless it is the table's own)."]
    head = f"Spread over training seeds {seeds} (measured {spread['measured']}"
    body = []
    once = spread.get("ran_once", [])
    for row in manifest.rows:
        if row.name in once:
            continue
        parts = []
        for col in manifest.columns:
            vals = [v for v in spread["values"].get(row.name, {}).get(col, []) if v is not None]
            d = manifest.digits_for(col)
            parts.append(f"{_fmt(min(vals), d)}-{_fmt(max(vals), d)} ({_fmt(statistics.stdev(vals), d)})"
                         if len(vals) > 1 else "n/a")
        if any(part != "n/a" for part in parts):
            body.append(_grid_row(row.name, parts))
    if body:
        title = (f"{head}; `omnimed-reproduce <table> --training-seeds {','.join(map(str, spread['seeds']))}`): "
                 "min-max (sd) of each cell.")
        lines = ["", title, "", *_grid(manifest, body)]
    else:  # every seed-dependent row changed since: no table of spreads to title
        lines = ["", f"{head}): no row of this table states one."]
    lines += seed_paired_lines(manifest, spread)
    if once:
        lines += ["", f"Run once for all seeds (they read nothing trained with the seed): {', '.join(once)}."]
    changed = spread.get("changed", [])
    if changed:
        lines += ["", f"Not stated for {', '.join(changed)}: the manifest defines the row otherwise than when its "
                  "spread was measured (its overrides, the preset or the prepare steps changed); `--training-seeds` "
                  "measures it again."]
    return lines


def seed_paired_lines(manifest: TableManifest, spread: dict) -> list[str]:
    """Each row's paired difference from the ``paired_against`` row at every training seed (``paired`` of
    ``seed_spread``): where rows differ only at later seeds (a trained part swapped for its seed-0 version), the
    default seed's table cannot tell them apart and this one can."""
    paired, ref = spread.get("paired") or {}, manifest.paired_against
    body = []
    for row in manifest.rows:
        if row.name == ref or row.name not in paired:
            continue
        parts = []
        for col in manifest.columns:
            d = manifest.digits_for(col)
            per = [f"{seed}: " + (_fmt_pair(*p, d) if p else "n/a")
                   for seed, p in zip(spread["seeds"], paired[row.name].get(col, []))]
            parts.append("; ".join(per) or "n/a")
        body.append(_grid_row(row.name, parts))
    if not body:
        return []
    return ["", f"Paired by question at each training seed (seed: `{ref}` minus the row, +- its 95% half-width; * "
                "where the two are told apart):", "", *_grid(manifest, body)]


def skew_lines(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> list[str]:
    """The cells whose run gave one answer, or one option position, to nearly every question
    (:data:`SKEWED_SHARE`), by column: there the score is that answer's share of the gold answers, whatever the row
    changes."""
    found = []
    for col in manifest.columns:
        skewed = [f"{row.name}: {c.skew[0]} {c.skew[1]}/{c.skew[2]}" for row in manifest.rows
                  if (c := cells.get(row.name, {}).get(col)) and c.skew and c.skew[1] >= SKEWED_SHARE * c.skew[2]
                  and not c.same_as]  # a row that is another row's run: named once, under the row that ran it
        if skewed:
            found.append(f"{col} ({', '.join(skewed)})")
    if not found:
        return []
    return ["", f"One answer (or option position) to at least {SKEWED_SHARE:.0%} of the questions in: "
                f"{'; '.join(found)}. There the cell is that answer's share of the gold answers: the reader does not "
                "use what the row gives it."]


def other_code_lines(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> list[str]:
    """The cells read from runs that other code than today's computed (a run kept from before a change), grouped by
    what differs: their config is today's, their code may not be. A row that is another row's run is named once,
    under the row that ran it."""
    found: dict[str, list[str]] = {}
    for row in manifest.rows:
        for col in manifest.columns:
            if (c := cells.get(row.name, {}).get(col)) and c.other_code and not c.same_as:
                found.setdefault(c.other_code, []).append(f"{row.name} / {col}")
    return [line for note, where in found.items() for line in (
        "", f"Read from runs {note}: {', '.join(where)}. Their config is today's; `--rerun` computes them with "
            "today's code.")]


def stored_name(table: str) -> str:
    """The file beside a table's report that keeps its finished runs' cells (:mod:`omnimed.tables.stored`)."""
    return f"{table}.cells.json.gz"


def stored_lines(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> list[str]:
    """The cells read from the table's stored cells rather than a run folder on this disk, with the day each run
    finished."""
    where = [f"{row.name} / {col} ({c.stored})" for row in manifest.rows for col in manifest.columns
             if (c := cells.get(row.name, {}).get(col)) and c.stored and not c.same_as]
    if not where:
        return []
    return ["", (f"Read from `{stored_name(manifest.table)}`, where each run's cells were kept when it finished (its "
                 f"folder is not on this disk; its config is today's): {', '.join(where)}. A run of the row "
                 "recomputes them.")]


def _fmt_pair(mean: float, half: float, digits: int) -> str:
    """A paired difference as printed: ``+mean +- half``, with ``*`` where its interval excludes 0."""
    return f"{mean:+.{digits}f} +- {half:.{digits}f}" + (" *" if abs(mean) > half else "")


def paired_cell(manifest: TableManifest, column: str, ref: Cell | None, cell: Cell | None
                ) -> tuple[float, float] | None:
    """``(mean, half-width)`` of ``ref`` minus ``cell`` paired by question, on the column's scale; None where
    either lacks its per-question outcomes."""
    found = paired_difference(ref.outcomes, cell.outcomes) if ref and cell and ref.outcomes and cell.outcomes else None
    if found is None:
        return None
    return found[0] * manifest.scale_for(column), found[1] * manifest.scale_for(column)


def paired_lines(manifest: TableManifest, cells: dict[str, dict[str, Cell]]) -> list[str]:
    """Every other row's paired (by question) difference from the ``paired_against`` row, per column, on the
    paper's scale: what tells a reader which of the method's gains this run separates, and, where the run separates
    two rows, whether it is in the paper's direction (the sign of the published difference). A row whose run is
    another row's is listed once, under the row that ran it."""
    ref_name = manifest.paired_against
    ref = cells.get(ref_name or "", {})
    if not ref_name or not any(c.outcomes for c in ref.values()):
        return []
    own = next((c.same_as for c in ref.values() if c.same_as), ref_name)
    published = next(r.published for r in manifest.rows if r.name == ref_name)
    body, along, against = [], 0, []
    for row in manifest.rows:
        mine = cells.get(row.name, {})
        if row.name == ref_name or any(c.same_as for c in mine.values()) or own == row.name:
            continue
        parts = []
        for col in manifest.columns:
            found = paired_cell(manifest, col, ref.get(col), mine.get(col))
            if found is None:
                parts.append("n/a")
                continue
            mean, half = found
            d = manifest.digits_for(col)
            parts.append(_fmt_pair(mean, half, d))
            mine_p, ref_p = row.published.get(col), published.get(col)
            paper = ref_p - mine_p if mine_p is not None and ref_p is not None else 0
            if abs(mean) > half and paper:
                if (mean > 0) == (paper > 0):
                    along += 1
                else:
                    against.append(f"{row.name} / {col} ({mean:+.{d}f}, the paper's {paper:+.{d}f})")
        if any(p != "n/a" for p in parts):
            body.append(_grid_row(row.name, parts))
    if not body:
        return []
    return ["", f"Paired by question: `{ref_name}` minus each row (mean difference +- its 95% half-width, 1.96 sd / "
                "sqrt(n), on the paper's scale; * where the interval excludes 0, i.e. the two rows are told apart).",
            "", *_grid(manifest, body),
            "", f"Told apart in the paper's direction (the sign of its published difference): {along} cell(s); "
                f"against it: {'; '.join(against) if against else 'none'}."]


def metric_line(manifest: TableManifest) -> str:
    """The table's metric and scale, and each column whose metric or scale differs from it (PolyRAG table 1's
    NDCG columns beside its HIT@3 ones)."""
    own = [f"{c}: {manifest.metric_for(c)} (x{manifest.scale_for(c):g})" for c in manifest.columns
           if (manifest.metric_for(c), manifest.scale_for(c)) != (manifest.metric, manifest.scale)]
    return f"{manifest.metric} (x{manifest.scale:g})" + (f"; columns with their own: {', '.join(own)}" if own else "")


def markdown(manifest: TableManifest, cells: dict[str, dict[str, Cell]], preset: str,
             detectable: Detectable | None = None, spread: dict | None = None) -> str:
    """Ours / paper / delta per column, intervals in brackets; rows we could not run say why (a long reason given in
    several cells once, in a numbered note under the table); under the rows, the smallest difference each accuracy
    column can detect and the paper's effects; each row's paired difference from the ``paired_against`` row; then
    the cells' spread over training seeds, where one was measured."""
    lines = [
        f"# {manifest.paper} {manifest.table}: {manifest.title}",
        "",
        f"Metric: {metric_line(manifest)}; preset `{preset}`; published numbers from "
        f"{manifest.source}. Cells: ours [95% CI] / paper (delta).",
        "",
        "| row | method | " + " | ".join(
            f"{c} ({holds})" if (holds := column_holds(manifest, preset, c)) else c for c in manifest.columns) + " |",
        "|---|---|" + "---|" * len(manifest.columns),
    ]
    reasons = Counter(c.status for row in cells.values() for c in row.values() if c.ours is None)
    repeated = {status for status, n in reasons.items() if n > 1}
    notes: dict[str, int] = {}
    for row in manifest.rows:
        parts = []
        for col in manifest.columns:
            cell = cells.get(row.name, {}).get(col)
            paper, d = row.published.get(col), manifest.digits_for(col)
            paper_s = _fmt(paper, d) or "-"
            if cell is None or cell.ours is None:
                status = cell.status if cell else (row.status if row.status != "runnable" else "not run")
                parts.append(f"{_short(status, notes, repeated)} / {paper_s}")
                continue
            ci = f" [{_fmt(cell.low, d)}, {_fmt(cell.high, d)}]" if cell.low is not None else ""
            delta = f" ({cell.ours - paper:+.{d}f})" if paper is not None else ""
            parts.append(f"{_fmt(cell.ours, d)}{ci} / {paper_s}{delta}")
        lines.append(f"| {row.name} | {row.method} | " + " | ".join(parts) + " |")
    if detectable:
        lines.append(f"| {DETECTABLE_ROW} | | " + " | ".join(
            f"{_fmt(detectable[c][0], manifest.digits_for(c))} (n={detectable[c][1]})" if c in detectable else "n/a"
            for c in manifest.columns) + " |")
        effects = paper_effects(manifest)
        lines.append(f"| {EFFECT_ROW} | | " + " | ".join(
            "-".join(_fmt(x, manifest.digits_for(c)) for x in effects[c]) if c in effects else "n/a"
            for c in manifest.columns) + " |")
        blind = [c for c in manifest.columns if c in detectable and c in effects and detectable[c][0] > effects[c][1]]
        lines += ["", f"Smallest detectable difference: the {DETECTABLE_NOTE}; two rows closer than it are not told "
                      f"apart by this run. {EFFECT_ROW.capitalize()}: the smallest and largest published difference "
                      "between consecutive rows."]
        if blind:
            lines.append(f"This run cannot detect even the paper's largest effect in: {', '.join(blind)}.")
        if alike := [c for c in manifest.columns if c in detectable and detectable[c][0] == 0]:
            lines.append(f"Every row has the same outcome on every question of: {', '.join(alike)}; there the run "
                         "tells no two rows apart, whatever their true difference (the 0 above is not a resolution).")
    if notes:
        lines += ["", "Cells not measured, why (each reason once; the CSV's `status` gives it in every cell):"]
        lines += [f"{number}. {status}" for status, number in notes.items()]
    lines += skew_lines(manifest, cells)
    lines += other_code_lines(manifest, cells)
    lines += stored_lines(manifest, cells)
    lines += paired_lines(manifest, cells)
    if shared := shared_runs(manifest, cells):
        lines += ["", f"Rows run once at `{preset}` (their overrides compose to the same `omnimed-evaluate` config "
                      "there: the preset stands one model or encoder in for the paper's several): "
                      + "; ".join(" = ".join(group) for group in shared) + "."]
    if spread:
        lines += spread_lines(manifest, spread)
    if manifest.note:
        lines += ["", f"Note: {manifest.note}"]
    return "\n".join(lines) + "\n"


def fill_averages(manifest: TableManifest, preset: str, row_cells: dict[str, Cell]) -> None:
    """An ``average`` column is the unweighted mean of the row's other columns, as the papers compute it; a column
    its run could not define (``undefined``, e.g. words per query of a source no plan queried) is left out, as the
    papers leave out a '-'. It stays empty unless every other column is measured or undefined, one at least
    measured."""
    averaged = [c for c in manifest.columns if manifest.datasets[preset][c] == AVERAGE]
    others = [row_cells.get(c, Cell()) for c in manifest.columns if c not in averaged]
    values = [c.ours for c in others if c.ours is not None]
    complete = all(c.ours is not None or c.status.startswith("undefined") for c in others)
    for col in averaged:
        if complete and values:
            row_cells[col] = Cell(ours=sum(values) / len(values), status="measured", run_dir="mean of the row")
        else:
            row_cells[col] = Cell(status="not run: needs every other column")


def write_report(
    manifest: TableManifest, cells: dict[str, dict[str, Cell]], out_dir: str | Path, preset: str,
    detectable: Detectable | None = None, spread: dict | None = None,
) -> dict[str, Path]:
    """``<out_dir>/<table>.{md,csv,png}``, each written atomically; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{manifest.table}.{ext}" for ext in ("md", "csv", "png")}
    atomic_write_text(paths["md"], markdown(manifest, cells, preset, detectable, spread))
    records = table_rows(manifest, cells, detectable)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]) if records else ["row"])
    writer.writeheader()
    writer.writerows(records)
    atomic_write_text(paths["csv"], buf.getvalue())
    _plot(manifest, [r for r in records if r["row"] != DETECTABLE_ROW], paths["png"], preset)
    return paths


def _plot(manifest: TableManifest, records: list[dict[str, object]], path: Path, preset: str) -> None:
    """One panel per column, titled by what it holds (a stand-in's content, the paper's column under it): the
    paper's bar and ours (with its interval) for every row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = manifest.columns
    names = [r.name for r in manifest.rows]
    fig, axes = plt.subplots(1, len(cols), figsize=(max(4.0, 3.2 * len(cols)), 0.45 * len(names) + 1.8),
                             sharey=True, squeeze=False)
    y = np.arange(len(names))
    for ax, col in zip(axes[0], cols):
        mine = {r["row"]: r for r in records if r["column"] == col}
        holds = column_holds(manifest, preset, col)
        paper = [mine[n]["paper"] if mine[n]["paper"] is not None else np.nan for n in names]
        ours = [mine[n]["ours"] if mine[n]["ours"] is not None else np.nan for n in names]
        ax.barh(y + 0.2, paper, height=0.4, color="#bbbbbb", label="paper (its own data)" if holds else "paper")
        err = [[(o - mine[n]["ci_low"]) if mine[n]["ci_low"] is not None else 0 for n, o in zip(names, ours)],
               [(mine[n]["ci_high"] - o) if mine[n]["ci_high"] is not None else 0 for n, o in zip(names, ours)]]
        ax.barh(y - 0.2, ours, height=0.4, color="#3b6ea5", xerr=np.nan_to_num(err), label="ours")
        ax.set_title(f"{holds}\n(paper: {col})" if holds else col, fontsize=9)
        ax.set_xlabel(f"{manifest.metric_for(col)} (x{manifest.scale_for(col):g})", fontsize=8)
    axes[0][0].set_yticks(y, names, fontsize=7)
    axes[0][0].invert_yaxis()
    # below the panels, where it covers no bar
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    stand_in = any(column_holds(manifest, preset, col) for col in cols)
    fig.suptitle(f"{manifest.paper} {manifest.table}" + (" (ours on the miniature stand-ins named above each panel, "
                                                         "the paper's on its benchmark)" if stand_in else ""),
                 fontsize=10 if not stand_in else 8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)

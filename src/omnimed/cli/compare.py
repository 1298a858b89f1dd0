"""``omnimed-compare``: runs side by side, as a table and a plot.

    omnimed-compare outputs/evaluate                              # every local run folder and offline W&B run
    omnimed-compare outputs --group omnirag-table4 --metrics accuracy
    omnimed-compare multirun --params task.lr,model.lora.r --sort val/loss --out cmp   # a sweep, best first
    omnimed-compare outputs --seeds --metrics val/loss --out cmp  # mean and 95% interval over seeds, curves too
    omnimed-compare --online --project omnimed --group selfbiorag-table6 --tags miniature
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

from rich.table import Table

from omnimed.cli.common import console


def console_table(metrics: list[str], rows: list[list], *, title: str) -> Table:
    """Runs as rows and metrics as columns; transposed (one row per metric) when there are more metrics than runs
    and too many to fit side by side, so a few runs with many metrics stay readable in a terminal."""
    table = Table(title=title)
    if len(metrics) > 6 and len(metrics) > len(rows):
        table.add_column("metric", no_wrap=True)
        for row in rows:
            table.add_column(row[0], justify="right", overflow="fold")
        for i, m in enumerate(metrics, start=1):
            table.add_row(m, *[_fmt(row[i]) for row in rows])
        return table
    table.add_column("run", no_wrap=True)
    for m in metrics:
        table.add_column(m, justify="right", min_width=max(6, min(len(m), 12)), overflow="fold")
    for row in rows:
        table.add_row(row[0], *[_fmt(v) for v in row[1:]])
    return table


def _fmt(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    from omnimed.data.artifacts import atomic_write_text
    from omnimed.tables.compare import (
        comparison_table,
        local_runs,
        online_runs,
        over_seeds,
        plot,
        plot_curves,
        select,
        sort_runs,
    )

    parser = argparse.ArgumentParser(prog="omnimed-compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="folders holding run folders or W&B offline runs")
    parser.add_argument("--group", help="W&B group (e.g. a paper table's <paper>-<table>)")
    parser.add_argument("--tags", default="", help="comma-separated tags every run must have")
    parser.add_argument("--metrics", help="comma-separated metrics to show (default: those all runs share)")
    parser.add_argument("--online", action="store_true", help="query the W&B server (needs credentials)")
    parser.add_argument("--project", default="omnimed")
    parser.add_argument("--entity")
    parser.add_argument("--params", default="", help="comma-separated config keys to show (task.lr,model.lora.r)")
    parser.add_argument("--sort", help="a metric to sort by, smallest first (-metric: largest first)")
    parser.add_argument("--seeds", action="store_true",
                        help="one row per run that differs only in its seed: the mean and 95%% interval")
    parser.add_argument("--curves", default="train/loss,val/loss",
                        help="metrics whose logged history compare_curves.png draws against the step")
    parser.add_argument("--out", type=Path, help="write compare.csv, compare.png and compare_curves.png here")
    args = parser.parse_args(argv)
    tags = [t for t in args.tags.split(",") if t]
    if args.online:
        runs = online_runs(args.project, group=args.group, tags=tags, entity=args.entity)
    else:
        if not args.paths:
            parser.error("give run folders, or --online")
        runs = select(local_runs(args.paths), group=args.group, tags=tags)
    if not runs:
        console.print("[red]omnimed-compare: no run matched[/red]")
        return 1
    if args.seeds:
        runs = over_seeds(runs)
    runs = sort_runs(runs, args.sort)  # the table, the CSV and both plots in one order
    metrics = args.metrics.split(",") if args.metrics else None
    if metrics and args.seeds:
        metrics = [k for m in metrics for k in (m, f"{m}/ci95") if k == m or any(k in r.metrics for r in runs)]
    params = [p for p in args.params.split(",") if p]
    columns, rows = comparison_table(runs, metrics, params, args.sort)
    console.print(console_table(columns, rows, title=f"omnimed-compare: {len(runs)} runs"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["run", *columns])
        writer.writerows(rows)
        atomic_write_text(args.out / "compare.csv", buf.getvalue())
        shown = [c for c in columns[len(params):] if not c.endswith("/ci95")]
        if shown:
            plot(runs, shown[:12], args.out / "compare.png")
        curves = plot_curves(runs, [c for c in args.curves.split(",") if c], args.out / "compare_curves.png")
        console.print(f"wrote {args.out / 'compare.csv'}, compare.png" + (" and compare_curves.png" if curves else
                                                                          " (no run logged a curve)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

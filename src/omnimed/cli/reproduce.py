"""``omnimed-reproduce``: run every row of a paper table and write it beside the published numbers.

    omnimed-reproduce --list                                   # every table: rows that run, missing (and why), external
    omnimed-reproduce experiments/omnirag/table4.yaml         # miniature preset (CPU), results/table4.{md,csv,png}
    omnimed-reproduce experiments/omnirag/table4.yaml --preset paper --launcher submitit_slurm \
        hydra.launcher.gpus_per_node=1 hydra.launcher.partition=gpu   # launcher settings, checked before any run
    omnimed-reproduce experiments/selfbiorag/table9.yaml --training-seeds 0,1,2   # trained rows' spread over seeds
    omnimed-reproduce experiments/omnirag/table7.yaml --finished   # while it runs: the report of what finished
    omnimed-reproduce experiments/omnirag/table7.yaml --rows '+ DPO'   # one row; the others as they stand
    omnimed-reproduce experiments/omnirag/table4.yaml --rows 'SPO Planning [Reader: Qwen2.5-7B]' --columns MMLU

Stopped part way, the same command resumes: prepare steps whose artifact exists and runs that already finished as
they would run now (same composed config, after the newest prepared artifact the row reads; in this table's runs
or another's beside them) are kept; --rerun runs them again. A kept run that other code computed (its code.json is
not today's source) is named in the log and the report.

A row runs only if its method is built and its task produces the table's metric; the others are listed as missing
with the reason. At a given preset, a column whose paper benchmark has no loader yet is reported missing too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from omnimed.cli.common import console
from omnimed.tables.manifest import ManifestError, find_manifests, load_manifest


def list_tables(root: Path) -> int:
    table = Table(title=f"paper tables under {root}")
    for col in ("paper", "table", "rows", "run", "missing", "external", "cols"):
        table.add_column(col, no_wrap=True)
    table.add_column("metric", overflow="fold")
    why: list[str] = []
    bad = 0
    for path in find_manifests(root):
        try:
            m = load_manifest(path)
        except ManifestError as exc:
            console.print(f"[red]{exc}[/red]")
            bad += 1
            continue
        c = m.counts()
        table.add_row(m.paper, m.table, str(len(m.rows)), str(c["runnable"]), str(c["missing"]),
                      str(c["external"]), str(len(m.columns)), m.metric)
        why += [f"  {m.group}: {n} missing: {reason}" for reason, n in m.missing_reasons().items()]
        why += [f"  {m.group}: {n} not run at {preset} (--rows runs them): {reason}"
                for (preset, reason), n in m.not_run_reasons().items()]
    console.print(table)
    if why:
        console.print("why rows are missing or not run:\n" + "\n".join(why), highlight=False, soft_wrap=True)
    return 1 if bad else 0


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (0,1,2), got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names ('+ DPO,Frozen'), got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnimed-reproduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest", nargs="?", help="experiments/<paper>/<table>.yaml")
    parser.add_argument("--list", action="store_true", help="list every table and how many rows run")
    parser.add_argument("--root", default="experiments", help="where --list looks (default: experiments)")
    parser.add_argument("--preset", default="miniature", help="scale preset: miniature (CPU) or paper (GPUs)")
    parser.add_argument("--out", help="output folder (default: experiments/<paper>/results)")
    parser.add_argument("--launcher", default="basic", help="hydra/launcher: basic | joblib | submitit_slurm; its "
                        "settings go among the overrides (hydra.launcher.gpus_per_node=1)")
    parser.add_argument("--dry-run", action="store_true", help="validate and show the runs without running them")
    parser.add_argument("--training-seeds", type=_seeds, default=(), metavar="0,1,2",
                        help="train the table's seeded prepare steps once per seed and run every row against each; "
                        "the table states each cell's spread over the seeds (stored for later runs)")
    parser.add_argument("--rerun", action="store_true", help="run every row again; by default a run that "
                        "already finished as it would run now, after the table's models were prepared, is kept")
    parser.add_argument("--finished", action="store_true", help="run nothing: write the report of the runs that "
                        "finished so far (a long table's interim view, e.g. from a second shell while it runs); the "
                        "rest is marked 'not run yet' and nothing is logged to W&B")
    parser.add_argument("--rows", type=_names, default=(), metavar="'+ DPO,Frozen'",
                        help="run only these rows (comma-separated names, as the manifest spells them); the others "
                        "are read from their finished runs as --finished reads them, and nothing is logged to W&B")
    parser.add_argument("--columns", type=_names, default=(), metavar="'MMLU,SEER'",
                        help="run only these columns (as the manifest spells them) of the rows that run; the other "
                        "cells are read as --rows reads the rows not named, and nothing is logged to W&B")
    parser.add_argument("overrides", nargs="*", help="extra overrides for every run, e.g. task.limit=50")
    args = parser.parse_intermixed_args(argv)
    if args.list:
        return list_tables(Path(args.root))
    if not args.manifest:
        parser.error("give a manifest path, or --list")
    from omnimed.tables.reproduce import reproduce

    try:
        manifest = load_manifest(args.manifest)
        out = Path(args.out) if args.out else Path(args.manifest).parent / "results"
        cells, paths = reproduce(manifest, preset=args.preset, out_dir=out, launcher=args.launcher,
                                 extra=args.overrides, dry_run=args.dry_run,
                                 training_seeds=args.training_seeds, rerun=args.rerun, finished_only=args.finished,
                                 rows=args.rows, columns=args.columns,
                                 # markup off: overrides hold [...]
                                 log=lambda text: console.print(text, markup=False, highlight=False))
    except ManifestError as exc:
        console.print(f"[red]omnimed-reproduce: {exc}[/red]")
        return 2
    if paths and not (args.finished or args.rows or args.columns):  # the whole table as a run of its W&B group
        from omnimed.tables.wandb_table import log_table_run, table_logger_settings

        try:
            settings = table_logger_settings(manifest, args.preset, args.launcher, args.overrides)
            where = log_table_run(manifest, args.preset, paths["csv"], paths["png"],
                                  out / "runs" / f"{manifest.table}-report", settings)
        except Exception as exc:  # the files are written; the failure is not hidden
            console.print(f"[red]omnimed-reproduce: the table is written ({paths['md']}) but logging it to W&B "
                          f"failed: {type(exc).__name__}: {exc}[/red]")
            return 1
        if where:
            paths["wandb"] = Path(where)
    counts = manifest.counts()
    measured = sum(c.status == "measured" for row in cells.values() for c in row.values())
    failed = sum(c.status.startswith("failed") for row in cells.values() for c in row.values())
    costly = sum(1 for row in manifest.rows if row.status == "runnable" and row.not_run.get(args.preset)
                 and row.name not in args.rows)
    console.print(f"{manifest.group}: {counts['runnable'] - costly} rows run"
                  + (f", {costly} not run at {args.preset} (why in the table)" if costly else "")
                  + f", {counts['missing']} missing (method not built or "
                  f"metric not produced yet), {counts['external']} external; {measured} cells measured"
                  + (f", [red]{failed} failed[/red] (reasons in the table)" if failed else ""))
    for ext, path in paths.items():
        console.print(f"  {ext}: {path}")
    if paths:
        console.print(paths["md"].read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

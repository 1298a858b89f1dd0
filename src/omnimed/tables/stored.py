"""A table's measured cells kept beside its report (``<table>.cells.json.gz``), so they outlive their run folders.

Run folders (predictions, logs) stay on the disk that computed them and are not committed. A table filled a few
rows at a time, over sessions on different machines, would otherwise lose every cell whose runs are not on this
disk the next time its report is written. What is kept per run: the config it saved (what it computes, names
aside), the code that computed it, when it finished, and each of its columns' cells with their per-question
outcomes, so paired differences and the smallest detectable difference still read them.

A stored run stands in only for a row that is not run now (``--rows`` names others, or ``--finished``), and only
while today's composed config computes what the stored one did (:func:`omnimed.tables.resume.computes_the_same`);
the report names every cell read this way. A table run in full runs its rows again; a spread over training seeds
reads its own seed from here when every run of it is here (``omnimed.tables.reproduce``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from omnimed.data.artifacts import atomic_path
from omnimed.tables.manifest import ManifestError
from omnimed.tables.provenance import code_difference
from omnimed.tables.report import Cell, stored_name
from omnimed.tables.resume import saved_config
from omnimed.tracking import CODE_FILE

#: the Cell fields a stored run keeps per column (run_dir, same_as and other_code describe this disk's reading)
KEPT_FIELDS = ("ours", "low", "high", "n", "status", "outcomes", "skew")


def store_path(out_dir: Path, table: str) -> Path:
    return out_dir / stored_name(table)


def load_store(path: Path) -> dict[str, dict[str, dict]]:
    """preset -> run id (``<row slug>/<folder>/<dataset key>``) -> stored run; empty without a file. A file that
    cannot be read stops the table before anything runs, naming it: starting afresh would drop every cell it holds
    at the next write."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError) as exc:
        raise ManifestError(f"{path}: not a readable stored-cells file ({exc}); restore it from git "
                            "(`git checkout -- <path>`) or delete it to keep no earlier cells") from exc
    if not isinstance(data, dict) or not isinstance(data.get("presets"), dict):
        raise ManifestError(f"{path}: expected a JSON object with 'presets' (preset -> run id -> stored run)")
    return data["presets"]


def stored_run(run_dir: Path, cells: dict[str, Cell]) -> dict[str, Any] | None:
    """What is kept of the finished run in ``run_dir`` whose columns read ``cells``; None for a run that did not
    finish (no metrics.json) or saved no config: a failure is never stored."""
    metrics = run_dir / "metrics.json"
    config = saved_config(run_dir)
    if not metrics.is_file() or config is None:
        return None
    try:  # a run without a readable record is stored as one without: the report says its code may differ
        code = json.loads((run_dir / CODE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        code = None
    finished = datetime.fromtimestamp(metrics.stat().st_mtime).isoformat(timespec="seconds")
    kept = {col: {f: getattr(cell, f) for f in KEPT_FIELDS} for col, cell in cells.items()
            if cell.status == "measured" or cell.status.startswith("undefined")}
    return {"config": config, "code": code, "finished": finished, "cells": kept} if kept else None


def stored_cells(entry: dict[str, Any], where: str) -> dict[str, Cell]:
    """The cells of a stored run, marked as read from the store (``stored``: when the run finished) and, where its
    code is not today's, saying so as a run folder's cells do."""
    note = code_difference(entry.get("code"), where) or ""
    out = {}
    for col, fields in entry["cells"].items():
        skew = tuple(fields["skew"]) if fields.get("skew") else None
        out[col] = Cell(**{**fields, "skew": skew}, run_dir=f"stored in {where}", other_code=note,
                        stored=entry["finished"][:10])
    return out


def write_store(path: Path, preset: str, runs: dict[str, dict], row_slugs: Iterable[str]) -> None:
    """Keep ``runs`` (run id -> stored run, this table's finished runs at ``preset``) in ``path``, atomically: they
    replace the stored runs of the same ids; other stored runs of rows the table still has are kept (a row not run
    today keeps what it had), those of rows it no longer has are dropped, other presets are kept as they are."""
    presets = load_store(path)
    slugs = set(row_slugs)
    kept = {run_id: entry for run_id, entry in presets.get(preset, {}).items() if run_id.split("/", 1)[0] in slugs}
    presets[preset] = dict(sorted({**kept, **runs}.items()))
    text = json.dumps({"presets": presets}, sort_keys=True, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_bytes(gzip.compress(text.encode(), mtime=0))

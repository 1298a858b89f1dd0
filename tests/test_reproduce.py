"""Paper-table manifests and `omnimed-reproduce` / `omnimed-compare` end to end on the tiny world's retrieval rows:
validation names the file and row before anything runs, rows that are not built are reported missing (never
filled), and the table lands as Markdown, CSV and PNG with ours beside the published numbers."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnimed.evaluation.manifest import ManifestError, find_manifests, load_manifest

BIN = Path(sys.executable).parent
COMMON = ["knowledge=world_tiny", "task.split=null", "logger=wandb"]


def manifest(tmp: Path, rows: list[dict], name: str = "table1") -> Path:
    data = {
        "paper": "demo", "table": name, "title": "BM25 vs dense on the tiny world", "source": "made up for a test",
        "metric": "hit@10", "scale": 100, "columns": ["World"],
        "datasets": {"miniature": {"World": "world"}, "paper": {"World": "world"}},
        "presets": {"miniature": COMMON, "paper": COMMON},
        "rows": rows,
    }
    path = tmp / "experiments" / "demo" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


ROWS = [
    {"name": "BM25", "method": "retrieval", "overrides": ["task.methods=[bm25]"], "published": {"World": 90.0}},
    {"name": "Dense", "method": "retrieval", "overrides": ["task.methods=[dense]"], "published": {"World": 80.0}},
    {"name": "Self-BioRAG", "method": "selfbiorag", "published": {"World": 70.0}},
    {"name": "GPT-4", "method": "external", "published": {"World": None}},
]


def reproduce(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "omnimed-reproduce"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_manifest_errors_name_the_file_and_field(tmp_path):
    bad = manifest(tmp_path, [{"name": "X", "method": "retrieval", "published": {"Nope": 1.0}}])
    with pytest.raises(ManifestError, match=r"table1\.yaml.*X.*unknown columns \['Nope'\]"):
        load_manifest(bad)
    bad = manifest(tmp_path, [{"name": "Y", "method": "magic"}], name="table2")
    with pytest.raises(ManifestError, match=r"table2\.yaml.*unknown method 'magic'"):
        load_manifest(bad)


def test_every_shipped_manifest_is_valid():
    root = Path(__file__).resolve().parents[1] / "experiments"
    paths = find_manifests(root)
    for path in paths:
        m = load_manifest(path)
        assert m.rows and m.columns, path
        assert any(v is not None for r in m.rows for v in r.published.values()), f"{path}: no published number"


def test_every_runnable_row_of_every_shipped_table_composes_at_every_preset():
    """What `omnimed-reproduce` checks before it runs anything: a row naming a model, corpus or key that has no
    config would stop its table; none of the shipped tables may."""
    from omnimed.evaluation.reproduce import plan_rows, validate

    root = Path(__file__).resolve().parents[1] / "experiments"
    for path in find_manifests(root):
        m = load_manifest(path)
        for preset in m.presets:
            validate(plan_rows(m, preset), m)


def test_a_row_with_an_unknown_option_fails_before_any_run(tmp_path):
    path = manifest(tmp_path, [*ROWS[:1], {"name": "Broken", "method": "retrieval",
                                            "overrides": ["knowledge=no_such_corpus"]}])
    res = reproduce(str(path), cwd=tmp_path)
    assert res.returncode == 2
    assert "Broken" in res.stderr + res.stdout and "no_such_corpus" in res.stderr + res.stdout
    assert not (tmp_path / "experiments" / "demo" / "results" / "runs").exists()  # nothing ran


def test_reproduce_runs_rows_reports_missing_and_writes_the_table(tmp_path):
    path = manifest(tmp_path, ROWS)
    res = reproduce(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "experiments" / "demo" / "results"
    rows = {r["row"]: r for r in csv.DictReader((out / "table1.csv").open())}
    for name in ("BM25", "Dense"):
        assert rows[name]["status"] == "measured"
        assert 0.0 <= float(rows[name]["ours"]) <= 100.0
        assert float(rows[name]["delta"]) == pytest.approx(float(rows[name]["ours"]) - float(rows[name]["paper"]))
    assert rows["Self-BioRAG"]["status"] == "missing" and rows["Self-BioRAG"]["ours"] == ""
    assert rows["GPT-4"]["status"] == "external" and rows["GPT-4"]["ours"] == ""
    md = (out / "table1.md").read_text()
    assert "| Self-BioRAG | selfbiorag | missing / 70.0 |" in md
    assert (out / "table1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # every run of the table is in its W&B group; omnimed-compare reads them back offline
    runs = out / "runs" / "table1"
    cmp = subprocess.run([str(BIN / "omnimed-compare"), str(runs), "--group", "demo-table1",
                          "--metrics", "bm25/hit@10,dense/hit@10", "--out", str(tmp_path / "cmp")],
                         capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    lines = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert len(lines) == 3  # header + the two offline W&B runs of the group
    assert float(rows["BM25"]["ours"]) / 100 == pytest.approx(
        float(next(line for line in lines[1:] if line.startswith("bm25")).split(",")[1]))


def test_list_shows_every_table_with_its_counts(tmp_path):
    manifest(tmp_path, ROWS)
    res = reproduce("--list", "--root", str(tmp_path / "experiments"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() + res.stderr.splitlines() if "table1" in line)
    assert "│ 4 " in line and "│ 2 " in line and "│ 1 " in line  # rows, run, missing, external

"""docs/adding-a-method.md, run: a method registered from the test tree (tests/plugins/toy_method.py, touching no
file under src/) is chosen with pipeline=toy, answers through omnimed-evaluate, builds its stage through
omnimed-build, and fills a two-row table through omnimed-reproduce."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
WORLD = ["knowledge=world_tiny", "backend=oracle", "logger=csv"]


def plugin_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(PLUGINS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMNIMED_PLUGINS": "toy_method", "PYTHONPATH": path}


def run(cmd: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=env or plugin_env(), check=False)


@pytest.fixture(scope="module")
def gold_letters() -> list[list[str]]:
    from omnimed.evaluation.datasets import DatasetRequest, load_eval_dataset

    return [q.answer for q in load_eval_dataset(DatasetRequest("world_mcq", split=None, world_size="tiny"))]


def test_a_plugin_method_answers_through_omnimed_evaluate(tmp_path, gold_letters):
    res = run("omnimed-evaluate", "task=qa", "pipeline=toy", "pipeline.letter=A", "task.split=null", *WORLD,
              f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"hydra.run.dir={tmp_path}/qa", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "qa" / "metrics.json").read_text())
    assert metrics["n"] == len(gold_letters)
    assert metrics["accuracy"] == pytest.approx(sum(g == ["A"] for g in gold_letters) / len(gold_letters))
    assert metrics["toy_answered"] == 1.0  # the method's own metric
    rows = [json.loads(line) for line in (tmp_path / "qa" / "predictions.jsonl").open()]
    assert len(rows) == len(gold_letters) and all(r["prediction"] == "A" and r["letter"] == "A" for r in rows)

    # without the plugin, the option does not exist: Hydra says so and lists what does
    env = {k: v for k, v in os.environ.items() if k != "OMNIMED_PLUGINS"}
    res = run("omnimed-evaluate", "task=qa", "pipeline=toy", *WORLD, f"hydra.run.dir={tmp_path}/no", cwd=tmp_path,
              env=env)
    assert res.returncode != 0 and "pipeline/toy" in res.stderr and "closed_book" in res.stderr


def test_a_plugin_stage_builds_once_through_omnimed_build(tmp_path, gold_letters):
    args = ["stage=toy_letters", "stage.letter=A", f"stage.out={tmp_path}/letters", "knowledge=world_tiny",
            f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/build"]
    res = run("omnimed-build", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((tmp_path / "letters" / "manifest.json").read_text())
    assert manifest["counts"]["records"] == sum(g == ["A"] for g in gold_letters) > 0
    again = run("omnimed-build", *args, cwd=tmp_path)
    assert again.returncode == 0 and "already built" in again.stderr


def test_a_two_row_table_of_a_plugin_method_through_omnimed_reproduce(tmp_path, gold_letters):
    table = {
        "paper": "toy", "table": "table1", "title": "Always one letter", "source": "made up for a test",
        "metric": "accuracy", "scale": 100, "columns": ["World"],
        "datasets": {"miniature": {"World": "world_mcq"}, "paper": {"World": "world_mcq"}},
        "presets": {"miniature": [*WORLD, "task.split=null"], "paper": [*WORLD, "task.split=null"]},
        "rows": [{"name": f"Always {x}", "method": "toy", "overrides": ["pipeline=toy", f"pipeline.letter={x}"],
                  "published": {"World": 25.0}} for x in "AB"],
    }
    path = tmp_path / "experiments" / "toy" / "table1.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(table, sort_keys=False))
    res = run("omnimed-reproduce", str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = {r["row"]: r for r in csv.DictReader((path.parent / "results" / "table1.csv").open())}
    for letter in "AB":
        row = rows[f"Always {letter}"]
        assert row["status"] == "measured" and row["method"] == "toy"
        share = sum(g == [letter] for g in gold_letters) / len(gold_letters)
        assert float(row["ours"]) == pytest.approx(100 * share)

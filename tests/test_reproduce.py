"""Paper-table manifests and `omnimed-reproduce` / `omnimed-compare` end to end on the tiny world's retrieval rows:
validation names the file and row before anything runs, rows that are not built are reported missing (never
filled), and the table lands as Markdown, CSV and PNG with ours beside the published numbers."""

from __future__ import annotations

import copy
import csv
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

import pytest
import yaml

from omnimed.tables.manifest import ManifestError, load_manifest

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


def reproduce_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "omnimed-reproduce"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_manifest_errors_name_the_file_and_field(tmp_path):
    bad = manifest(tmp_path, [{"name": "X", "method": "retrieval", "published": {"Nope": 1.0}}])
    with pytest.raises(ManifestError, match=r"table1\.yaml.*X.*unknown columns \['Nope'\]"):
        load_manifest(bad)
    bad = manifest(tmp_path, [{"name": "Y", "method": "magic"}], name="table2")
    with pytest.raises(ManifestError, match=r"table2\.yaml.*unknown method 'magic'"):
        load_manifest(bad)


def test_per_subject_and_per_level_paper_keys_read_one_part_of_the_benchmark_folder(tmp_path):
    from omnimed.evaluation.datasets import DatasetRequest, load_eval_dataset

    mmlu = tmp_path / "mmlu_med"
    mmlu.mkdir()
    (mmlu / "anatomy_test.csv").write_text("Which bone?,Femur,Ulna,Skull,Rib,A\nWhich organ?,Liver,Lung,Skin,Eye,B\n")
    (mmlu / "college_biology_test.csv").write_text("Which cell?,Neuron,Myocyte,Erythrocyte,Osteocyte,C\n")
    anatomy = load_eval_dataset(DatasetRequest("mmlu_anatomy", data_dir=str(tmp_path)))
    assert [q.metadata["subject"] for q in anatomy] == ["anatomy", "anatomy"]
    assert len(load_eval_dataset(DatasetRequest("mmlu_med", data_dir=str(tmp_path)))) == 3
    with pytest.raises(ValueError, match="no record .* subject = 'medical_genetics'"):
        load_eval_dataset(DatasetRequest("mmlu_medical_genetics", data_dir=str(tmp_path)))
    items = [{"id": f"b{i}", "level": level, "question": f"q{i}?", "options": ["x", "y"], "answer": "A"}
             for i, level in enumerate(["Level 1", 2, "level2", "3", "Level 12"])]
    (tmp_path / "biomedmcqs").write_text("".join(json.dumps(item) + "\n" for item in items))
    assert [q.id for q in load_eval_dataset(DatasetRequest("biomedmcqs_level2", data_dir=str(tmp_path)))] == [
        "biomedmcqs/b1", "biomedmcqs/b2"]
    assert [q.id for q in load_eval_dataset(DatasetRequest("biomedmcqs_level1", data_dir=str(tmp_path)))] == [
        "biomedmcqs/b0"]
    with pytest.raises(ValueError, match="seer.*no loader yet"):
        load_eval_dataset(DatasetRequest("seer", data_dir=str(tmp_path)))


@pytest.mark.realdata
def test_miniature_mmlu_subject_keys_read_one_real_file_each(realdata):
    from omnimed.evaluation.datasets import MMLU_VAL_SUBJECTS, DatasetRequest, load_eval_dataset

    total = 0
    for key, subject in MMLU_VAL_SUBJECTS.items():
        questions = load_eval_dataset(DatasetRequest(key, realdata_root=str(realdata)))
        assert questions and {q.metadata["subject"] for q in questions} == {subject}
        total += len(questions)
    assert total == len(load_eval_dataset(DatasetRequest("mmlu_med_val", realdata_root=str(realdata))))


def qa_manifest(tmp: Path, datasets: dict, rows: list[dict] | None = None, **extra) -> Path:
    data = {
        "paper": "demo", "table": "table3", "title": "QA", "source": "made up for a test", "metric": "accuracy",
        "columns": list(datasets["miniature"]), "datasets": datasets,
        "presets": {"miniature": ["knowledge=world_tiny"], "paper": ["knowledge=world_tiny"]},
        "rows": rows or [{"name": "Closed book", "method": "closed_book", "overrides": ["pipeline=closed_book"],
                          "published": {}}],
        **extra,
    }
    path = tmp / "experiments" / "demo" / "table3.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_an_unknown_dataset_key_fails_validation_naming_row_column_and_known_keys(tmp_path):
    from omnimed.tables.reproduce import plan_rows, validate

    m = load_manifest(qa_manifest(tmp_path, {"miniature": {"MedQA": "world_mcq", "MMLU": "mmlu_med_vall"},
                                             "paper": {"MedQA": "medqa", "MMLU": "mmlu_med"}}))
    validate(plan_rows(m, "paper"), m)  # every paper key is known
    with pytest.raises(ManifestError) as err:
        validate(plan_rows(m, "miniature"), m)
    msg = str(err.value)
    assert "row 'Closed book', column 'MMLU'" in msg and "unknown dataset 'mmlu_med_vall'" in msg
    assert "known:" in msg and "mmlu_med_val" in msg and "mmlu_anatomy" in msg and "average" in msg
    # a retrieval row knows its own keys (task.queries), not the QA ones
    m = load_manifest(manifest(tmp_path, [ROWS[0]], name="table4"))
    m.datasets["miniature"]["World"] = "world_mcq"
    with pytest.raises(ManifestError, match=r"row 'BM25', column 'World': unknown dataset 'world_mcq' for "
                                            r"task=retrieval; known: world, world_diagnosis, .*, pubmedqa, "
                                            r"medquad, bioasq, average"):
        validate(plan_rows(m, "miniature"), m)


def test_a_benchmark_without_a_loader_leaves_its_cells_missing_and_the_rest_runs(tmp_path):
    from omnimed.tables.reproduce import plan_rows, reproduce

    path = qa_manifest(tmp_path, {"miniature": {"MedQA": "world_mcq", "SEER": "world_mcq", "Avg": "average"},
                                  "paper": {"MedQA": "medqa", "SEER": "seer", "Avg": "average"}})
    m = load_manifest(path)
    (plan,) = plan_rows(m, "paper")
    assert plan.datasets == {"medqa": ["MedQA"]}
    assert plan.pending == {"SEER": "missing: dataset seer: SEER (Omni-RAG's clinical QA set) has no loader yet"}
    lines: list[str] = []
    cells, _ = reproduce(m, preset="paper", out_dir=tmp_path / "out", dry_run=True, log=lines.append)
    assert cells["Closed book"]["SEER"].status.startswith("missing: dataset seer")
    assert any("not run: dataset seer" in line for line in lines)


def test_rows_whose_metric_no_task_produces_are_missing_with_the_reason(tmp_path):
    from omnimed.evaluation.tasks import EVAL_TASKS
    from omnimed.tables.manifest import produces
    from omnimed.tables.reproduce import plan_rows, reproduce

    rows = [{"name": "Original", "method": "rag", "overrides": ["pipeline=rag"], "published": {"Book": 117.1}},
            {"name": "Planner", "method": "biomedsearch", "published": {"Book": 9.0}},
            {"name": "SPO", "method": "omnirag", "overrides": ["pipeline=omnirag"], "published": {"Book": 5.4}}]
    path = qa_manifest(tmp_path, {"miniature": {"Book": "world_mcq"}, "paper": {"Book": "world_mcq"}}, rows,
                       metric="words_per_query", metrics={"Book": "words_per_query/book"}, scale=1)
    with pytest.raises(ManifestError, match="unknown method 'biomedsearch'"):
        load_manifest(path)  # neither registered nor a paper folder beside the manifest's
    (tmp_path / "experiments" / "biomedsearch").mkdir()  # a paper whose method is not built yet: its folder exists
    m = load_manifest(path)
    original, spo = m.rows[0], m.rows[2]
    assert original.status == "missing" and [p.row.name for p in plan_rows(m, "miniature")] == ["SPO"]
    assert original.reason.startswith("metric words_per_query/book not produced yet (task=qa writes accuracy, ")
    assert spo.status == "runnable"  # the omnirag method declares the plan statistics it writes
    assert m.counts() == {"runnable": 1, "missing": 2, "external": 0}
    cells, _ = reproduce(m, out_dir=tmp_path / "out", dry_run=True, log=lambda _: None)
    assert cells["Original"]["Book"].status == "missing: " + original.reason
    assert cells["Planner"]["Book"].status == "missing"  # method not built: as before
    res = reproduce_cli("--list", "--root", str(tmp_path / "experiments"), cwd=tmp_path)
    out = res.stdout + res.stderr
    assert "metric words_per_query/book not produced yet" in out and "method biomedsearch not built" in out
    assert produces("qa", "words_per_query/book", "omnirag") and not produces("qa", "words_per_query/book", "rag")
    # the families each task writes; adding a metric to a task is one entry of its EvalTask.metrics
    assert produces("retrieval", "ndcg@3") and produces("retrieval", "mrr") and not produces("retrieval", "accuracy")
    assert produces("critic_accuracy", "support/accuracy") and produces("qa", "accuracy")
    assert produces("qa", "statement_correct_ratio") and not produces("qa", "words_per_query")
    assert "qa" in EVAL_TASKS and not produces("no_such_task", "accuracy")


def test_launcher_settings_validate_against_the_chosen_launcher_and_reach_the_runs(tmp_path):
    from omnimed.tables.reproduce import plan_rows, run_overrides, split_launcher, validate

    path = manifest(tmp_path, ROWS[:1])
    m = load_manifest(path)
    extra = ["hydra.launcher.gpus_per_node=1", "hydra.launcher.partition=gpu"]
    plans = plan_rows(m, "miniature", extra)
    validate(plans, m, launcher="submitit_slurm")
    with pytest.raises(ManifestError, match="gpus_per_node"):  # the basic launcher has no such setting
        validate(plans, m)
    cmd = run_overrides(plans[0], m, tmp_path / "runs", "submitit_slurm", "world")
    assert [c for c in cmd if c.startswith("hydra/launcher=")] == ["hydra/launcher=submitit_slurm"]
    assert set(extra) <= set(cmd)
    # the launcher named among the overrides is the same choice, passed once; two different ones are refused
    assert split_launcher("basic", ["hydra/launcher=joblib", "task.k=3"]) == ("joblib", ["task.k=3"])
    assert split_launcher("joblib", ["hydra/launcher=joblib"]) == ("joblib", [])
    with pytest.raises(ManifestError, match="two launchers"):
        split_launcher("submitit_slurm", ["hydra/launcher=joblib"])
    res = reproduce_cli(str(path), "--launcher", "submitit_slurm", "--dry-run", *extra, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    res = reproduce_cli(str(path), "--launcher", "submitit_slurm", "--dry-run", "hydra.launcher.gpus_per_nod=1",
                        cwd=tmp_path)
    assert res.returncode == 2 and "gpus_per_nod" in res.stdout + res.stderr


def test_a_row_with_an_unknown_option_fails_before_any_run(tmp_path):
    path = manifest(tmp_path, [*ROWS[:1], {"name": "Broken", "method": "retrieval",
                                            "overrides": ["knowledge=no_such_corpus"]}])
    res = reproduce_cli(str(path), cwd=tmp_path)
    assert res.returncode == 2
    assert "Broken" in res.stderr + res.stdout and "no_such_corpus" in res.stderr + res.stdout
    assert not (tmp_path / "experiments" / "demo" / "results" / "runs").exists()  # nothing ran
    # the row's overrides are composed last too only where the preset sets one of the same keys (it hides them)
    from omnimed.tables.reproduce import plan_rows

    plans = plan_rows(load_manifest(path), "miniature")
    assert plans[0].row_last == [] and plans[1].row_last[-1] == "knowledge=no_such_corpus"


def test_reproduce_runs_rows_reports_missing_and_writes_the_table(tmp_path):
    path = manifest(tmp_path, ROWS)
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "experiments" / "demo" / "results"
    rows = {r["row"]: r for r in csv.DictReader((out / "table1.csv").open())}
    for name in ("BM25", "Dense"):
        assert rows[name]["status"] == "measured"
        assert 0.0 <= float(rows[name]["ours"]) <= 100.0
        assert float(rows[name]["delta"]) == pytest.approx(float(rows[name]["ours"]) - float(rows[name]["paper"]))
    # selfbiorag is built, but its task (qa) does not produce this table's hit@10: missing, saying why
    assert rows["Self-BioRAG"]["status"].startswith("missing: metric hit@10 not produced yet (task=qa writes accuracy")
    assert rows["Self-BioRAG"]["ours"] == ""
    assert rows["GPT-4"]["status"] == "external" and rows["GPT-4"]["ours"] == ""
    md = (out / "table1.md").read_text()
    assert "| Self-BioRAG | selfbiorag | missing: metric hit@10 not produced yet (task=qa writes accuracy" in md
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
    # without a filter each run is still listed once (its folder's metrics.json and its W&B run are one run)
    cmp = subprocess.run([str(BIN / "omnimed-compare"), str(runs), "--metrics", "bm25/hit@10,dense/hit@10",
                          "--out", str(tmp_path / "all")], capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert len((tmp_path / "all" / "compare.csv").read_text().splitlines()) == 3

    # the table itself is a run of the same group (job type "table"): every cell's ours and paper as its summary
    (run_file,) = (out / "runs" / "table1-report").glob("wandb/offline-run-*/run-*.wandb")
    logged = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json", str(run_file)],
                                       capture_output=True, text=True, check=True).stdout)
    assert logged["summary"]["ours/BM25/World"] == pytest.approx(float(rows["BM25"]["ours"]))
    assert logged["summary"]["paper/Dense/World"] == 80.0 and "ours/GPT-4/World" not in logged["summary"]
    assert logged["summary"]["table"]["_type"] == "table-file" and logged["summary"]["plot"]["_type"] == "image-file"
    assert "wandb:" in res.stdout + res.stderr and "table1-report" in res.stdout + res.stderr  # where it is


def test_a_run_that_fails_is_shown_in_its_cell_and_fails_the_command(tmp_path):
    """A row that composes but whose run breaks (here: the real-data knowledge base with no real-data folder set)
    is reported in its cell with the reason, and the command exits non-zero so a sweep script notices."""
    import os

    path = manifest(tmp_path, [{"name": "Real queries", "method": "retrieval",
                                "overrides": ["task.methods=[bm25]", "knowledge=realdata"],
                                "published": {"World": 50.0}}])
    env = {k: v for k, v in os.environ.items() if k != "OMNIMED_REALDATA"}
    # at `paper` scale the row's own choices win over the preset's knowledge base
    res = subprocess.run([str(BIN / "omnimed-reproduce"), str(path), "--preset", "paper", f"paths.root={tmp_path}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 failed" in res.stdout + res.stderr
    rows = {r["row"]: r for r in csv.DictReader((tmp_path / "experiments" / "demo" / "results" / "table1.csv").open())}
    assert rows["Real queries"]["status"].startswith("failed") and "OMNIMED_REALDATA" in rows["Real queries"]["status"]
    assert rows["Real queries"]["ours"] == ""


def test_a_dataset_the_failed_sweep_never_reached_says_so_and_does_not_take_the_failure_as_its_own(tmp_path):
    """A multirun stops at its first failing dataset: that run's cell carries the sweep's error, while the datasets
    after it, which never started, say they were not reached, naming the error as the earlier dataset's."""
    from omnimed.tables.report import Cell
    from omnimed.tables.reproduce import sweep_failure

    reason = "omnimed-evaluate: error: OMNIMED_REALDATA is not set"
    started, never = tmp_path / "mmlu", tmp_path / "pubmedqa"
    started.mkdir()
    assert sweep_failure(Cell(status="failed"), started, reason).status == f"failed: {reason}"
    unreached = sweep_failure(Cell(status="failed"), never, reason).status
    assert unreached.startswith("failed: not reached;") and reason in unreached
    own = Cell(status="failed: the backend timed out on 12 of 40 questions")  # its own failed.json wins
    assert sweep_failure(own, started, reason) == own
    assert sweep_failure(Cell(status="failed"), started, "").status == "failed"  # no reason is invented


def test_a_metric_a_finished_run_says_it_could_not_define_is_shown_with_why_and_is_no_failure(tmp_path):
    """Table 12's words per graph query when no plan queried the graph: the run wrote its reason in undefined.json,
    the cell shows it and is not counted as failed; a metric missing without a reason still is a failure."""
    from omnimed.tables.reproduce import read_cell

    table = load_manifest(manifest(tmp_path, ROWS))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"n": 500.0}))
    assert read_cell(run, table, "World").status == "failed: no 'hit@10' in metrics.json"
    (run / "undefined.json").write_text(json.dumps({"hit@10": "none of the 500 plans sent a query to graph"}))
    cell = read_cell(run, table, "World")
    assert cell.status == "undefined: none of the 500 plans sent a query to graph" and cell.ours is None
    # an Average leaves an undefined column out, as the papers leave out a '-', but not a failed one
    from omnimed.tables.report import Cell, fill_averages

    averaged = load_manifest(qa_manifest(tmp_path, {p: {"Book": "world_mcq", "Graph": "world_mcq", "Avg": "average"}
                                                    for p in ("miniature", "paper")}))
    row = {"Book": Cell(ours=5.0, status="measured"), "Graph": cell}
    fill_averages(averaged, "miniature", row)
    assert row["Avg"].ours == 5.0
    row["Graph"] = Cell(status="failed: no 'accuracy' in metrics.json")
    fill_averages(averaged, "miniature", row)
    assert row["Avg"].ours is None and row["Avg"].status == "not run: needs every other column"


def test_list_shows_every_table_with_its_counts(tmp_path):
    manifest(tmp_path, ROWS)
    res = reproduce_cli("--list", "--root", str(tmp_path / "experiments"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() + res.stderr.splitlines() if "table1" in line)
    assert "│ 4 " in line and "│ 2 " in line and "│ 1 " in line  # rows, run, missing, external


def test_compare_lists_a_run_once_and_filters_local_runs_by_group_and_tags(tmp_path, monkeypatch):
    """A run folder and the W&B offline run inside it are one run; a folder without W&B still has the group and
    tags of its Hydra config, so --group / --tags select it too."""
    from omnimed.cli.compare import main as compare_main
    from omnimed.tables import compare
    from omnimed.tables.compare import RunRecord, local_runs, select

    def run_folder(rel: str, metrics: dict, config: dict, wandb: str | None = None) -> Path:
        folder = tmp_path / "runs" / rel
        (folder / ".hydra").mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(metrics))
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        if wandb:
            (folder / "wandb" / f"offline-run-{wandb}").mkdir(parents=True)
            (folder / "wandb" / f"offline-run-{wandb}" / f"run-{wandb}.wandb").write_bytes(b"")
        return folder

    run_folder("bm25/world", {"bm25": {"hit@10": 0.5}, "queries": 20},
               {"logger": {"group": "demo-table1", "tags": ["mini"]}, "experiment": "demo-table1",
                "task": {"name": "retrieval", "queries": "world"}, "knowledge": {"name": "world_tiny"}}, wandb="a")
    run_folder("closed/world_mcq", {"accuracy": 0.7, "n": 29},
               {"logger": {"group": None, "tags": []}, "experiment": "other-table",
                "task": {"name": "qa", "dataset": "world_mcq"}, "pipeline": {"name": "closed_book"}})
    loose = tmp_path / "runs" / "elsewhere" / "offline-run-b"
    loose.mkdir(parents=True)
    (loose / "run-b.wandb").write_bytes(b"")
    wandb_runs = {
        "run-a.wandb": RunRecord("bm25-world", "a", "demo-table1", ["mini", "retrieval"],
                                 {"bm25/hit@10": 0.5, "bm25/mrr": 0.4}),
        "run-b.wandb": RunRecord("dense-world", "b", "demo-table1", ["retrieval"], {"dense/hit@10": 0.6}),
    }
    monkeypatch.setattr(compare, "offline_wandb_run", lambda path: wandb_runs[path.name])

    runs = local_runs([tmp_path / "runs"])
    assert sorted(r.name for r in runs) == ["bm25-world", "closed/world_mcq", "dense-world"]  # bm25 once, not twice
    bm25 = next(r for r in runs if r.name == "bm25-world")
    assert bm25.origin.endswith("bm25/world") and bm25.metrics["bm25/hit@10"] == 0.5
    assert bm25.metrics["bm25/mrr"] == 0.4 and bm25.metrics["queries"] == 20  # both sources merged
    assert [r.name for r in select(runs, group="demo-table1", tags=[])] == ["bm25-world", "dense-world"]
    # a local folder without W&B: its group (experiment) and tags (qa, dataset, pipeline) from .hydra/config.yaml
    assert [r.name for r in select(runs, group="other-table", tags=[])] == ["closed/world_mcq"]
    assert [r.name for r in select(runs, group=None, tags=["qa", "world_mcq"])] == ["closed/world_mcq"]
    assert [r.name for r in select(runs, group="demo-table1", tags=["mini"])] == ["bm25-world"]

    out = tmp_path / "cmp"
    assert compare_main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert len((out / "compare.csv").read_text().splitlines()) == 4  # header + three runs, none twice
    assert compare_main([str(tmp_path / "runs"), "--group", "other-table", "--out", str(out)]) == 0
    assert (out / "compare.csv").read_text().splitlines() == ["run,accuracy,n", "closed/world_mcq,0.7,29.0"]


def test_seeds_average_the_curves_with_a_band_and_the_plots_follow_the_sort(tmp_path, monkeypatch):
    """--seeds: the seeds' mean curve over the steps all of them logged, with its 95% band drawn; a seed at the
    start of a name (s0_lr3e-3) leaves the label too; the plot lists runs in the --sort order, as the table does."""
    import matplotlib.pyplot as plt

    from omnimed.tables.compare import RunRecord, over_seeds, plot, plot_curves, sort_runs

    runs = [RunRecord("s0_lr3e-3", "a", metrics={"val/loss": 2.0}, history={"train/loss": [(1, 3.0), (2, 2.0)]}),
            RunRecord("s1_lr3e-3", "b", metrics={"val/loss": 4.0},
                      history={"train/loss": [(1, 5.0), (2, 4.0), (3, 1.0)]}),
            RunRecord("s0_lr1e-3", "c", metrics={"val/loss": 1.0}, history={"train/loss": [(1, 1.0)]})]
    pair, single = over_seeds(runs)
    assert pair.name == "lr3e-3 (2 seeds)" and pair.metrics["val/loss"] == 3.0
    assert pair.metrics["val/loss/ci95"] == pytest.approx(12.7062, rel=1e-4)  # t(0.975, 1) x sd / sqrt(2), sd = sqrt(2)
    assert pair.history["train/loss"] == [(1, 4.0), (2, 3.0)]  # step 3: one seed only
    assert [ci for _, ci in pair.history["train/loss/ci95"]] == pytest.approx([12.7062, 12.7062], rel=1e-4)
    assert single.name == "s0_lr1e-3" and single.metrics == {"val/loss": 1.0, "seeds": 1.0}
    ordered = sort_runs([pair, single], "val/loss")
    assert [r.name for r in ordered] == ["s0_lr1e-3", "lr3e-3 (2 seeds)"]
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot(ordered, ["val/loss"], tmp_path / "p.png")
    assert [t.get_text() for t in figures[0].axes[0].get_yticklabels()] == ["s0_lr1e-3", "lr3e-3 (2 seeds)"]
    assert plot_curves(ordered, ["train/loss"], tmp_path / "c.png")
    assert len(figures[1].axes[0].collections) == 1  # one band: the seeds' mean has one, a single run none


def test_compare_prints_many_metrics_of_few_runs_one_per_line():
    from omnimed.cli.compare import console_table

    metrics = [f"m{i}" for i in range(10)]
    rows = [["run-a", *range(10)], ["run-b", *([None] * 10)]]
    wide = console_table(metrics, rows, title="t")
    assert [c.header for c in wide.columns] == ["metric", "run-a", "run-b"] and wide.row_count == 10
    narrow = console_table(metrics[:2], [r[:3] for r in rows], title="t")
    assert [c.header for c in narrow.columns] == ["run", "m0", "m1"] and narrow.row_count == 2


def test_a_retrieval_ndcg_column_pairs_each_querys_own_ndcg_whose_mean_is_the_tables_cell(tmp_path):
    """NDCG@k columns state a detectable difference too: each query's NDCG from the predictions, on the ranking
    ir-measures scored (a passage at its first chunk, a query without hits at 0), averages to the cell."""
    from omnimed.data.records import Passage
    from omnimed.evaluation.retrieval import RetrievalQuery, ir_metrics, prediction_rows
    from omnimed.knowledge.types import Hit
    from omnimed.tables.detectable import question_outcomes

    def hit(pid: str, rank: int, chunk_of: str | None = None) -> Hit:
        meta = {"chunk_of": chunk_of} if chunk_of else {}
        return Hit(Passage(id=pid, source="book", text="t", metadata=meta), 1.0 / rank, rank, "bm25")

    queries = [RetrievalQuery("q1", "book", "a", {"g1"}), RetrievalQuery("q2", "book", "b", {"g2", "g3"}),
               RetrievalQuery("q3", "book", "c", {"g4"}), RetrievalQuery("q4", "book", "d", set())]
    hits = {"q1": [hit("x#0", 1, "x"), hit("x#1", 2, "x"), hit("g1", 3)],  # x's second chunk does not push g1 down
            "q2": [hit("g3", 1), hit("y", 2), hit("z", 3), hit("g2", 4)],
            "q3": [], "q4": [hit("g1", 1)]}
    run = tmp_path / "ret"
    run.mkdir()
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prediction_rows(queries,
                                                                                                 {"bm25": hits})))
    per_query = question_outcomes(run, "bm25/ndcg@3")
    assert set(per_query) == {"q1", "q2", "q3"}  # a query without gold has no NDCG
    assert per_query["q1"] == pytest.approx(1 / math.log2(3)) and per_query["q3"] == 0.0
    assert per_query["q2"] == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert sum(per_query.values()) / 3 == pytest.approx(ir_metrics(queries, hits, ks=(3,))["ndcg@3"], abs=1e-9)


def test_the_smallest_detectable_difference_is_the_paired_half_width_of_the_most_discordant_rows(tmp_path):
    from omnimed.tables.detectable import detectable_difference, question_outcomes

    a = {"q1#0": True, "q2#0": True, "q3#0": False, "q4#0": False}
    b = {"q1#0": True, "q2#0": False, "q3#0": True, "q4#0": False}  # disagrees with a on 2 of 4
    half, n = detectable_difference([a, b, dict(a)])
    assert n == 4 and half == pytest.approx(1.959964 * (0.5 / 4) ** 0.5, abs=1e-6)
    assert detectable_difference([a]) is None and detectable_difference([a, {"other#0": True}]) is None
    # per question from a run's predictions: all rows for accuracy, one label type for <type>/accuracy
    run = tmp_path / "run"
    run.mkdir()
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "e1", "type": "utility", "correct": True}, {"id": "e2", "type": "support", "correct": False}]))
    assert question_outcomes(run, "utility/accuracy") == {"e1#0": True}
    assert question_outcomes(run, "accuracy") == {"e1#0": True, "e2#0": False}
    assert question_outcomes(run, "hit@10") is None and question_outcomes(tmp_path, "accuracy") is None
    # a retrieval HIT@k column: per query, the method's first gold rank within k
    ret = tmp_path / "ret"
    ret.mkdir()
    (ret / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"method": "bm25", "query_id": "q1@pool", "first_gold_rank": 3},
        {"method": "bm25", "query_id": "q2@pool", "first_gold_rank": None},
        {"method": "dense", "query_id": "q1@pool", "first_gold_rank": 4}]))
    assert question_outcomes(ret, "bm25/hit@3") == {"q1@pool": True, "q2@pool": False}
    assert question_outcomes(ret, "dense/hit@3") == {"q1@pool": False}
    assert question_outcomes(ret, "bm25/ndcg@3") is None  # rows without their hits: no per-query NDCG
    # a long-form statement column (PolyRAG table 2): per answer, its share or count of statements with the label
    open_run = tmp_path / "open"
    open_run.mkdir()
    (open_run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": "o1", "seed": 0, "labels": ["correct", "incorrect", "correct", "not_mentioned"]},
        {"question_id": "o2", "seed": 0, "labels": []}]))
    assert question_outcomes(open_run, "statement_correct_ratio") == {"o1#0": 0.5}  # no statements: no share
    assert question_outcomes(open_run, "statement_correct_count") == {"o1#0": 2.0, "o2#0": 0.0}
    # an LUQ column (Omni-RAG table 10): each sampled question's uncertainty; questions left unsampled have none
    luq_run = tmp_path / "luq"
    luq_run.mkdir()
    (luq_run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": "m1", "seed": 0, "correct": True, "luq": 0.25}, {"question_id": "m2", "seed": 0, "luq": None},
        {"question_id": "m3", "seed": 0, "correct": False}]))
    assert question_outcomes(luq_run, "luq") == {"m1#0": 0.25}
    # numbers pair the same way: the half-width from the mean squared difference (here 0.25 and 0.75 apart)
    half, n = detectable_difference([{"o1#0": 0.5, "o3#0": 1.0}, {"o1#0": 0.25, "o3#0": 0.25}])
    assert n == 2 and half == pytest.approx(1.959964 * (((0.25 ** 2 + 0.75 ** 2) / 2) / 2) ** 0.5, abs=1e-6)


def test_a_column_where_every_row_answers_alike_is_reported_as_telling_no_rows_apart(tmp_path):
    from omnimed.tables.detectable import detectable_difference
    from omnimed.tables.report import Cell, markdown

    m = load_manifest(manifest(tmp_path, ROWS[:2]))
    same = {f"q{i}#0": i % 3 == 0 for i in range(30)}  # one answer for all: the rows agree on every question
    cells = {r["name"]: {"World": Cell(ours=33.3, status="measured", outcomes=dict(same))} for r in ROWS[:2]}
    alike = markdown(m, cells, "miniature", {"World": detectable_difference([dict(same), dict(same)])})
    assert "Every row has the same outcome on every question of: World" in alike
    other = cells[ROWS[1]["name"]]["World"].outcomes
    other["q1#0"] = True  # one question apart: a resolution, not this line
    apart = markdown(m, cells, "miniature", {"World": detectable_difference([dict(same), other])})
    assert "Every row has the same outcome" not in apart
    assert "One answer to at least" not in apart


def test_a_fraction_column_prints_the_decimals_its_manifest_asks_for(tmp_path):
    """An uncertainty in [0, 1] (Omni-RAG table 10's LUQ) read to one decimal would hide every difference between
    rows: ``digits`` sets a column's decimals; an unknown column there is an error naming the field."""
    from omnimed.tables.report import Cell, markdown
    from omnimed.tables.reproduce import read_cell

    path = manifest(tmp_path, [{**ROWS[0], "published": {"World": 0.343}}])
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "scale": 1, "digits": {"World": 3}}, sort_keys=False))
    m = load_manifest(path)
    text = markdown(m, {"BM25": {"World": Cell(ours=0.2498, low=0.231, high=0.2687, status="measured")}}, "miniature")
    assert "| BM25 | retrieval | 0.250 [0.231, 0.269] / 0.343 (-0.093) |" in text
    # an LUQ run samples part of its questions (task.luq_limit): the cell counts those, paired by question
    path.write_text(yaml.safe_dump({**data, "metric": "luq", "scale": 1, "digits": {"World": 3}}, sort_keys=False))
    run = tmp_path / "luq"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"accuracy": 0.5, "n": 3, "luq": 0.25, "luq/n": 2}))
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": "a", "luq": 0.5}, {"question_id": "b", "luq": 0.0}, {"question_id": "c"}]))
    cell = read_cell(run, load_manifest(path), "World")
    assert (cell.status, cell.ours, cell.n, cell.outcomes) == ("measured", 0.25, 2, {"a#0": 0.5, "b#0": 0.0})
    path.write_text(yaml.safe_dump({**data, "digits": {"Nope": 3}}, sort_keys=False))
    with pytest.raises(ManifestError, match=r"digits: unknown columns \['Nope'\]"):
        load_manifest(path)


def test_a_cell_whose_reader_gives_one_answer_to_nearly_every_question_says_so(tmp_path):
    from omnimed.tables.detectable import answer_skew
    from omnimed.tables.report import Cell, markdown

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"question_id": f"q{i}", "prediction": "C" if i < 19 else "A", "correct": i >= 16} for i in range(20)]
    rows.append({"question_id": "q20", "prediction": None, "error": "timeout"})  # failed calls are not answers
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert answer_skew(run) == ("C", 19, 20)
    assert answer_skew(tmp_path) is None
    m = load_manifest(manifest(tmp_path, ROWS[:2]))
    first, second = (r["name"] for r in ROWS[:2])
    cells = {first: {"World": Cell(ours=20.0, status="measured", skew=answer_skew(run))},
             second: {"World": Cell(ours=40.0, status="measured", skew=("B", 17, 20))}}  # 85%: under the bar
    text = markdown(m, cells, "miniature")
    assert f"One answer (or option position) to at least 90% of the questions in: World ({first}: C 19/20)." in text
    assert f"{second}: B" not in text


def test_a_reader_that_answers_by_position_is_reported_even_when_its_letters_differ(tmp_path):
    from omnimed.tables.detectable import answer_skew
    from omnimed.tables.report import Cell, markdown

    run = tmp_path / "run"
    run.mkdir()

    def row(i: int, letters: str, pick: str) -> dict:
        return {"question_id": f"q{i}", "prediction": pick, "correct": False,
                "output": json.dumps({x: -1.0 - (x != pick) for x in letters})}

    # the last option every time: D on four-option questions, E on five; no letter reaches 90% by itself
    rows = [row(i, "ABCD" if i % 2 else "ABCDE", "D" if i % 2 else "E") for i in range(19)]
    rows.append(row(19, "ABCDE", "A"))
    rows.append({"question_id": "q20", "prediction": "B", "output": "B, because"})  # a generated answer: no options
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert answer_skew(run) == ("the last option", 19, 21)
    m = load_manifest(manifest(tmp_path, ROWS[:1]))
    name = ROWS[0]["name"]
    text = markdown(m, {name: {"World": Cell(ours=20.0, status="measured", skew=answer_skew(run))}}, "miniature")
    assert f"World ({name}: the last option 19/21)." in text
    answer = Cell(ours=20.0, status="measured", skew=answer_skew(run))
    again = replace(answer, same_as=name)
    two = load_manifest(manifest(tmp_path, ROWS[:2]))
    text = markdown(two, {name: {"World": answer}, ROWS[1]["name"]: {"World": again}}, "miniature")
    assert f"World ({name}: the last option 19/21)." in text  # the row that is its run is not named twice
    noted = replace(answer, other_code="computed by other code (outside git): the package's source differs")
    text = " ".join(markdown(two, {name: {"World": noted}, ROWS[1]["name"]: {"World": replace(noted, same_as=name)}},
                             "miniature").split())
    assert f"differs: {name} / World. Their config" in text  # nor among the cells other code computed
    mixed = [row(i, "ABCDE", "D") for i in range(6)] + [row(i, "ABCDE", "E") for i in range(6, 10)]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mixed))
    assert answer_skew(run) == ("D", 6, 10)  # the last option 4 times, D 6: the letter is what is reported


def test_each_row_is_paired_by_question_against_the_named_row_and_separated_pairs_are_marked(tmp_path):
    from omnimed.tables.detectable import paired_difference
    from omnimed.tables.report import Cell, markdown

    d = paired_difference({"q1": 1.0, "q2": 0.5, "q3": 0.0}, {"q1": 0.5, "q2": 0.5, "q3": 0.5})
    assert d == pytest.approx((0.0, 1.959964 * 0.5 / 3 ** 0.5, 3), abs=1e-6)  # differences 0.5, 0, -0.5
    assert paired_difference({"q1": True}, {"q1": False}) is None  # one shared question: no interval
    path = manifest(tmp_path, ROWS[:3])
    data = yaml.safe_load(path.read_text())
    data["paired_against"] = "Self-BioRAG"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    m = load_manifest(path)
    many = [f"q{i}#0" for i in range(40)]
    best = {k: True for k in many}
    cells = {"Self-BioRAG": {"World": Cell(ours=100.0, status="measured", outcomes=best)},
             "BM25": {"World": Cell(ours=25.0, status="measured",
                                    outcomes={k: i % 4 == 0 for i, k in enumerate(many)})},
             "Dense": {"World": Cell(ours=97.5, status="measured", outcomes={k: i != 0 for i, k in enumerate(many)})}}
    text = markdown(m, cells, "miniature")
    assert "Paired by question: `Self-BioRAG` minus each row" in text
    assert "| BM25 | +75.0 +- 13.6 * |" in text  # 30 of 40 better: told apart
    assert "| Dense | +2.5 +- 4.9 |" in text  # one question: not told apart, no mark
    # the paper puts BM25 20 points above Self-BioRAG: a separated pair the other way round is named, never hidden
    assert ("Told apart in the paper's direction (the sign of its published difference): 0 cell(s); against it: "
            "BM25 / World (+75.0, the paper's -20.0).") in " ".join(text.split())
    data["rows"][0]["published"]["World"] = 60.0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "paper's direction (the sign of its published difference): 1 cell(s); against it: none." in " ".join(
        markdown(load_manifest(path), cells, "miniature").split())
    cells["Dense"]["World"].same_as = "BM25"  # a row that is another row's run is listed once
    assert "| Dense |" not in markdown(m, cells, "miniature").split("Paired by question")[1]
    data["paired_against"] = "Nobody"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(Exception, match="paired_against='Nobody': no row of that name"):
        load_manifest(path)


@pytest.mark.slow
def test_training_seeds_train_each_seed_once_and_the_table_states_the_spread(tmp_path):
    """`--training-seeds` fills {train_seed} / {seed_tag} in the prepare steps and overrides, so each seed builds
    its own artifact (the default seed's keeps its untagged path) and every row runs against it; the table states
    each cell's spread over the seeds, and a later single-seed run of the table still states it. A row that reads
    nothing trained with the seed runs once for all seeds. A seed measured before is not trained or run again, on
    this disk or another."""
    fixed = {"name": "BM25 on seed 0's world", "method": "retrieval",
             "overrides": ["task.methods=[bm25]", "knowledge.world_seed=0"], "published": {"World": 90.0}}
    path = manifest(tmp_path, [{**ROWS[0], "preset_overrides": {"miniature": ["knowledge.world_seed={train_seed}"]}},
                               fixed])
    data = yaml.safe_load(path.read_text())
    data["prepare"] = {"miniature": [{
        "name": "seeded world", "command": ["omnimed-data", "world", "size=tiny", "seed={train_seed}",
                                            "out=${paths.root}/builds/w{seed_tag}"],
        "creates": "builds/w{seed_tag}/manifest.json"}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = reproduce_cli(str(path), "--training-seeds", "0,3", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = " ".join((res.stdout + res.stderr).split())
    assert "BM25 on seed 0's world: the same run as 'BM25' at training seed 0" in log
    assert (tmp_path / "builds" / "w" / "manifest.json").is_file()
    assert (tmp_path / "builds" / "w-seed3" / "manifest.json").is_file()
    out = tmp_path / "experiments" / "demo" / "results"
    spread = json.loads((out / "table1.seeds.json").read_text())
    assert spread["seeds"] == [0, 3] and spread["preset"] == "miniature"
    bm25 = spread["values"]["BM25"]["World"]
    assert len(bm25) == 2 and None not in bm25
    for seed, runs in ((0, "table1"), (3, "table1-seed3")):  # each seed's rows ran with that seed's overrides
        config = yaml.safe_load((out / "runs" / runs / "bm25" / "world" / ".hydra" / "config.yaml").read_text())
        assert config["knowledge"]["world_seed"] == seed
    assert not (out / "runs" / "table1-seed3" / "bm25-on-seed-0-s-world").exists()  # taken from seed 0, not run
    assert spread["values"]["BM25 on seed 0's world"]["World"] == [bm25[0], bm25[0]]
    assert spread["ran_once"] == ["BM25 on seed 0's world"]
    rows = {r["row"]: r for r in csv.DictReader((out / "table1.csv").open())}
    assert float(rows["BM25"]["ours"]) == pytest.approx(bm25[0])  # the table itself is the default seed's
    md = (out / "table1.md").read_text()
    assert "Spread over training seeds 0, 3" in md
    assert "| World (world question -> gold passage) |" in md  # the miniature column, labelled by its content
    assert f"| BM25 | {min(bm25):.1f}-{max(bm25):.1f} (" in md
    assert "Run once for all seeds (they read nothing trained with the seed): BM25 on seed 0's world." in md
    # a single-seed rerun reuses seed 0's artifact and still states the measured spread
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "seeded world: done" in " ".join((res.stdout + res.stderr).split())
    assert "Spread over training seeds 0, 3" in (out / "table1.md").read_text()
    # seed 3's numbers are stored: with its model and runs gone (another machine, say), it is read back, not rebuilt
    shutil.rmtree(tmp_path / "builds" / "w-seed3")
    shutil.rmtree(out / "runs" / "table1-seed3")
    res = reproduce_cli(str(path), "--training-seeds", "0,3", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "table1.seeds.json, where an earlier run stored it" in " ".join((res.stdout + res.stderr).split())
    assert not (tmp_path / "builds" / "w-seed3").exists() and not (out / "runs" / "table1-seed3").exists()
    assert json.loads((out / "table1.seeds.json").read_text())["values"] == spread["values"]
    # on a fresh disk, with both seeds measured before: seed 0's cells come from the stored cells, seed 3's from the
    # spread, so nothing is built or run, and the table and its spread read as before
    before = (out / "table1.md").read_text().splitlines()
    shutil.rmtree(tmp_path / "builds")
    shutil.rmtree(out / "runs")
    res = reproduce_cli(str(path), "--training-seeds", "0,3", "--dry-run", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = " ".join((res.stdout + res.stderr).split())  # the preview says what the run will do: train nothing
    assert "every run of the table is on this disk or in table1.cells.json.gz" in log
    assert "prepare seeded world" not in log and "[1/2] BM25" not in log
    res = reproduce_cli(str(path), "--training-seeds", "0,3", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = " ".join((res.stdout + res.stderr).split())
    assert "every run of the table is on this disk or in table1.cells.json.gz" in log
    assert not (tmp_path / "builds").exists() and not (out / "runs" / "table1").exists()
    assert json.loads((out / "table1.seeds.json").read_text())["values"] == spread["values"]
    after = (out / "table1.md").read_text().splitlines()
    assert [line for line in after if line.startswith("| ")] == [line for line in before if line.startswith("| ")]
    assert "Spread over training seeds 0, 3" in "\n".join(after) and "BM25 / World (" in "\n".join(after)
    with pytest.raises(SystemExit):
        from omnimed.cli.reproduce import main
        main([str(path), "--training-seeds", "zero"])


def test_a_recipe_pinned_to_a_seed_keeps_that_seed_whatever_seed_the_table_trains_with(tmp_path):
    """`{recipe: ..., seed: 0}` takes a recipe's steps at seed 0 at every training seed (a row that compares the
    run's seed's model with seed 0's needs both), beside the same recipe at the run's seed, and once at seed 0
    itself; a malformed entry names the manifest and the entry."""
    from omnimed.tables.reproduce import for_training_seed

    path = manifest(tmp_path, ROWS[:1])
    (path.parent / "recipes").mkdir()
    (path.parent / "recipes" / "world.yaml").write_text(yaml.safe_dump([{
        "name": "seeded world", "command": ["omnimed-data", "world", "seed={train_seed}", "out=builds/w{seed_tag}"],
        "creates": "builds/w{seed_tag}/manifest.json"}]))
    data = yaml.safe_load(path.read_text())
    data["prepare"] = {"miniature": ["recipes/world.yaml", {"recipe": "recipes/world.yaml", "seed": 0}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    steps = for_training_seed(load_manifest(path), 3).prepare["miniature"]
    assert [(s.name, s.command[2], s.creates) for s in steps] == [
        ("seeded world", "seed=3", "builds/w-seed3/manifest.json"),
        ("seeded world at seed 0", "seed=0", "builds/w/manifest.json")]
    # at the pinned seed itself both entries are the same step: it is listed (and run, and dry-run) once
    assert [(s.name, s.creates) for s in for_training_seed(load_manifest(path), 0).prepare["miniature"]] == [
        ("seeded world", "builds/w/manifest.json")]
    data["prepare"] = {"miniature": [{"recipe": "recipes/world.yaml", "seed": "zero"}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ManifestError, match=r"table1\.yaml: prepare\.miniature\.0: a pinned recipe is"):
        load_manifest(path)


def test_the_spread_pairs_each_row_with_the_reference_at_every_seed_and_keeps_the_pairs_of_stored_seeds(tmp_path):
    """Rows that coincide at the default seed (a trained part swapped for its seed-0 version) differ only at later
    seeds: the spread records each row's paired difference from `paired_against` per seed, states it under the
    spread, and keeps a stored seed's pairs when that seed is read back without its predictions."""
    from omnimed.tables.report import Cell, spread_lines
    from omnimed.tables.seeds import seed_spread

    path = manifest(tmp_path, [{**ROWS[0], "name": "both at 0"}, {**ROWS[0], "name": "part at the seed"}])
    data = yaml.safe_load(path.read_text())
    data["paired_against"] = "both at 0"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    m = load_manifest(path)

    def cell(right: int, n: int = 100) -> Cell:
        return Cell(ours=100 * right / n, status="measured", outcomes={f"q{i}": i < right for i in range(n)})

    per_seed = {0: {"both at 0": {"World": cell(80)}, "part at the seed": {"World": cell(80)}},
                1: {"both at 0": {"World": cell(80)}, "part at the seed": {"World": cell(60)}}}
    spread = seed_spread(m, per_seed, "miniature")
    zero, one = spread["paired"]["part at the seed"]["World"]
    assert zero == [0.0, 0.0]
    assert one[0] == pytest.approx(20.0) and one[1] == pytest.approx(100 * 1.959964 * (16 / 99) ** 0.5 / 10)
    text = "\n".join(spread_lines(m, spread))
    assert "| part at the seed | 0: +0.0 +- 0.0; 1: +20.0 +- 7.9 * |" in text
    # seed 1 read back from the stored spread (no outcomes), seed 2 measured now
    stored = {name: {"World": Cell(ours=c["World"].ours, status="measured")} for name, c in per_seed[1].items()}
    again = seed_spread(m, {0: per_seed[0], 1: stored, 2: per_seed[0]}, "miniature", previous=spread)
    assert again["paired"]["part at the seed"]["World"] == [[0.0, 0.0], one, [0.0, 0.0]]


def test_a_stored_seed_spread_is_not_stated_for_a_row_whose_definition_changed_since(tmp_path):
    """A spread over training seeds describes the rows as they were defined when it was measured: once a row's
    overrides (or the prepare steps it reads) change, a later single-seed run states no spread for it, and says so;
    the rows left as they were keep theirs."""
    from omnimed.tables.report import Cell, spread_lines
    from omnimed.tables.reproduce import read_seed_spread, seed_spread, stored_seed_cells

    rows = [{**ROWS[0], "preset_overrides": {"miniature": ["knowledge.world_seed={train_seed}"]}}, ROWS[1]]
    path = manifest(tmp_path, rows)
    m = load_manifest(path)
    per_seed = {s: {"BM25": {"World": Cell(ours=50.0 + s, status="measured")},
                    "Dense": {"World": Cell(ours=40.0 + 2 * s, status="measured")}} for s in (0, 1, 2)}
    stored = tmp_path / "table1.seeds.json"
    stored.write_text(json.dumps(seed_spread(m, per_seed, "miniature")))
    kept = read_seed_spread(stored, m, "miniature")
    assert kept["changed"] == [] and set(kept["values"]) == {"BM25", "Dense"}
    assert "| Dense | 40.0-44.0 (2.0) |" in "\n".join(spread_lines(m, kept))
    again = stored_seed_cells(kept, m, [0, 1, 2], main=0)  # a seed-spread run reads seeds 1 and 2 back
    assert sorted(again) == [1, 2] and again[2]["Dense"]["World"].ours == 44.0
    broken = {**per_seed, 2: {**per_seed[2], "Dense": {"World": Cell(status="failed: exit 1")}}}
    assert sorted(stored_seed_cells(seed_spread(m, broken, "miniature"), m, [0, 1, 2], main=0)) == [1]
    partial = seed_spread(m, {0: per_seed[0]}, "miniature")  # a run stopped after its first seed
    assert "only seed 0 measured so far" in "\n".join(spread_lines(m, partial))

    data = yaml.safe_load(path.read_text())
    data["rows"][1]["overrides"] = ["task.methods=[dense]", "task.k=3"]  # Dense is now another computation
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    edited = load_manifest(path)
    spread = read_seed_spread(stored, edited, "miniature")
    assert spread["changed"] == ["Dense"] and list(spread["values"]) == ["BM25"]
    assert stored_seed_cells(spread, edited, [0, 1, 2], main=0) == {}  # a changed row: every seed runs again
    text = "\n".join(spread_lines(edited, spread))
    assert "| BM25 | 50.0-52.0 (1.0) |" in text and "| Dense |" not in text
    assert "Not stated for Dense: the manifest defines the row otherwise" in text
    assert read_seed_spread(stored, edited, "paper") is None  # measured at another preset: nothing to state
    data["rows"] = data["rows"][1:]  # a row since removed from the table is neither stated nor named
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spread = read_seed_spread(stored, load_manifest(path), "miniature")
    assert spread["values"] == {} and spread["changed"] == ["Dense"]
    text = "\n".join(spread_lines(load_manifest(path), spread))
    assert "no row of this table states one" in text and "min-max" not in text  # no title over an absent table


def test_the_plot_labels_each_panel_by_its_own_metric_and_keeps_the_legend_off_the_bars(tmp_path, monkeypatch):
    """PolyRAG table 1's NDCG panels say ndcg@3 (not the table's hit@3), the legend sits below the panels, and the
    title says ours come from the miniature stand-ins while the paper's come from its benchmark."""
    import matplotlib.pyplot as plt

    from omnimed.tables.report import _plot

    m = load_manifest(Path(__file__).resolve().parents[1] / "experiments" / "polyrag" / "table1.yaml")
    records = [{"row": r.name, "column": c, "paper": 30.0, "ours": 80.0, "ci_low": 75.0, "ci_high": 85.0}
               for r in m.rows for c in m.columns]
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    _plot(m, records, tmp_path / "t.png", "miniature")
    (fig,) = kept
    labels = {ax.get_title().split("(paper: ")[-1].rstrip(")"): ax.get_xlabel() for ax in fig.axes}
    assert labels["CARE/NDCG@3"].startswith("ndcg@3") and labels["CARE/HIT@3"].startswith("hit@3")
    assert fig.legends and not any(ax.get_legend() for ax in fig.axes)
    assert "stand-ins" in fig._suptitle.get_text() and (tmp_path / "t.png").is_file()
    # the markdown's metric line names the columns whose metric is not the table's
    from omnimed.tables.report import metric_line

    line = metric_line(m)
    assert line.startswith("hit@3 (x100); columns with their own: CARE/NDCG@3: ndcg@3 (x100)")
    assert "CARE/HIT@3" not in line


@pytest.mark.slow
def test_a_column_with_overrides_of_its_own_runs_apart_with_them(tmp_path):
    """Table 8's shape: a restriction per column (there, the one source available). Each such column runs on its
    own, in its own folder, with its overrides; the other columns keep sharing the row's sweep."""
    path = manifest(tmp_path, ROWS[:1])
    data = yaml.safe_load(path.read_text())
    data["columns"] = ["World", "First 5"]
    data["column_overrides"] = {"First 5": ["task.max_queries=5"]}
    for preset in data["datasets"].values():
        preset["First 5"] = "world"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(First 5: task.max_queries=5)" in " ".join((res.stdout + res.stderr).split())  # the log names it
    runs = tmp_path / "experiments" / "demo" / "results" / "runs" / "table1" / "bm25"
    shared, alone = runs / "world", runs / "first-5" / "world"
    assert "task.max_queries=5" in (alone / ".hydra" / "overrides.yaml").read_text()
    assert "task.max_queries" not in (shared / ".hydra" / "overrides.yaml").read_text()
    rows = list(csv.DictReader((tmp_path / "experiments" / "demo" / "results" / "table1.csv").open()))
    assert {r["column"] for r in rows if r["status"] == "measured"} == {"World", "First 5"}
    with pytest.raises(ManifestError, match=r"column_overrides: unknown columns \['Nope'\]"):
        data["column_overrides"] = {"Nope": ["task.k=1"]}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_manifest(path)


@pytest.mark.slow
def test_rows_that_compose_to_the_same_run_at_a_preset_run_once_and_the_table_says_so(tmp_path):
    """At miniature one model stands in for the paper's several (PolyRAG table 2's fifteen rows are three runs
    there): a row whose overrides compose to the same config as an earlier row's takes its cells instead of running
    again, and the table names the rows that share a run. At `paper` the row's own choice wins, so both run."""
    rows = [{"name": "BM25", "method": "retrieval", "overrides": ["task.methods=[bm25]"], "published": {"World": 90.0}},
            {"name": "BM25, GTE encoder", "method": "retrieval",
             "overrides": ["task.methods=[bm25]", "knowledge.dense.encoder=gte"], "published": {"World": 91.0}}]
    path = manifest(tmp_path, rows)
    data = yaml.safe_load(path.read_text())
    data["presets"]["miniature"] = [*COMMON, "knowledge.dense.encoder=minilm-l6"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the same run as 'BM25'" in " ".join((res.stdout + res.stderr).split())
    out = tmp_path / "experiments" / "demo" / "results"
    assert sorted(p.name for p in (out / "runs" / "table1").iterdir()) == ["bm25"]  # one run, not two
    got = {r["row"]: r for r in csv.DictReader((out / "table1.csv").open())}
    assert got["BM25, GTE encoder"]["status"] == "measured" and got["BM25, GTE encoder"]["same_run_as"] == "BM25"
    assert got["BM25, GTE encoder"]["ours"] == got["BM25"]["ours"] and got["BM25"]["same_run_as"] == ""
    assert "BM25 = BM25, GTE encoder" in (out / "table1.md").read_text()
    paper = reproduce_cli(str(path), "--preset", "paper", "--dry-run", cwd=tmp_path)
    assert paper.returncode == 0, paper.stderr[-3000:]
    assert "the same run as" not in paper.stdout + paper.stderr


def test_a_prepare_step_whose_folder_a_stopped_run_left_half_there_says_so(tmp_path):
    """A training run stopped before its export leaves the checkpoint folder without ``hf/``: the step runs again,
    and the log says why the folder that is there does not count (a failing step still stops the table)."""
    from omnimed.tables.reproduce import run_prepare

    path = manifest(tmp_path, [ROWS[0]])
    data = yaml.safe_load(path.read_text())
    data["prepare"] = {"miniature": [{"name": "a model", "command": ["omnimed-data", "no_such_command"],
                                      "creates": "checkpoints/model/hf"}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    half = tmp_path / "checkpoints" / "model"
    half.mkdir(parents=True)
    (half / "config.yaml").write_text("seed: 0\n")
    (half / "versions.json").write_text("{}\n")
    lines: list[str] = []
    with pytest.raises(ManifestError, match="prepare step 'a model' failed"):
        run_prepare(load_manifest(path), "miniature", tmp_path / "runs", [f"paths.root={tmp_path}"], log=lines.append)
    assert f"running ({half} holds config.yaml, versions.json but no hf: an earlier run stopped first)" in lines[0]


def test_an_interim_report_neither_runs_nor_composes_the_prepare_steps(tmp_path):
    """``--finished`` reads what is on disk: a prepare step still to run (here one that does not compose) does not
    stop it, where the table's own run refuses before anything runs."""
    path = manifest(tmp_path, [ROWS[0]])
    data = yaml.safe_load(path.read_text())
    data["prepare"] = {"miniature": [{"name": "a model", "command": ["omnimed-data", "no_such_command"],
                                      "creates": "checkpoints/model/hf"}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "experiments" / "demo" / "results"
    assert next(csv.DictReader((out / "table1.csv").open()))["status"].startswith("not run yet")
    res = reproduce_cli(str(path), "--dry-run", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 2 and "prepare step 'a model' does not compose" in res.stderr


def test_rows_runs_only_the_named_rows_and_reads_the_others_as_they_stand(tmp_path):
    """A researcher reruns one row of a long table (table 7's DPO-only planner) without its hours of other rows:
    ``--rows`` runs the named rows, reports the others from their finished runs or as not run, and logs no W&B
    table run, since the table is not whole; a name the table lacks is refused before anything runs."""
    path = manifest(tmp_path, ROWS[:2])
    out = tmp_path / "experiments" / "demo" / "results"
    res = reproduce_cli(str(path), "--rows", "Dense", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {row["row"]: row for row in csv.DictReader((out / "table1.csv").open())}
    assert rows["Dense"]["status"] == "measured" and rows["BM25"]["status"].startswith("not run yet: not among")
    assert not (out / "runs" / "table1" / "bm25").exists() and not (out / "runs" / "table1-report").exists()
    dense = (out / "runs" / "table1" / "dense" / "world" / "metrics.json").stat().st_mtime_ns
    res = reproduce_cli(str(path), "--rows", "BM25", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "runs" / "table1" / "bm25" / "world" / "metrics.json").is_file()
    assert (out / "runs" / "table1" / "dense" / "world" / "metrics.json").stat().st_mtime_ns == dense  # read back
    rows2 = {row["row"]: row for row in csv.DictReader((out / "table1.csv").open())}
    assert rows2["BM25"]["status"] == "measured" and rows2["Dense"]["ours"] == rows["Dense"]["ours"]
    res = reproduce_cli(str(path), "--rows", "BM25,Nope", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 2
    assert "--rows names rows the table does not have: ['Nope']" in " ".join((res.stdout + res.stderr).split())
    assert reproduce_cli(str(path), "--rows", "BM25", "--finished", cwd=tmp_path).returncode == 2


def test_columns_run_only_the_named_cells_of_the_rows_that_run(tmp_path):
    """A cell failed (its data was not there) or a row is too long for one sitting: ``--columns`` runs only the
    named columns of the rows that run, keeps or reads the others as they stand, and logs no W&B table run; a
    column the table lacks is refused before anything runs, and so is ``--columns`` with ``--finished``."""
    path = manifest(tmp_path, ROWS[:2])
    data = yaml.safe_load(path.read_text())
    data["columns"] = ["World", "Diagnosis"]
    for preset in data["datasets"].values():
        preset["Diagnosis"] = "world_diagnosis"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "experiments" / "demo" / "results"
    runs = out / "runs" / "table1"

    def table() -> dict[tuple[str, str], dict]:
        return {(row["row"], row["column"]): row for row in csv.DictReader((out / "table1.csv").open())}

    res = reproduce_cli(str(path), "--columns", "Diagnosis", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0 and "BM25: world_diagnosis\n" in res.stdout + res.stderr, res.stderr[-3000:]
    res = reproduce_cli(str(path), "--columns", "Diagnosis", "--rows", "Dense", f"paths.root={tmp_path}",
                        cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "BM25: world, world_diagnosis\n" in res.stdout + res.stderr  # a row only read lists all it reads
    cells = table()
    assert cells[("Dense", "Diagnosis")]["status"] == "measured"
    assert cells[("Dense", "World")]["status"] == "not run yet: not among the columns asked for"
    assert cells[("BM25", "Diagnosis")]["status"].startswith("not run yet: not among the rows")
    assert not (runs / "dense" / "world").exists() and not (runs / "bm25").exists()
    assert not (out / "runs" / "table1-report").exists()
    diagnosis = (runs / "dense" / "world_diagnosis" / "metrics.json").stat().st_mtime_ns
    res = reproduce_cli(str(path), "--columns", "World", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    cells = table()
    assert {key: row["status"] for key, row in cells.items() if key[0] in ("BM25", "Dense")} == {
        ("BM25", "World"): "measured", ("Dense", "World"): "measured", ("Dense", "Diagnosis"): "measured",
        ("BM25", "Diagnosis"): "not run yet: not among the columns asked for"}
    assert (runs / "dense" / "world_diagnosis" / "metrics.json").stat().st_mtime_ns == diagnosis  # kept
    assert not (runs / "bm25" / "world_diagnosis").exists()
    shutil.rmtree(runs / "dense" / "world")  # another disk: one column's folder is here, the other's is stored
    res = reproduce_cli(str(path), "--columns", "Diagnosis", "--rows", "Dense", f"paths.root={tmp_path}",
                        cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world: read from table1.cells.json.gz, where" in " ".join((res.stdout + res.stderr).split())
    assert table()[("Dense", "World")]["run_dir"] == "stored in table1.cells.json.gz"
    assert (runs / "dense" / "world_diagnosis" / "metrics.json").stat().st_mtime_ns == diagnosis
    res = reproduce_cli(str(path), "--columns", "World,Nope", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 2
    assert "--columns names columns the table does not have: ['Nope']; its columns: ['World', 'Diagnosis']" in (
        " ".join((res.stdout + res.stderr).split()))
    assert reproduce_cli(str(path), "--columns", "World", "--finished", cwd=tmp_path).returncode == 2


def test_a_long_reason_is_written_once_under_the_markdown_table_and_in_full_in_every_csv_cell(tmp_path):
    """Table 4's Reflexion and SeRTS rows give a 300-character reason in each of their 24 cells, which made the
    Markdown table unreadable: a long reason given in several cells is numbered and written once under the table,
    each cell saying its kind and its note; a short one, or one given once, stays in its cell; the CSV keeps every
    reason in every cell."""
    from omnimed.tables.report import NOTE_AFTER_CHARS, Cell, markdown, write_report

    path = manifest(tmp_path, [{**ROWS[0], "published": {"World": 90.0, "Book": 70.0}},
                               {**ROWS[1], "published": {"World": 80.0, "Book": 60.0}}])
    data = yaml.safe_load(path.read_text())
    data["columns"] = ["World", "Book"]
    data["datasets"] = {p: {"World": "world", "Book": "world"} for p in ("miniature", "paper")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    m = load_manifest(path)
    long = "not run at miniature: " + "every plan and review runs to the token budget, " * 3 + "days a column"
    assert len(long) > NOTE_AFTER_CHARS
    cells = {"BM25": {"World": Cell(status=long), "Book": Cell(status=long)},
             "Dense": {"World": Cell(ours=40.0, status="measured"), "Book": Cell(status="failed: " + long)}}
    text = markdown(m, cells, "miniature")
    assert text.count(long) == 2 and "\n1. " + long in text
    assert "| BM25 | retrieval | not run at miniature (note 1) / 90.0 | not run at miniature (note 1) / 70.0 |" in text
    assert f"failed: {long} / 60.0" in text and "\n2. " not in text
    out = tmp_path / "out"
    write_report(m, cells, out, "miniature")
    rows = list(csv.DictReader((out / "table1.csv").open()))
    assert [r["status"] for r in rows if r["row"] == "BM25"] == [long, long]


def test_a_row_too_costly_at_a_preset_states_why_and_still_runs_when_asked_for(tmp_path):
    """Table 4's SeRTS loop takes days a column on CPU: its manifest says so at ``miniature``, a whole-table run
    leaves it out with that reason in its cells (and still logs the table), ``--rows`` runs it anyway, and the next
    whole-table run reads that finished run instead of the reason. A reason for an unknown preset, or an empty one,
    is refused."""
    costly = {**ROWS[0], "not_run": {"miniature": "days a column on 2 cores"}}
    path = manifest(tmp_path, [costly, ROWS[1]])
    out = tmp_path / "experiments" / "demo" / "results"
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {row["row"]: row for row in csv.DictReader((out / "table1.csv").open())}
    assert rows["BM25"]["status"] == "not run at miniature: days a column on 2 cores"
    assert "1 rows run, 1 not run at miniature (why in the table)" in " ".join((res.stdout + res.stderr).split())
    assert rows["Dense"]["status"] == "measured" and not (out / "runs" / "table1" / "bm25").exists()
    assert (out / "runs" / "table1-report").is_dir()
    assert reproduce_cli(str(path), "--rows", "BM25", f"paths.root={tmp_path}", cwd=tmp_path).returncode == 0
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {row["row"]: row for row in csv.DictReader((out / "table1.csv").open())}
    assert rows["BM25"]["status"] == "measured" and float(rows["BM25"]["ours"]) > 0
    for bad, match in (({"paper-scale": "x"}, r"BM25.*not_run for unknown presets \['paper-scale'\]"),
                       ({"miniature": " "}, r"BM25.*not_run\.miniature is empty")):
        with pytest.raises(ManifestError, match=match):
            load_manifest(manifest(tmp_path, [{**ROWS[0], "not_run": bad}], name="table2"))


def test_rows_prepare_only_the_steps_the_named_rows_read():
    """--rows trains what the asked rows read and not the other rows' models: table 4's No Retrieval row needs the
    reader (and the builds read through defaults), none of the planners; table 8's + SPO row none of the planners
    trained without one source, which its OOD row names through the method's {source} placeholder."""
    from omnimed.tables.prepared import steps_for_rows
    from omnimed.tables.reproduce import for_training_seed, plan_rows

    def needed(table: str, row: str) -> list[str]:
        m = for_training_seed(load_manifest(Path(__file__).resolve().parents[1] / "experiments" / "omnirag" /
                                            f"{table}.yaml"), 0)
        need = steps_for_rows(m, "miniature", plan_rows(m, "miniature", []), {row})
        return [step.name for step in m.prepare["miniature"] if step.name in need]

    no_retrieval = needed("table4", "No Retrieval [Reader: Qwen2.5-7B]")
    trains_a_planner = ("planner SFT", "planner SPO", "Trainable", "RaFe")
    assert "reader training" in no_retrieval and not [s for s in no_retrieval if s.startswith(trains_a_planner)]
    trainable = needed("table4", "Trainable Planning [Reader: Qwen2.5-7B]")
    assert "Trainable Planning's labels (the reader's accuracy gain)" in trainable  # what its planner's data reads
    assert not [s for s in trainable if s.startswith("RaFe")] and "planner SPO (DPO from the SFT planner)" not in trainable
    spo = needed("table8", "+ SPO")
    assert "planner SPO (DPO from the SFT planner)" in spo and not [s for s in spo if "without" in s]
    assert "planner SPO without book" in needed("table8", "+ SPO (OOD corpus)")


def test_a_model_that_only_other_rows_name_does_not_make_a_row_stale(tmp_path):
    """Table 7 trains its DPO-only planner after table 6 ran the SPO row they share: the SPO row's finished runs
    stay valid, since only the DPO-only row names that model. A model no row names (a build, a reader read through
    defaults) counts for every row, and a row's own model counts for it."""
    import os

    from omnimed.tables.prepared import prepared_for_rows
    from omnimed.tables.reproduce import plan_rows

    rows = [{"name": name, "method": "retrieval",
             "overrides": ["task.methods=[bm25]", *([f"+planner=${{paths.root}}/checkpoints/{model}/hf"] if model else [])]}
            for name, model in (("SPO", "spo"), ("DPO only", "dpo"), ("BM25", None), ("SPO old", "spo_old"))]
    path = manifest(tmp_path, rows)
    data = yaml.safe_load(path.read_text())
    steps = {"spo": "checkpoints/spo/hf", "dpo": "checkpoints/dpo/hf", "build": "builds/pairs/manifest.json",
             "spo_old": "checkpoints/spo_old/hf"}
    data["prepare"] = {"miniature": [{"name": name, "command": ["omnimed-train"], "creates": creates}
                                     for name, creates in steps.items()]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    for i, creates in enumerate(steps.values()):
        (tmp_path / creates).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / creates).touch()
        os.utime(tmp_path / creates, (1000.0 * (i + 1),) * 2)  # spo 1000, dpo 2000, build 3000, spo_old 4000
    extra = [f"paths.root={tmp_path}"]
    m = load_manifest(path)
    when = prepared_for_rows(m, "miniature", extra, plan_rows(m, "miniature", extra))
    # SPO: its own model and the build, not table 7's later DPO-only model nor spo_old (not a prefix match)
    assert when == {"SPO": 3000.0, "DPO only": 3000.0, "BM25": 3000.0, "SPO old": 4000.0}
    os.utime(tmp_path / steps["dpo"], (5000.0,) * 2)  # the DPO-only planner trained last
    when = prepared_for_rows(m, "miniature", extra, plan_rows(m, "miniature", extra))
    assert when["SPO"] == 3000.0 and when["DPO only"] == 5000.0 and when["BM25"] == 3000.0
    # table 8's planners trained without one source, and their data: the OOD row names them through the method's
    # {source}, so training them later leaves the other rows' runs standing
    data["rows"].append({"name": "OOD", "method": "retrieval", "overrides": [
        "task.methods=[bm25]", "+planner='${paths.root}/checkpoints/ood-{source}/hf'"]})
    data["prepare"]["miniature"] += [
        {"name": "ood data", "command": ["omnimed-build"], "creates": "builds/ood/manifest.json"},
        {"name": "ood", "command": ["omnimed-train", "data.path=${paths.root}/builds/ood"],
         "creates": "checkpoints/ood-book/hf"}]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    for creates, t in (("builds/ood/manifest.json", 6000.0), ("checkpoints/ood-book/hf", 7000.0)):
        (tmp_path / creates).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / creates).touch()
        os.utime(tmp_path / creates, (t, t))
    m = load_manifest(path)
    when = prepared_for_rows(m, "miniature", extra, plan_rows(m, "miniature", extra))
    assert when["SPO"] == 3000.0 and when["BM25"] == 3000.0 and when["OOD"] == 7000.0


def test_a_stopped_table_resumes_after_its_finished_runs_and_reruns_what_changed(tmp_path):
    """Table 7's rows take hours: a table stopped part way resumes, keeping each run that finished as it would run
    now, and a table whose run another table already made (tables 12 and 13) reads it. A run is run again when
    its overrides compose to another config, when a prepared artifact (a model it reads) is newer than it, or under
    --rerun; a run without metrics.json (failed, stopped) always runs."""
    from omnimed.tables.prepared import prepared_for_rows
    from omnimed.tables.reproduce import plan_rows, run_overrides, sweeps, validate
    from omnimed.tables.resume import finished_runs
    from omnimed.tracking import source_digest

    path = manifest(tmp_path, [ROWS[0]])
    data = yaml.safe_load(path.read_text())
    data["prepare"] = {"miniature": [{"name": "a model", "command": ["omnimed-train", "task=sft"],
                                      "creates": "checkpoints/model/hf"}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    model = tmp_path / "checkpoints" / "model" / "hf"
    model.mkdir(parents=True)  # the step's artifact exists: it is not run
    out = tmp_path / "experiments" / "demo" / "results"
    run = out / "runs" / "table1" / "bm25" / "world"
    # --finished: the interim report of what finished, running nothing (here: nothing yet)
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not run.exists()
    assert next(csv.DictReader((out / "table1.csv").open()))["status"].startswith("not run yet")
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    first = (run / "metrics.json").stat().st_mtime_ns
    ours = next(csv.DictReader((out / "table1.csv").open()))["ours"]
    shutil.rmtree(out / "runs" / "table1-report")  # the W&B run of the table; an interim report logs none
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert next(csv.DictReader((out / "table1.csv").open()))["ours"] == ours
    assert not (out / "runs" / "table1-report").exists()
    assert reproduce_cli(str(path), "--finished", "--rerun", cwd=tmp_path).returncode == 2

    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world: kept, the run that finished" in " ".join((res.stdout + res.stderr).split())
    assert (run / "metrics.json").stat().st_mtime_ns == first  # not run again
    row = next(csv.DictReader((out / "table1.csv").open()))
    assert row["status"] == "measured" and row["ours"] == ours
    assert "other code" not in (out / "table1.md").read_text()
    dry = reproduce_cli(str(path), "--dry-run", f"paths.root={tmp_path}", cwd=tmp_path)  # says what would be kept
    assert dry.returncode == 0 and "world: kept, the run that finished" in " ".join((dry.stdout + dry.stderr).split())
    # another table whose row computes the same run (its own W&B group) reads table1's, not running it again
    other = manifest(tmp_path, [ROWS[0]], name="table2")
    other.write_text(path.read_text().replace("table: table1", "table: table2"))
    res = reproduce_cli(str(other), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = "".join((res.stdout + res.stderr).split())
    assert "world:kept,therunthatfinished" in log and str(run) in log
    assert not (out / "runs" / "table2" / "bm25").exists()
    assert next(csv.DictReader((out / "table2.csv").open()))["ours"] == ours

    def kept(extra: list[str], not_before: float, edited: tuple[str, ...] = ()) -> dict[str, tuple[Path, float]]:
        m = load_manifest(path)
        plan, = plan_rows(m, "miniature", extra)
        validate([plan], m, runs_dir=out / "runs" / "table1")
        (folder, datasets, column), = sweeps(plan, m)
        runs = out / "runs" / "table1"
        return finished_runs(runs / plan.slug / folder, runs.parent, datasets,
                             lambda key: [*run_overrides(plan, m, runs, "basic", key, folder=folder, column=column),
                                          *edited], not_before)

    extra = [f"paths.root={tmp_path}"]
    m = load_manifest(path)
    prepared = prepared_for_rows(m, "miniature", extra, plan_rows(m, "miniature", extra))
    assert prepared == {"BM25": model.stat().st_mtime}  # the model no row names counts for every row
    assert list(kept(extra, prepared["BM25"])) == ["world"]
    assert kept([*extra, "task.k=5"], 0.0) == {}  # another config: its finished run is not this one
    assert kept(extra, (run / "metrics.json").stat().st_mtime + 1) == {}  # a model retrained since
    # conf/ edited while the table ran, so that a run no longer composes: a clear error naming it, no traceback
    with pytest.raises(ManifestError, match=r"world composed when the table started and no longer does .*no_such_knob"):
        kept(extra, 0.0, ("task.no_such_knob=1",))
    (run / "metrics.json").unlink()
    assert kept(extra, 0.0) == {}

    res = reproduce_cli(str(path), "--rerun", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "kept" not in res.stdout + res.stderr
    assert json.loads((run / "code.json").read_text())["source"] == source_digest()
    assert (run / "metrics.json").is_file()
    assert next(csv.DictReader((out / "table1.csv").open()))["ours"] == ours


class _Mode(Enum):
    fast = 1
    exact = 2


@dataclass
class _Sampling:
    n: int = 1


@dataclass
class _Pipe:  # a pipeline config class as it is today; the saved run below predates all but top_k
    top_k: int = 5
    open_first_source: bool = False
    sources: list = field(default_factory=list)
    mode: _Mode = _Mode.fast
    sampling: _Sampling = field(default_factory=_Sampling)


def test_a_run_saved_before_a_config_field_existed_is_kept_while_the_field_stays_at_its_default():
    """A knob added to a config class (``pipeline.open_first_source``) defaults to what the code did before it, so
    the finished runs of every table stay kept; a row that sets it otherwise, or any other difference, runs again."""
    from omegaconf import OmegaConf

    from omnimed.tables.resume import _plain, computes_the_same

    def today(**knobs):
        cfg = OmegaConf.create({"pipeline": OmegaConf.structured(_Pipe(**knobs)), "task": {"k": 3}})
        return _plain(cfg), cfg

    saved = {"pipeline": {"top_k": 5}, "task": {"k": 3}}  # run before the other pipeline fields existed
    assert computes_the_same(saved, *today())  # an Enum or a nested config class at its default is no change
    assert not computes_the_same(saved, *today(mode=_Mode.exact))
    assert not computes_the_same(saved, *today(sampling=_Sampling(n=3)))
    assert not computes_the_same(saved, *today(open_first_source=True))  # a row that turns the new knob on
    assert not computes_the_same(saved, *today(sources=["book"]))
    assert not computes_the_same(saved, *today(top_k=3))
    assert not computes_the_same({**saved, "task": {"k": 3, "gone": 1}}, *today())  # a field removed since
    assert not computes_the_same({"pipeline": {"top_k": 5}, "task": {}}, *today())  # no class default for task.k


def test_a_run_placed_elsewhere_computes_the_same_and_a_changed_knob_does_not():
    """``paths.root=/abs/checkout`` (a second worktree pointing at the first one's models) reads the runs made with
    the default root ``.``: the artifact paths stay ``${paths.root}/...`` unresolved, and where the root is only
    places the run, also for a run stored (``<table>.cells.json.gz``) with its paths; a computing knob beside it
    still runs again."""
    from omegaconf import OmegaConf

    from omnimed.tables.resume import _plain, _unplaced, computes_the_same

    def cfg(root: str, k: int = 3):
        node = OmegaConf.create({"paths": {"root": root, "cache": f"{root}/.cache"}, "task": {"k": k},
                                 "pipeline": {"encoder": "${paths.root}/checkpoints/u/hf"}})
        return _plain(node), node

    saved = cfg(".")[0]
    assert computes_the_same(saved, *cfg("/work/main"))
    assert not computes_the_same(saved, *cfg("/work/main", k=5))
    stored = {**saved, "paths": {"root": ".", "cache": "./.cache"}, "run_name": "bm25-world"}  # as kept before
    assert computes_the_same(_unplaced(stored), *cfg("/work/main"))


def test_a_query2doc_run_made_before_the_question_expansion_runs_again():
    from omnimed.tables.resume import _plain, compose_run, computes_the_same, evaluate_configs

    with evaluate_configs():
        today = compose_run(["task=qa", "pipeline=query2doc"], "query2doc does not compose")
    wanted = _plain(today)
    assert wanted["pipeline"]["question_repeats"] == 1  # the config's value, not the field's default (0)
    before = copy.deepcopy(wanted)
    del before["pipeline"]["question_repeats"]  # a run saved before the knob: its queries were the documents alone
    assert not computes_the_same(before, wanted, today)
    assert computes_the_same(copy.deepcopy(wanted), wanted, today)


def test_a_kept_run_that_other_code_computed_is_named_in_the_log_and_the_report(tmp_path):
    """A run is kept when its config is today's, but a change to a metric or a pipeline leaves the config as it
    was: the kept run's code record (code.json) is compared with today's source, and a run computed by other code,
    or before runs recorded their code, is named where the researcher reads the table, with --rerun as the cure."""
    from omnimed.tables.provenance import other_code
    from omnimed.tracking import CODE_FILE, code_version

    path = manifest(tmp_path, [ROWS[0]])
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "experiments" / "demo" / "results"
    run = out / "runs" / "table1" / "bm25" / "world"
    assert other_code(run) is None  # this code computed it
    older = {**code_version(), "source": "0" * 64, "commit": None}
    (run / CODE_FILE).write_text(json.dumps(older))
    assert other_code(run) == "computed by other code (outside git): the package's source differs from today's"
    res = reproduce_cli(str(path), f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = " ".join((res.stdout + res.stderr).split())
    assert "world: kept, the run that finished" in log and "but it was computed by other code (outside git)" in log
    report = " ".join((out / "table1.md").read_text().split())
    assert "Read from runs computed by other code (outside git): the package's source differs from today's: BM25 / " \
        "World." in report
    (run / CODE_FILE).write_text("{torn")  # a damaged record says so instead of failing the report
    assert other_code(run).startswith(f"computed by unknown code ({run / CODE_FILE} unreadable")
    (run / CODE_FILE).unlink()  # a run from before the record
    assert "no code.json" in other_code(run)


def test_cells_outlive_their_run_folders_and_stand_in_for_rows_not_run_now(tmp_path):
    """A long table is filled a few rows at a time, on machines whose disks do not last: each finished run's cells
    (per-question outcomes included) are kept in ``<table>.cells.json.gz`` beside the report, so with the run
    folders gone, ``--rows`` of another row and ``--finished`` still report them, say where they were read from,
    and pair on them for the smallest detectable difference. A row whose config changed since does not read them;
    a damaged file stops the table before anything runs, naming it."""
    path = manifest(tmp_path, ROWS[:2])
    out = tmp_path / "experiments" / "demo" / "results"
    store = out / "table1.cells.json.gz"

    def table() -> dict[str, dict]:
        return {row["row"]: row for row in csv.DictReader((out / "table1.csv").open())}

    res = reproduce_cli(str(path), "--rows", "Dense", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert store.is_file()
    dense = table()["Dense"]
    shutil.rmtree(out / "runs")  # another machine: what was committed is the report and the stored cells
    res = reproduce_cli(str(path), "--rows", "BM25", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world: read from table1.cells.json.gz" in " ".join((res.stdout + res.stderr).split())
    rows = table()
    assert rows["Dense"]["status"] == "measured" and rows["Dense"]["ours"] == dense["ours"]
    assert rows["BM25"]["status"] == "measured" and not (out / "runs" / "table1" / "dense").exists()
    report = " ".join((out / "table1.md").read_text().split())
    assert "Read from `table1.cells.json.gz`" in report and "Dense / World (" in report
    assert "BM25 / World (" not in report  # its run folder is here: read from it
    detectable = next(line for line in (out / "table1.md").read_text().splitlines()
                      if line.startswith("| smallest detectable difference"))
    assert "(n=" in detectable  # both rows' per-question outcomes: the stored one's too
    shutil.rmtree(out / "runs")
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert {name: (row["status"], row["ours"]) for name, row in table().items()} == {
        name: (row["status"], row["ours"]) for name, row in rows.items()}
    # the Dense row now computes something else: its stored run no longer stands in for it
    data = yaml.safe_load(path.read_text())
    data["rows"][1]["overrides"] = ["task.methods=[dense]", "task.k=5"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert table()["Dense"]["status"].startswith("not run yet") and table()["BM25"]["status"] == "measured"
    store.write_bytes(b"torn")
    res = reproduce_cli(str(path), "--finished", f"paths.root={tmp_path}", cwd=tmp_path)
    assert res.returncode == 2 and "table1.cells.json.gz: not a readable stored-cells file" in " ".join(
        (res.stdout + res.stderr).split())

"""Sweeps of `omnimed-train` and how their runs are compared: a local joblib sweep, an Optuna study in a W&B group
of its own, the folder and run names a sweep's jobs get, and ``omnimed-compare`` over finished runs."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml
from train_runs import BIN, compose_train, train


def test_joblib_sweep_runs_both_jobs(tmp_path):
    """-m with the joblib launcher: two jobs in parallel, each with its metrics.json and its own checkpoint folder
    (their default run names carry the job number and a key of the job's config, never the clock)."""
    res = subprocess.run(
        [str(BIN / "omnimed-train"), "-m", f"paths.root={tmp_path}", f"hydra.sweep.dir={tmp_path}/sweep",
         "model=tiny-llama", "data=world_tiny", "trainer.max_steps=2", "logger=csv",
         "task.lr=1e-3,3e-3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # one folder per job, <num>_<overrides>, even though paths.root=/... puts slashes among the overrides
    metrics = sorted((tmp_path / "sweep").rglob("metrics.json"))
    assert [m.parent.parent for m in metrics] == [tmp_path / "sweep"] * 2
    assert [m.parent.name[:2] for m in metrics] == ["0_", "1_"] and "task.lr=0.001" in metrics[0].parent.name
    assert all(json.loads(m.read_text())["train/steps"] == 2 for m in metrics)
    # deterministic names, <model>_<data>_s<seed>_j<NNN>_<values given>_<config key>: they sort in job order and
    # say what each job trained with
    runs = sorted((tmp_path / "checkpoints" / "sft").iterdir())
    names = [re.fullmatch(r"tiny-llama_world_tiny_s0_j(\d{3})_max-steps2_(lr[0-9.]+)_[0-9a-f]{8}", r.name) for r in runs]
    assert all(names), [r.name for r in runs]
    assert [(m[1], m[2]) for m in names] == [("000", "lr0.001"), ("001", "lr0.003")]
    assert all((r / "hf").is_dir() for r in runs)


def test_an_optuna_study_runs_its_trials_in_a_group_of_its_own(tmp_path):
    """`-m hparams_search=critic`: the critic's preset plus a search space for Hydra's Optuna sweeper; each trial
    is one run under its own name, Optuna minimises the val/loss each returns, and the trials share the W&B group
    `optuna-critic` rather than landing among every SFT run."""
    cfg = compose_train("hparams_search=critic")
    assert cfg.logger.group == "optuna-critic" and cfg.run_name is None and cfg.task.name == "critic"
    res = subprocess.run(
        [str(BIN / "omnimed-train"), "-m", "hparams_search=critic", "hydra.sweeper.n_trials=2", "task=sft",
         "model=tiny-llama", "data=world_tiny", "trainer.max_steps=2", "logger=csv", f"paths.root={tmp_path}",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = [json.loads(m.read_text()) for m in sorted((tmp_path / "sweep").rglob("metrics.json"))]
    assert len(metrics) == 2 and all(m["train/steps"] == 2 and "val/loss" in m for m in metrics)
    best = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(min(m["val/loss"] for m in metrics), rel=1e-4)
    assert set(best["best_params"]) == {"task.lr", "task.warmup_ratio", "model.lora.r"}
    assert len(list((tmp_path / "checkpoints" / "sft").iterdir())) == 2  # one run per trial, none refused


def test_sweep_folder_names_are_one_safe_level_of_bounded_length():
    from omnimed.conf import SUBDIR_MAX, dir_safe

    assert dir_safe("model=tiny-llama,paths.root=/tmp/x/y") == "model=tiny-llama,paths.root=_tmp_x_y"
    a, b = dir_safe("k=" + "a" * 300 + "1"), dir_safe("k=" + "a" * 300 + "2")
    assert len(a) == len(b) == SUBDIR_MAX and a != b  # cut, but two jobs never share a folder


def test_a_trials_run_name_shows_its_floats_to_four_digits():
    """An Optuna trial's values in its run name: 4 significant digits, not Python's 17."""
    from omnimed.training.engine import swept_values

    assert swept_values(["task.lr=0.0008558894657793092", "task.warmup_ratio=0.0715189366", "model.lora.r=8",
                         "trainer.max_steps=2", "task.lr=0.001", "paths.root=/x"]) == [
        "lr0.0008559", "warmup-ratio0.07152", "r8", "max-steps2", "lr0.001"]


@pytest.mark.slow
def test_compare_draws_loss_curves_shows_swept_values_sorted_and_aggregates_seeds(tmp_path):
    """omnimed-compare on three tiny runs (two seeds of one setting, one of another): the swept value as a column,
    rows sorted by val/loss, the seeds of one setting as one row with its mean and 95% interval, and loss curves
    from the runs' logged histories (W&B offline) drawn against the step."""
    for seed, lr in ((0, "1e-3"), (1, "1e-3"), (0, "3e-3")):
        name = f"tiny_s{seed}_lr{lr}"
        train(tmp_path, "model=tiny-llama", "data=world_tiny", "trainer.max_steps=4", "trainer.val_check_interval=2",
              f"seed={seed}", f"task.lr={lr}", f"run_name={name}", f"hydra.run.dir={tmp_path}/runs/{name}")
    out = tmp_path / "cmp"
    res = subprocess.run([str(BIN / "omnimed-compare"), str(tmp_path / "runs"), "--params", "task.lr",
                          "--sort", "val/loss", "--metrics", "val/loss", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    import csv

    rows = list(csv.DictReader((out / "compare.csv").open()))
    losses = [float(r["val/loss"]) for r in rows]
    assert losses == sorted(losses) and len(rows) == 3 and {r["task.lr"] for r in rows} == {"0.001", "0.003"}
    assert (out / "compare_curves.png").read_bytes()[:4] == b"\x89PNG"
    res = subprocess.run([str(BIN / "omnimed-compare"), str(tmp_path / "runs"), "--seeds", "--metrics", "val/loss",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["run"]: r for r in csv.DictReader((out / "compare.csv").open())}
    pair = rows["tiny_lr1e-3 (2 seeds)"]
    seeds = [json.loads((tmp_path / "runs" / name / "metrics.json").read_text())["val/loss"]
             for name in ("tiny_s0_lr1e-3", "tiny_s1_lr1e-3")]
    assert float(pair["val/loss"]) == pytest.approx(sum(seeds) / 2, rel=1e-6)
    assert float(pair["val/loss/ci95"]) == pytest.approx(12.706 * abs(seeds[0] - seeds[1]) / 2, rel=1e-3)
    assert "tiny_s0_lr3e-3" in rows  # a setting with one seed stays as it was

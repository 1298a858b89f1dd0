"""`omnimed-train` end to end on the tiny model: config errors at compose time (and task names of the wrong app
before it), a run that writes everything a researcher relies on (checkpoint, HF export, metrics.json, W&B offline
run with the logged losses, group, job type and tags), config and versions of a run that crashes, resuming after
SIGKILL to the same weights, the alternative loggers, the debug presets and a local joblib sweep."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from safetensors.torch import load_file

from omnimed.cli.common import check_task_choice, conf_dir, task_catalog
from omnimed.training.config import register_train_configs

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TINY = ["model=tiny-llama", "data=world_tiny", "trainer.checkpoint_every_n_steps=4", "trainer.val_check_interval=4", "trainer.max_epochs=-1"]


def train(tmp: Path, *overrides: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline"}
    res = subprocess.run(
        [str(BIN / "omnimed-train"), f"paths.root={tmp}", f"hydra.run.dir={tmp}/hydra_run", *overrides],
        cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env,
    )
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


# ------------------------------------------------------------------------------------------- composition
def _compose(*overrides: str):
    register_train_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_default_config_composes_to_the_main_job():
    cfg = _compose()
    assert cfg.model.name == "smollm2-135m" and cfg.model.lora.enabled
    assert cfg.data.source == "world" and cfg.strategy.name == "cpu" and cfg.logger.name == "wandb"


def test_wrong_key_and_type_fail_at_compose_time_naming_the_key():
    with pytest.raises(ConfigCompositionException) as info:
        _compose("task.lrr=1")
    assert "lrr" in str(info.value.__cause__ or info.value)
    with pytest.raises(ConfigCompositionException) as info:
        _compose("task.lr=fast")
    assert "task.lr" in str(info.value.__cause__)


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(MissingConfigException) as info:
        _compose("model=gpt-9")
    assert "smollm2-135m" in str(info.value) and "tiny-llama" in str(info.value)
    with pytest.raises(MissingConfigException) as info:
        _compose("strategy=magic")
    assert "deepspeed_zero3" in str(info.value)


# ------------------------------------------------------------------------------------------- task names
def _tasks_by_schema() -> tuple[set[str], set[str]]:
    """(training, evaluation) task names of conf/task/, read straight from the YAML files' defaults."""
    import yaml

    train_tasks, eval_tasks = set(), set()
    for path in Path(conf_dir(), "task").glob("*.yaml"):
        first = next((d for d in yaml.safe_load(path.read_text()).get("defaults") or [] if d != "_self_"), None)
        if first == "task_schema":
            train_tasks.add(path.stem)
        elif isinstance(first, str) and first.endswith("_task_schema"):
            eval_tasks.add(path.stem)
    return train_tasks, eval_tasks


def _listed(stderr: str, app: str) -> set[str]:
    line = next(line for line in stderr.splitlines() if line.startswith(f"{app} tasks: "))
    return set(line.removeprefix(f"{app} tasks: ").split(", "))


def test_task_of_the_other_app_or_of_none_is_refused_before_composing(tmp_path):
    """qa/retrieval live in conf/task/ beside the training tasks: omnimed-train task=qa says it is an
    omnimed-evaluate task (not Hydra's "Could not load 'task/qa_task_schema'"), unknown names list only the app's
    own tasks (no evaluation tasks, no *_schema entries), each value of a sweep is checked; exit code 2."""
    train_tasks, eval_tasks = _tasks_by_schema()
    assert {"sft"} <= train_tasks and {"qa", "retrieval"} <= eval_tasks

    res = train(tmp_path, "task=qa", check=False)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "qa_task_schema" not in res.stderr and "omnimed-evaluate task=qa" in res.stderr
    assert _listed(res.stderr, "omnimed-train") == train_tasks

    res = subprocess.run([str(BIN / "omnimed-train"), "-m", "task=sft,nope", f"paths.root={tmp_path}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "task=nope: no such task" in res.stderr and "task=sft" not in res.stderr
    assert _listed(res.stderr, "omnimed-train") == train_tasks
    assert not list(tmp_path.rglob("metrics.json"))  # nothing ran, not even the valid sft job

    res = subprocess.run([str(BIN / "omnimed-evaluate"), "++task=sft"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "omnimed-train task=sft" in res.stderr
    assert _listed(res.stderr, "omnimed-evaluate") == eval_tasks


def test_task_check_reads_the_task_files_not_a_fixed_list(tmp_path, monkeypatch, capsys):
    """A task file added to conf/task/ is classified by its schema (inheriting another task's kind too)."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "task" / "distill.yaml").write_text("defaults: [task_schema, _self_]\nname: distill\n")
    (conf / "task" / "sft_long.yaml").write_text("defaults: [sft, _self_]\nname: sft_long\nmax_length: 512\n")
    (conf / "task" / "judge.yaml").write_text("defaults:\n  - judge_task_schema\n  - _self_\nname: judge\n")
    monkeypatch.setenv("OMNIMED_CONF", str(conf))
    catalog = task_catalog()
    assert catalog["distill"] == catalog["sft_long"] == catalog["sft"] == "train"
    assert catalog["judge"] == catalog["qa"] == "evaluate"
    check_task_choice("train", ["task=sft_long,distill", "model=tiny-llama"])  # fine: returns
    check_task_choice("evaluate", ["+task=judge"])
    check_task_choice("train", ["task.max_length=3"])  # not a task choice
    with pytest.raises(SystemExit) as info:
        check_task_choice("train", ["task=choice(sft,judge)"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "task=judge is an omnimed-evaluate task" in err
    assert _listed(err, "omnimed-train") >= {"sft", "sft_long", "distill"} and "judge" not in _listed(err, "omnimed-train")


def test_objective_that_is_not_built_fails_naming_it(tmp_path):
    """task.objective=listwise (no such objective) must not silently train SFT."""
    res = train(tmp_path, *TINY, "task.objective=listwise", "logger=none", "run_name=listwise", check=False)
    assert res.returncode != 0
    assert "task.objective='listwise'" in res.stderr and "built objectives: distill, dpo, sft" in res.stderr
    assert not (tmp_path / "checkpoints" / "sft" / "listwise").exists()  # refused before any work


# ------------------------------------------------------------------------------------------- a full run
def test_tiny_run_writes_checkpoint_export_metrics_and_wandb(tmp_path):
    res = train(tmp_path, *TINY, "trainer.max_steps=8", "run_name=full", "experiment=unit", "task.max_length=192")
    run = tmp_path / "checkpoints" / "sft" / "full"
    assert (run / "lightning" / "last.ckpt").exists()
    assert (run / "config.yaml").exists() and "tiny-llama" in (run / "config.yaml").read_text()
    versions = json.loads((run / "versions.json").read_text())
    assert versions["packages"]["torch"].startswith("2.")
    metrics = json.loads((tmp_path / "hydra_run" / "metrics.json").read_text())
    assert metrics["train/steps"] > 0 and "val/loss" in metrics
    assert "omnimed-train: done: full" in res.stderr + res.stdout  # a sweep's summaries say whose they are
    # tiny-llama's small vocabulary makes many world_tiny prompts longer than 192 tokens: counted and reported,
    # with the max_length that would keep them all
    dropped, examples = int(metrics["data/dropped_too_long"]), int(metrics["data/examples"])
    needed = int(metrics["data/needed_length"])
    assert 0 < dropped < examples and needed > 192
    assert f"dropped {dropped} of {examples} examples" in res.stdout and "max_length=192" in res.stdout
    assert f"task.max_length={needed} keeps every example whole" in res.stdout

    # the HF export (LoRA merged) loads with plain from_pretrained and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run / "hf")
    tok = AutoTokenizer.from_pretrained(run / "hf")
    out = model.generate(**tok("hello", return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape[1] > 1

    # the W&B offline run holds the config lineage and every logged loss
    runs = list((tmp_path / "hydra_run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json", str(runs[0])],
                                        capture_output=True, text=True, check=True).stdout)
    assert summary["config"]["config"]["model"]["name"] == "tiny-llama"
    assert summary["config"]["data_lineage"]["fingerprint"]
    assert "commit" in summary["config"]["git"] and "torch" in summary["config"]["versions"]
    assert summary["config"]["config"]["model"]["special_tokens"] == []  # configuration, not a redacted secret
    assert summary["summary"]["data/dropped_too_long"] == dropped
    tags = ["sft", "tiny-llama", "world_tiny", "unit"]  # task, model, data, experiment
    assert summary["tags"] == tags
    history = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(runs[0])],
                             capture_output=True, text=True, check=True).stdout
    run_record = next(json.loads(line)["run"] for line in history.splitlines() if '"type":"run"' in line)
    assert run_record["run_group"] == "unit"  # experiment=unit
    assert run_record["job_type"] == "train-sft" and run_record["tags"] == tags and run_record["display_name"] == "full"
    losses = [json.loads(line)["history"]["item"]["train/loss"] for line in history.splitlines()
              if '"train/loss"' in line and '"history"' in line]
    assert len(losses) == int(metrics["train/steps"])
    assert losses[-1] == pytest.approx(metrics["train/loss"], rel=1e-5)
    # ... and the lineage graph's two ends: the data it used (an input once synced) and the model it exported
    artifacts = [json.loads(line)["artifact"] for line in history.splitlines() if '"type":"artifact"' in line]
    data = next(a for a in artifacts if a["type"] == "dataset")
    assert data["name"] == "world-tiny" and data["use_after_commit"]
    assert json.loads(data["metadata"])["fingerprint"] == summary["config"]["data_lineage"]["fingerprint"]
    model = next(a for a in artifacts if a["type"] == "model")
    assert model["name"] == "sft-full" and model["aliases"] == ["latest"]
    assert (run / "hf" / "model.safetensors").resolve().as_uri() in {e.get("ref") for e in model["manifest"]["contents"]}


def test_a_lora_export_with_added_tokens_loads_with_plain_transformers_after_the_cache_moves(tmp_path, monkeypatch):
    """The export a user tries first: `AutoModelForCausalLM.from_pretrained(hf/)` on a LoRA run with added tokens
    gives the trained model (the adapter applied to its base, as omnimed loads it) although the base's cache folder
    was renamed; the adapter beside it names its base, and its files are readable by others (0644)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnimed.models.exported import load_exported

    cache = tmp_path / "cache"
    monkeypatch.setenv("OMNIMED_CACHE", str(cache))
    train(tmp_path, *TINY, "trainer.max_steps=4", "logger=none", "run_name=tokens",
          'model.special_tokens=["[Retrieval]","[No Retrieval]"]')
    hf = tmp_path / "checkpoints" / "sft" / "tokens" / "hf"
    base = json.loads((hf / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base).is_relative_to(cache)  # the tiny model has no hub id; SmolLM2's is checked in test_models
    ids = torch.tensor([[1, 5, 9, 7, 3]])
    with torch.no_grad():
        expected = load_exported(hf / "adapter")[0](input_ids=ids).logits  # adapter on its base, before the move

    cache.rename(tmp_path / "cache-moved")
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    new = tokenizer.convert_tokens_to_ids(["[Retrieval]", "[No Retrieval]"])
    assert min(new) >= 0 and max(new) < model.get_input_embeddings().weight.shape[0]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)
        assert torch.isfinite(model(input_ids=torch.tensor([new])).logits).all()
    assert {oct(f.stat().st_mode & 0o777) for f in hf.rglob("*") if f.is_file()} == {"0o644"}


# ------------------------------------------------------------------------------------------- resume
def _adapter(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "hf" / "adapter" / "adapter_model.safetensors")


def test_sigkill_then_resume_ends_with_the_same_weights(tmp_path):
    common = ["model=tiny-llama", "data=world_small", "data.batch_size=4", "trainer.max_steps=60",
              "trainer.checkpoint_every_n_steps=10", "trainer.max_epochs=-1", "trainer.limit_val_batches=0", "logger=csv", "seed=7"]
    train(tmp_path, *common, "run_name=straight")

    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [str(BIN / "omnimed-train"), f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/killed", *common,
           "run_name=crashed"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    ckpts = tmp_path / "checkpoints" / "sft" / "crashed" / "lightning"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if any(int(p.stem.removeprefix("step")) >= 20 for p in ckpts.glob("step*.ckpt")):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL, "the run finished before it could be killed"
    step_at_kill = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 0 < step_at_kill < 60
    assert not (tmp_path / "checkpoints" / "sft" / "crashed" / "hf").exists()
    # written before fit: the killed run still says what it was
    assert "seed: 7" in (tmp_path / "checkpoints" / "sft" / "crashed" / "config.yaml").read_text()
    assert (tmp_path / "checkpoints" / "sft" / "crashed" / "versions.json").exists()

    # the resumed run is killed again, in its export: the hf/ folder is written but not yet in place
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "faults.py"), "publish:hf", "omnimed.cli.train:main",
                             f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/killed2", *common,
                             "run_name=crashed", "ckpt_path=last"], cwd=tmp_path, env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # resumed mid-epoch, its bar still counts the epoch (Lightning's own showed `0/?` until the epoch ended)
    assert re.search(r"Epoch 0: 100%\|[^|]*\| 60/60", killed.stdout.decode()), killed.stdout[-3000:]
    run = tmp_path / "checkpoints" / "sft" / "crashed"
    assert not (run / "hf").exists() and list(run.glob(".hf.*.tmp"))
    train(tmp_path, *common, "run_name=crashed", "ckpt_path=last")  # resumes at step 60: only the export is left
    resumed = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)
    assert resumed["global_step"] == 60
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]  # the killed export's temp is gone
    straight = tmp_path / "checkpoints" / "sft" / "straight" / "hf"
    assert (straight / "model.safetensors").read_bytes() == (run / "hf" / "model.safetensors").read_bytes()
    a, b = _adapter(straight.parent), _adapter(run)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_a_run_that_crashes_in_fit_still_has_its_config_and_versions(tmp_path):
    """config.yaml and versions.json are written before fit starts (and again at the end); here fit raises in
    configure_optimizers (an unknown scheduler), after the model is built."""
    res = train(tmp_path, *TINY, "task.scheduler=bogus", "logger=none", "run_name=crash", check=False)
    assert res.returncode != 0 and "task.scheduler" in res.stderr
    run = tmp_path / "checkpoints" / "sft" / "crash"
    assert "scheduler: bogus" in (run / "config.yaml").read_text()
    assert json.loads((run / "versions.json").read_text())["packages"]["lightning"][0].isdigit()
    assert not (run / "hf").exists()


def test_a_short_run_trains_the_steps_it_is_given_and_validates(tmp_path):
    """`trainer.max_steps=10` on world_tiny (an epoch of a few batches) trains 10 steps, not one epoch, and a run
    shorter than the validation interval (20) still logs val/loss, at its last step."""
    res = train(tmp_path, "model=tiny-llama", "data=world_tiny", "trainer.max_steps=10", "logger=csv",
                "run_name=short", f"hydra.run.dir={tmp_path}/short", "debug=memory")
    metrics = json.loads((tmp_path / "short" / "metrics.json").read_text())
    assert metrics["train/steps"] == 10 and "val/loss" in metrics
    # one bar for the run's 10 steps, across world_tiny's epochs (not a 6/6 bar, then a 4/4 one)
    bars = re.findall(r"Epoch \d+: +\d+%\|[^|]*\| (\d+)/(\d+)", res.stdout + res.stderr)
    assert bars and {total for _, total in bars} == {"10"} and bars[-1][0] == "10", bars
    # debug=memory: the run's resident memory by phase, its peak in metrics.json too
    memory = json.loads((tmp_path / "short" / "memory.json").read_text())
    assert {"model load", "forward", "backward", "optimizer step", "validation", "export"} <= set(memory["phases"])
    assert metrics["memory/peak_rss_mb"] == memory["peak_mb"] > 100
    import csv

    rows = list(csv.DictReader((tmp_path / "short" / "csv" / "short" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [9]  # Lightning counts steps from 0


def test_a_tiny_run_prints_each_line_once_and_no_notice_a_user_cannot_act_on(tmp_path):
    """Lightning's INFO lines once (Hydra's stdout handler, not also Lightning's stderr one), no cloud-logger
    advertisement, no deprecation warnings from inside the libraries, no W&B 'anonymous' warning, and the summary's
    paths in full (folded, not cut at 80 columns). With added tokens (as the critic's), no notice of the choices
    omnimed makes on purpose (mean resizing, saving the embedding layers), nor DeepSpeed's 'no GPU' at export."""
    res = train(tmp_path, "model=tiny-llama", "data=world_tiny", "trainer.max_steps=3", "run_name=quiet",
                'model.special_tokens=["[Retrieval]","[No Retrieval]"]')
    text = res.stdout + res.stderr
    lines = [re.sub(r"^\[[^]]*\]\[[^]]*\]\[\w+\] - ", "", line).removeprefix("INFO: ").strip()
             for line in text.splitlines()]
    lines = [line for line in lines if line and "it/s" not in line and not set(line) <= set("─┌┐└┘┬┴│ ")]
    assert [line for line in lines if lines.count(line) > 1] == []
    assert "GPU available" in text
    for noise in ("litlogger", "anonymous", "FutureWarning", "deprecated", "Setting accelerator to CPU",
                  "multivariate normal", "save_embedding_layers"):
        assert noise not in text, noise
    folded = "".join(res.stderr.split()).replace("│", "")  # the table without its borders and line breaks
    assert str(tmp_path / "checkpoints" / "sft" / "quiet" / "lightning" / "last.ckpt") in folded


def test_resume_without_a_checkpoint_says_where_it_looked(tmp_path):
    res = train(tmp_path, *TINY, "run_name=nothing", "ckpt_path=last", check=False)
    assert res.returncode != 0 and "nothing/lightning/last.ckpt" in res.stderr


# ------------------------------------------------------------------------------------------- loggers, debug
def test_csv_and_tensorboard_loggers(tmp_path):
    train(tmp_path, *TINY, "trainer.max_steps=3", "logger=csv", "run_name=c", "hydra.run.dir=" + str(tmp_path / "c"))
    csv = list((tmp_path / "c" / "csv").rglob("metrics.csv"))
    assert csv and "train/loss" in csv[0].read_text().splitlines()[0]
    train(tmp_path, *TINY, "trainer.max_steps=3", "logger=tensorboard", "run_name=t",
          "hydra.run.dir=" + str(tmp_path / "t"))
    assert list((tmp_path / "t" / "tensorboard").rglob("events.out.tfevents.*"))


def test_overfit_preset_fits_one_batch(tmp_path):
    """debug=overfit: every step sees the same batch (same token count) and its loss falls steadily."""
    train(tmp_path, *TINY, "debug=overfit", "trainer.max_steps=12", "trainer.limit_val_batches=0",
          "model.lora.enabled=false", "task.lr=1e-2", "task.warmup_ratio=0", "task.scheduler=constant", "logger=csv",
          "run_name=ov", f"hydra.run.dir={tmp_path}/ov")
    import csv

    rows = list(csv.DictReader((tmp_path / "ov" / "csv" / "ov" / "metrics.csv").open()))
    steps = [r for r in rows if r.get("train/loss")]
    losses = [float(r["train/loss"]) for r in steps]
    assert len(losses) == 12
    assert len({r["train/tokens"] for r in steps}) == 1  # one batch, over and over
    # the run's count is the steps' logged real tokens summed (it was the supervised targets alone before); the
    # supervised ones are counted apart
    metrics = json.loads((tmp_path / "ov" / "metrics.json").read_text())
    assert metrics["train/tokens"] == sum(float(r["train/tokens"]) for r in steps)
    assert 0 < metrics["train/target_tokens"] < metrics["train/tokens"]
    assert losses[-1] < 0.7 * losses[0], losses  # about 6.8 -> 3.7 here
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 8, losses


def test_profiler_preset_writes_its_report(tmp_path):
    res = train(tmp_path, *TINY, "debug=profiler", "trainer.max_steps=2", "logger=none", "run_name=prof")
    report = tmp_path / "hydra_run" / "fit-profiler.txt"
    text = report.read_text()
    assert "run_training_batch" in text and "training_step" in text
    assert "profiler report" in res.stdout + res.stderr


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
    cfg = _compose("hparams_search=critic")
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


def test_fast_dev_run_preset_touches_no_checkpoint(tmp_path):
    res = train(tmp_path, *TINY, "debug=fast_dev_run", "logger=none", "run_name=dev")
    assert "omnimed-train: done" in res.stderr + res.stdout
    assert not (tmp_path / "checkpoints" / "sft" / "dev" / "hf").exists()


# ------------------------------------------------------------------------------------------- ZeRO-3 on CPU
ZERO3 = ["model=tiny-llama", "data=world_tiny", "trainer.accelerator=cpu",
         "trainer.devices=2", "trainer.max_steps=4", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
         "logger=csv", "task.lr=1e-2"]


def _zero3_train(tmp: Path, *overrides: str, strategy: str = "deepspeed_zero3") -> Path:
    old = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed without CUDA: its CPU accelerator, gloo between the 2 ranks
    try:
        train(tmp, *ZERO3, f"strategy={strategy}", *overrides, timeout=600)
    finally:
        os.environ.pop("DS_ACCELERATOR") if old is None else os.environ.__setitem__("DS_ACCELERATOR", old)
    return tmp / "checkpoints" / "sft" / overrides[-1].removeprefix("run_name=")


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["deepspeed_zero3", "deepspeed_zero3_offload"])
def test_zero3_cli_two_processes_full_finetune_exports_a_plain_hf_model(tmp_path, strategy):
    """The users' GPU code path (Lightning DeepSpeedStrategy, ZeRO-3 sharding inside configure_model) on 2 CPU
    ranks: both ranks save a shard, the shards consolidate, and the HF export holds exactly the trained weights.
    The offload preset (optimizer state and parameters on the CPU) trains with DeepSpeed's CPU AdamW."""
    from transformers import AutoModelForCausalLM

    from omnimed.models.config import ModelConfig
    from omnimed.models.loading import load_causal_lm
    from omnimed.training.export import consolidate_checkpoint

    run = _zero3_train(tmp_path, "model.lora.enabled=false", "run_name=z3full", strategy=strategy)
    shards = sorted((run / "lightning" / "last.ckpt").rglob("*model_states.pt"))
    assert len(shards) == 2, shards  # one ZeRO partition per rank
    exported = AutoModelForCausalLM.from_pretrained(run / "hf")
    trained = consolidate_checkpoint(run / "lightning" / "last.ckpt")
    for key, value in exported.state_dict().items():
        if key in trained:
            torch.testing.assert_close(value, trained[key], rtol=0, atol=0, msg=key)
    initial = load_causal_lm(ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama"),
                             for_training=False)
    moved = [k for k, v in initial.state_dict().items() if not torch.equal(v, exported.state_dict()[k])]
    assert moved, "the exported model equals the untrained one"


@pytest.mark.multiprocess
def test_fsdp2_cli_two_processes_exports_the_trained_adapter(tmp_path):
    """FSDP2 (Lightning's ModelParallelStrategy) on 2 CPU ranks through ``omnimed-train``: training ends with the
    parameters sharded, so the export is rebuilt from the distributed checkpoint the ranks saved, and its adapter
    holds exactly the trained weights (it failed with "parameter ... is sharded" before)."""
    from omnimed.models.exported import load_exported
    from omnimed.training.export import consolidate_checkpoint

    train(tmp_path, *ZERO3, "strategy=fsdp2", "run_name=fsdp2lora", timeout=600)
    run = tmp_path / "checkpoints" / "sft" / "fsdp2lora"
    assert len(list((run / "lightning" / "last.ckpt").glob("*.distcp"))) == 2  # one shard file per rank
    trained = consolidate_checkpoint(run / "lightning" / "last.ckpt")
    adapter = load_file(run / "hf" / "adapter" / "adapter_model.safetensors")
    assert adapter and any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0
    for key, value in adapter.items():
        own = re.sub(r"\.(lora_[AB])\.weight$", r".\1.default.weight", key)  # PEFT names the adapter in the model
        torch.testing.assert_close(value, trained[own], rtol=0, atol=0, msg=key)
    model, _ = load_exported(run / "hf")
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.multiprocess
def test_ddp_and_fsdp2_micro_batches_train_the_weights_of_whole_batches(tmp_path):
    """`task.micro_batch_tokens` on 2 CPU processes: under DDP the chunks' gradients add up and are all-reduced
    once, under FSDP2 they add up unsharded (sync off) and the last chunk's backward reduce-scatters the sum; so 4
    steps end at the whole batches' adapter (dropout off: its masks are drawn per forward pass)."""
    runs = {}
    for strategy, budget in (("ddp", "null"), ("ddp", "96"), ("fsdp2", "96")):
        name = f"mb{budget}" if strategy == "ddp" else f"{strategy}{budget}"
        res = train(tmp_path, *ZERO3, f"strategy={strategy}", "model.lora.dropout=0",
                    f"task.micro_batch_tokens={budget}", "trainer.num_threads=1", f"hydra.run.dir={tmp_path}/run{name}",
                    f"run_name={name}", timeout=600)
        assert "micro_batch_tokens" not in res.stdout + res.stderr  # no "not used with <strategy>" warning
        runs[strategy, budget] = load_file(tmp_path / "checkpoints" / "sft" / name / "hf" / "adapter"
                                           / "adapter_model.safetensors")
    whole = runs["ddp", "null"]
    assert any(v.abs().max() > 1e-3 for k, v in whole.items() if "lora_B" in k)  # it trained
    for run in (("ddp", "96"), ("fsdp2", "96")):
        assert runs[run].keys() == whole.keys()
        for key, value in whole.items():
            torch.testing.assert_close(runs[run][key], value, rtol=0, atol=1e-5, msg=f"{run}: {key}")
    # the run's token count is both processes' (the steps' logged counts are summed over ranks; it was rank 0's)
    import csv

    steps = [r for r in csv.DictReader((tmp_path / "runmbnull" / "csv" / "mbnull" / "metrics.csv").open())
             if r.get("train/tokens")]
    metrics = json.loads((tmp_path / "runmbnull" / "metrics.json").read_text())
    assert len(steps) == 4 and metrics["train/tokens"] == sum(float(r["train/tokens"]) for r in steps)


@pytest.mark.multiprocess
def test_zero3_cli_lora_with_added_tokens_exports_a_loadable_adapter(tmp_path):
    """LoRA + new special tokens under ZeRO-3 on CPU: embeddings grow inside zero.Init, the new rows train, and the
    exported adapter reloads with its tokenizer and emits the new token ids."""
    from omnimed.models.exported import load_exported

    run = _zero3_train(tmp_path, 'model.special_tokens=["<ret>","<rel>"]', "run_name=z3lora")
    model, tokenizer = load_exported(run / "hf")
    ids = tokenizer.convert_tokens_to_ids(["<ret>", "<rel>"])
    assert all(i >= 0 and i != tokenizer.unk_token_id for i in ids)
    assert tokenizer.decode(ids, skip_special_tokens=False).replace(" ", "") == "<ret><rel>"
    adapter = load_file(run / "hf" / "adapter" / "adapter_model.safetensors")
    deltas = [v for k, v in adapter.items() if "trainable_tokens" in k]
    assert deltas and deltas[0].shape[0] == 2  # exactly the two new rows train, not the whole vocabulary
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape[-1] >= max(ids) + 1 and torch.isfinite(logits).all()


def test_continuing_a_finished_run_matches_one_longer_run(tmp_path):
    """A run stopped by max_steps mid-epoch, continued with ckpt_path=last and a larger max_steps, ends where one
    longer run ends: last.ckpt records the position inside the epoch, not an epoch Lightning closed at fit end.
    (Constant LR: a decaying schedule depends on max_steps, so it could not match.)"""
    common = ["model=tiny-llama", "data=world_tiny", "trainer.max_epochs=-1", "trainer.limit_val_batches=0",
              "logger=none", "seed=3", "trainer.checkpoint_every_n_steps=5", "task.scheduler=constant",
              "task.warmup_ratio=0"]
    train(tmp_path, *common, "trainer.max_steps=12", "run_name=long", f"hydra.run.dir={tmp_path}/a")
    train(tmp_path, *common, "trainer.max_steps=7", "run_name=cont", f"hydra.run.dir={tmp_path}/b")
    again = train(tmp_path, *common, "trainer.max_steps=7", "run_name=cont", f"hydra.run.dir={tmp_path}/c",
                  check=False)
    assert again.returncode != 0 and "ckpt_path=last" in again.stderr  # refuses to overwrite a finished run
    train(tmp_path, *common, "trainer.max_steps=12", "run_name=cont", "ckpt_path=last", f"hydra.run.dir={tmp_path}/d")
    a, b = _adapter(tmp_path / "checkpoints" / "sft" / "long"), _adapter(tmp_path / "checkpoints" / "sft" / "cont")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


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

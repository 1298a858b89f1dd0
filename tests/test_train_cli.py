"""`omnimed-train` end to end on the tiny model: config errors at compose time (and task names of the wrong app
before it), a run that writes everything a researcher relies on (checkpoint, HF export, metrics.json, W&B offline
run with the logged losses, group, job type and tags), config and versions of a run that crashes, resuming after
SIGKILL to the same weights, continuing a finished run, the alternative loggers and the debug presets. The
distributed strategies are in ``test_train_distributed.py``, sweeps and ``omnimed-compare`` in
``test_train_sweeps.py``."""

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
from hydra.errors import ConfigCompositionException, MissingConfigException
from safetensors.torch import load_file
from train_runs import BIN, REPO, TINY, compose_train, train

from omnimed.cli.common import check_task_choice, conf_dir, task_catalog


# ------------------------------------------------------------------------------------------- composition
def test_default_config_composes_to_the_main_job():
    cfg = compose_train()
    assert cfg.model.name == "smollm2-135m" and cfg.model.lora.enabled
    assert cfg.data.source == "world" and cfg.strategy.name == "cpu" and cfg.logger.name == "wandb"


def test_wrong_key_and_type_fail_at_compose_time_naming_the_key():
    with pytest.raises(ConfigCompositionException) as info:
        compose_train("task.lrr=1")
    assert "lrr" in str(info.value.__cause__ or info.value)
    with pytest.raises(ConfigCompositionException) as info:
        compose_train("task.lr=fast")
    assert "task.lr" in str(info.value.__cause__)


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(MissingConfigException) as info:
        compose_train("model=gpt-9")
    assert "smollm2-135m" in str(info.value) and "tiny-llama" in str(info.value)
    with pytest.raises(MissingConfigException) as info:
        compose_train("strategy=magic")
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


def test_fast_dev_run_preset_touches_no_checkpoint(tmp_path):
    res = train(tmp_path, *TINY, "debug=fast_dev_run", "logger=none", "run_name=dev")
    assert "omnimed-train: done" in res.stderr + res.stdout
    assert not (tmp_path / "checkpoints" / "sft" / "dev" / "hf").exists()


@pytest.mark.slow
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

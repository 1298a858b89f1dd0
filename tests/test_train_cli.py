"""`omnimed-train` end to end on the tiny model: config errors at compose time, a run that writes everything a
researcher relies on (checkpoint, HF export, metrics.json, W&B offline run with the logged losses), resuming after
SIGKILL to the same weights, the alternative loggers and the debug presets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError
from safetensors.torch import load_file

from omnimed.cli.common import conf_dir
from omnimed.cli.schema import register_train_configs

BIN = Path(sys.executable).parent
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


# ------------------------------------------------------------------------------------------- a full run
def test_tiny_run_writes_checkpoint_export_metrics_and_wandb(tmp_path):
    res = train(tmp_path, *TINY, "trainer.max_steps=8", "run_name=full", "experiment=unit")
    run = tmp_path / "checkpoints" / "sft" / "full"
    assert (run / "lightning" / "last.ckpt").exists()
    assert (run / "config.yaml").exists() and "tiny-llama" in (run / "config.yaml").read_text()
    versions = json.loads((run / "versions.json").read_text())
    assert versions["packages"]["torch"].startswith("2.")
    metrics = json.loads((tmp_path / "hydra_run" / "metrics.json").read_text())
    assert metrics["train/steps"] > 0 and "val/loss" in metrics
    assert "omnimed-train: done" in res.stderr + res.stdout

    # the HF export loads with from_pretrained (LoRA adapter on the cached base) and generates
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(run / "hf")
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
    history = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(runs[0])],
                             capture_output=True, text=True, check=True).stdout
    losses = [json.loads(line)["history"]["item"]["train/loss"] for line in history.splitlines()
              if '"train/loss"' in line and '"history"' in line]
    assert len(losses) == int(metrics["train/steps"])
    assert losses[-1] == pytest.approx(metrics["train/loss"], rel=1e-5)


# ------------------------------------------------------------------------------------------- resume
def _adapter(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "hf" / "adapter_model.safetensors")


def test_sigkill_then_resume_ends_with_the_same_weights(tmp_path):
    common = ["model=tiny-llama", "data=world_small", "data.batch_size=4", "trainer.max_steps=120",
              "trainer.checkpoint_every_n_steps=10", "trainer.max_epochs=-1", "trainer.limit_val_batches=0", "logger=csv", "seed=7"]
    train(tmp_path, *common, "run_name=straight")

    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [str(BIN / "omnimed-train"), f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/killed", *common,
           "run_name=crashed"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    ckpts = tmp_path / "checkpoints" / "sft" / "crashed" / "lightning"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if any(int(p.stem.removeprefix("step")) >= 30 for p in ckpts.glob("step*.ckpt")):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL, "the run finished before it could be killed"
    step_at_kill = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 0 < step_at_kill < 120
    assert not (tmp_path / "checkpoints" / "sft" / "crashed" / "hf").exists()

    train(tmp_path, *common, "run_name=crashed", "ckpt_path=last")
    resumed = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)
    assert resumed["global_step"] == 120
    a, b = _adapter(tmp_path / "checkpoints" / "sft" / "straight"), _adapter(tmp_path / "checkpoints" / "sft" / "crashed")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


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


def test_fast_dev_run_preset_touches_no_checkpoint(tmp_path):
    res = train(tmp_path, *TINY, "debug=fast_dev_run", "logger=none", "run_name=dev")
    assert "omnimed-train: done" in res.stderr + res.stdout
    assert not (tmp_path / "checkpoints" / "sft" / "dev" / "hf").exists()


# ------------------------------------------------------------------------------------------- ZeRO-3 on CPU
ZERO3 = ["model=tiny-llama", "data=world_tiny", "strategy=deepspeed_zero3", "trainer.accelerator=cpu",
         "trainer.devices=2", "trainer.max_steps=4", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
         "logger=csv", "task.lr=1e-2"]


def _zero3_train(tmp: Path, *overrides: str) -> Path:
    old = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed without CUDA: its CPU accelerator, gloo between the 2 ranks
    try:
        train(tmp, *ZERO3, *overrides, timeout=600)
    finally:
        os.environ.pop("DS_ACCELERATOR") if old is None else os.environ.__setitem__("DS_ACCELERATOR", old)
    return tmp / "checkpoints" / "sft" / overrides[-1].removeprefix("run_name=")


def test_zero3_cli_two_processes_full_finetune_exports_a_plain_hf_model(tmp_path):
    """The users' GPU code path (Lightning DeepSpeedStrategy, ZeRO-3 sharding inside configure_model) on 2 CPU
    ranks: both ranks save a shard, the shards consolidate, and the HF export holds exactly the trained weights."""
    from transformers import AutoModelForCausalLM

    from omnimed.models.config import ModelConfig
    from omnimed.models.loading import load_causal_lm
    from omnimed.training.export import consolidate_checkpoint

    run = _zero3_train(tmp_path, "model.lora.enabled=false", "run_name=z3full")
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


def test_zero3_cli_lora_with_added_tokens_exports_a_loadable_adapter(tmp_path):
    """LoRA + new special tokens under ZeRO-3 on CPU: embeddings grow inside zero.Init, the new rows train, and the
    exported adapter reloads with its tokenizer and emits the new token ids."""
    from omnimed.training.export import load_exported

    run = _zero3_train(tmp_path, 'model.special_tokens=["<ret>","<rel>"]', "run_name=z3lora")
    model, tokenizer = load_exported(run / "hf")
    ids = tokenizer.convert_tokens_to_ids(["<ret>", "<rel>"])
    assert all(i >= 0 and i != tokenizer.unk_token_id for i in ids)
    assert tokenizer.decode(ids, skip_special_tokens=False).replace(" ", "") == "<ret><rel>"
    adapter = load_file(run / "hf" / "adapter_model.safetensors")
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

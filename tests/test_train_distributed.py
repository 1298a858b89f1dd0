"""`omnimed-train` under the distributed strategies on 2 CPU processes (gloo): DeepSpeed ZeRO-3 and its offload
preset with full fine-tuning, ZeRO-3 with LoRA and added tokens, FSDP2, and micro-batches under DDP and FSDP2. Each
test is ``multiprocess``: under xdist it runs while no other test does (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_runs import train

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
@pytest.mark.slow
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
@pytest.mark.slow
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
@pytest.mark.slow
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

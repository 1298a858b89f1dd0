"""Strategies (cpu/ddp/fsdp2/deepspeed), their YAML presets, checkpoint consolidation and HF export.

The 2-process tests launch tests/distributed/strategy_worker.py with ``torchrun --standalone --nproc_per_node 2`` on
CPU (gloo). The first DeepSpeed run on a machine compiles two ops (~1 minute, cached in ~/.cache/torch_extensions).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy

from omnimed.training.config import StrategyConfig, TrainerConfig
from omnimed.models.exported import load_exported
from omnimed.training.export import ADAPTER_SUBDIR, consolidate_checkpoint, export_hf
from omnimed.training.strategies import (
    CPUDeepSpeedStrategy,
    build_strategy,
    resolve_deepspeed_config,
)

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "distributed" / "strategy_worker.py"
PRESETS = ["cpu", "ddp", "fsdp2", "deepspeed_zero3", "deepspeed_zero3_offload", "deepspeed_zero3_8xa100"]

_spec = importlib.util.spec_from_file_location("strategy_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------------ helpers
def run_workers(
    preset: str, out: Path, *, steps: int = 3, timeout: int = 300, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Run the worker on 2 CPU processes; return both ranks' results, or fail showing the workers' output."""
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(WORKER), "--preset", preset, "--out", str(out), "--steps", str(steps), *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{preset} workers timed out after {timeout}s\n{_tail(exc.stdout)}\n{_tail(exc.stderr)}")
    elapsed = time.perf_counter() - started
    results = [out / f"rank{r}.json" for r in range(2)]
    if proc.returncode != 0 or not all(p.is_file() for p in results):
        pytest.fail(
            f"{preset} workers failed (rc={proc.returncode}, {elapsed:.0f}s)\n"
            f"--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
        )
    print(f"{preset}: 2 processes in {elapsed:.1f}s")
    return [json.loads(p.read_text()) for p in results]


def _tail(text: Any, n: int = 8000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def tiny_tokenizer(extra_special: list[str] | None = None) -> Any:
    """A word-level tokenizer over the tiny model's 128 ids, with optional added special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    if extra_special:
        fast.add_special_tokens({"additional_special_tokens": extra_special})
    return fast


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def fresh_tiny_llama(vocab_size: int | None = None) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(worker.tiny_llama_config())
    if vocab_size is not None:
        model.resize_token_embeddings(vocab_size)
    return model


# ------------------------------------------------------------------------------------------ mapping and presets
@pytest.mark.parametrize("preset", PRESETS)
def test_presets_compose_against_schema(preset: str) -> None:
    """Every conf/strategy preset composes through Hydra against StrategyConfig registered as strategy_schema."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    ConfigStore.instance().store(group="strategy", name="strategy_schema", node=StrategyConfig)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(overrides=[f"+strategy={preset}"])
    assert set(cfg.strategy) == {"name", "process_group_backend", "deepspeed"}
    if preset.startswith("deepspeed"):
        zero = cfg.strategy.deepspeed.zero_optimization
        assert cfg.strategy.name == "deepspeed" and zero.stage == 3
        assert zero.stage3_gather_16bit_weights_on_model_save is True
    if preset == "deepspeed_zero3_offload":
        assert cfg.strategy.deepspeed.zero_optimization.offload_param.device == "cpu"
        assert cfg.strategy.deepspeed.zero_optimization.offload_optimizer.pin_memory is True
    if preset == "deepspeed_zero3_8xa100":
        assert cfg.strategy.deepspeed.bf16.enabled is True
        assert cfg.strategy.deepspeed.gradient_clipping == TrainerConfig().gradient_clip_val
        assert "offload_param" not in cfg.strategy.deepspeed.zero_optimization


def test_build_strategy_on_cpu() -> None:
    trainer = TrainerConfig(devices=2)
    spec = build_strategy(StrategyConfig(name="cpu"), trainer)
    assert tuple(spec) == ("auto", "cpu", 1, "32-true")

    ddp = build_strategy(StrategyConfig(name="ddp"), trainer)
    assert isinstance(ddp.strategy, DDPStrategy) and ddp.strategy.process_group_backend == "gloo"
    assert (ddp.accelerator, ddp.devices, ddp.precision) == ("cpu", 2, "32-true")

    fsdp2 = build_strategy(StrategyConfig(name="fsdp2"), trainer)
    assert isinstance(fsdp2.strategy, ModelParallelStrategy)
    assert (fsdp2.strategy._data_parallel_size, fsdp2.strategy._tensor_parallel_size) == (2, 1)

    with pytest.warns(UserWarning, match="DeepSpeed on CPU"):
        ds = build_strategy(worker.load_strategy_preset("deepspeed_zero3_8xa100"), TrainerConfig(devices=2))
    assert type(ds.strategy) is CPUDeepSpeedStrategy and ds.precision == "32-true"
    assert ds.strategy.config["bf16"] == {"enabled": False}
    assert "gradient_accumulation_steps" not in ds.strategy.config  # Lightning sets it from the trainer

    with pytest.raises(ValueError, match="strategy.name"):
        build_strategy(StrategyConfig(name="horovod"), trainer)


def test_build_strategy_on_bf16_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the 8xA100 preset resolves to where CUDA with bf16 exists (no GPU needed to build the objects)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    spec = build_strategy(worker.load_strategy_preset("deepspeed_zero3_8xa100"), TrainerConfig(devices=8))
    assert type(spec.strategy) is DeepSpeedStrategy
    assert (spec.accelerator, spec.devices, spec.precision) == ("cuda", 8, "bf16-mixed")
    assert spec.strategy.process_group_backend == "nccl"
    assert spec.strategy.config["bf16"] == {"enabled": True}
    assert spec.strategy.config["gradient_clipping"] == 1.0
    ddp = build_strategy(StrategyConfig(name="ddp"), TrainerConfig())
    assert ddp.strategy.process_group_backend == "nccl" and ddp.precision == "bf16-mixed"
    fsdp2 = build_strategy(StrategyConfig(name="fsdp2"), TrainerConfig(devices="auto"))
    assert fsdp2.strategy._data_parallel_size == 8


def test_deepspeed_auto_values() -> None:
    trainer = TrainerConfig(accumulate_grad_batches=4, gradient_clip_val=0.5)
    ds = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
        },
    }
    out = resolve_deepspeed_config(
        ds, precision="32-true", trainer_cfg=trainer, micro_batch_size=8, hidden_size=64
    )
    assert out["train_micro_batch_size_per_gpu"] == 8 and "train_batch_size" not in out
    assert "gradient_accumulation_steps" not in out and out["gradient_clipping"] == 0.5
    assert out["fp16"] == {"enabled": False}
    assert out["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    assert ds["gradient_clipping"] == "auto"  # the caller's dict is left alone

    no_hidden = resolve_deepspeed_config(ds, precision="32-true", trainer_cfg=trainer)
    assert "reduce_bucket_size" not in no_hidden["zero_optimization"]
    assert "train_micro_batch_size_per_gpu" not in no_hidden  # Lightning reads the dataloader's batch size
    with pytest.raises(ValueError, match="accumulate_grad_batches"):
        resolve_deepspeed_config({"gradient_accumulation_steps": 2}, precision="32-true", trainer_cfg=trainer)
    with pytest.raises(ValueError, match="optimizer.params.lr"):
        resolve_deepspeed_config(
            {"optimizer": {"params": {"lr": "auto"}}}, precision="32-true", trainer_cfg=trainer
        )
    with pytest.warns(UserWarning, match="bf16.enabled=true overridden"):
        resolve_deepspeed_config({"bf16": {"enabled": True}}, precision="32-true", trainer_cfg=trainer)


# --------------------------------------------------------------------------------------- single-process export
def test_export_full_model_round_trip(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = tiny_tokenizer(["[Retrieval]", "[No Retrieval]"])
    model = fresh_tiny_llama(len(tok))
    ids = torch.tensor([[1, 5, 9, 128, 129, 2]])
    out = export_hf(model, tok, tmp_path / "full", generation_config={"max_new_tokens": 32})

    assert list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits_of(reloaded, ids), logits_of(model, ids), rtol=0, atol=0)
    tok2 = AutoTokenizer.from_pretrained(out)
    assert len(tok2) == 130 and tok2.convert_tokens_to_ids("[No Retrieval]") == 129
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["max_new_tokens"] == 32 and gen["eos_token_id"] == tok.eos_token_id
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left

    with pytest.raises(FileExistsError):
        export_hf(model, tok, out)
    export_hf(model, tok, out, overwrite=True)
    with pytest.raises(ValueError, match="resize_token_embeddings"):
        export_hf(fresh_tiny_llama(), tok, tmp_path / "too_small")


@pytest.mark.parametrize(
    "trainable_embeddings",
    [{"trainable_token_indices": [128, 129]}, {"modules_to_save": ["embed_tokens", "lm_head"]}],
    ids=["token_rows", "modules_to_save"],
)
def test_export_lora_adapter_and_merged_round_trip(
    tmp_path: Path, trainable_embeddings: dict[str, Any]
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    export_hf(fresh_tiny_llama(), tiny_tokenizer(), base_dir)
    tok = tiny_tokenizer(["[Retrieval]", "[No Retrieval]"])
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    base.resize_token_embeddings(len(tok))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **trainable_embeddings)
    peft_model = get_peft_model(base, lora)
    torch.manual_seed(1)
    with torch.no_grad():  # stand-in for training: non-zero LoRA B and new token rows
        for name, p in peft_model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    ids = torch.tensor([[1, 5, 9, 128, 129, 2]])
    expected = logits_of(peft_model, ids)

    out = export_hf(peft_model, tok, tmp_path / "merged", merge_lora=True, base_model_id=str(base_dir))
    torch.testing.assert_close(logits_of(peft_model, ids), expected, rtol=0, atol=0)  # live model untouched
    merged = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, added tokens included
    torch.testing.assert_close(logits_of(merged, ids), expected, rtol=1e-4, atol=1e-5)
    assert (out / "tokenizer.json").is_file() and not (out / "adapter_config.json").is_file()
    adapter = out / ADAPTER_SUBDIR
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()

    alone = export_hf(peft_model, tok, tmp_path / "adapter")  # merge_lora=False: the adapter alone
    for folder in (adapter, alone):
        adapter_model, tok2 = load_exported(folder)
        assert len(tok2) == len(tok)
        torch.testing.assert_close(logits_of(adapter_model, ids), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits_of(load_exported(out)[0], ids), logits_of(merged, ids), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- 2 processes
@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama every 2-process run starts from, so that their losses can be compared step by step."""
    out = tmp_path_factory.mktemp("pretrained")
    fresh_tiny_llama().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory, pretrained_dir: Path) -> list[dict[str, Any]]:
    """DDP through the model's own loss: the reference the sharded strategies, trained through the chunked LM head
    (task.head_chunk_positions), must match step by step (the same loss and, from step 2 on, the same updates)."""
    return run_workers("ddp", tmp_path_factory.mktemp("ddp"), extra=("--pretrained", str(pretrained_dir)))


@pytest.mark.multiprocess
def test_ddp_gloo_two_processes(ddp_results: list[dict[str, Any]]) -> None:
    for r, res in enumerate(ddp_results):
        assert (res["rank"], res["world_size"], res["strategy"]) == (r, 2, "DDPStrategy")
        assert len(res["losses"]) == 3 and all(math.isfinite(x) for x in res["losses"])
    assert ddp_results[0]["losses"] != ddp_results[1]["losses"]  # each rank saw its own shard of the data


@pytest.mark.multiprocess
def test_fsdp2_matches_ddp(ddp_results: list[dict[str, Any]], pretrained_dir: Path, tmp_path: Path) -> None:
    fsdp = run_workers("fsdp2", tmp_path, extra=("--pretrained", str(pretrained_dir), "--head-chunk", "5"))
    for res_f, res_d in zip(fsdp, ddp_results):
        assert res_f["strategy"] == "ModelParallelStrategy"
        assert res_f["local_numel"] < res_f["full_numel"]  # really sharded
        torch.testing.assert_close(
            torch.tensor(res_f["losses"]), torch.tensor(res_d["losses"]), rtol=0, atol=1e-4
        )
    state = consolidate_checkpoint(tmp_path / "ckpt")
    live = torch.load(tmp_path / "live_state.pt")
    assert set(state) == {k.removeprefix("model.") for k in live}
    for key, value in live.items():
        torch.testing.assert_close(state[key.removeprefix("model.")], value, rtol=0, atol=0)


@pytest.mark.multiprocess
def test_deepspeed_zero3_cpu(ddp_results: list[dict[str, Any]], pretrained_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    pretrained = fresh_tiny_llama()
    results = run_workers(
        "deepspeed_zero3", tmp_path / "run", timeout=600,
        extra=("--pretrained", str(pretrained_dir), "--head-chunk", "5"),
    )
    for res, res_d in zip(results, ddp_results):
        # the partitioned head's weight is read and its gradient delivered inside ZeRO-3's gather
        torch.testing.assert_close(torch.tensor(res["losses"]), torch.tensor(res_d["losses"]), rtol=0, atol=1e-4)
    for res in results:
        assert res["strategy"] == "CPUDeepSpeedStrategy" and res["backend"] == "gloo"
        assert res["precision"] == "32-true"
        assert res["local_numel"] * 2 <= res["full_numel"] + 1024, res  # each rank holds ~half
        assert all(math.isfinite(x) for x in res["losses"])
        # from_pretrained inside zero.Init loaded the real weights: step-0 loss = the unsharded model's loss on the
        # rank's first batch
        batch = torch.tensor(res["first_batch"])
        with torch.no_grad():
            expected = pretrained(input_ids=batch, labels=batch).loss.item()
        assert res["losses"][0] == pytest.approx(expected, abs=1e-4)

    state = consolidate_checkpoint(tmp_path / "run" / "ckpt")
    live = torch.load(tmp_path / "run" / "live_state.pt")
    for key, value in live.items():  # the consolidated checkpoint is the trained model
        torch.testing.assert_close(state[key.removeprefix("model.")], value, rtol=0, atol=0)

    model = fresh_tiny_llama()
    model.load_state_dict(state, strict=True)
    out = export_hf(model, tiny_tokenizer(), tmp_path / "hf")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits_of(reloaded, ids), logits_of(model, ids), rtol=0, atol=0)

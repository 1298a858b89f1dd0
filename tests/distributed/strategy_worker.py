"""One rank of a 2-process strategy test, launched by tests/test_strategies.py through ``torchrun``.

Trains a tiny Llama, created in ``configure_model`` like the real SFT module's, for a few steps on fixed random
tokens under one strategy built by ``omnimed.training.strategies.build_strategy`` from a ``conf/strategy`` preset, and
writes ``rank<r>.json`` (per-step losses, shard sizes) into ``--out``. With DeepSpeed it also saves a ZeRO-3 checkpoint
(``--out/ckpt``) and the gathered live weights (``--out/live_state.pt``, rank 0) so the test can check consolidation.

The process ends with ``destroy_process_group`` + flush + ``os._exit`` (see /work/shared/ENVIRONMENT.md: without it
about 1 two-process run in 10 aborts at interpreter exit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from omnimed.conf import load_option
from omnimed.training.chunked_head import supervised_loss_sum
from omnimed.training.config import StrategyConfig, TrainerConfig
from omnimed.training.strategies import apply_fsdp2, build_strategy, hf_zero3_context

SEQ_LEN = 16
BATCH_SIZE = 2


def tiny_llama_config() -> LlamaConfig:
    """A 2-layer Llama with tied embeddings (like SmolLM2), small enough for CPU tests."""
    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )


def load_strategy_preset(name: str) -> StrategyConfig:
    """A ``conf/strategy/<name>.yaml`` preset validated against ``StrategyConfig`` (its ``defaults`` list dropped)."""
    return load_option("strategy", name, StrategyConfig)


class RandomTokens(Dataset):
    """Fixed random token sequences: identical on every rank and every run."""

    def __init__(self, n: int, vocab_size: int, seed: int = 1234) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n, SEQ_LEN), generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class TinyCausalLM(LightningModule):
    """Minimal stand-in for the SFT module: the HF model is created in ``configure_model`` (so ZeRO-3's
    ``zero.Init`` partitions it at construction and FSDP2 can shard it), next-token loss on the batch."""

    def __init__(self, lr: float = 5e-3, pretrained: str | None = None, head_chunk: int | None = None) -> None:
        super().__init__()
        self.lr = lr
        self.pretrained = pretrained
        self.head_chunk = head_chunk
        self.model: LlamaForCausalLM | None = None
        self.losses: list[float] = []
        self.first_batch: list[list[int]] | None = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        with hf_zero3_context(self.trainer.strategy):
            if self.pretrained:
                self.model = LlamaForCausalLM.from_pretrained(self.pretrained)
            else:
                # from_config (not the class constructor): under ZeRO-3 it initialises the partitioned weights
                self.model = AutoModelForCausalLM.from_config(tiny_llama_config())
        if self.device_mesh is not None:
            apply_fsdp2(self.model, self.device_mesh)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.first_batch is None:
            self.first_batch = batch.tolist()
        if self.head_chunk is None:
            loss = self.model(input_ids=batch, labels=batch).loss
        else:  # the same mean next-token loss through the chunked head (task.head_chunk_positions)
            index = torch.arange(batch.numel(), device=batch.device).view_as(batch)[:, :-1].flatten()
            targets = batch[:, 1:].flatten()
            kwargs = {"input_ids": batch, "attention_mask": torch.ones_like(batch)}
            loss = supervised_loss_sum(self.model, kwargs, index, targets, self.head_chunk) / targets.numel()
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _shard_sizes(trainer: Trainer) -> dict[str, int]:
    """Parameter elements this rank holds vs the full model (ZeRO-3: ``ds_tensor`` vs ``ds_numel``)."""
    module = trainer.strategy.model.module  # the DeepSpeedEngine's wrapped LightningModule
    local = full = 0
    for p in module.parameters():
        full += int(p.ds_numel)
        local += int(p.ds_tensor.numel())
    return {"local_numel": local, "full_numel": full}


def _save_live_state(trainer: Trainer, path: Path) -> None:
    """Gather the partitioned ZeRO-3 parameters (collective) and save them on rank 0 with LightningModule names."""
    import deepspeed

    module = trainer.strategy.model.module
    named = list(module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        if trainer.global_rank == 0:
            torch.save({n: p.detach().clone() for n, p in named}, path)


def _dtensor_shard_sizes(module: LightningModule) -> dict[str, int]:
    """Parameter elements this rank holds vs the full model (FSDP2: local shard of each DTensor)."""
    local = full = 0
    for p in module.parameters():
        full += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return {"local_numel": local, "full_numel": full}


def _save_full_fsdp2_state(module: LightningModule, rank: int, path: Path) -> None:
    """All-gather the FSDP2 parameters (collective) and save them on rank 0 with LightningModule names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, path)


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    seed_everything(0, workers=True, verbose=False)
    strategy_cfg = load_strategy_preset(args.preset)
    trainer_cfg = TrainerConfig(devices=2, max_steps=args.steps, precision="auto")
    spec = build_strategy(strategy_cfg, trainer_cfg, micro_batch_size=BATCH_SIZE)
    trainer = Trainer(
        **spec.trainer_kwargs(),
        max_steps=trainer_cfg.max_steps,
        accumulate_grad_batches=trainer_cfg.accumulate_grad_batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = TinyCausalLM(pretrained=args.pretrained, head_chunk=args.head_chunk)
    data = RandomTokens(args.steps * BATCH_SIZE * 2, tiny_llama_config().vocab_size)  # 2 ranks
    started = time.perf_counter()
    trainer.fit(module, DataLoader(data, batch_size=BATCH_SIZE, shuffle=False))
    result: dict[str, Any] = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "precision": spec.precision,
        "losses": module.losses,
        "first_batch": module.first_batch,
        "fit_seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    if args.preset == "fsdp2":
        result.update(_dtensor_shard_sizes(module))
        trainer.save_checkpoint(out / "ckpt")  # torch distributed checkpoint: a folder of per-rank shards
        _save_full_fsdp2_state(module, trainer.global_rank, out / "live_state.pt")
    if args.preset.startswith("deepspeed"):
        result.update(_shard_sizes(trainer))
        result["backend"] = dist.get_backend()
        trainer.save_checkpoint(out / "ckpt")
        _save_live_state(trainer, out / "live_state.pt")
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--preset", required=True, help="conf/strategy preset name, e.g. ddp, deepspeed_zero3"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--pretrained", default=None, help="HF folder to load in configure_model (else from config)"
    )
    parser.add_argument("--head-chunk", type=int, default=None,
                        help="train through the chunked LM head, this many positions at a time")
    args = parser.parse_args()
    code = 0
    try:
        run(args)
    except BaseException:  # noqa: BLE001 - report anything, then exit non-zero
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()

"""Where our side of ``omnimed-bench train`` holds host memory: resident set size at each Lightning hook of the
first steps, and the large CPU tensors alive after the first step (shape, dtype, what holds them).

    python scripts/rss_trace.py [--model llama3.2-1b-shape] [--accelerator cuda] [--strategy single]
                                [--no-lean-mlp] [--batch-size 8] [--max-length 2048]

A diagnostic for issue 18 (our side's peak RSS on a GPU was 2.6x TRL's on the same model): it runs our side in this
process, as ``omnimed.bench.train_child`` would, with one extra callback.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import threading
import time
import traceback

import psutil


def _census(min_mb: float) -> list[dict]:
    import torch

    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                mb = obj.untyped_storage().nbytes() / 2**20
                if mb >= min_mb:
                    holders = [type(r).__name__ for r in gc.get_referrers(obj)][:4]
                    found.append({"shape": list(obj.shape), "dtype": str(obj.dtype), "mb": round(mb, 1),
                                  "param": isinstance(obj, torch.nn.Parameter), "held_by": holders})
        except Exception:  # noqa: BLE001 - objects mid-teardown
            continue
    return sorted(found, key=lambda t: -t["mb"])[:25]


class PeakStack(threading.Thread):
    """Samples RSS every 2 ms and keeps the main thread's stack at the highest sample: what runs at the peak."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.proc, self.main_id, self.peak_mb, self.stack, self.stop = psutil.Process(), threading.get_ident(), 0, [], False

    def run(self) -> None:
        while not self.stop:
            mb = self.proc.memory_info().rss / 2**20
            if mb > self.peak_mb + 64:
                frame = sys._current_frames().get(self.main_id)
                self.peak_mb, self.stack = mb, traceback.format_stack(frame)[-14:] if frame else []
            time.sleep(0.002)


def main() -> None:
    import lightning as L
    from lightning.pytorch import Callback

    import omnimed.bench.train_data as train_data
    from omnimed.bench.train_config import TrainBenchConfig, model_config
    from omnimed.bench.train_ours import run_ours

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3.2-1b-shape")
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--strategy", default="single")
    ap.add_argument("--lean-mlp", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--min-mb", type=float, default=64.0)
    args = ap.parse_args()
    cfg = TrainBenchConfig(model=args.model, lora_r=0, accelerator=args.accelerator, strategy=args.strategy,
                           precision="bf16-mixed" if args.accelerator == "cuda" else "32-true", packing=True,
                           batch_size=args.batch_size, max_length=args.max_length, steps=1, warmup=1, threads=8,
                           micro_batch_tokens=None, lr=1e-5, sides=["ours"])
    cfg.validate()
    train_data.model_config = lambda c: dataclasses.replace(model_config(c), lean_mlp=args.lean_mlp)
    proc, timeline, census = psutil.Process(), [], {}

    def mark(name: str) -> None:
        timeline.append((name, round(proc.memory_info().rss / 2**20)))

    class Trace(Callback):
        def setup(self, trainer, pl_module, stage):  # noqa: ANN001
            mark("setup")

        def on_fit_start(self, trainer, pl_module):  # noqa: ANN001
            mark(f"fit_start (params on {next(pl_module.parameters()).device})")

        def on_train_start(self, trainer, pl_module):  # noqa: ANN001
            mark("train_start")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            mark(f"step{batch_idx} start")

        def on_before_backward(self, trainer, pl_module, loss):  # noqa: ANN001
            mark(f"step{trainer.global_step} before backward")

        def on_after_backward(self, trainer, pl_module):  # noqa: ANN001
            mark(f"step{trainer.global_step} after backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # noqa: ANN001
            mark(f"step{trainer.global_step} before optimizer step")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            mark(f"step{batch_idx} end")
            if batch_idx == 0:
                census["after_step0"] = _census(args.min_mb)

    trainer_cls = L.Trainer

    def traced_trainer(*a, **kw):  # noqa: ANN002, ANN003
        kw["callbacks"] = [*kw.get("callbacks", []), Trace()]
        return trainer_cls(*a, **kw)

    L.Trainer = traced_trainer
    sampler = PeakStack()
    sampler.start()
    result = run_ours(cfg)
    sampler.stop = True
    print(f"lean_mlp={args.lean_mlp} strategy={args.strategy} peak RSS {result['peak_rss_mb']} MB, "
          f"after model load {result['rss_after_model_load_mb']} MB")
    for name, mb in timeline:
        print(f"  {mb:>8} MB  {name}")
    print(f"main thread's stack at the sampled peak ({sampler.peak_mb:.0f} MB):")
    print("".join(sampler.stack))
    print("CPU tensors alive after step 0 (largest first):")
    for t in census.get("after_step0") or []:
        print("  " + json.dumps(t))

if __name__ == "__main__":
    main()

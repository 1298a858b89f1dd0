"""Time one SFT step of SmolLM2-135M + LoRA r16 with our layers, PEFT's, or PEFT's under ``torch.compile``.

    .venv/bin/python scripts/compile_probe.py ours|peft|compile|compile_dyn

Forward and backward on a fixed 4 x 256 batch of random tokens, the loss on each row's last 50 positions through
the supervised-positions head (:func:`omnimed.training.lm_head.supervised_logits`), 2 threads; prints the first
step's time (the compile, for ``compile``) and the median of the next 6. The README's "Training cost on CPU"
quotes one run of each variant.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import AutoModelForCausalLM

from omnimed.models.config import LoraSettings
from omnimed.models.lean_mlp import use_lean_mlps
from omnimed.models.lora import apply_lora
from omnimed.models.packaged import packaged_model_path
from omnimed.training.lm_head import supervised_logits

VARIANTS = ("ours", "peft", "compile", "compile_dyn")


def main(variant: str) -> None:
    if variant not in VARIANTS:
        raise SystemExit(f"variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(packaged_model_path("smollm2-135m"), torch_dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model = apply_lora(model, LoraSettings(enabled=True, fused=variant == "ours"))
    if variant == "ours":
        use_lean_mlps(model)
    model.train()
    torch.manual_seed(0)
    ids = torch.randint(0, 49000, (4, 256))
    index = torch.arange(ids.numel()).view(ids.shape)[:, -50:].reshape(-1)
    targets = ids.flatten()[index]
    run = torch.compile(model, dynamic=variant == "compile_dyn") if variant.startswith("compile") else model

    def step() -> float:
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(supervised_logits(run, {"input_ids": ids}, index).float(), targets)
        loss.backward()
        return time.perf_counter() - t0

    print(f"{variant}: first step {step():.1f} s", flush=True)
    times = sorted(step() for _ in range(6))
    print(f"{variant}: median of 6 steps {times[3]:.2f} s (all: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ours")

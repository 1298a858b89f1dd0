"""Model FLOPs utilisation of a training run, by llm-foundry's formula (``scripts/train/benchmarking/README.md``).

Per token a training step costs ``6 N`` FLOPs for the ``N`` parameters (forward, backward to the activations,
backward to the weights: a multiply-add each) plus ``12 L d T`` for attention's two ``T x T`` products over ``L``
layers of width ``d`` at sequence length ``T``. MFU is that times the tokens per second, over the chip's dense bf16
peak. Normalisation, activations and residuals are left out, as there; recomputation (activation checkpointing) is
not counted, which is what makes MFU comparable across implementations. ``6 N`` assumes every parameter is trained
(full fine-tuning); under LoRA the frozen weights get no weight gradient, so the same number overstates the work.
"""

from __future__ import annotations

from typing import Any

#: dense bf16 peak FLOP/s per chip, the numbers llm-foundry divides by (NVIDIA's data sheets, without sparsity)
PEAK_BF16_FLOPS: dict[str, float] = {"H100": 989.5e12, "H200": 989.5e12, "A100": 312e12}


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L d T``."""
    return 6 * n_params + 12 * n_layers * d_model * seq_len


def peak_flops(device_name: str | None) -> float | None:
    """The dense bf16 peak of a GPU named like ``NVIDIA H200`` (None when the name is not in the table)."""
    for key, value in PEAK_BF16_FLOPS.items():
        if device_name and key in device_name.upper():
            return value
    return None


def mfu_fields(model: Any, seq_len: int, tokens_per_s: float, device_name: str | None) -> dict[str, Any]:
    """``model_params``, ``flops_per_token``, ``model_tflops`` (achieved) and ``mfu`` (None on an unknown chip) of a
    run that processed ``tokens_per_s`` positions a second. Parameters are counted once each (tied embeddings once;
    under ZeRO-3 their full size, ``ds_numel``)."""
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    config = model.config
    per_token = flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, seq_len)
    achieved = per_token * tokens_per_s
    peak = peak_flops(device_name)
    return {"model_params": n_params, "flops_per_token": per_token, "model_tflops": round(achieved / 1e12, 2),
            "mfu": round(achieved / peak, 4) if peak else None, "peak_tflops": peak / 1e12 if peak else None}


def gpu_mfu(accelerator: str, model: Any, seq_len: int, tokens_per_s: float) -> dict[str, Any]:
    """:func:`mfu_fields` on the current CUDA device (empty on CPU). ``seq_len`` is the bench's ``max_length``: the
    attention term is exact for packed blocks and an upper bound for shorter padded batches."""
    import torch

    if accelerator != "cuda":
        return {}
    return mfu_fields(model, seq_len, tokens_per_s, torch.cuda.get_device_name(0))

"""``model.fused_kernels`` (Liger's Triton kernels): where they cannot run, loading stops with the key to turn off
and what is missing, instead of training silently without them or failing inside a kernel."""

from __future__ import annotations

import sys

import pytest
import torch

from omnimed.models.config import ModelConfig
from omnimed.models.errors import ModelLoadError
from omnimed.models.loading import load_causal_lm


def _tiny(**fields: object) -> ModelConfig:
    return ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama", **fields)


def test_fused_kernels_without_a_gpu_name_the_key_to_turn_off(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"model\.fused_kernels=true needs a CUDA GPU"):
        load_causal_lm(_tiny(fused_kernels=True))


def test_fused_kernels_without_liger_say_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it fails, installed or not
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    with pytest.raises(ModelLoadError, match=r"pip install liger-kernel \(also in the `gpu` extra\)"):
        load_causal_lm(_tiny(fused_kernels=True))


def test_fused_kernels_off_by_default_leave_the_lean_mlp_in_place() -> None:
    """The default model (no GPU needed) keeps the lean MLP; ``fused_kernels`` is a choice, not a requirement."""
    from omnimed.models.lean_mlp import lean_mlp_forward

    model = load_causal_lm(_tiny())
    mlp = next(m for m in model.modules() if type(m).__name__ == "LlamaMLP")
    assert not ModelConfig().fused_kernels and mlp.forward.__func__ is lean_mlp_forward

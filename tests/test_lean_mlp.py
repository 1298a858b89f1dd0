"""The lean gated MLP (omnimed.models.lean_mlp): the same loss and gradients, without keeping its activation."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import torch

from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.lean_mlp import use_lean_mlps
from omnimed.models.loading import load_causal_lm, load_tokenizer

TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")


def model_with(lean: bool, checkpointing: bool = False):
    torch.manual_seed(0)
    cfg = replace(TINY, lean_mlp=lean, gradient_checkpointing=checkpointing,
                  lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
    model = load_causal_lm(cfg, load_tokenizer(cfg))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model


def activations_kept(model, ids) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """How many MLP activation outputs are still alive between forward and backward; the loss; the gradients."""
    mlps = [m for m in model.modules() if type(m).__name__ == "LlamaMLP"]
    outputs: list[weakref.ref] = []
    handles = [m.act_fn.register_forward_hook(lambda _m, _i, out: outputs.append(weakref.ref(out))) for m in mlps]
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
    for h in handles:
        h.remove()
    gc.collect()
    alive = sum(ref() is not None for ref in outputs)
    loss.backward()
    return alive, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_the_lean_mlp_gives_the_same_loss_and_gradients_without_keeping_its_activation():
    ids = torch.randint(3, 200, (3, 21), generator=torch.Generator().manual_seed(1))
    kept_plain, loss_plain, grads_plain = activations_kept(model_with(lean=False), ids)
    kept_lean, loss_lean, grads_lean = activations_kept(model_with(lean=True), ids)
    assert kept_plain == 2 and kept_lean == 0  # tiny-llama has two layers
    assert torch.allclose(loss_lean, loss_plain, rtol=0, atol=1e-6)
    for name, grad in grads_plain.items():
        assert torch.allclose(grads_lean[name], grad, rtol=1e-5, atol=1e-7), name


def test_a_model_with_activation_checkpointing_keeps_its_own_mlp():
    assert use_lean_mlps(model_with(lean=False, checkpointing=True)) == 0
    assert use_lean_mlps(model_with(lean=False)) == 2

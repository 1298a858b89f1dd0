"""The fused LoRA linear layer (omnimed.models.lora_fused) computes what PEFT's does, with less memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from omnimed.models import dropout_kernel
from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.loading import load_causal_lm, load_tokenizer
from omnimed.models.lora_fused import FusedLoraLinear, _LoraLinearFn, _Mask

TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")


def lora_model(dropout: float, fused: bool, checkpointing: bool = False):
    torch.manual_seed(0)  # the same LoRA A init either way
    cfg = replace(TINY, gradient_checkpointing=checkpointing,
                  lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=dropout, fused=fused))
    model = load_causal_lm(cfg, load_tokenizer(cfg))
    with torch.no_grad():  # B = 0 would hide the adapter path
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    return model


def step(model, seed: int = 1):
    torch.manual_seed(seed)
    ids = torch.randint(3, 200, (3, 17))
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_without_dropout_the_fused_layers_give_pefts_loss_and_gradients():
    peft_model, fused_model = lora_model(0.0, fused=False), lora_model(0.0, fused=True)
    assert not any(isinstance(m, FusedLoraLinear) for m in peft_model.modules())
    assert sum(isinstance(m, FusedLoraLinear) for m in fused_model.modules()) == 7 * 2  # 7 projections x 2 layers
    loss_peft, grads_peft = step(peft_model)
    loss_fused, grads_fused = step(fused_model)
    assert torch.allclose(loss_fused, loss_peft, rtol=0, atol=1e-6)
    assert grads_fused.keys() == grads_peft.keys()
    for name in grads_peft:
        assert torch.allclose(grads_fused[name], grads_peft[name], rtol=1e-4, atol=1e-6), name


@pytest.fixture(params=["kernel", "numpy"])
def mask_path(request, monkeypatch) -> str:
    """Each dropout test runs on the CPU kernel's path (omnimed.models.dropout_kernel) and on the numpy one."""
    if request.param == "numpy":
        monkeypatch.setattr(dropout_kernel, "usable", lambda x: False)
    elif dropout_kernel.load() is None:
        pytest.skip("the LoRA dropout kernel cannot be built here (it warned why)")
    return request.param


def test_the_fused_gradient_is_the_derivative_of_its_forward_with_dropout(mask_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 12, dtype=torch.double, generator=g, requires_grad=True)
    weight, bias = torch.randn(9, 12, dtype=torch.double, generator=g), torch.randn(9, dtype=torch.double, generator=g)
    a = torch.randn(3, 12, dtype=torch.double, generator=g, requires_grad=True)
    b = torch.randn(9, 3, dtype=torch.double, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a, b: _LoraLinearFn.apply(x, weight, bias, a, b, 2.0, 0.3, 1234),
                                    (x, a, b))


def test_the_dropout_mask_is_drawn_from_its_seed_at_the_configured_rate_independently(mask_path):
    x = torch.ones(200_000)
    keep = _Mask(x, 0.1, seed=7).keep()
    assert _Mask(x, 0.1, seed=7).kernel == (mask_path == "kernel")
    assert keep.dtype == np.bool_ and keep.shape == (200_000,)
    assert np.array_equal(keep, _Mask(x, 0.1, seed=7).keep())
    other = _Mask(x, 0.1, seed=8).keep()
    assert abs(1.0 - keep.mean() - 0.1) < 0.003  # 200,000 draws: 4 standard deviations
    # independent between elements and between seeds: both drop an element with probability 0.01
    assert abs(np.mean(~keep[1:] & ~keep[:-1]) - 0.01) < 0.0025
    assert abs(np.mean(~keep & ~other) - 0.01) < 0.0025


def test_the_kernels_mask_does_not_depend_on_the_thread_count():
    if dropout_kernel.load() is None:
        pytest.skip("the LoRA dropout kernel cannot be built here (it warned why)")
    x = torch.randn(300_000)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = dropout_kernel.keep_where(x, 0.2, 11)
        torch.set_num_threads(2)
        two = dropout_kernel.keep_where(x, 0.2, 11)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_the_forward_drops_the_elements_its_mask_drops(mask_path):
    """With A = I and B = I the adapter path returns the dropped input: zeros exactly where the mask drops."""
    x = torch.randn(6, 50) + 5.0  # no element is zero by chance
    eye = torch.eye(50)
    y = _LoraLinearFn.apply(x, torch.zeros(50, 50), None, eye, eye, 1.0, 0.25, 99)
    keep = torch.from_numpy(_Mask(x, 0.25, 99).keep()).view(x.shape)
    assert torch.equal(y == 0, ~keep)
    assert torch.allclose(y[keep], x[keep] / 0.75)


def test_with_dropout_and_checkpointing_the_recomputed_masks_are_the_forwards(mask_path):
    """Under activation checkpointing the layer runs forward twice; the second run must draw the same masks."""
    loss_plain, grads_plain = step(lora_model(0.2, fused=True).train())
    loss_ckpt, grads_ckpt = step(lora_model(0.2, fused=True, checkpointing=True).train())
    assert torch.allclose(loss_ckpt, loss_plain, rtol=0, atol=1e-6)
    for name in grads_plain:
        assert torch.allclose(grads_ckpt[name], grads_plain[name], rtol=1e-4, atol=1e-6), name


def test_dropout_is_active_in_training_and_off_in_eval():
    model = lora_model(0.5, fused=True)
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.eval()
        first, second = (model(input_ids=ids).logits for _ in range(2))
        model.train()
        trained = model(input_ids=ids).logits
    assert torch.equal(first, second)
    assert not torch.allclose(trained, first)


def test_under_autocast_the_layer_is_pefts_own():
    fused = lora_model(0.0, fused=True)
    layer = next(m for m in fused.modules() if isinstance(m, FusedLoraLinear))
    x = torch.randn(2, 4, layer.in_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer._fused_adapter(x, (), {}) is None
    assert layer._fused_adapter(x, (), {}) == "default"
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = layer(x)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("merge", [True, False])
def test_a_fused_model_merges_and_saves_as_peft_does(merge, tmp_path):
    fused, plain = lora_model(0.0, fused=True).eval(), lora_model(0.0, fused=False).eval()
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        if merge:
            got = fused.merge_and_unload()(input_ids=ids).logits
        else:
            fused.save_pretrained(tmp_path)
            assert {p.name for p in tmp_path.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
            got = fused(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5)

"""A LoRA linear layer computed as one autograd node: the frozen base projection, the adapter and its dropout.

PEFT computes ``base(x) + scale * B(A(dropout(x)))`` as separate modules. On a CPU training step of SmolLM2-135M with
LoRA on the seven projections (issue 18's profile) that costs, per adapted layer:

* **memory**: the dropout's output, a copy of the layer's input, is kept for ``A``'s weight gradient, together with
  its mask: 850 MB of the step's 2.2 GB of saved activations, although q, k and v (and gate and up) read one and
  the same input;
* **time**: ``bernoulli_`` draws the mask from torch's Mersenne Twister one element at a time (1.4 ms for a
  4 x 150 x 576 input, 14% of the step), ``masked_fill`` applies it at a few GB/s, and the scaled adapter output and
  the sum are two more full-width passes.

:class:`FusedLoraLinear` keeps the input itself (shared with the other projections that read it) and the adapter's
``r``-wide activation. The adapter's output is added into the base output in place (``addmm_``). The mask is
Bernoulli(1 - p) per element as PEFT's, 16 bits per element (the drop rate is ``p`` rounded to a multiple of
1/65,536: 0.05 -> 0.0500031), from a seed drawn from torch's generator (so ``seed_everything`` makes it
reproducible, and activation checkpointing's second forward draws the same mask). On CPU a small C++ kernel
(:mod:`omnimed.models.dropout_kernel`) computes the mask from the seed and each element's index in the same pass
that applies it, so backward computes it again and nothing is kept; elsewhere (or where the kernel cannot be
built) the bits come from numpy's SFC64, the mask is applied by multiplying with it and kept packed to one bit per
element (1/32 of a float copy). The draws differ from PEFT's, the distribution does not; with ``p = 0`` the layer
computes exactly what PEFT's does.

The fused path runs where it is exact and safe; everywhere else the layer is PEFT's own (:meth:`FusedLoraLinear.
forward`): one active vanilla adapter, not merged, an ``nn.Linear`` base whose weight does not train, no autocast
(bf16-mixed keeps PEFT's path), one dtype throughout, and no DeepSpeed ZeRO-3 partitioned parameters (whose gather
runs in the base layer's own forward hooks, which the fused path does not call). ``model.lora.fused: false`` turns
it off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as PeftLoraLinear
from torch import nn

from omnimed.models import dropout_kernel


def keep_mask(numel: int, p: float, seed: int) -> np.ndarray:
    """Bernoulli(1 - ``p``) keep mask of ``numel`` elements (bool, True where an element is kept), drawn from SFC64
    seeded with ``seed``: the same ``seed`` gives the same mask (activation checkpointing's second forward relies on
    it)."""
    words = np.random.SFC64(seed).random_raw((numel + 3) // 4)
    halves = words.view(np.int16)[:numel]  # uniform over the 65,536 int16 values
    return np.greater_equal(halves, round(p * 65536) - 32768)


def _kept(t: torch.Tensor, keep: np.ndarray, *, in_place: bool = False) -> torch.Tensor:
    """``t`` with the elements ``keep`` drops set to zero (a copy, or ``t`` itself with ``in_place``). On CPU, for
    dtypes numpy has, numpy multiplies by the bool mask directly, allocating no float mask (the transient copies it
    would add showed as 100 MB more peak RSS in the default job); elsewhere a 0/1 factor of ``t``'s dtype on its
    device."""
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64, torch.float16) and t.is_contiguous():
        out = t if in_place else torch.empty_like(t)
        np.multiply(t.detach().numpy().reshape(-1), keep, out=out.detach().numpy().reshape(-1))
        return out
    factor = torch.from_numpy(keep.view(np.uint8)).to(device=t.device, dtype=t.dtype).view(t.shape)
    return t.mul_(factor) if in_place else t * factor


class _Mask:
    """The dropout mask of one call: computed again from its seed by the CPU kernel
    (:mod:`omnimed.models.dropout_kernel`) where that runs, else drawn by :func:`keep_mask` and kept packed to one
    bit an element until backward."""

    def __init__(self, x2: torch.Tensor, p: float, seed: int) -> None:
        self.p, self.seed, self.numel = p, seed, x2.numel()
        self.kernel = dropout_kernel.usable(x2)
        self._keep = None if self.kernel else keep_mask(self.numel, p, seed)
        self._packed: np.ndarray | None = None

    def apply(self, t: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
        """``t`` (shaped like the layer's input) with the dropped elements set to zero."""
        if self.kernel and t.is_contiguous():
            return dropout_kernel.keep_where(t, self.p, self.seed, out=t if in_place else None)
        return _kept(t, self.keep(), in_place=in_place)

    def keep(self) -> np.ndarray:
        """The keep mask as a bool array (unpacked again after :meth:`pack`)."""
        if self._keep is None:
            if self._packed is not None:
                self._keep = np.unpackbits(self._packed, count=self.numel).view(bool)
            else:
                ones = torch.ones(self.numel)
                self._keep = self.apply(ones, in_place=True).numpy() != 0
        return self._keep

    def pack(self) -> _Mask:
        """Keep only what backward needs: nothing on the kernel's path, the mask at one bit an element otherwise."""
        if not self.kernel and self._keep is not None:
            self._packed, self._keep = np.packbits(self._keep), None
        return self


class _LoraLinearFn(torch.autograd.Function):
    """``y = x W^T + b + s * (x * m) A^T B^T`` with ``s = scale / (1 - p)`` and ``m`` 0 where the mask of ``seed``
    drops an element, else 1;
    gradients for ``x``, ``A`` and ``B`` (the base ``W`` and ``b`` are frozen)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scale: float, p: float, seed: int) -> torch.Tensor:
        y = F.linear(x, weight, bias)
        x2 = x.reshape(-1, x.shape[-1])
        mask = _Mask(x2, p, seed) if p > 0 else None
        h = (x2 if mask is None else mask.apply(x2)) @ lora_a.t()
        s = scale / (1.0 - p)
        y.view(-1, y.shape[-1]).addmm_(h, lora_b.t(), alpha=s)
        ctx.save_for_backward(x, weight, lora_a, lora_b, h)
        ctx.s = s
        ctx.mask = None if mask is None else mask.pack()
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, lora_a, lora_b, h = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])
        grad_h = (g @ lora_b).mul_(ctx.s)
        grad_b = (g.t() @ h).mul_(ctx.s) if ctx.needs_input_grad[4] else None
        x2 = x.reshape(-1, x.shape[-1])
        needs_x, needs_a = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        mask = ctx.mask
        grad_a = grad_x = None
        if needs_a:
            grad_a = grad_h.t() @ (x2 if mask is None else mask.apply(x2))
        if needs_x:
            lora_part = grad_h @ lora_a
            if mask is not None:
                mask.apply(lora_part, in_place=True)
            grad_x = lora_part.addmm_(g, weight).view(x.shape)
        return grad_x, None, None, grad_a, grad_b, None, None, None


class FusedLoraLinear(PeftLoraLinear):
    """PEFT's LoRA ``Linear`` whose forward is :class:`_LoraLinearFn` where that is exact (module docstring).
    Made by :func:`fuse_lora_layers`, which changes the class of PEFT's modules in place: parameters, state dict
    keys, merging and saving are PEFT's."""

    def _fused_adapter(self, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
        """The adapter to run fused, or None where PEFT's own forward must run."""
        if args or kwargs or self.disable_adapters or self.merged or len(self.active_adapters) != 1:
            return None
        name = self.active_adapters[0]
        base = self.base_layer
        if name not in self.lora_A or name in self.lora_variant or type(base) is not nn.Linear:
            return None
        weight, lora_a = base.weight, self.lora_A[name].weight
        if weight.requires_grad or hasattr(weight, "ds_id") or hasattr(lora_a, "ds_id"):
            return None
        if torch.is_autocast_enabled(x.device.type) or not (x.dtype == weight.dtype == lora_a.dtype):
            return None
        dropout = self.lora_dropout[name]
        if not isinstance(dropout, (nn.Dropout, nn.Identity)):
            return None
        return name

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        name = self._fused_adapter(x, args, kwargs)
        if name is None:
            return super().forward(x, *args, **kwargs)
        dropout = self.lora_dropout[name]
        p = dropout.p if isinstance(dropout, nn.Dropout) and self.training else 0.0
        seed = int(torch.randint(0, 2**62, (1,))) if p > 0 else 0
        return _LoraLinearFn.apply(x, self.base_layer.weight, self.base_layer.bias, self.lora_A[name].weight,
                                   self.lora_B[name].weight, float(self.scaling[name]), float(p), seed)


def fuse_lora_layers(model: nn.Module) -> int:
    """Turn every PEFT LoRA ``Linear`` of ``model`` into a :class:`FusedLoraLinear` (in place); returns how many."""
    n = 0
    for module in model.modules():
        if type(module) is PeftLoraLinear:
            module.__class__ = FusedLoraLinear
            n += 1
    return n

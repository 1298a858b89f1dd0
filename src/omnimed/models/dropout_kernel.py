"""A CPU kernel for LoRA dropout: ``out = x * keep`` with the keep mask computed from ``(seed, element index)``.

The fused LoRA layer (:mod:`omnimed.models.lora_fused`) drops elements of its input with probability ``p``. With
numpy the mask costs three passes over the input in the forward pass (draw the bits, multiply, pack them to one bit
an element) and three in the backward pass, on one thread: about 0.5 ms for a 320 x 576 input on the 2-core
Xeon, a quarter of that layer's time and about 13% of a training step. Torch has no fast CPU dropout (its
``bernoulli_`` draws from a Mersenne Twister one element at a time).

This kernel draws nothing and stores nothing: element ``i`` is kept when 16 bits of a counter-based hash of ``i``
and the seed (two rounds of the ``lowbias32`` integer hash) are at least ``round(p * 65536)``, so the keep
probability is ``1 - p`` rounded to a multiple of 1/65,536, as on the numpy path, and the same seed gives the same
mask on any number of threads: the backward pass, and activation checkpointing's second forward, compute it again
instead of keeping it. One pass, vectorised and split over torch's intra-op threads.

It is C++ built once per machine with torch's extension builder (about 25 s; ``scripts/setup.sh`` builds it, the
build is cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). Where it cannot be built (no
compiler, no AVX2) :func:`load` says why once and returns None, and the layer keeps the numpy path: the same
distribution from another generator. ``OMNIMED_DROPOUT_KERNEL=0`` turns it off.

``python -m omnimed.models.dropout_kernel`` builds it and checks its drop rate.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstdint>

static inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}

// out[i] = x[i] where 16 bits of hash(seed, i) >= threshold, else 0; out may be x.
torch::Tensor keep_where(torch::Tensor x, torch::Tensor out, int64_t seed, int64_t threshold) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && out.is_contiguous(), "keep_where: contiguous CPU tensors");
  TORCH_CHECK(x.numel() == out.numel() && x.scalar_type() == out.scalar_type(), "keep_where: x and out differ");
  TORCH_CHECK(x.numel() < (int64_t(1) << 32), "keep_where: at most 2^32 elements");
  const uint32_t s1 = (uint32_t)seed, s2 = lowbias32((uint32_t)((uint64_t)seed >> 32) ^ 0x5bd1e995U);
  const uint32_t t = (uint32_t)threshold;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "keep_where", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      const uint32_t first = (uint32_t)begin, n = (uint32_t)(end - begin);  // a 32-bit counter vectorises
      const scalar_t* a = src + begin;
      scalar_t* b = dst + begin;
      for (uint32_t j = 0; j < n; ++j) {
        const uint32_t h = lowbias32(lowbias32(first + j + s1) ^ s2);
        b[j] = (h >> 16) >= t ? a[j] : scalar_t(0);
      }
    });
  });
  return out;
}
"""

#: the instruction-set flags per torch CPU capability; the build's name carries the capability, so a cache shared
#: by machines of different kinds never hands one a build it cannot run
_FLAGS = {
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"],
}
_VERSION = 1  # raise when _SOURCE changes


@functools.cache
def load() -> Any | None:
    """The built kernel (its ``keep_where(x, out, seed, threshold)``), or None where it is off or cannot be built
    (the reason is warned once)."""
    if os.environ.get("OMNIMED_DROPOUT_KERNEL", "1") == "0":
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    flags = _FLAGS.get(capability)
    if flags is None:
        warnings.warn(f"LoRA dropout kernel: CPU capability {capability!r} (needs AVX2); using numpy", stacklevel=2)
        return None
    from torch.utils.cpp_extension import load_inline

    log.info("loading the LoRA dropout kernel (%s; built once per machine, about 25 s the first time)", capability)
    try:
        return load_inline(
            name=f"omnimed_dropout_v{_VERSION}_{capability.lower()}",
            cpp_sources=_SOURCE,
            functions=["keep_where"],
            extra_cflags=["-O3", "-fopenmp", *flags],
            extra_ldflags=["-fopenmp"],  # libgomp.so.1: the one torch has loaded, so one thread pool
        )
    except Exception as err:  # noqa: BLE001 - any build failure leaves the numpy path, which is correct
        warnings.warn(f"LoRA dropout kernel could not be built ({type(err).__name__}: {err}); using numpy",
                      stacklevel=2)
        return None


def keep_where(x: torch.Tensor, p: float, seed: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with the elements the mask of ``seed`` drops (probability ``p``) set to zero, into ``out`` (a new
    tensor by default; ``x`` itself for in place). Needs :func:`load` to have returned the kernel."""
    kernel = load()
    if kernel is None:
        raise RuntimeError("the LoRA dropout kernel is not available (omnimed.models.dropout_kernel.load)")
    return kernel.keep_where(x, torch.empty_like(x) if out is None else out, seed, round(p * 65536))


def usable(x: torch.Tensor) -> bool:
    """Whether the kernel can mask ``x``: built here, a contiguous CPU tensor of a floating dtype, < 2^32 elements."""
    return (x.device.type == "cpu" and x.is_floating_point() and x.is_contiguous() and x.numel() < 2**32
            and load() is not None)


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    if load() is None:
        raise SystemExit("the LoRA dropout kernel is not available here; training uses the numpy path")
    ones = torch.ones(1 << 20)
    rate = float((keep_where(ones, 0.05, 7) == 0).float().mean())
    if not 0.048 < rate < 0.052:
        raise SystemExit(f"the LoRA dropout kernel dropped {rate:.4f} of 2^20 elements at p = 0.05")
    print(f"LoRA dropout kernel ready ({torch.backends.cpu.get_cpu_capability()}, {time.perf_counter() - start:.1f} s;"
          f" drop rate {rate:.4f} at p = 0.05)")

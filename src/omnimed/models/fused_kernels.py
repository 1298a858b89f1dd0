"""Liger's Triton kernels for a model's RMSNorm, SwiGLU MLP and rotary embedding, on a CUDA GPU.

A decoder layer's norms, gated activation and rotary embedding are chains of small elementwise operations, each a
pass over a ``[tokens, width]`` tensor; on a GPU those passes, not the matrix products, are what separates a step's
time from its FLOPs (README, "Training cost on one GPU"). Liger-Kernel fuses each chain into one kernel with its
own backward (its SwiGLU keeps only the gate and up projections for backward, as :mod:`omnimed.models.lean_mlp`
does). The loss is left to ours (:func:`omnimed.training.lm_head.supervised_logits`): Liger's fused linear
cross-entropy would replace the model's forward.

``model.fused_kernels=true`` turns it on; it needs ``pip install liger-kernel`` (also in the ``gpu`` extra) and Triton
on a CUDA machine. Liger patches the layers of the instance and, for the rotary embedding, the function of the
model's ``transformers`` module, so every model of that type loaded later in the process uses it too.
"""

from __future__ import annotations

import torch
from torch import nn

from omnimed.models.errors import ModelLoadError

#: what we ask Liger for: the layers' elementwise chains, never the loss
KERNELS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
           "fused_linear_cross_entropy": False}


def use_fused_kernels(model: nn.Module) -> str:
    """Patch ``model``'s RMSNorm, SwiGLU MLP and rotary embedding with Liger's kernels, in place; returns the model
    type patched. Raises :class:`ModelLoadError` naming ``model.fused_kernels`` where they cannot run: no CUDA
    device, Liger-Kernel not installed, or a model type Liger does not know."""
    if not torch.cuda.is_available():
        raise ModelLoadError("model.fused_kernels=true needs a CUDA GPU (Liger's kernels are Triton kernels); "
                             "set model.fused_kernels=false on this machine")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as err:
        raise ModelLoadError(f"model.fused_kernels=true needs Liger-Kernel: pip install liger-kernel (also in the "
                             f"`gpu` extra); import failed: {err}") from err
    base = getattr(model, "get_base_model", lambda: model)()  # a PEFT model patches its base's layers
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ModelLoadError(f"model.fused_kernels=true: Liger-Kernel has no kernels for model type {model_type!r} "
                             f"(it knows {', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set it to false")
    _apply_liger_kernel_to_instance(model=base, **KERNELS)
    return model_type

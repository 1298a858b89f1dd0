"""The LM head applied to the positions that predict a supervised token, and nowhere else.

A causal LM's forward projects every position through its ``[hidden, vocab]`` head; SFT and DPO then throw away the
prompt's rows (most of a batch: on the world's instructions about 80% of the positions). :func:`supervised_logits`
runs the model whole (its forward, so DeepSpeed ZeRO-3 and FSDP2 gather parameters as usual and any logit scaling
or soft-capping after the head still applies) with a forward pre-hook on its output embedding that hands the head
only the hidden states listed in ``index``: the projection, its backward and the float32 logits shrink to the
supervised tokens'. The loss computed from them is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def supervised_logits(model: nn.Module, model_kwargs: Mapping[str, torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """``[len(index), vocab]`` logits of the hidden states at ``index`` into the flattened ``[rows, length]``
    positions. A model whose forward does not call its head as a module returns full logits, indexed the same way."""

    def keep(_head: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].flatten(0, 1)[index], *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(keep)
    try:
        logits = model(**model_kwargs, use_cache=False).logits
    finally:
        handle.remove()
    if logits.dim() == 3:  # the head was not called as a module: full logits came back
        logits = logits.flatten(0, 1)[index]
    return logits

"""The LM head and its cross-entropy computed a chunk of positions at a time, never the whole ``[positions, vocab]``
logits (``task.head_chunk_positions``).

With full fine-tuning every position is supervised, and the float32 logits of a Llama-3-sized vocabulary dwarf
everything else a step holds: 8 x 2,048 positions x 128,256 columns are 8.4 GB, kept for backward, plus their
gradient. :class:`ChunkedLinearCrossEntropy` computes, chunk by chunk, the logits, the summed cross-entropy and the
gradients of that sum with respect to the hidden states and the head's weight, in the forward pass (the Liger-Kernel
design, in plain torch so that it runs on any device): one chunk's logits are alive at a time, backward only scales
the stored gradients, and the matrix products are those of the unchunked head. The loss is the same float32
cross-entropy.

:func:`supervised_loss_sum` runs the model's own forward (so DeepSpeed ZeRO-3 and FSDP2 gather the head as they
would) with the head's forward replaced for that call by the chunked loss over the supervised positions.
:func:`supervised_token_log_probs` gives DPO each supervised token's log-prob instead of their sum: there the
gradient of each token is scaled by its sequence's weight in the loss, which is known only in backward, so the head's
weight must be frozen (LoRA): the gradient with respect to the hidden states is computed row by row in forward and
each row scaled in backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int, *,
                          need_hidden: bool = False, need_weight: bool = False, per_token: bool = False,
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``sum_i CE(hidden[i] @ weight.T, targets[i])`` in float32, ``chunk`` positions at a time (with ``per_token``
    each ``CE_i`` instead of their sum), and where asked the gradients of the sum with respect to ``hidden`` and
    ``weight``."""
    device = hidden.device.type
    # the products run in the dtype the plain head would (autocast's, where it is on); the loss in float32
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    # the weight's gradient is summed over the chunks in float32
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
    losses = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
    w = weight.to(compute)
    with torch.autocast(device, enabled=False):
        for start in range(0, hidden.size(0), chunk):
            h, t = hidden[start:start + chunk].to(compute), targets[start:start + chunk]
            logits = (h @ w.T).float()
            lse = logits.logsumexp(-1)
            losses[start:start + chunk] = lse - logits.gather(1, t[:, None]).squeeze(1)
            if not (need_hidden or need_weight):
                continue
            probs = logits.sub_(lse[:, None]).exp_()  # d(sum of CE) / d(logits) = softmax - one-hot
            probs[torch.arange(t.numel(), device=t.device), t] -= 1
            g = probs.to(compute)
            if grad_hidden is not None:
                grad_hidden[start:start + chunk] = g @ w
            if grad_weight is not None and compute == torch.float32:
                grad_weight.addmm_(g.T, h)
            elif grad_weight is not None:
                grad_weight += g.T @ h
    return (losses if per_token else losses.sum()), grad_hidden, (
        None if grad_weight is None else grad_weight.to(weight.dtype))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """:func:`chunked_cross_entropy` as an autograd function: the gradients are computed in forward and only scaled
    in backward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        total, grad_hidden, grad_weight = chunked_cross_entropy(
            hidden, weight, targets, chunk, need_hidden=ctx.needs_input_grad[0], need_weight=ctx.needs_input_grad[1])
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_total.to(grad_hidden.dtype),
                None if grad_weight is None else grad_weight * grad_total.to(grad_weight.dtype), None, None)


class ChunkedTokenLogProbs(torch.autograd.Function):
    """Each position's float32 ``log p(target | hidden)`` through the head, a chunk of positions at a time. The
    gradient of each log-prob with respect to its own hidden state is computed in forward (a row of ``[positions,
    hidden]``) and scaled by that position's incoming gradient in backward; the head's weight gets none, so it must
    not be trained."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        if ctx.needs_input_grad[1]:
            raise ValueError(f"task.head_chunk_positions={chunk} with per-token log-probs (DPO) needs the output head "
                             "frozen (LoRA without trainable token rows): its weight's gradient would need each "
                             "token's weight in the loss before backward; set it to null")
        losses, grad_hidden, _ = chunked_cross_entropy(hidden, weight, targets, chunk,
                                                       need_hidden=ctx.needs_input_grad[0], per_token=True)
        ctx.save_for_backward(grad_hidden)
        return -losses

    @staticmethod
    def backward(ctx, grad_logps: torch.Tensor):
        (grad_hidden,) = ctx.saved_tensors  # of each token's cross-entropy: the log-prob's is its negative
        if grad_hidden is None:
            return None, None, None, None
        return grad_hidden * -grad_logps.to(grad_hidden.dtype)[:, None], None, None, None


def _plain_linear(module: nn.Module) -> bool:
    """A bias-free layer computing exactly ``nn.Linear``'s forward (a quantized subclass overrides it)."""
    return isinstance(module, nn.Linear) and module.bias is None and type(module).forward is nn.Linear.forward


def _token_rows(head: nn.Module) -> Any | None:
    """PEFT's trainable-token layer where ``head`` is its wrapper over a plain linear head, else None."""
    from peft.utils.other import TrainableTokensWrapper

    layer = head.token_adapter if isinstance(head, TrainableTokensWrapper) else None
    return layer if layer is not None and _plain_linear(layer.base_layer) else None


def can_chunk(head: nn.Module) -> bool:
    """Whether the chunked loss can stand in for ``head``: a plain bias-free linear layer, or PEFT's trainable-token
    rows on one (a tied head with added tokens). Not LoRA on the head, a bias or a quantized layer."""
    return _plain_linear(head) or _token_rows(head) is not None


def head_weight(head: nn.Module) -> torch.Tensor:
    """The ``[vocab, hidden]`` matrix a head that :func:`can_chunk` multiplies by: its weight, or the base weight
    with the trained token rows in place. Read inside the head's call, where ZeRO-3 and FSDP2 have gathered it."""
    layer = _token_rows(head)
    if layer is None:
        return head.weight
    if head.disable_adapters or layer.merged or not layer.active_adapters:
        return layer.base_layer.weight
    layer._check_overlapping_tokens(layer.active_adapters)
    return layer.get_merged_weights(layer.active_adapters)


def supervised_loss_sum(model: nn.Module, model_kwargs: Mapping[str, torch.Tensor], index: torch.Tensor,
                        targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """The float32 cross-entropy summed over the hidden states at ``index`` (into the flattened ``[rows, length]``
    positions) against ``targets``, the head applied ``chunk`` positions at a time."""

    def loss(selected: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return ChunkedLinearCrossEntropy.apply(selected, weight, targets, chunk)
        # validation: an autograd function would still compute the gradients of inputs that require them
        return chunked_cross_entropy(selected, weight, targets, chunk)[0]

    return _chunked_head_call(model, model_kwargs, index, chunk, loss)


def supervised_token_losses(model: nn.Module, model_kwargs: Mapping[str, torch.Tensor], index: torch.Tensor,
                            targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """:func:`supervised_loss_sum`'s terms, one float32 cross-entropy per target, without gradients: what a
    validation loss per group of examples (``data.val_group_by``) adds up."""
    if torch.is_grad_enabled():
        raise RuntimeError("supervised_token_losses computes no gradients: call it under torch.no_grad()")
    return _chunked_head_call(model, model_kwargs, index, chunk,
                              lambda s, w: chunked_cross_entropy(s, w, targets, chunk, per_token=True)[0])


def supervised_token_log_probs(model: nn.Module, model_kwargs: Mapping[str, torch.Tensor], index: torch.Tensor,
                               targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """The float32 log-prob of each target given the hidden state at ``index``, the head applied ``chunk``
    positions at a time (:class:`ChunkedTokenLogProbs`: differentiable with the head frozen)."""

    def log_probs(selected: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return ChunkedTokenLogProbs.apply(selected, weight, targets, chunk)
        return -chunked_cross_entropy(selected, weight, targets, chunk, per_token=True)[0]

    return _chunked_head_call(model, model_kwargs, index, chunk, log_probs)


def _chunked_head_call(model: nn.Module, model_kwargs: Mapping[str, torch.Tensor], index: torch.Tensor, chunk: int,
                       compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The model's own forward with its head's forward replaced, for this call, by ``compute(hidden states at
    index, head weight)``."""
    head = model.get_output_embeddings()
    if not can_chunk(head):
        raise ValueError(f"task.head_chunk_positions={chunk}: the model's output head is a {type(head).__name__}; "
                         "the chunked loss stands in for a plain bias-free nn.Linear or PEFT's trainable-token rows "
                         "on one (not LoRA on the head, a bias or a quantized layer); set it to null")
    produced: list[torch.Tensor] = []

    def chunked_forward(hidden: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
        # the weight is read inside the head's call: ZeRO-3 / FSDP2 have gathered it by now
        produced.append(compute(hidden.flatten(0, 1)[index], head_weight(head)))
        return produced[-1]

    head.forward = chunked_forward
    try:
        out = model(**model_kwargs, use_cache=False).logits
    finally:
        del head.forward
    # the same value, not the same object: DeepSpeed's module hooks hand a head's output on through a function of theirs
    if len(produced) != 1 or out.shape != produced[0].shape or not torch.equal(out.detach(), produced[0].detach()):
        raise ValueError(f"task.head_chunk_positions={chunk}: the {type(model).__name__} forward does not return "
                         "its head's output as its logits (it scales or caps them, or calls the head another way); "
                         "set it to null")
    return out

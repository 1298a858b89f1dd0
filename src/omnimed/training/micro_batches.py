"""A batch cut into chunks of rows that fit a token budget, each trimmed to its own longest row.

``task.micro_batch_tokens`` bounds the positions (rows x padded length) that one forward pass holds activations for.
An optimizer step still sees the whole batch: :class:`~omnimed.training.sft.SFTModule` runs the chunks one after
the other, each chunk's summed loss divided by the whole batch's supervised tokens, and their gradients add up to
the batch's. The activation memory of a step falls with the budget (on SmolLM2-135M + LoRA about 1 MB per position
on CPU, fp32), at some speed: smaller matrix products and more operator calls.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def micro_batches(batch: Mapping[str, torch.Tensor], max_tokens: int | None) -> list[dict[str, torch.Tensor]]:
    """``batch`` (right-padded ``[rows, length]`` tensors with an ``attention_mask``) as chunks of at most
    ``max_tokens`` positions each, rows taken longest first, every chunk cut to its longest row; a row longer than
    the budget is a chunk of its own. The whole batch, as one chunk, when it fits or ``max_tokens`` is None."""
    mask = batch["attention_mask"]
    rows, length = mask.shape
    if max_tokens is None or rows * length <= max_tokens:
        return [dict(batch)]
    lengths = mask.sum(1)
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    sizes = lengths.tolist()
    chunks: list[list[int]] = []
    for row in order:
        # rows come longest first, so a chunk's padded length is that of its first row
        if chunks and (len(chunks[-1]) + 1) * sizes[chunks[-1][0]] <= max_tokens:
            chunks[-1].append(row)
        else:
            chunks.append([row])
    odd = [key for key, value in batch.items() if tuple(value.shape[:2]) != (rows, length)]
    if odd:
        raise ValueError(f"task.micro_batch_tokens splits [rows, length] tensors; {odd} are shaped otherwise")
    out = []
    for chunk in chunks:
        index = torch.tensor(chunk, device=mask.device)
        width = max(int(sizes[chunk[0]]), 1)
        out.append({key: value.index_select(0, index)[:, :width] for key, value in batch.items()})
    return out

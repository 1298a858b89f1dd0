"""Sequence log-probs of a batch of preference pairs, as :mod:`omnimed.training.dpo` scores them.

A batch (:class:`~omnimed.training.dpo_data.PairCollator`) holds B pairs as 2B right-padded rows, the chosen
sequences then the rejected ones. Two things make scoring it cheaper than running those 2B rows through the model
and its LM head, without changing what is computed:

* **Shared prompts.** A pair's chosen and rejected sequences start with the same prompt, and under causal attention
  the hidden states of a common prefix do not depend on what follows it. :func:`pair_inputs` packs each pair into
  one row: the chosen sequence, then the rejected sequence's tokens after the longest common prefix of the two, at
  the positions they have in the rejected sequence (``position_ids``), with a 4-D attention mask under which the
  rejected tokens see the shared prefix and each other (causally) but not the chosen tokens. The prompt runs once
  instead of twice; the log-prob of every supervised token is that of its own sequence. This needs a model that
  honours a custom 4-D boolean mask (``attn_implementation="sdpa"``) and no sliding window
  (:func:`can_share_prompts`); otherwise the pairs run as the 2B rows.
* **The LM head on supervised positions only** (:func:`omnimed.training.lm_head.supervised_logits`): the
  ``[tokens, vocab]`` projection, its backward and the float32 logits shrink to the completions'; with
  ``task.head_chunk_positions`` (a frozen head) a chunk of them at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from omnimed.training.chunked_head import supervised_token_log_probs
from omnimed.training.lm_head import supervised_logits
from omnimed.training.tokenize import IGNORE_INDEX


@dataclass
class PairInputs:
    """What the model runs on (``model_kwargs``) and where the supervised tokens are: ``index`` into the flattened
    ``[rows, length]`` hidden states, the ``targets`` those hidden states predict, and the ``sequence`` (0..2B-1,
    chosen then rejected, the batch's row order) each token belongs to; ``sequences`` = 2B."""

    model_kwargs: dict[str, torch.Tensor]
    index: torch.Tensor
    targets: torch.Tensor
    sequence: torch.Tensor
    sequences: int
    shared: bool


def can_share_prompts(model: nn.Module) -> bool:
    """Whether ``model`` can score a pair in one row (see the module docstring): SDPA attention, which takes the
    packed rows' 4-D boolean mask as given, and no sliding-window attention, which that mask would bypass."""
    config = getattr(model, "config", None)
    return (getattr(config, "_attn_implementation", None) == "sdpa"
            and getattr(config, "sliding_window", None) is None)


def pair_inputs(batch: Mapping[str, torch.Tensor], share_prompts: bool) -> PairInputs:
    """The model inputs and supervised-token layout of a batch of pairs: one packed row per pair (shared prompt)
    when ``share_prompts``, else the batch's 2B rows as they are."""
    ids, attention, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    rows, length = ids.shape
    supervised = labels[:, 1:] != IGNORE_INDEX  # position t - 1 predicts label t
    sequence, source = supervised.nonzero(as_tuple=True)
    targets = labels[:, 1:][supervised]
    if not share_prompts:
        return PairInputs({"input_ids": ids, "attention_mask": attention}, sequence * length + source, targets,
                          sequence, rows, shared=False)

    pairs = rows // 2
    lengths = attention.sum(1)
    chosen_len, rejected_len = lengths[:pairs], lengths[pairs:]
    real = attention.bool()
    same = (ids[:pairs] == ids[pairs:]) & real[:pairs] & real[pairs:]
    prefix = same.long().cumprod(1).sum(1)  # the longest common prefix of each pair's two sequences
    packed_len = chosen_len + rejected_len - prefix
    width = int(packed_len.max())
    pos = torch.arange(width, device=ids.device).expand(pairs, width)
    in_chosen = pos < chosen_len[:, None]
    in_rejected = ~in_chosen & (pos < packed_len[:, None])
    rejected_pos = (pos - chosen_len[:, None] + prefix[:, None]).clamp(0, length - 1)
    chosen_ids = ids[:pairs].gather(1, pos.clamp(max=length - 1))
    rejected_ids = ids[pairs:].gather(1, rejected_pos)
    packed_ids = torch.where(in_chosen, chosen_ids, torch.where(in_rejected, rejected_ids, ids[0, -1]))
    position_ids = torch.where(in_chosen, pos, torch.where(in_rejected, rejected_pos, 0))
    # which sequence a position belongs to: 0 the shared prefix, 1 chosen only, 2 rejected only (or padding)
    branch = torch.where(in_chosen, (pos >= prefix[:, None]).long(), 2)
    causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
    allowed = (causal & (in_chosen | in_rejected)[:, None, :]
               & ~((branch[:, :, None] == 2) & (branch[:, None, :] == 1)))
    # rejected tokens read the hidden state of their own sequence's previous position: shared, or its packed copy
    pair = sequence % pairs
    moved = (sequence >= pairs) & (source >= prefix[pair])
    packed_source = torch.where(moved, chosen_len[pair] + source - prefix[pair], source)
    return PairInputs({"input_ids": packed_ids, "attention_mask": allowed[:, None], "position_ids": position_ids},
                      pair * width + packed_source, targets, sequence, rows, shared=True)


def sequence_log_probs(model: nn.Module, inputs: PairInputs, head_chunk: int | None = None) -> torch.Tensor:
    """Per sequence (2B values, chosen then rejected), the sum of the float32 log-probs ``model`` gives its
    supervised tokens, the LM head applied to the hidden states that predict them only; with ``head_chunk``
    (``task.head_chunk_positions``) that many positions at a time, no ``[tokens, vocab]`` logits held (the head
    frozen: :func:`~omnimed.training.chunked_head.supervised_token_log_probs`)."""
    if head_chunk:
        token_logps = supervised_token_log_probs(model, inputs.model_kwargs, inputs.index, inputs.targets, head_chunk)
    else:
        logits = supervised_logits(model, inputs.model_kwargs, inputs.index)
        token_logps = logits.float().log_softmax(-1).gather(-1, inputs.targets.unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(inputs.sequences, dtype=token_logps.dtype, device=token_logps.device)
    return out.index_add(0, inputs.sequence, token_logps)

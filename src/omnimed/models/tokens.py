"""Adding special tokens (e.g. Self-RAG reflection tokens) to a tokenizer and growing the model to match."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def add_special_tokens(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[int]:
    """Register ``tokens`` as additional special tokens and return their ids, in the order given.

    Special tokens are never split by the BPE and survive ``decode(..., skip_special_tokens=False)``.
    Tokens already known to the tokenizer are kept (re-adding is a no-op), so reloading a fine-tuned
    tokenizer that already holds them gives the same ids. Existing additional special tokens are kept.
    """
    tokens = list(dict.fromkeys(tokens))  # de-duplicate, keep order
    if not tokens:
        return []
    # transformers 5 names these "extra_special_tokens"; extend the list rather than replace it.
    tokenizer.add_special_tokens({"extra_special_tokens": tokens}, replace_extra_special_tokens=False)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    for token, token_id in zip(tokens, ids):
        if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise RuntimeError(f"Special token {token!r} was not added to the tokenizer")
    return list(ids)


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the tokenizer a pad token without growing the vocabulary.

    Prefers ``unk`` (Llama-2 style tokenizers have one, so padding never masks a real ``eos``), else ``eos``.
    Padding stays on the right, which causal-LM training with a loss mask expects.
    """
    if tokenizer.pad_token is None:
        if tokenizer.unk_token is not None and tokenizer.unk_token != tokenizer.eos_token:
            tokenizer.pad_token = tokenizer.unk_token
        elif tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            raise ValueError("Tokenizer has neither pad, unk nor eos token; cannot choose a pad token")
        log.info("Tokenizer had no pad token; using %r", tokenizer.pad_token)
    tokenizer.padding_side = "right"


def embedding_rows(model: PreTrainedModel) -> int:
    """Rows of the input embedding, also when ZeRO-3 has partitioned it (its local ``shape`` is then empty)."""
    weight = model.get_input_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


@contextmanager
def _outside_zero3_init(model: PreTrainedModel) -> Iterator[None]:
    """Build the resized embedding as a plain module when ZeRO-3 is partitioning modules as they are made.

    Lightning creates the model inside ``deepspeed.zero.Init``; transformers' resize expects its new embedding to be
    whole (it gathers the old one and copies rows into the new one), so the partitioning hooks are paused for the
    resize and DeepSpeed partitions the new weight when its engine starts.
    """
    if not hasattr(model.get_input_embeddings().weight, "ds_shape"):
        yield
        return
    from deepspeed.runtime.zero.partition_parameters import restore_init_context, shutdown_init_context

    shutdown_init_context()
    try:
        yield
    finally:
        restore_init_context()


def resize_for_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Grow the input (and tied or untied output) embeddings to ``len(tokenizer)`` when tokens were added.

    New rows start at the mean of the old ones (``mean_resizing``), a better start than random for tokens
    that will be learned. Never shrinks: checkpoints such as Qwen2.5 carry padded, unused rows.
    Returns whether the model was resized.
    """
    current = embedding_rows(model)
    wanted = len(tokenizer)
    if wanted <= current:
        return False
    with _outside_zero3_init(model):
        model.resize_token_embeddings(wanted, mean_resizing=True)
    log.info("Resized embeddings %d -> %d rows for added tokens", current, wanted)
    return True

"""LoRA wiring through PEFT, including training the rows of newly added special tokens.

New special tokens (Self-RAG's ``[Retrieval]``, ``[Relevant]``, ...) start with no meaning, so their input
embedding rows and output (``lm_head``) rows must learn while the base model stays frozen. PEFT offers two
ways: ``modules_to_save`` copies and trains the *whole* embedding and head (for a 7B model with a 150k vocab
that is over a billion extra trainable parameters, and a full copy of both matrices in every adapter), and
``trainable_token_indices``, which trains only the listed rows as a small delta. We use the latter:

- tied embeddings (SmolLM2, tiny-llama): targeting the input embedding is enough; PEFT 0.21 wraps the tied
  ``lm_head`` with an adapter that *shares* the embedding's token delta, so input and output rows stay one
  tensor (PEFT ties them whenever the model config says ``tie_word_embeddings`` and the indices match);
- untied embeddings (Llama-2-7B, Qwen2.5-7B): the input embedding and the output head are both targeted with
  the same indices, each learning its own rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import PreTrainedModel

from omnimed.models.config import LoraSettings

log = logging.getLogger(__name__)


def _module_name(model: PreTrainedModel, module: object) -> str:
    return next(name for name, mod in model.named_modules() if mod is module)


def build_lora_config(
    model: PreTrainedModel, settings: LoraSettings, trainable_token_ids: Sequence[int] = ()
) -> LoraConfig:
    """Translate ``LoraSettings`` into a PEFT ``LoraConfig`` for ``model``.

    ``trainable_token_ids`` are embedding rows (the added special tokens) to train besides the LoRA matrices.
    """
    token_ids = sorted({int(i) for i in trainable_token_ids})
    trainable_tokens: dict[str, list[int]] | None = None
    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    if token_ids:
        embed_name = _module_name(model, model.get_input_embeddings())
        trainable_tokens = {embed_name: token_ids}
        head = model.get_output_embeddings()
        if head is not None and not tied:
            trainable_tokens[_module_name(model, head)] = token_ids
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        trainable_token_indices=trainable_tokens,
    )


@contextmanager
def _zero3_token_rows_without_cuda() -> Iterator[None]:
    """Let PEFT read the new token rows of ZeRO-3-partitioned embeddings on CPU-only torch.

    PEFT 0.21 gathers those rows onto ``cuda`` (``_collect_token_weights``), which fails where torch has no CUDA
    (the CPU ZeRO-3 runs of CI). A gather with ``modifier_rank=None`` already gives every rank the full matrix,
    so each rank can copy its rows locally; on CUDA machines PEFT's own code runs unchanged.
    """
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
    from peft.utils.integrations import gather_params_ctx

    if torch.cuda.is_available():
        yield
        return

    def rows_of(self: TrainableTokensLayer, weight: torch.Tensor, rows: Any, embed_dim: int) -> torch.Tensor:
        with gather_params_ctx([weight], modifier_rank=None):
            return weight[rows].detach().clone()

    original = TrainableTokensLayer._collect_token_weights
    TrainableTokensLayer._collect_token_weights = rows_of
    try:
        yield
    finally:
        TrainableTokensLayer._collect_token_weights = original


def _init_partitioned_lora(model: PeftModel) -> None:
    """Redo PEFT's LoRA init (A: kaiming uniform, B: zeros) where DeepSpeed ZeRO-3 partitioned the adapters.

    Under ZeRO-3, Lightning builds the model inside ``deepspeed.zero.Init``: each LoRA matrix is partitioned as soon
    as its ``nn.Linear`` is created, so PEFT's ``zeros_(lora_B)`` right after writes into an empty placeholder and B
    keeps ``nn.Linear``'s random init. The model then does not start as its base (measured on tiny-llama: ||B|| about
    4 per matrix; a DPO run's step-0 loss 0.62 instead of log 2, the policy no longer being its reference). The
    adapters are gathered (all of them at once: they are small), re-initialised on rank 0 and re-partitioned from
    there. A no-op without ZeRO-3 partitioned parameters. Collective: every rank must call it.
    """
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    params = [p for m in layers for d in (m.lora_A, m.lora_B, m.lora_embedding_A, m.lora_embedding_B)
              for p in d.parameters()]
    if not any(hasattr(p, "ds_id") for p in params):
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        for layer in layers:
            for adapter in [*layer.lora_A.keys(), *layer.lora_embedding_A.keys()]:
                layer.reset_lora_parameters(adapter, model.peft_config[adapter].init_lora_weights)


def apply_lora(
    model: PreTrainedModel, settings: LoraSettings, trainable_token_ids: Sequence[int] = ()
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters; base weights are frozen, LoRA matrices and new token rows train. The
    adapters start as PEFT initialises them (B = 0: the wrapped model computes what the base did), under DeepSpeed
    ZeRO-3 too (:func:`_init_partitioned_lora`). With ``settings.fused`` each adapted linear layer runs as one
    autograd node where that is exact (:mod:`omnimed.models.lora_fused`)."""
    with _zero3_token_rows_without_cuda():
        peft_model = get_peft_model(model, build_lora_config(model, settings, trainable_token_ids))
    _init_partitioned_lora(peft_model)
    if settings.fused:
        from omnimed.models.lora_fused import fuse_lora_layers

        fuse_lora_layers(peft_model)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%d: %d / %d parameters trainable", settings.r, settings.alpha, trainable, total)
    return peft_model


def merge_lora(model: PreTrainedModel | PeftModel) -> PreTrainedModel:
    """Fold LoRA deltas and trained token rows into the base weights (``LoraSettings.merge_on_export``).

    Returns a plain ``PreTrainedModel`` that ``save_pretrained`` writes as an ordinary checkpoint, loadable
    with ``source=hub`` and a local ``name_or_path``. A model without adapters is returned unchanged.
    """
    if isinstance(model, PeftModel):
        return model.merge_and_unload()
    return model

"""Reloading a checkpoint that ``omnimed-train`` exported (``checkpoints/<task>/<run>/hf``): a full model, or a LoRA
adapter on its base with the embeddings resized to the saved tokenizer (added tokens), ready for inference."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

PathLike = str | os.PathLike

def load_exported(folder: PathLike, *, merge: bool = False, **model_kwargs: Any) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` from an :func:`export_hf` folder (tokenizer ``None`` when none was saved).

    A full-model folder (a full fine-tune, or a LoRA run exported merged, the default) loads with
    ``AutoModelForCausalLM.from_pretrained``. An adapter folder (``model.lora.merge_on_export=false``, exports from
    before the merged layout, or the ``adapter/`` beside a merged export) loads its base model
    (``base_model_name_or_path``, a hub id or a folder, resolved by :func:`omnimed.models.loading.resolve_base`; an
    adapter export itself is loaded the same way and merged), resizes its embeddings to the saved tokenizer when
    tokens were added, then applies the adapter with ``PeftModel.from_pretrained``; ``merge`` folds it into the base
    (a plain model that runs as fast as the base, and can be trained on again).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    adapter_cfg = path / "adapter_config.json"
    if not adapter_cfg.is_file():
        return AutoModelForCausalLM.from_pretrained(path, **model_kwargs), tokenizer

    from peft import PeftModel

    from omnimed.models.loading import resolve_base

    base_id = json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")
    if not base_id:
        raise ValueError(f"{adapter_cfg} names no base_model_name_or_path; load the base yourself")
    base_folder = resolve_base(base_id)
    if (base_folder / "adapter_config.json").is_file():  # trained on another adapter export (an older layout)
        base = load_exported(base_folder, merge=True, **model_kwargs)[0]
    else:
        base = AutoModelForCausalLM.from_pretrained(base_folder, **model_kwargs)
    rows = max(len(tokenizer) if tokenizer is not None else 0, _saved_embedding_rows(path))
    if base.get_input_embeddings().weight.shape[0] < rows:
        base.resize_token_embeddings(rows, mean_resizing=False)  # the adapter holds the rows
    model = PeftModel.from_pretrained(base, path)
    return (model.merge_and_unload() if merge else model), tokenizer


def _saved_embedding_rows(folder: Path) -> int:
    """Rows of the largest full embedding matrix saved in an adapter (embed_tokens / lm_head), 0 if none."""
    from safetensors import safe_open

    file = folder / "adapter_model.safetensors"
    if not file.is_file():
        return 0
    rows = 0
    with safe_open(str(file), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            if (
                ("embed_tokens" in key or "lm_head" in key)
                and "lora_" not in key
                and "trainable_tokens" not in key
            ):
                shape = f.get_slice(key).get_shape()
                if len(shape) == 2:
                    rows = max(rows, int(shape[0]))
    return rows

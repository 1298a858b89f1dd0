"""Turn training results into Hugging Face folders that ``AutoModelForCausalLM.from_pretrained`` loads.

- :func:`consolidate_checkpoint`: a Lightning checkpoint (``.ckpt`` file, DeepSpeed ZeRO-2/3 checkpoint directory, or
  a ModelParallelStrategy/FSDP2 distributed-checkpoint directory) -> the model's full fp32 state dict, keys without
  the LightningModule's attribute prefix (``model.``), so sharded training runs export like single-device ones.
- :func:`export_hf`: a full model, or a PEFT model merged (the adapter beside it in ``adapter/``) or as its adapter
  alone, + tokenizer + generation config, written to a temporary folder next to the target and renamed into place,
  so readers never see half a checkpoint.
- the inverse, :func:`omnimed.models.exported.load_exported`, reloads such a folder (adapters whose base model's
  vocabulary was extended included).

Call these on one process (rank 0) with an ordinary, unsharded model; ZeRO-3 / FSDP2 runs go through
:func:`consolidate_checkpoint` first.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from omnimed.data.artifacts import atomic_path

log = logging.getLogger(__name__)

PathLike = str | os.PathLike
ADAPTER_SUBDIR = "adapter"


# ----------------------------------------------------------------------------------------------------- consolidation
def consolidate_checkpoint(
    ckpt_path: PathLike,
    *,
    prefix: str | None = "model.",
    tag: str | None = None,
) -> dict[str, Tensor]:
    """The model parameters of a Lightning checkpoint as one plain CPU state dict.

    ``ckpt_path`` may be a ``.ckpt`` file, a DeepSpeed checkpoint directory (as Lightning's DeepSpeedStrategy saves
    it: per-rank ZeRO shards under a tag folder, merged with DeepSpeed's ``zero_to_fp32``), or a torch distributed
    checkpoint directory (ModelParallelStrategy/FSDP2 with ``save_distributed_checkpoint=True``).
    Keys starting with ``prefix`` (the attribute holding the HF model in the LightningModule) are kept with the
    prefix removed; other keys (e.g. extra heads) are dropped and logged. ``prefix=None`` keeps every key as is.
    Checkpoints are unpickled: load only trusted ones.
    """
    path = Path(ckpt_path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.is_dir() and _is_deepspeed_dir(path):
        state = _deepspeed_state_dict(path, tag)
    elif path.is_dir() and (path / ".metadata").is_file():
        state = _dcp_state_dict(path)
    elif path.is_file():
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        state = ckpt["state_dict"] if isinstance(ckpt, dict) and "state_dict" in ckpt else ckpt
    else:
        raise ValueError(
            f"{path} is neither a checkpoint file, a DeepSpeed nor a distributed checkpoint directory"
        )
    state = {_strip(k, "_forward_module."): v for k, v in state.items()}  # Lightning < 2.1 DeepSpeed wrapper
    return _select_prefix(state, prefix)


def _is_deepspeed_dir(path: Path) -> bool:
    if (path / "latest").is_file():
        return True
    return any(sub.is_dir() and any(sub.glob("*_model_states.pt")) for sub in path.iterdir())


def _deepspeed_state_dict(path: Path, tag: str | None) -> dict[str, Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    if tag is None and not (path / "latest").is_file():
        tags = [sub.name for sub in path.iterdir() if sub.is_dir() and any(sub.glob("*_model_states.pt"))]
        if len(tags) != 1:
            raise ValueError(f"{path} has no 'latest' file and several tags {tags}; pass tag=")
        tag = tags[0]
    return dict(get_fp32_state_dict_from_zero_checkpoint(str(path), tag=tag))


def _dcp_state_dict(path: Path) -> dict[str, Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="omnimed-dcp-") as tmp:
        target = Path(tmp) / "full.pt"
        dcp_to_torch_save(path, target)
        full = torch.load(target, map_location="cpu", weights_only=False)
    state = full.get("state_dict", full)
    return {k: v for k, v in state.items() if isinstance(v, Tensor)}


def _select_prefix(state: dict[str, Tensor], prefix: str | None) -> dict[str, Tensor]:
    if not prefix:
        return state
    kept = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    if not kept:
        raise KeyError(f"no checkpoint key starts with {prefix!r}; first keys: {sorted(state)[:5]}")
    dropped = sorted(k for k in state if not k.startswith(prefix))
    if dropped:
        log.info(
            "consolidate_checkpoint: dropped %d keys outside %r, e.g. %s", len(dropped), prefix, dropped[:3]
        )
    return kept


def _strip(key: str, prefix: str) -> str:
    return key.removeprefix(prefix)


# ------------------------------------------------------------------------------------------------------------ export
def export_hf(
    model: nn.Module,
    tokenizer: Any,
    out_dir: PathLike,
    *,
    merge_lora: bool = False,
    base_model_id: str | None = None,
    generation_config: Any = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (+ tokenizer, generation config) as an HF folder at ``out_dir``; returns its path.

    - A transformers ``PreTrainedModel``: the full model as safetensors.
    - A PEFT model with ``merge_lora``: the merged full model in ``out_dir``, which plain
      ``AutoModelForCausalLM.from_pretrained`` loads on any machine (added tokens included), and the adapter in
      ``out_dir/adapter`` (made from a copy: the live PEFT model is left as it was, at the cost of a second copy in
      memory). Without ``merge_lora``: the adapter alone in ``out_dir`` (``adapter_config.json`` +
      ``adapter_model.safetensors``, including ``modules_to_save`` and trainable token rows), which
      ``AutoPeftModelForCausalLM`` or :func:`~omnimed.models.exported.load_exported` loads on its base.
    ``base_model_id``: what the adapter names as its base (the base's hub id where it has one, so the adapter
    loads on another machine); ``None`` keeps the path the base was loaded from.
    ``tokenizer`` may be ``None`` (weights only). ``generation_config``: a ``GenerationConfig``, a dict of its fields,
    or ``None`` for the model's own (with the tokenizer's eos/pad/bos ids filled where unset).
    The folder is written under a temporary name beside ``out_dir`` and renamed into place; an existing ``out_dir``
    is replaced only with ``overwrite=True``.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True to replace it")
    _check_exportable(model, tokenizer)
    gen = _generation_config(model, tokenizer, generation_config)

    with atomic_path(out, is_dir=True) as tmp:
        if _is_peft(model):
            adapter_dir = tmp / ADAPTER_SUBDIR if merge_lora else tmp
            _save_adapter(model, adapter_dir, base_model_id)
            _save_extras(tokenizer, gen, adapter_dir)
            if merge_lora:
                merged = copy.deepcopy(model).merge_and_unload()
                _save_full(merged, tokenizer, gen, tmp)
                del merged
        else:
            if merge_lora:
                log.info("export_hf: merge_lora ignored, %s is not a PEFT model", type(model).__name__)
            _save_full(model, tokenizer, gen, tmp)
    log.info("exported %s to %s", type(model).__name__, out)
    return out


def _save_adapter(model: nn.Module, folder: Path, base_model_id: str | None) -> None:
    """The adapter's files, naming ``base_model_id`` as its base. Written against the local base and renamed in
    ``adapter_config.json`` after: PEFT would look the hub id up online while saving (a warning offline)."""
    model.save_pretrained(folder, safe_serialization=True)
    if base_model_id:
        for config in folder.rglob("adapter_config.json"):  # one per adapter
            data = json.loads(config.read_text())
            data["base_model_name_or_path"] = base_model_id
            config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save_full(model: nn.Module, tokenizer: Any, gen: Any, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)  # safetensors (transformers >= 5 writes nothing else)
    if not list(folder.glob("*.safetensors")):
        raise RuntimeError(f"save_pretrained wrote no safetensors file into {folder}")
    _save_extras(tokenizer, gen, folder)


def _save_extras(tokenizer: Any, gen: Any, folder: Path) -> None:
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if gen is not None:
        gen.save_pretrained(folder)


def _is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def _check_exportable(model: nn.Module, tokenizer: Any) -> None:
    """Refuse sharded parameters (they would save as empty shards) and a tokenizer larger than the embedding."""
    for name, param in model.named_parameters():
        if (
            hasattr(param, "ds_id")
            or type(param).__name__ == "DTensor"
            or type(param.data).__name__ == "DTensor"
        ):
            raise ValueError(
                f"parameter {name} is sharded (ZeRO-3/FSDP); export a model built from consolidate_checkpoint(...)"
            )
    if tokenizer is not None and hasattr(model, "get_input_embeddings"):
        rows = model.get_input_embeddings().weight.shape[0]
        if rows < len(tokenizer):
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the model embeds {rows}; resize_token_embeddings first"
            )


def _generation_config(model: nn.Module, tokenizer: Any, given: Any) -> Any:
    from transformers import GenerationConfig

    base = model.get_base_model() if _is_peft(model) else model
    if isinstance(given, GenerationConfig):
        gen = copy.deepcopy(given)
    elif isinstance(given, Mapping):
        gen = GenerationConfig(**dict(given))
    elif given is None:
        own = getattr(base, "generation_config", None)
        gen = copy.deepcopy(own) if own is not None else GenerationConfig.from_model_config(base.config)
    else:
        raise TypeError(f"generation_config must be a GenerationConfig, a mapping or None, not {type(given)}")
    if tokenizer is not None:
        for field in ("eos_token_id", "pad_token_id", "bos_token_id"):
            if getattr(gen, field, None) is None and getattr(tokenizer, field, None) is not None:
                setattr(gen, field, getattr(tokenizer, field))
    return gen

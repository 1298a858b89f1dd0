"""Turn a ``ModelConfig`` into a tokenizer, a causal LM (optionally with LoRA) or a sentence encoder.

Every source ends as a local HF folder (``resolve_model_path``) that is then loaded by one code path, so the
tiny test model, the converted SmolLM2 and a 7B hub checkpoint go through exactly the same loading,
token-adding, resizing and LoRA code.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from omnimed.models.config import ModelConfig
from omnimed.models.errors import ModelLoadError
from omnimed.models.hub import resolve_hub
from omnimed.models.packaged import PACKAGED_MODELS, get_packaged, packaged_model_path
from omnimed.models.resolve import SOURCES, resolve_model_path  # noqa: F401 - re-exported, as before
from omnimed.models.tokens import add_special_tokens, embedding_rows, ensure_pad_token, resize_for_tokenizer

if TYPE_CHECKING:
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "auto": "auto",
}
# Plain BERT checkpoints with no sentence-transformers modules.json whose authors pool the [CLS] vector.
_CLS_POOLED = ("medcpt",)


def torch_dtype(name: str) -> torch.dtype | str:
    """Map ``ModelConfig.dtype`` to a torch dtype (or ``"auto"``: the checkpoint's own)."""
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"Unknown dtype {name!r}; use one of {sorted(set(_DTYPES))}") from None


def base_model_id(cfg: ModelConfig) -> str:
    """What an adapter trained on ``cfg`` names as its base (``base_model_name_or_path``): a packaged model's hub
    id (SmolLM2 -> ``HuggingFaceTB/SmolLM2-135M-Instruct``) or a hub id as configured, so the adapter loads on
    another machine; a local folder (an export, a tiny test model) as its absolute path."""
    if cfg.source == "packaged":
        return get_packaged(cfg.name_or_path).hub_id
    if cfg.source == "hub" and not Path(cfg.name_or_path).expanduser().exists():
        return cfg.name_or_path
    return str(resolve_model_path(cfg))


def resolve_base(base: str) -> Path:
    """The local folder of an adapter's ``base_model_name_or_path``: the folder itself; for the hub id of a
    packaged model, the packaged copy (what ``source=packaged`` trains on: SmolLM2's dequantised 4-bit weights,
    not the hub's bf16 ones); any other hub id through the hub (or its local cache)."""
    if Path(base).expanduser().is_dir():
        return Path(base).expanduser()
    packaged = [spec.name for spec in PACKAGED_MODELS.values() if spec.hub_id == base]
    if packaged:
        return packaged_model_path(packaged[0])
    return resolve_hub(base)


def _require_safetensors(folder: Path) -> None:
    """Refuse folders whose weights exist only as pickled ``.bin``/``.pt`` files (arbitrary code on load)."""
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder} holds no *.safetensors weights; omnimed loads safetensors only. Convert the checkpoint "
            f"once on a trusted machine (load it with transformers, then save_pretrained(...)) and point "
            f"model.name_or_path at the converted folder."
        )


def load_tokenizer(cfg: ModelConfig, path: Path | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer for ``cfg``, add ``cfg.special_tokens`` and make sure it can pad (on the right).

    ``path`` skips resolving again when the caller already holds the folder.
    """
    folder = path or resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.trust_remote_code)
    add_special_tokens(tokenizer, cfg.special_tokens)
    ensure_pad_token(tokenizer)
    return tokenizer


def load_causal_lm(
    cfg: ModelConfig,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    for_training: bool = True,
) -> PreTrainedModel | PeftModel:
    """Load ``cfg``'s causal LM, sized for ``tokenizer`` and ready to train or to run.

    A folder holding an ``omnimed-train`` LoRA export (``adapter_config.json``) loads as its base with the adapter
    merged, so a model trained here (the miniature reader) can be the starting point of another run.

    Weights load from safetensors only, in ``cfg.dtype`` with ``cfg.attn_implementation``; remote code runs
    only when ``cfg.trust_remote_code`` is set. Embeddings grow to ``len(tokenizer)`` when special tokens
    were added. With ``for_training`` the model is put in train mode, gets gradient checkpointing when
    configured (non-reentrant, input grads on so LoRA receives gradients), Liger's fused kernels when
    ``cfg.fused_kernels`` (``omnimed.models.fused_kernels``, CUDA only), else the lean MLP forward when
    ``cfg.lean_mlp`` (``omnimed.models.lean_mlp``), and LoRA when ``cfg.lora.enabled``:
    then only the LoRA matrices and the rows of ``cfg.special_tokens`` (plus any rows added for tokens the
    caller put into ``tokenizer`` itself) train (see ``omnimed.models.lora``).
    Without it the plain model is returned in eval mode with gradients off.
    ``tokenizer`` defaults to ``load_tokenizer(cfg)``; pass the one your data pipeline uses.
    """
    if cfg.kind != "causal_lm":
        raise ModelLoadError(f"Model {cfg.name!r} is a {cfg.kind}, not a causal_lm; use load_encoder")
    folder = resolve_model_path(cfg)
    _require_safetensors(folder)
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg, folder)
    weights = {
        "dtype": torch_dtype(cfg.dtype),
        "attn_implementation": cfg.attn_implementation,
        "trust_remote_code": cfg.trust_remote_code,
        "use_safetensors": True,
    }
    if (folder / "adapter_config.json").is_file():  # an omnimed-train LoRA export: its base with the adapter merged
        from omnimed.models.exported import load_exported

        model = load_exported(folder, merge=True, **weights)[0]
        model.name_or_path = model.config._name_or_path = str(folder)  # what an adapter trained on it names as base
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, **weights)
    rows_before = embedding_rows(model)
    resize_for_tokenizer(model, tokenizer)
    for holder in (model.config, model.generation_config):
        if getattr(holder, "pad_token_id", None) is None:
            holder.pad_token_id = tokenizer.pad_token_id

    if not for_training:
        model.eval()
        model.requires_grad_(False)
        return model

    model.train()
    if cfg.gradient_checkpointing:
        # transformers 5 renamed gradient checkpointing to activation checkpointing; same mechanism.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if cfg.lora.enabled:
            model.enable_input_require_grads()
    if cfg.fused_kernels:
        from omnimed.models.fused_kernels import use_fused_kernels

        use_fused_kernels(model)
    elif cfg.lean_mlp:
        from omnimed.models.lean_mlp import use_lean_mlps

        use_lean_mlps(model)
    if cfg.lora.enabled:
        # Train the rows of cfg.special_tokens and of any token the caller added to the tokenizer itself.
        token_ids = (
            set(tokenizer.convert_tokens_to_ids(list(cfg.special_tokens))) if cfg.special_tokens else set()
        )
        token_ids.update(range(rows_before, len(tokenizer)))
        from omnimed.models.lora import apply_lora  # PEFT (5 s to import) only where an adapter is made

        return apply_lora(model, cfg.lora, sorted(token_ids))
    return model


def load_encoder(cfg: ModelConfig) -> SentenceTransformer:
    """Load ``cfg``'s text encoder as a ``SentenceTransformer`` (for retrieval and embeddings).

    Folders in sentence-transformers format (MiniLM, BGE-M3) bring their own pooling and normalisation.
    Plain BERT checkpoints get mean pooling, except MedCPT, whose encoders are trained on the [CLS] vector.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    if cfg.kind != "encoder":
        raise ModelLoadError(f"Model {cfg.name!r} is a {cfg.kind}, not an encoder; use load_causal_lm")
    folder = resolve_model_path(cfg)
    model_kwargs = {"dtype": torch_dtype(cfg.dtype), "attn_implementation": cfg.attn_implementation}
    if (folder / "modules.json").is_file():
        return SentenceTransformer(
            str(folder),
            trust_remote_code=cfg.trust_remote_code,
            model_kwargs=model_kwargs,
            local_files_only=True,
        )
    label = f"{cfg.name} {cfg.name_or_path}".lower()
    pooling_mode = "cls" if any(key in label for key in _CLS_POOLED) else "mean"
    remote = {"trust_remote_code": cfg.trust_remote_code, "local_files_only": True}
    transformer = Transformer(
        str(folder),
        model_kwargs={**model_kwargs, **remote},
        processor_kwargs=dict(remote),
        config_kwargs=dict(remote),
    )
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    return SentenceTransformer(modules=[transformer, pooling])

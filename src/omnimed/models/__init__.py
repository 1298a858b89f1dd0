"""Loading causal LMs and encoders from a config: PyPI-packaged real models, hub ids, local paths, tiny test models."""

from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.errors import HubUnavailableError, ModelLoadError, PackageMissingError, UnknownModelError
from omnimed.models.loading import load_causal_lm, load_encoder, load_tokenizer, resolve_model_path

__all__ = [
    "HubUnavailableError",
    "LoraSettings",
    "ModelConfig",
    "ModelLoadError",
    "PackageMissingError",
    "UnknownModelError",
    "load_causal_lm",
    "load_encoder",
    "load_tokenizer",
    "resolve_model_path",
]

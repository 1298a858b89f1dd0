"""Loading causal LMs and encoders from a config: PyPI-packaged real models, hub ids, local paths, tiny test models.

The loaders (torch, transformers, PEFT: seconds to import) are imported on first use, so that a command that only
reads a model config (``--help``, a config error) starts without them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LoraSettings": "omnimed.models.config",
    "ModelConfig": "omnimed.models.config",
    "HubUnavailableError": "omnimed.models.errors",
    "ModelLoadError": "omnimed.models.errors",
    "PackageMissingError": "omnimed.models.errors",
    "UnknownModelError": "omnimed.models.errors",
    "load_causal_lm": "omnimed.models.loading",
    "load_encoder": "omnimed.models.loading",
    "load_tokenizer": "omnimed.models.loading",
    "resolve_model_path": "omnimed.models.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

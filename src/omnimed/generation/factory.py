"""``BackendConfig`` (``conf/backend/*.yaml``) -> a backend, wrapped in the on-disk call cache when asked."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from omnimed.generation.types import Backend, GenerationError
from omnimed.models.cache import generation_cache_dir

BACKENDS: tuple[str, ...] = ("hf", "vllm", "openai", "oracle")


@dataclass
class BackendConfig:
    """Which backend answers generation calls, and how.

    ``name``: ``hf`` (transformers in process) | ``vllm`` (vLLM in process) | ``openai`` (an OpenAI-compatible
    server at ``base_url``, key from the environment variable ``api_key_env``) | ``oracle`` (the synthetic world).
    ``model``: for hf / vllm a ``conf/model`` name, a local HF folder (e.g. an ``omnimed-train`` export) or a hub
    id; for openai the served model name. ``None``: the run's ``model`` config (its ``name`` for openai).
    ``cache``: memoise every call in ``cache_dir`` (default ``<paths.cache>/generation``).
    ``prefix_cache_mb`` (hf): memory for the key/value caches of scored prompts kept for their continuations.
    ``share_prefix`` (hf): a prompt that a ``next_token_logprobs`` call's rows share is run once, then each row's
    rest after it; ``None``: on the CPU only, where arithmetic is the cost (on a GPU a small model's forward pass
    costs its kernel launches, so one padded batch of whole rows is faster than two passes).
    """

    name: str = "hf"
    model: Optional[str] = None
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout: float = 60.0
    max_retries: int = 5
    batch_size: int = 8
    max_length: Optional[int] = None
    device: str = "auto"
    dtype: Optional[str] = None
    prefix_cache_mb: float = 2048.0
    share_prefix: Optional[bool] = None
    extra_body: Dict[str, Any] = field(default_factory=dict)
    cache: bool = True
    cache_dir: Optional[str] = None


def _plain(cfg: Any) -> BackendConfig:
    """A ``BackendConfig`` from itself or from a Hydra/OmegaConf node (validated against the dataclass)."""
    if isinstance(cfg, BackendConfig):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(BackendConfig), cfg))  # type: ignore


def _vllm_model(cfg: BackendConfig, model: Any) -> str:
    """What vLLM loads: a folder as is, a ``conf/model`` name or the run's model resolved to its local folder,
    anything else as a hub id."""
    from omnimed.models.config import named_model_config
    from omnimed.models.loading import resolve_model_path

    if cfg.model:
        if Path(cfg.model).is_dir():
            return str(Path(cfg.model).resolve())
        named = named_model_config(cfg.model)
        if named.source == "hub" and named.name_or_path == cfg.model:
            return cfg.model  # not a conf/model name: a hub id vLLM fetches itself
        return str(resolve_model_path(named))
    if model is None:
        raise GenerationError("backend=vllm needs backend.model or the run's model config")
    from omnimed.generation.hf import _as_model_config

    return str(resolve_model_path(_as_model_config(model)))


def build_backend(cfg: Any, *, model: Any = None, world: Any = None,
                  cache_root: str | Path | None = None) -> Backend:
    """Build the backend ``cfg`` names. ``model``: the run's ``ModelConfig`` (used when ``cfg.model`` is unset);
    ``world``: a ``World`` (oracle); ``cache_root``: where ``generation/`` goes when ``cfg.cache_dir`` is unset
    (``$OMNIMED_GENERATION_CACHE`` overrides it)."""
    cfg = _plain(cfg)
    backend: Backend
    if cfg.name == "hf":
        from omnimed.generation.hf import HFBackend

        backend = HFBackend(cfg.model or model or "smollm2-135m", batch_size=cfg.batch_size,
                            max_length=cfg.max_length, device=cfg.device, dtype=cfg.dtype,
                            prefix_cache_mb=cfg.prefix_cache_mb, share_prefix=cfg.share_prefix)
    elif cfg.name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            from omnimed.generation.vllm_backend import INSTALL_HINT

            raise GenerationError(INSTALL_HINT)
        from omnimed.generation.vllm_backend import VLLMBackend

        backend = VLLMBackend(_vllm_model(cfg, model), dtype=cfg.dtype or "auto", max_model_len=cfg.max_length)
    elif cfg.name == "openai":
        from omnimed.generation.openai_backend import OpenAIBackend

        served = cfg.model or getattr(model, "name", None)
        if not served:
            raise GenerationError("backend=openai needs backend.model: the model name the server serves")
        backend = OpenAIBackend(cfg.base_url, served, api_key_env=cfg.api_key_env, concurrency=cfg.concurrency,
                                timeout=cfg.timeout, max_retries=cfg.max_retries, extra_body=cfg.extra_body)
    elif cfg.name == "oracle":
        from omnimed.generation.oracle import OracleBackend

        if world is None:
            raise GenerationError("backend=oracle answers from the synthetic world: use a world knowledge config")
        backend = OracleBackend(world)
    else:
        raise GenerationError(f"backend.name={cfg.name!r}; expected one of {', '.join(BACKENDS)}")
    if not cfg.cache:
        return backend
    from omnimed.generation.cache import CachedBackend

    folder = Path(cfg.cache_dir) if cfg.cache_dir else generation_cache_dir(cache_root)
    return CachedBackend(backend, folder)

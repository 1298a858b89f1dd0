"""``BackendConfig`` (``conf/backend/*.yaml``) -> a backend, wrapped in the on-disk call cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omnimed.generation.types import Backend, GenerationError

BACKENDS: tuple[str, ...] = ("hf", "vllm", "openai", "oracle")


@dataclass
class BackendConfig:
    """``name``: hf (the ``model`` config, or ``model_path``: an exported checkpoint folder) | vllm (``model_path``
    or the model's hub id, in process) | openai (``base_url`` + ``served_model``; the key from ``api_key_env``) |
    oracle (the synthetic world of the knowledge config). ``cache``: memoise every call on disk."""

    name: str = "hf"
    model_path: Optional[str] = None
    base_url: str = "http://127.0.0.1:8000/v1"
    served_model: Optional[str] = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout: float = 60.0
    max_retries: int = 5
    batch_size: int = 8
    cache: bool = True
    cache_dir: Optional[str] = None


def build_backend(cfg: BackendConfig, *, model: Any = None, world: Any = None,
                  cache_root: str | Path | None = None) -> Backend:
    """``model``: the run's ``ModelConfig`` (hf, vllm); ``world``: a ``World`` (oracle)."""
    if cfg.name == "hf":
        from omnimed.generation.hf import HFBackend

        backend: Backend = HFBackend(cfg.model_path or model, batch_size=cfg.batch_size)
    elif cfg.name == "vllm":
        from omnimed.generation.vllm_backend import VLLMBackend

        backend = VLLMBackend(cfg.model_path or getattr(model, "name_or_path", model))
    elif cfg.name == "openai":
        from omnimed.generation.openai_backend import OpenAIBackend

        served = cfg.served_model or getattr(model, "name", None)
        if not served:
            raise GenerationError("backend=openai needs backend.served_model (the name the server serves)")
        backend = OpenAIBackend(cfg.base_url, served, api_key_env=cfg.api_key_env, concurrency=cfg.concurrency,
                                timeout=cfg.timeout, max_retries=cfg.max_retries)
    elif cfg.name == "oracle":
        from omnimed.generation.oracle import OracleBackend

        if world is None:
            raise GenerationError("backend=oracle answers from the synthetic world: use a world knowledge base")
        backend = OracleBackend(world)
    else:
        raise GenerationError(f"backend.name={cfg.name!r}; expected one of {', '.join(BACKENDS)}")
    if not cfg.cache:
        return backend
    from omnimed.generation.cache import CachedBackend

    root = Path(cfg.cache_dir) if cfg.cache_dir else Path(cache_root or ".cache/omnimed") / "generation"
    return CachedBackend(backend, root)

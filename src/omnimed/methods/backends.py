"""The generation backend of a run: the one place that knows the oracle backend answers from the synthetic world
the knowledge config describes, so evaluators and build stages ask for a backend the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_backend(backend_cfg: Any, *, model: Any, knowledge: Any, cache_root: str | Path | None) -> Any:
    """The backend ``backend_cfg`` names, serving ``model`` (when it names none itself); the oracle gets the world
    of ``knowledge``. Calls go through the on-disk cache under ``cache_root`` (None: the default one) unless the
    backend config names its own folder or turns it off."""
    from omnimed.generation.factory import build_backend

    world = None
    if backend_cfg.name == "oracle":
        from omnimed.knowledge.corpus import world_of

        world = world_of(knowledge)
    return build_backend(backend_cfg, model=model, world=world, cache_root=Path(cache_root) if cache_root else None)

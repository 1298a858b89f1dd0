"""Code outside the package that registers methods or training objectives: the modules named in the environment
variable ``OMNIMED_PLUGINS`` (comma-separated import paths), imported once by the registries before they are read.

An environment variable rather than a config key, because the registries are read before Hydra composes: a plugin's
pipeline and stage configs must be registered before ``pipeline=<name>`` can be chosen. Child processes (sweeps,
``omnimed-reproduce``'s runs) inherit it.
"""

from __future__ import annotations

import importlib
import os

ENV = "OMNIMED_PLUGINS"
_loaded: set[str] = set()


def load_plugins() -> list[str]:
    """Import every module ``OMNIMED_PLUGINS`` names (once each); returns their names. A module that cannot be
    imported stops with a message naming it and the variable."""
    names = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"{ENV}={os.environ[ENV]!r}: cannot import {name!r} ({exc}); is its folder on "
                              "PYTHONPATH?") from exc
        _loaded.add(name)
    return names

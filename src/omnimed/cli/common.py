"""What every Hydra entry point shares: where conf/ lives, and running a Hydra app with a clear error."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

console = Console(stderr=True)


def conf_dir() -> str:
    """The repository's ``conf/`` folder (``OMNIMED_CONF`` overrides it, e.g. for an installed package)."""
    env = os.environ.get("OMNIMED_CONF")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[3] / "conf")

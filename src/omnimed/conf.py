"""Where the repository's Hydra configs live, and the resolvers they use: shared by every entry point and by
``omnimed-reproduce``, which composes evaluation configs itself to validate a table before it runs."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# ----------------------------------------------------------------------------------------------- sweep folders
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
SUBDIR_MAX = 160  # a folder name is at most 255 bytes; the rest of the path needs room too


def dir_safe(text: str) -> str:
    """One folder name from Hydra's ``override_dirname``: path separators and shell-unfriendly characters become
    ``_`` (a ``pipeline.generator=/a/b`` override must not nest folders), and a long name is cut with a hash of the
    whole so two sweep jobs never share a folder."""
    safe = _UNSAFE.sub("_", str(text)).strip("_")
    if len(safe) <= SUBDIR_MAX:
        return safe
    return f"{safe[:SUBDIR_MAX - 9]}_{hashlib.sha1(str(text).encode()).hexdigest()[:8]}"


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("omnimed.dir_safe"):
        OmegaConf.register_new_resolver("omnimed.dir_safe", dir_safe)


_register_resolvers()


def conf_dir() -> str:
    """The repository's ``conf/`` folder (``OMNIMED_CONF`` overrides it, e.g. for an installed package)."""
    env = os.environ.get("OMNIMED_CONF")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[2] / "conf")



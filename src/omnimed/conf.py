"""Where the repository's Hydra configs live, and the resolvers they use: shared by every entry point and by
``omnimed-reproduce``, which composes evaluation configs itself to validate a table before it runs."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

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
    if not OmegaConf.has_resolver("omnimed.pid"):
        # run folders are named by the second they start in and the process: two runs started in the same second
        # (a script, parallel jobs) never share a folder and overwrite each other's metrics
        OmegaConf.register_new_resolver("omnimed.pid", lambda: str(os.getpid()))


_register_resolvers()


def conf_dir() -> str:
    """The repository's ``conf/`` folder (``OMNIMED_CONF`` overrides it, e.g. for an installed package)."""
    env = os.environ.get("OMNIMED_CONF")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[2] / "conf")


def load_option(group: str, name: str, schema: type) -> Any:
    """``conf/<group>/<name>.yaml`` outside a Hydra run, validated against ``schema`` (its dataclass) and returned
    as that dataclass: for tools that need one config option (a model, a strategy) without composing a job."""
    from omegaconf import OmegaConf

    file = Path(conf_dir()) / group / f"{name}.yaml"
    if not file.is_file():
        raise FileNotFoundError(f"no config option {group}={name}: {file} does not exist")
    raw = OmegaConf.load(file)
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), raw))


def register_option(group: str, name: str, schema: str, node: type) -> None:
    """Store a registered config dataclass with Hydra: as ``<group>/<schema>``, the schema a YAML option lists
    first in its defaults, and, when ``conf/<group>/<name>.yaml`` does not exist, as the option ``<group>=<name>``
    itself (the dataclass defaults, its ``name`` set), so a plugin's method or stage needs no YAML file. Storing
    the option beside a YAML of the same name would make Hydra treat it as that YAML's schema."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group=group, name=schema, node=node)
    if not (Path(conf_dir()) / group / f"{name}.yaml").is_file():
        cs.store(group=group, name=name, node=node(name=name))

"""A short id of a checkpoint folder's contents, so cached results of one checkpoint never answer for another."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FILES = ("*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "adapter_config.json",
         "chat_template.jinja")


def fingerprint(folder: str | Path, *extra: Any) -> str:
    """12 hex digits hashing the names, sizes and modification times of a checkpoint's files, plus ``extra``
    (e.g. the dtype and added tokens), and the fingerprint of the export an adapter was trained on. Cheap (no weight
    file is read); a re-export to the same folder changes it."""
    h = hashlib.sha256(repr(extra).encode())
    for pattern in FILES:
        for f in sorted(Path(folder).glob(pattern)):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    adapter = Path(folder) / "adapter_config.json"
    base = json.loads(adapter.read_text()).get("base_model_name_or_path") if adapter.is_file() else None
    if base and (Path(base) / "adapter_config.json").is_file():  # an adapter on another export: that one counts too
        h.update(fingerprint(base).encode())
    return h.hexdigest()[:12]

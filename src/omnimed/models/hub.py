"""Resolving ``source=hub`` models: a local HF folder, or a hub id fetched (safetensors only) into the HF cache.

Training machines may have no network. Rather than letting ``huggingface_hub`` retry for minutes, we ask
the hub endpoint once with a short timeout (bounded even when DNS hangs) and, when it cannot be reached,
fall back to the local HF cache or raise an error naming the id and the two ways to point at local files.
"""

from __future__ import annotations

import http.client
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

from omnimed.models.errors import HubUnavailableError

PROBE_TIMEOUT_S = float(os.environ.get("OMNIMED_HUB_PROBE_TIMEOUT", "4"))

# Weights in safetensors only (never pickled .bin), plus configs, tokenizers and sentence-transformers modules.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]
IGNORE_PATTERNS = ["onnx/*", "openvino/*", "*.onnx", "*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.gguf"]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Whether offline mode is requested (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``), read at call time."""
    from huggingface_hub import constants

    return (
        _truthy(os.environ.get("HF_HUB_OFFLINE"))
        or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))
        or bool(constants.HF_HUB_OFFLINE)
    )


def hub_endpoint() -> str:
    """The hub base URL (``HF_ENDPOINT`` or huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def probe_hub(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Return None when the hub endpoint answers within ``timeout`` seconds, else the reason it did not.

    Any HTTP answer (even an error status) proves the network path works. The request runs in a daemon
    thread so a hanging DNS lookup cannot hold us beyond the timeout. Proxies from the environment apply.
    """
    result: list[str | None] = []

    def ask() -> None:
        try:
            request = urllib.request.Request(hub_endpoint() + "/api/models?limit=1", method="HEAD")
            urllib.request.urlopen(request, timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, DNS, SSL: unreachable
            result.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=ask, daemon=True, name="omnimed-hub-probe")
    thread.start()
    thread.join(timeout + 0.5)
    return result[0] if result else f"no answer within {timeout:.0f} s"


def _how_to_fix(repo_id: str) -> str:
    return (
        f"To use local files instead, set model.name_or_path=/path/to/folder (a folder holding the "
        f"checkpoint of {repo_id}: config.json, tokenizer files and *.safetensors), or set HF_HUB_OFFLINE=1 "
        f"with a Hugging Face cache (HF_HOME / HF_HUB_CACHE) already populated with {repo_id}."
    )


def _download(repo_id: str, revision: str | None, local_only: bool, allow_code: bool) -> Path:
    from huggingface_hub import snapshot_download

    allow = ALLOW_PATTERNS if allow_code else [p for p in ALLOW_PATTERNS if p != "*.py"]
    return Path(
        snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=allow,
            ignore_patterns=IGNORE_PATTERNS,
            local_files_only=local_only,
        )
    )


def resolve_hub(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False) -> Path:
    """Return a local folder for ``name_or_path``: itself when it is a folder, else a hub snapshot.

    Raises ``HubUnavailableError`` (naming the id and how to use local files) when the hub cannot be reached
    and no cached snapshot exists, and ``FileNotFoundError`` for a path-like value that is not a folder.
    Remote code (``*.py``) is only fetched when ``trust_remote_code`` is set.
    """
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local.resolve()
    if name_or_path.startswith(("/", "./", "../", "~")) or local.exists() or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"Model folder {name_or_path!r} does not exist (or is not a folder)")

    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if hub_offline():
        try:
            return _download(name_or_path, revision, local_only=True, allow_code=trust_remote_code)
        except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
            raise HubUnavailableError(
                f"Hugging Face hub is offline (HF_HUB_OFFLINE=1) and {name_or_path!r} is not in the local HF "
                f"cache. {_how_to_fix(name_or_path)}"
            ) from exc

    problem = probe_hub()
    if problem is not None:
        try:  # a previously downloaded snapshot still works without the network
            return _download(name_or_path, revision, local_only=True, allow_code=trust_remote_code)
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            raise HubUnavailableError(
                f"Could not reach the Hugging Face hub at {hub_endpoint()} to fetch {name_or_path!r} "
                f"({problem}), and it is not in the local HF cache. {_how_to_fix(name_or_path)}"
            ) from None
    try:
        return _download(name_or_path, revision, local_only=False, allow_code=trust_remote_code)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise HubUnavailableError(
            f"Could not fetch {name_or_path!r} (revision {revision or 'main'}) from the Hugging Face hub: {exc}. "
            f"Check the id and access rights (gated models such as meta-llama need `hf auth login`). "
            f"{_how_to_fix(name_or_path)}"
        ) from exc

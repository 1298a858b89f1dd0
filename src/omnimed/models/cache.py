"""Verified, atomically built model folders under the omnimed cache.

Converted and generated checkpoints (SmolLM2 from GGUF, the tiny test models) are expensive or must be
reproducible, so each one is built once into a temporary folder, described by a manifest holding the
sha256 and size of every file, and only then renamed into place. Every later use re-checks the manifest,
so a missing file, a truncated safetensors file or a changed byte is noticed and the folder is rebuilt
instead of silently loading garbage. A file lock serialises builders across processes.

Hashing a 270 MB checkpoint costs ~0.2-0.7 s, too much for every load, so after a full check we record
each file's (size, mtime, inode) in a stamp file; while those are unchanged a load re-checks sizes and
safetensors headers only. Any write to a file changes its mtime and triggers a full re-hash. (A deliberate
edit that restores the old mtime would go unnoticed until ``verify_folder(..., full=True)``.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

log = logging.getLogger(__name__)

MANIFEST_NAME = "omnimed_manifest.json"
STAMP_NAME = "omnimed_verified.json"
_MANIFEST_FORMAT = 1
_LOCK_TIMEOUT_S = 30 * 60  # a SmolLM2 conversion takes well under a minute; this only bounds a stuck peer


def cache_root() -> Path:
    """The omnimed cache folder: ``$OMNIMED_CACHE`` when set, else ``~/.cache/omnimed``."""
    env = os.environ.get("OMNIMED_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "omnimed"


def generation_cache_dir(root: str | Path | None = None) -> Path:
    """Where generation backends memoise their calls: ``$OMNIMED_GENERATION_CACHE`` when set (a shared disk; the
    tests' own folder, so no test reads a reply an older version of the code cached), else ``<root>/generation``
    (``root``: the run's ``paths.cache``; default :func:`cache_root`)."""
    env = os.environ.get("OMNIMED_GENERATION_CACHE")
    return Path(env).expanduser() if env else Path(root or cache_root()).expanduser() / "generation"


def models_dir() -> Path:
    """Where built model folders live (``<cache>/models``)."""
    return cache_root() / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_safetensors(path: Path) -> str | None:
    """Return a problem description if ``path`` is not a structurally complete safetensors file, else None.

    Reads only the header: its tensors' byte ranges must end exactly at the end of the file, which catches
    truncation even before a checksum is compared.
    """
    size = path.stat().st_size
    if size < 8:
        return f"{path.name}: {size} bytes, too short for a safetensors header"
    with path.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > size - 8:
            return f"{path.name}: header length {header_len} exceeds file size {size}"
        try:
            header = json.loads(fh.read(header_len))
        except ValueError as exc:
            return f"{path.name}: unreadable header ({exc})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    expected = 8 + header_len + (max(ends) if ends else 0)
    if expected != size:
        return f"{path.name}: {size} bytes on disk, header describes {expected} (truncated or padded)"
    return None


def write_manifest(folder: Path, recipe: str) -> None:
    """Describe every file in ``folder`` (recursively) by size and sha256, tagged with the build ``recipe``."""
    files = {}
    for path in sorted(
        p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST_NAME, STAMP_NAME)
    ):
        rel = path.relative_to(folder).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"format": _MANIFEST_FORMAT, "recipe": recipe, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read_stamp(folder: Path) -> dict:
    try:
        return json.loads((folder / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _write_stamp(folder: Path, files: dict) -> None:
    """Remember the stat of every verified file (best effort: a read-only cache just re-hashes each time)."""
    try:
        stamp = {rel: _stat_key(folder / rel) for rel in files}
        tmp = folder / f".{STAMP_NAME}.{os.getpid()}"
        tmp.write_text(json.dumps(stamp))
        tmp.replace(folder / STAMP_NAME)
    except OSError:
        pass


def verify_folder(folder: Path, recipe: str, *, full: bool = False) -> str | None:
    """Return why ``folder`` is not a complete build of ``recipe`` (None when it is).

    Sizes and safetensors headers are always checked; sha256 is compared for every file whose stat changed
    since the last full check, or for all files when ``full`` is set.
    """
    manifest_path = folder / MANIFEST_NAME
    if not folder.is_dir():
        return "not built yet"
    if not manifest_path.is_file():
        return "no manifest (interrupted or foreign build)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as exc:
        return f"unreadable manifest ({exc})"
    if manifest.get("format") != _MANIFEST_FORMAT or manifest.get("recipe") != recipe:
        return f"built by recipe {manifest.get('recipe')!r}, current recipe is {recipe!r}"
    if not files:
        return "manifest lists no files"
    stamp = {} if full else _read_stamp(folder)
    hashed = False
    for rel, meta in files.items():
        path = folder / rel
        if not path.is_file():
            return f"missing file {rel}"
        if path.stat().st_size != meta["size"]:
            return f"{rel}: size {path.stat().st_size}, manifest says {meta['size']}"
        if path.suffix == ".safetensors":
            problem = check_safetensors(path)
            if problem:
                return problem
        if stamp.get(rel) == _stat_key(path):
            continue
        hashed = True
        if _sha256(path) != meta["sha256"]:
            return f"{rel}: sha256 differs from the manifest"
    if hashed:
        _write_stamp(folder, files)
    return None


def ensure_built(name: str, recipe: str, build: Callable[[Path], None]) -> Path:
    """Return ``<cache>/models/<name>``, building it with ``build(tmp_folder)`` when absent or corrupt.

    ``recipe`` names the build procedure and its version; a folder built by another recipe is rebuilt.
    The build writes into a fresh temporary folder next to the target; the manifest is written and checked
    there, and the folder is renamed into place only when complete, so readers never see a partial build.
    """
    root = models_dir()
    final = root / name
    if verify_folder(final, recipe) is None:
        return final
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{name}.lock"), timeout=_LOCK_TIMEOUT_S):
        problem = verify_folder(final, recipe)  # another process may have built it while we waited
        if problem is None:
            return final
        if final.exists():
            log.warning("Rebuilding cached model %s at %s: %s", name, final, problem)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        try:
            build(tmp)
            write_manifest(tmp, recipe)
            problem = verify_folder(tmp, recipe)
            if problem:
                raise RuntimeError(f"Fresh build of {name} failed its own check: {problem}")
            if final.exists():
                stale = root / f".{name}.stale-{uuid.uuid4().hex[:8]}"
                final.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final

"""The resumable embedding cache: document vectors on disk keyed by (encoder fingerprint, text).

Vectors are stored in shard files written atomically as encoding proceeds, so an interrupted corpus embedding
resumes where it stopped, and several processes (or indexes) share the vectors of one encoder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from omnimed.data.artifacts import atomic_path, atomic_write_bytes, atomic_write_json
from omnimed.knowledge.encoders import Encoder, describe_fingerprint
from omnimed.knowledge.types import IndexMismatchError

__all__ = ["EmbeddingCache"]

log = logging.getLogger(__name__)


class _Space:
    """The shards of one encoder inside an ``EmbeddingCache``: key -> (shard number, row)."""

    def __init__(self, folder: Path, dim: int) -> None:
        self.folder = folder
        self.dim = dim
        self.rows: dict[str, tuple[int, int]] = {}
        self.shards: list[np.ndarray] = []
        self.seen: set[str] = set()

    def refresh(self) -> None:
        """Pick up shards written since the last look (by this process or another one)."""
        for keys_path in sorted(self.folder.glob("shard-*.keys")):
            if keys_path.name in self.seen:
                continue
            self.seen.add(keys_path.name)
            vectors_path = keys_path.with_suffix(".npy")
            try:
                keys = keys_path.read_text(encoding="ascii").split()
                vectors = np.load(vectors_path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                log.warning("Skipping unreadable embedding shard %s: %s", keys_path, exc)
                continue
            if vectors.shape != (len(keys), self.dim) or vectors.dtype != np.float32:
                log.warning(
                    "Skipping embedding shard %s: %d keys but vectors %s %s",
                    keys_path,
                    len(keys),
                    vectors.shape,
                    vectors.dtype,
                )
                continue
            self.add(keys, vectors)

    def add(self, keys: list[str], vectors: np.ndarray) -> None:
        shard = len(self.shards)
        self.shards.append(vectors)
        for row, key in enumerate(keys):
            self.rows[key] = (shard, row)

    def write(self, keys: list[str], vectors: np.ndarray) -> None:
        """Persist one shard: vectors first, then the keys file, whose presence marks the shard complete."""
        stem = f"shard-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        vectors_path, keys_path = self.folder / f"{stem}.npy", self.folder / f"{stem}.keys"
        with atomic_path(vectors_path) as tmp, open(tmp, "wb") as handle:
            np.save(handle, vectors, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        atomic_write_bytes(keys_path, ("\n".join(keys) + "\n").encode("ascii"))
        self.seen.add(keys_path.name)
        self.add(keys, vectors)


class EmbeddingCache:
    """On-disk document vectors keyed by ``sha256(encoder fingerprint_id + text)``, resumable and shared.

    Each encoder gets its own subfolder (named by its ``fingerprint_id``, with ``fingerprint.json`` for humans),
    so vectors of two encoders never mix. ``embed`` computes only the texts not stored yet and writes them in
    shards of ``batch_size`` texts (``.npy`` + ``.keys``, each via temp file + rename): a run killed mid-way keeps
    every finished shard and the next run computes only the rest. Several processes may share one cache; at
    worst they encode the same text twice, never corrupt it.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._spaces: dict[str, _Space] = {}

    @staticmethod
    def key(fingerprint_id: str, text: str) -> str:
        """The cache key of ``text`` under one encoder."""
        return hashlib.sha256(f"{fingerprint_id}\n{text}".encode()).hexdigest()

    def _space(self, encoder: Encoder) -> _Space:
        fingerprint_id = encoder.fingerprint_id
        space = self._spaces.get(fingerprint_id)
        if space is None:
            folder = self.directory / fingerprint_id
            folder.mkdir(parents=True, exist_ok=True)
            marker = folder / "fingerprint.json"
            if not marker.is_file():
                atomic_write_json(marker, encoder.fingerprint)
            space = self._spaces[fingerprint_id] = _Space(folder, encoder.dim)
        space.refresh()
        return space

    def count(self, encoder: Encoder) -> int:
        """How many distinct texts are stored for ``encoder``."""
        return len(self._space(encoder).rows)

    def embed(
        self,
        encoder: Encoder,
        texts: Sequence[str],
        *,
        batch_size: int = 4096,
        progress: bool = False,
    ) -> np.ndarray:
        """Vectors of ``texts`` in order (float32 ``(len(texts), dim)``), encoding only those not cached.

        Missing texts are deduplicated and encoded ``batch_size`` at a time; each batch is flushed to disk as a
        shard before the next one starts. ``progress`` shows a rich progress bar over the missing texts.
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        texts = list(texts)
        space = self._space(encoder)
        fingerprint_id = encoder.fingerprint_id
        keys = [self.key(fingerprint_id, text) for text in texts]
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts):
            if key not in space.rows and key not in missing:
                missing[key] = text
        if missing:
            log.info(
                "Embedding %d of %d texts with %s (%d cached)",
                len(missing),
                len(texts),
                describe_fingerprint(encoder.fingerprint),
                len(texts) - len(missing),
            )
            self._compute(space, encoder, list(missing.items()), batch_size, progress)
        return self._gather(space, keys)

    def _compute(
        self, space: _Space, encoder: Encoder, todo: list[tuple[str, str]], batch_size: int, progress: bool
    ) -> None:
        chunks = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
        if not progress:
            for chunk in chunks:
                self._encode_chunk(space, encoder, chunk)
            return
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("Embedding passages", total=len(todo))
            for chunk in chunks:
                self._encode_chunk(space, encoder, chunk)
                bar.advance(task, len(chunk))

    @staticmethod
    def _encode_chunk(space: _Space, encoder: Encoder, chunk: list[tuple[str, str]]) -> None:
        vectors = np.ascontiguousarray(encoder.encode_docs([text for _, text in chunk]), dtype=np.float32)
        if vectors.shape != (len(chunk), space.dim):
            raise IndexMismatchError(
                f"Encoder returned vectors of shape {vectors.shape} for {len(chunk)} texts; expected "
                f"({len(chunk)}, {space.dim})"
            )
        space.write([key for key, _ in chunk], vectors)

    @staticmethod
    def _gather(space: _Space, keys: list[str]) -> np.ndarray:
        out = np.empty((len(keys), space.dim), dtype=np.float32)
        by_shard: dict[int, tuple[list[int], list[int]]] = {}
        for position, key in enumerate(keys):
            shard, row = space.rows[key]
            positions, rows = by_shard.setdefault(shard, ([], []))
            positions.append(position)
            rows.append(row)
        for shard, (positions, rows) in by_shard.items():
            out[np.asarray(positions)] = space.shards[shard][np.asarray(rows)]
        return out

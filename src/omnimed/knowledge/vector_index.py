"""What every vector index shares (``FaissIndex``, ``QdrantIndex``): the :class:`VectorIndex` protocol that
``DenseRetriever`` searches through, the ``meta.json`` that marks a saved index complete, and query checks.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from omnimed.knowledge.types import IndexMismatchError, KnowledgeError, Ranking

__all__ = ["META_FILE", "VectorIndex", "as_query_matrix", "now_iso", "read_index_meta"]

META_FILE = "meta.json"


@runtime_checkable
class VectorIndex(Protocol):
    """What ``DenseRetriever`` needs from an index (``FaissIndex``, ``QdrantIndex``)."""

    encoder: dict[str, Any] | None

    @property
    def dim(self) -> int: ...

    def __len__(self) -> int: ...

    def search(self, query_vectors: np.ndarray, k: int) -> list[Ranking]: ...


def read_index_meta(directory: Path, what: str) -> dict[str, Any]:
    """Read ``directory/meta.json``; a missing folder or file (an unfinished save) raises ``KnowledgeError``."""
    if not directory.is_dir():
        raise KnowledgeError(f"{what} folder {directory} does not exist; build the index first")
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise KnowledgeError(
            f"{what} folder {directory} has no {META_FILE}: the index is missing or incomplete "
            f"(interrupted build or save); rebuild it"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise KnowledgeError(f"Cannot read {meta_path}: {exc}") from exc
    if not isinstance(meta, dict):
        raise KnowledgeError(f"{meta_path} does not hold a JSON object")
    return meta


def now_iso() -> str:
    """The current UTC time to the second, ISO 8601: the ``created`` stamp of a saved index."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def as_query_matrix(query_vectors: np.ndarray, dim: int) -> np.ndarray:
    """Queries as a C-contiguous float32 ``(q, dim)`` matrix (a single vector becomes one row)."""
    queries = np.asarray(query_vectors, dtype=np.float32)
    if queries.ndim == 1:
        queries = queries[None, :]
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise IndexMismatchError(
            f"Query vectors have shape {queries.shape}, but the index holds {dim}-d vectors"
        )
    return np.ascontiguousarray(queries)


def as_vector_matrix(vectors: np.ndarray, encoder: dict[str, Any] | None) -> np.ndarray:
    """Document vectors as a float32 ``(n, dim)`` matrix, checked against the encoder fingerprint's dimension, so
    no index is ever built from vectors another encoder made."""
    from omnimed.knowledge.encoders import describe_fingerprint

    data = np.asarray(vectors, dtype=np.float32)
    if data.ndim != 2 or data.shape[1] == 0:
        raise KnowledgeError(f"Expected a 2-d (n, dim) array of vectors, got shape {data.shape}")
    dim = data.shape[1]
    if encoder is not None and encoder.get("dim") not in (None, dim):
        raise IndexMismatchError(f"Vectors are {dim}-d but the encoder fingerprint says {describe_fingerprint(encoder)}")
    return data

"""The FAISS vector index: flat / HNSW / IVF-PQ builds, searches into ``Ranking``s, and safe save/load.

A saved index is a folder with ``index.faiss`` and a ``meta.json`` recording the encoder fingerprint (written
last: present = complete); loading it for another encoder raises ``IndexMismatchError``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from omnimed.data.artifacts import atomic_path, atomic_write_json
from omnimed.knowledge.encoders import check_fingerprint, describe_fingerprint
from omnimed.knowledge.types import IndexMismatchError, KnowledgeError, Ranking
from omnimed.knowledge.vector_index import (
    META_FILE,
    as_query_matrix,
    as_vector_matrix,
    now_iso,
    read_index_meta,
)

__all__ = ["INDEX_FILE", "KINDS", "METRICS", "FaissIndex", "l2_normalized"]

INDEX_FILE = "index.faiss"
KINDS = ("flat", "hnsw", "ivfpq", "auto")
METRICS = ("ip", "cosine", "l2")


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2-normalised float32 copy (zero rows stay zero)."""
    out = np.array(vectors, dtype=np.float32, copy=True)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def _default_pq_m(dim: int) -> int:
    """Sub-quantizer count: the divisor of ``dim`` closest to ``dim / 8`` (8-d sub-vectors, 1 byte each)."""
    divisors = [m for m in range(1, dim + 1) if dim % m == 0]
    return min(divisors, key=lambda m: (abs(m - dim / 8), m))


def _default_nbits(n: int) -> int:
    """Bits per PQ code: 8 when there are enough points to train 256 centroids well (39 per centroid)."""
    return int(max(1, min(8, math.floor(math.log2(max(n / 39, 2))))))


def _faiss_metric(metric: str) -> int:
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


class FaissIndex:
    """A FAISS index over row-numbered vectors; ``search`` returns ``(row, score)`` lists, best first.

    ``metric``: ``ip`` (inner product; cosine when the vectors are normalised, as ``TextEncoder`` makes them),
    ``cosine`` (vectors and queries are normalised here) or ``l2`` (scores are negated squared distances, so
    higher is always better). ``encoder`` is the fingerprint of the encoder that made the vectors.
    """

    def __init__(
        self,
        index: faiss.Index,
        *,
        kind: str,
        metric: str,
        params: dict[str, Any],
        encoder: dict[str, Any] | None = None,
    ) -> None:
        self.index = index
        self.kind = kind
        self.metric = metric
        self.params = dict(params)
        self.encoder = encoder
        self._apply_search_params()

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def __repr__(self) -> str:
        return f"FaissIndex(kind={self.kind!r}, metric={self.metric!r}, dim={self.dim}, n={len(self)})"

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @classmethod
    def build(
        cls,
        vectors: np.ndarray,
        *,
        kind: str = "flat",
        metric: str = "ip",
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 512,
        nlist: int | None = None,
        pq_m: int | None = None,
        pq_nbits: int | None = None,
        nprobe: int = 16,
        auto_threshold: int = 50_000,
        encoder: dict[str, Any] | None = None,
    ) -> FaissIndex:
        """Index ``vectors`` (row ``i`` becomes id ``i``).

        ``kind``: ``flat`` (exact), ``hnsw`` (graph; ``hnsw_m``, ``ef_construction``, ``ef_search``), ``ivfpq``
        (compressed; ``nlist`` defaults to ~4*sqrt(n), ``pq_m`` to the divisor of dim nearest dim/8,
        ``pq_nbits`` to 8 when n allows, ``nprobe`` lists searched) or ``auto`` (flat below ``auto_threshold``
        passages, hnsw above).
        """
        if kind not in KINDS:
            raise KnowledgeError(f"Unknown dense index kind {kind!r}; use one of {list(KINDS)}")
        if metric not in METRICS:
            raise KnowledgeError(f"Unknown dense metric {metric!r}; use one of {list(METRICS)}")
        data = as_vector_matrix(vectors, encoder)
        n, dim = data.shape
        data = l2_normalized(data) if metric == "cosine" else np.ascontiguousarray(data)
        if kind == "auto":
            kind = "flat" if n < auto_threshold else "hnsw"
        faiss_metric = _faiss_metric(metric)
        params: dict[str, Any] = {}
        if kind == "flat":
            index = faiss.IndexFlat(dim, faiss_metric)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss_metric)
            index.hnsw.efConstruction = ef_construction
            params = {"hnsw_m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
        else:
            if n == 0:
                raise KnowledgeError("An ivfpq index needs vectors to train on; got none")
            nlist = nlist or max(1, min(round(4 * math.sqrt(n)), n // 39))
            pq_m = pq_m or _default_pq_m(dim)
            pq_nbits = pq_nbits or _default_nbits(n)
            if dim % pq_m:
                raise KnowledgeError(f"pq_m={pq_m} must divide the vector dimension {dim}")
            quantizer = faiss.IndexFlat(dim, faiss_metric)
            # Built directly rather than through index_factory: the factory turns on polysemous training for
            # 8-bit codes, which makes training ~20x slower and is of no use for our searches.
            index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, pq_nbits, faiss_metric)
            index.own_fields = True
            quantizer.this.disown()
            index.train(data)
            params = {"nlist": nlist, "pq_m": pq_m, "pq_nbits": pq_nbits, "nprobe": nprobe}
        if n:
            index.add(data)
        return cls(index, kind=kind, metric=metric, params=params, encoder=encoder)

    def _apply_search_params(self) -> None:
        if self.kind == "hnsw" and "ef_search" in self.params:
            faiss.downcast_index(self.index).hnsw.efSearch = int(self.params["ef_search"])
        if self.kind == "ivfpq" and "nprobe" in self.params:
            faiss.extract_index_ivf(self.index).nprobe = int(self.params["nprobe"])

    def search(self, query_vectors: np.ndarray, k: int) -> list[Ranking]:
        """Top ``k`` rows per query (``k`` clipped to the index size; FAISS's -1 padding removed)."""
        queries = as_query_matrix(query_vectors, self.dim)
        k = min(int(k), len(self))
        if k <= 0 or len(queries) == 0:
            return [[] for _ in range(len(queries))]
        if self.metric == "cosine":
            queries = l2_normalized(queries)
        scores, ids = self.index.search(queries, k)
        if self.metric == "l2":
            scores = -scores
        return [
            [(int(i), float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
            for row_ids, row_scores in zip(ids, scores)
        ]

    # -- persistence -----------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``index.faiss`` and ``meta.json`` into ``directory``; ``meta.json`` goes last and marks completion.

        An existing ``meta.json`` is removed first, so a save interrupted half-way leaves a folder that
        ``load`` reports as incomplete instead of a new index described by old metadata.
        """
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / META_FILE).unlink(missing_ok=True)
        index_path = folder / INDEX_FILE
        with atomic_path(index_path) as tmp:
            faiss.write_index(self.index, str(tmp))
        meta = {
            "format": "omnimed-faiss",
            "version": 1,
            "kind": self.kind,
            "metric": self.metric,
            "dim": self.dim,
            "n": len(self),
            "params": self.params,
            "encoder": self.encoder,
            "faiss_version": faiss.__version__,
            "created": now_iso(),
        }
        atomic_write_json(folder / META_FILE, meta)
        return folder

    @classmethod
    def load(
        cls,
        directory: str | Path,
        expect_encoder: dict[str, Any] | None = None,
        *,
        ef_search: int | None = None,
        nprobe: int | None = None,
        mmap: bool = False,
    ) -> FaissIndex:
        """Load an index saved by ``save``; ``expect_encoder`` (a fingerprint) must match the stored one.

        ``ef_search`` / ``nprobe`` override the saved search settings; ``mmap`` maps the index file instead of
        reading it into memory (large flat or IVF indexes).
        """
        folder = Path(directory)
        meta = read_index_meta(folder, "Dense index")
        check_fingerprint(meta.get("encoder"), expect_encoder, f"Dense index {folder}")
        if expect_encoder is not None and expect_encoder.get("dim") not in (None, meta.get("dim")):
            raise IndexMismatchError(
                f"Dense index {folder} holds {meta.get('dim')}-d vectors, but "
                f"{describe_fingerprint(expect_encoder)} was asked for"
            )
        index_path = folder / INDEX_FILE
        if not index_path.is_file():
            raise KnowledgeError(
                f"Dense index folder {folder} has {META_FILE} but no {INDEX_FILE}; rebuild it"
            )
        try:
            index = faiss.read_index(str(index_path), faiss.IO_FLAG_MMAP if mmap else 0)
        except RuntimeError as exc:
            raise KnowledgeError(f"Cannot read FAISS index {index_path}: {exc}") from exc
        if index.d != meta.get("dim") or index.ntotal != meta.get("n"):
            raise KnowledgeError(
                f"{index_path} holds {index.ntotal} {index.d}-d vectors but {folder / META_FILE} says "
                f"{meta.get('n')} {meta.get('dim')}-d: the folder is inconsistent; rebuild it"
            )
        params = dict(meta.get("params") or {})
        if ef_search is not None:
            params["ef_search"] = ef_search
        if nprobe is not None:
            params["nprobe"] = nprobe
        return cls(
            index, kind=meta["kind"], metric=meta["metric"], params=params, encoder=meta.get("encoder")
        )

"""Dense retrieval: a resumable embedding cache, a FAISS index with safe save/load, and a query-side retriever.

- ``EmbeddingCache`` stores document vectors on disk keyed by (encoder fingerprint, text), in shard files that
  are written atomically as encoding proceeds, so an interrupted corpus embedding resumes where it stopped.
- ``FaissIndex`` builds flat / HNSW / IVF-PQ indexes, searches them into ``Ranking``s and saves them with a
  ``meta.json`` recording the encoder fingerprint; loading with another encoder raises ``IndexMismatchError``.
- ``DenseRetriever`` pairs an encoder with any vector index (FAISS or Qdrant) and searches with query texts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import faiss
import numpy as np

from omnimed.knowledge.encoders import Encoder, check_fingerprint, describe_fingerprint
from omnimed.knowledge.types import IndexMismatchError, KnowledgeError, Ranking

log = logging.getLogger(__name__)

META_FILE = "meta.json"
INDEX_FILE = "index.faiss"
KINDS = ("flat", "hnsw", "ivfpq", "auto")
METRICS = ("ip", "cosine", "l2")


# -- small file helpers (shared with omnimed.knowledge.qdrant) -------------------------------------------------


def _temp_name(path: Path) -> Path:
    """A unique hidden sibling of ``path`` to write into before an atomic rename."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


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


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2-normalised float32 copy (zero rows stay zero)."""
    out = np.array(vectors, dtype=np.float32, copy=True)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


# -- embedding cache ------------------------------------------------------------------------------------------


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
        tmp = _temp_name(vectors_path)
        try:
            with open(tmp, "wb") as handle:
                np.save(handle, vectors, allow_pickle=False)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, vectors_path)
        finally:
            tmp.unlink(missing_ok=True)
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
                write_json_atomic(marker, encoder.fingerprint)
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


# -- FAISS ----------------------------------------------------------------------------------------------------


@runtime_checkable
class VectorIndex(Protocol):
    """What ``DenseRetriever`` needs from an index (``FaissIndex``, ``QdrantIndex``)."""

    encoder: dict[str, Any] | None

    @property
    def dim(self) -> int: ...

    def __len__(self) -> int: ...

    def search(self, query_vectors: np.ndarray, k: int) -> list[Ranking]: ...


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
        data = np.asarray(vectors, dtype=np.float32)
        if data.ndim != 2 or data.shape[1] == 0:
            raise KnowledgeError(f"Expected a 2-d (n, dim) array of vectors, got shape {data.shape}")
        n, dim = data.shape
        if encoder is not None and encoder.get("dim") not in (None, dim):
            raise IndexMismatchError(
                f"Vectors are {dim}-d but the encoder fingerprint says {describe_fingerprint(encoder)}"
            )
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
        tmp = _temp_name(index_path)
        try:
            faiss.write_index(self.index, str(tmp))
            os.replace(tmp, index_path)
        finally:
            tmp.unlink(missing_ok=True)
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
        write_json_atomic(folder / META_FILE, meta)
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


# -- retriever ------------------------------------------------------------------------------------------------


class DenseRetriever:
    """Encode query texts in one batch and search a vector index built from the same encoder's vectors."""

    def __init__(self, encoder: Encoder, index: VectorIndex) -> None:
        self.encoder = encoder
        self.index = index
        self._checked = False

    @classmethod
    def from_texts(
        cls,
        encoder: Encoder,
        texts: Sequence[str],
        *,
        cache: EmbeddingCache | None = None,
        progress: bool = False,
        **index_kwargs: Any,
    ) -> DenseRetriever:
        """Embed ``texts`` (through ``cache`` when given) and build a ``FaissIndex`` stamped with the encoder."""
        vectors = (
            cache.embed(encoder, texts, progress=progress) if cache else encoder.encode_docs(texts, progress)
        )
        return cls(encoder, FaissIndex.build(vectors, encoder=encoder.fingerprint, **index_kwargs))

    def _check(self) -> None:
        """Refuse an index built by another encoder (checked once, on first search: it loads the model)."""
        if self._checked:
            return
        if self.index.encoder is not None:
            check_fingerprint(self.index.encoder, self.encoder.fingerprint, f"Index {self.index!r}")
        elif self.index.dim != self.encoder.dim:
            raise IndexMismatchError(
                f"Index {self.index!r} holds {self.index.dim}-d vectors but the encoder makes "
                f"{describe_fingerprint(self.encoder.fingerprint)}"
            )
        self._checked = True

    def search(self, queries: Sequence[str], k: int) -> list[Ranking]:
        """One ranking of index rows per query text, best first."""
        queries = list(queries)
        if not queries:
            return []
        self._check()
        return self.index.search(self.encoder.encode_queries(queries), k)

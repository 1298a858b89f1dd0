"""A Qdrant-backed vector index with the same build / search / save / load contract as ``FaissIndex``.

Three modes: local on-disk (``QdrantClient(path=...)``, the default when a directory is given: no server, one
process at a time, exact search), in-memory (neither directory nor url: tests and throwaway indexes) and server
(``url=``; the API key is read from the environment variable named by ``api_key_env`` and is never logged or
stored). Point id = row index; the collection uses cosine distance by default.

Layout of a saved index folder: ``meta.json`` (ours: mode, collection, dim, n, encoder fingerprint)
and, in local mode, ``qdrant/`` (the client's storage; it writes its own ``meta.json`` there, hence the
subfolder). ``meta.json`` is written last, so a build or save that was interrupted is reported as incomplete on
load.

The collection itself carries the encoder fingerprint in its metadata, and ``load`` checks it and the
collection's vector size, not only ``meta.json``: on a server, ``meta.json`` lives on this machine while
the collection can be replaced by any other build that uses its name.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ApiException

from omnimed.data.artifacts import atomic_write_json
from omnimed.knowledge.encoders import check_fingerprint, describe_fingerprint, fingerprint_id_of
from omnimed.knowledge.types import IndexMismatchError, KnowledgeError, Ranking
from omnimed.knowledge.vector_index import (
    META_FILE,
    as_query_matrix,
    as_vector_matrix,
    now_iso,
    read_index_meta,
)

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger(__name__)

STORAGE_DIR = "qdrant"
_DISTANCES = {"cosine": qm.Distance.COSINE, "ip": qm.Distance.DOT}
_QUERY_BATCH = 256
_META_ENCODER = "omnimed_encoder"  # collection metadata: the encoder fingerprint as canonical JSON
_META_ENCODER_ID = "omnimed_encoder_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
MAX_COLLECTION_NAME = 255


def _canonical(fingerprint: dict[str, Any]) -> str:
    return json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)


def collection_name(*parts: str) -> str:
    """A valid Qdrant collection name from ``parts``, joined by ``-``: characters other than ASCII letters,
    digits, ``_`` and ``-`` become ``_`` and the name is cut to Qdrant's 255 characters (keeping the end, where
    the index keys are)."""
    name = "-".join(_UNSAFE.sub("_", str(p)).strip("_") or "_" for p in parts)
    return name[-MAX_COLLECTION_NAME:]


def _open_local(path: Path) -> QdrantClient:
    """Open local on-disk storage; a folder held by another client becomes a ``KnowledgeError`` with a hint."""
    try:
        return QdrantClient(path=str(path))
    except RuntimeError as exc:
        if "already accessed" in str(exc):
            raise KnowledgeError(
                f"Qdrant storage {path} is open in another QdrantIndex or process (local mode allows one "
                f"client at a time); close it first, or run a Qdrant server and pass url="
            ) from exc
        raise


def _open_server(url: str, api_key_env: str | None, timeout: int | None) -> QdrantClient:
    """Connect to a Qdrant server; the API key comes from the environment only (never logged or stored)."""
    api_key = os.environ.get(api_key_env) if api_key_env else None
    log.info(
        "Connecting to Qdrant server %s (API key from $%s: %s)",
        url,
        api_key_env,
        "set" if api_key else "unset",
    )
    return QdrantClient(url=url, api_key=api_key or None, timeout=timeout)


class QdrantIndex:
    """Vectors in one Qdrant collection; ``search`` returns ``(row, score)`` lists, best first.

    Use as a context manager or call ``close()``: local mode holds a file lock on its storage folder until then.
    """

    def __init__(
        self,
        client: QdrantClient,
        *,
        collection: str,
        dim: int,
        n: int,
        metric: str = "cosine",
        encoder: dict[str, Any] | None = None,
        mode: str = "memory",
        storage: Path | None = None,
        url: str | None = None,
        api_key_env: str | None = None,
        hnsw_ef: int | None = None,
    ) -> None:
        self.client = client
        self.collection = collection
        self._dim = dim
        self._n = n
        self.metric = metric
        self.encoder = encoder
        self.mode = mode  # memory | local | server
        self.storage = storage
        self.url = url
        self.api_key_env = api_key_env
        self.hnsw_ef = hnsw_ef
        self._closed = False

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        where = self.url if self.mode == "server" else (self.storage or ":memory:")
        return (
            f"QdrantIndex({self.mode} {where}, collection={self.collection!r}, dim={self._dim}, n={self._n})"
        )

    @property
    def dim(self) -> int:
        return self._dim

    # -- lifecycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the client (and the local storage lock). Safe to call twice."""
        if not self._closed:
            self._closed = True
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _require_open(self) -> None:
        if self._closed:
            raise KnowledgeError(f"{self!r} is closed; load it again")

    # -- build -----------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        vectors: np.ndarray,
        *,
        directory: str | Path | None = None,
        url: str | None = None,
        api_key_env: str | None = "QDRANT_API_KEY",
        collection: str = "omnimed",
        metric: str = "cosine",
        batch_size: int = 256,
        hnsw_ef: int | None = None,
        timeout: int | None = None,
        encoder: dict[str, Any] | None = None,
    ) -> QdrantIndex:
        """(Re)create ``collection`` holding ``vectors`` (row ``i`` -> point id ``i``), upserting in batches.

        With ``url`` the collection lives on that server (and ``directory``, if given, gets its ``meta.json``);
        otherwise with ``directory`` it is stored locally under ``directory/qdrant``; with neither, in memory.
        An existing collection of the same name is replaced.
        """
        if metric not in _DISTANCES:
            raise KnowledgeError(f"Unknown Qdrant metric {metric!r}; use one of {sorted(_DISTANCES)}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        data = as_vector_matrix(vectors, encoder)
        n, dim = data.shape
        folder = Path(directory) if directory is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / META_FILE).unlink(missing_ok=True)  # incomplete until the new meta.json is written
        if url:
            client, mode, storage = _open_server(url, api_key_env, timeout), "server", None
        elif folder is not None:
            storage = folder / STORAGE_DIR
            client, mode = _open_local(storage), "local"
        else:
            client, mode, storage = QdrantClient(location=":memory:"), "memory", None
        index = cls(
            client,
            collection=collection,
            dim=dim,
            n=n,
            metric=metric,
            encoder=encoder,
            mode=mode,
            storage=storage,
            url=url,
            api_key_env=api_key_env if url else None,
            hnsw_ef=hnsw_ef,
        )
        try:
            index._fill(data, batch_size)
            if folder is not None:
                index._write_meta(folder)
        except ApiException as exc:
            index.close()
            raise KnowledgeError(f"Qdrant {index!r} failed while building: {exc}") from exc
        except BaseException:
            index.close()
            raise
        return index

    def _collection_metadata(self) -> dict[str, Any]:
        """What the collection says about itself: the encoder that made its vectors and the build that wrote it."""
        meta: dict[str, Any] = {}
        if self.encoder is not None:
            meta[_META_ENCODER] = _canonical(self.encoder)
            meta[_META_ENCODER_ID] = fingerprint_id_of(self.encoder)
        return meta

    def _fill(self, data: np.ndarray, batch_size: int) -> None:
        """Recreate the collection and upsert ``data`` batch by batch (ids = row numbers)."""
        if self.client.collection_exists(self.collection):
            self.client.delete_collection(self.collection)
        self.client.create_collection(
            self.collection,
            vectors_config=qm.VectorParams(size=self._dim, distance=_DISTANCES[self.metric]),
            metadata=self._collection_metadata(),
        )
        for start in range(0, len(data), batch_size):
            chunk = data[start : start + batch_size]
            self.client.upsert(
                self.collection,
                points=qm.Batch(ids=list(range(start, start + len(chunk))), vectors=chunk.tolist()),
                wait=True,
            )

    # -- search ----------------------------------------------------------------------------------------------

    def search(self, query_vectors: np.ndarray, k: int) -> list[Ranking]:
        """Top ``k`` rows per query (``k`` clipped to the collection size), best first."""
        self._require_open()
        queries = as_query_matrix(query_vectors, self._dim)
        k = min(int(k), self._n)
        if k <= 0 or len(queries) == 0:
            return [[] for _ in range(len(queries))]
        params = qm.SearchParams(hnsw_ef=self.hnsw_ef) if self.hnsw_ef else None
        rankings: list[Ranking] = []
        for start in range(0, len(queries), _QUERY_BATCH):
            requests = [
                qm.QueryRequest(query=vector.tolist(), limit=k, params=params, with_payload=False)
                for vector in queries[start : start + _QUERY_BATCH]
            ]
            for response in self.client.query_batch_points(self.collection, requests=requests):
                rankings.append([(int(point.id), float(point.score)) for point in response.points])
        return rankings

    # -- persistence -----------------------------------------------------------------------------------------

    def _write_meta(self, folder: Path) -> None:
        meta = {
            "format": "omnimed-qdrant",
            "version": 1,
            "mode": "server" if self.mode == "server" else "local",
            "collection": self.collection,
            "metric": self.metric,
            "dim": self._dim,
            "n": self._n,
            "encoder": self.encoder,
            "url": self.url,
            "api_key_env": self.api_key_env,  # the variable's name only, never its value
            "hnsw_ef": self.hnsw_ef,
            "created": now_iso(),
        }
        atomic_write_json(folder / META_FILE, meta)

    def save(self, directory: str | Path, *, batch_size: int = 256) -> Path:
        """Make ``directory`` loadable with ``QdrantIndex.load``.

        Server mode writes only ``meta.json`` (the points stay on the server). Local storage already in
        ``directory`` just gets its ``meta.json``; in-memory indexes (or local ones stored elsewhere) are copied
        point by point into ``directory/qdrant`` first.
        """
        self._require_open()
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / STORAGE_DIR
        same_storage = self.storage is not None and self.storage.resolve() == target.resolve()
        if self.mode != "server" and not same_storage:
            (folder / META_FILE).unlink(missing_ok=True)
            if target.exists():
                shutil.rmtree(target)
            copy = _open_local(target)
            try:
                self._copy_into(copy, batch_size)
            finally:
                copy.close()
        self._write_meta(folder)
        return folder

    def _copy_into(self, other: QdrantClient, batch_size: int) -> None:
        other.create_collection(
            self.collection,
            vectors_config=qm.VectorParams(size=self._dim, distance=_DISTANCES[self.metric]),
            metadata=self._collection_metadata(),
        )
        offset = None
        while True:
            records, offset = self.client.scroll(
                self.collection, limit=batch_size, offset=offset, with_payload=False, with_vectors=True
            )
            if records:
                other.upsert(
                    self.collection,
                    points=qm.Batch(ids=[r.id for r in records], vectors=[r.vector for r in records]),
                    wait=True,
                )
            if offset is None:
                break

    @classmethod
    def load(
        cls,
        directory: str | Path,
        expect_encoder: dict[str, Any] | None = None,
        *,
        url: str | None = None,
        api_key_env: str | None = None,
        hnsw_ef: int | None = None,
        timeout: int | None = None,
    ) -> QdrantIndex:
        """Open an index saved by ``build(directory=...)`` or ``save``; the encoder fingerprint must match.

        ``url`` / ``api_key_env`` override the saved server settings (e.g. the same collection behind another
        address). The collection must exist, hold as many points as when it was saved, have vectors of the saved
        dimension, and its metadata must name the same encoder as ``meta.json``: a collection that
        another build has since replaced is refused with ``IndexMismatchError`` instead of being searched.
        """
        folder = Path(directory)
        meta = read_index_meta(folder, "Qdrant index")
        if meta.get("format") != "omnimed-qdrant":
            raise KnowledgeError(
                f"{folder / META_FILE} does not describe a Qdrant index (format {meta.get('format')!r})"
            )
        check_fingerprint(meta.get("encoder"), expect_encoder, f"Qdrant index {folder}")
        collection, dim, n = meta["collection"], int(meta["dim"]), int(meta["n"])
        if expect_encoder is not None and expect_encoder.get("dim") not in (None, dim):
            raise IndexMismatchError(
                f"Qdrant index {folder} holds {dim}-d vectors, but {describe_fingerprint(expect_encoder)} was asked for"
            )
        storage: Path | None = None
        if meta.get("mode") == "server":
            url = url or meta.get("url")
            api_key_env = api_key_env or meta.get("api_key_env")
            if not url:
                raise KnowledgeError(f"{folder / META_FILE} is a server index without a url; pass url=")
            client, mode = _open_server(url, api_key_env, timeout), "server"
        else:
            storage = folder / STORAGE_DIR
            if not storage.is_dir():
                raise KnowledgeError(
                    f"Qdrant index folder {folder} has {META_FILE} but no {STORAGE_DIR}/ storage"
                )
            client, mode = _open_local(storage), "local"
        index = cls(
            client,
            collection=collection,
            dim=dim,
            n=n,
            metric=meta.get("metric", "cosine"),
            encoder=meta.get("encoder"),
            mode=mode,
            storage=storage,
            url=url,
            api_key_env=api_key_env,
            hnsw_ef=hnsw_ef if hnsw_ef is not None else meta.get("hnsw_ef"),
        )
        try:
            index._verify(folder, expect_encoder)
        except ApiException as exc:
            index.close()
            raise KnowledgeError(f"Qdrant {index!r} (from {folder}) cannot be read: {exc}") from exc
        except BaseException:
            index.close()
            raise
        return index

    def _verify(self, folder: Path, expect_encoder: dict[str, Any] | None = None) -> None:
        """Check the collection itself (not only our ``meta.json``): it exists, its vectors have the expected
        dimension, its metadata names the expected encoder, and it holds ``n`` points."""
        if not self.client.collection_exists(self.collection):
            raise KnowledgeError(
                f"Qdrant index {folder}: collection {self.collection!r} does not exist; rebuild it"
            )
        where = f"Qdrant collection {self.collection!r} (index {folder})"
        config = self.client.get_collection(self.collection).config
        vectors = config.params.vectors
        size = getattr(vectors, "size", None)
        if size is None:
            raise KnowledgeError(f"{where} has named vectors {sorted(vectors or {})}, not one unnamed vector")
        wanted = (expect_encoder or {}).get("dim") or self._dim
        if size != self._dim or size != wanted:
            raise IndexMismatchError(
                f"{where} holds {size}-d vectors, but {folder / META_FILE} says {self._dim}-d and "
                f"{describe_fingerprint(expect_encoder or self.encoder)} was asked for (dimension {size} != "
                f"{wanted}); another build replaced the collection: rebuild this index"
            )
        metadata = config.metadata or {}
        wanted_encoder = expect_encoder or self.encoder
        if _META_ENCODER in metadata:
            if wanted_encoder is not None and metadata[_META_ENCODER] != _canonical(wanted_encoder):
                check_fingerprint(json.loads(metadata[_META_ENCODER]), wanted_encoder, where)
        elif wanted_encoder is not None:
            log.warning("%s has no encoder fingerprint in its metadata (built by an older omnimed or another "
                        "tool?); only its dimension and point count were checked", where)
        stored = self.client.count(self.collection, exact=True).count
        if stored != self._n:
            raise KnowledgeError(
                f"Qdrant index {folder}: collection {self.collection!r} holds {stored} points but "
                f"{folder / META_FILE} says {self._n}; rebuild it"
            )

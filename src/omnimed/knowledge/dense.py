"""Dense retrieval on the query side: :class:`DenseRetriever` encodes query texts and searches a vector index.

The index is any :class:`~omnimed.knowledge.vector_index.VectorIndex` built from the same encoder's vectors:
a :class:`~omnimed.knowledge.faiss_index.FaissIndex` or a :class:`~omnimed.knowledge.qdrant.QdrantIndex`;
document vectors come from the :class:`~omnimed.knowledge.embedding_cache.EmbeddingCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnimed.knowledge.embedding_cache import EmbeddingCache
from omnimed.knowledge.encoders import Encoder, check_fingerprint, describe_fingerprint
from omnimed.knowledge.faiss_index import FaissIndex
from omnimed.knowledge.types import IndexMismatchError, Ranking
from omnimed.knowledge.vector_index import VectorIndex

__all__ = ["DenseRetriever"]


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

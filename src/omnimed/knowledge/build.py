"""Build a knowledge base's indexes on disk, or reuse them: ``omnimed-index`` and ``build_knowledge_base``.

Layout under ``<root>/<index_dir>/<name>/``::

    <source>-<key>/passages.jsonl      the chunked passages, row order = index order
    <source>-<key>/bm25-<key>/         bm25s files (memory-mapped on load)
    <source>-<key>/dense-<key>/        FAISS index (or Qdrant storage) + meta.json naming the encoder; a Qdrant
                                       collection is named omnimed-<name>-<source>-<key>-dense-<key>
    <source>-<key>/manifest.json       fingerprints, config, counts, timings (written last: present = complete)
    graph-<key>.sqlite                 the concept store
    ../embeddings/                     the embedding cache, by content hash (shared; resumes an interrupted run)

Every key is a hash of what decides the content (the corpus fingerprint, the chunking, the BM25 parameters, the
encoder's fingerprint and the index settings), so an unchanged corpus is never indexed twice and an index made with
another encoder is never mixed with this one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from omnimed.data.artifacts import atomic_write_json, package_versions, settings_key
from omnimed.data.io import read_records, write_records
from omnimed.data.records import Passage
from omnimed.knowledge.base import KnowledgeBase, SourceIndex
from omnimed.knowledge.config import TEXT_SOURCES, KnowledgeConfig
from omnimed.knowledge.corpus import SourceCorpus, check_inputs, check_sources, load_source
from omnimed.knowledge.types import KnowledgeError, index_text

console = Console(stderr=True)
INDEX_KINDS = ("bm25", "dense")


def build_encoder(cfg: KnowledgeConfig):
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.models.config import named_model_config

    d = cfg.dense
    return TextEncoder(
        named_model_config(d.encoder),
        named_model_config(d.query_encoder) if d.query_encoder else None,
        query_prefix=d.query_prefix,
        doc_prefix=d.doc_prefix,
        batch_size=d.batch_size,
        max_length=d.max_length,
    )


def build_reranker(cfg: KnowledgeConfig, encoder):
    from omnimed.knowledge.rerank import BiEncoderReranker, CrossEncoderReranker
    from omnimed.models.config import named_model_config

    r = cfg.rerank
    if r.kind == "cross_encoder":
        return CrossEncoderReranker(r.model, batch_size=r.batch_size)
    if r.kind == "bi_encoder":
        if encoder is not None and r.model == cfg.dense.encoder and not cfg.dense.query_encoder:
            return BiEncoderReranker(encoder)
        from omnimed.knowledge.encoders import TextEncoder

        return BiEncoderReranker(TextEncoder(named_model_config(r.model), batch_size=r.batch_size))
    raise KnowledgeError(f"knowledge.rerank.kind={r.kind!r}; expected cross_encoder or bi_encoder")


def _check(cfg: KnowledgeConfig) -> None:
    check_sources(list(cfg.sources))
    bad = [i for i in cfg.indexes if i not in INDEX_KINDS]
    if bad:
        raise KnowledgeError(f"knowledge.indexes: unknown {bad}; expected a subset of {list(INDEX_KINDS)}")
    needs = {"bm25": ["bm25"], "dense": ["dense"], "hybrid": ["bm25", "dense"]}.get(cfg.retriever)
    if needs is None:
        raise KnowledgeError(f"knowledge.retriever={cfg.retriever!r}; expected bm25, dense or hybrid")
    if any(n not in cfg.indexes for n in needs):
        raise KnowledgeError(f"knowledge.retriever={cfg.retriever} needs indexes {needs}; knowledge.indexes={cfg.indexes}")


def build_knowledge_base(
    cfg: KnowledgeConfig, root: str | Path = ".", *, progress: bool = True, report: list | None = None
) -> KnowledgeBase:
    """Build what is missing of ``cfg``'s indexes under ``root`` and open the knowledge base.

    ``report`` (a list) receives one dict per source: what was built or reused, counts, seconds, directory.
    """
    from omnimed.knowledge.embedding_cache import EmbeddingCache

    _check(cfg)
    check_inputs(cfg)  # config and input paths first: a refused build loads no model and creates no folder
    base_dir = Path(root) / cfg.index_dir / cfg.name
    encoder = build_encoder(cfg) if "dense" in cfg.indexes else None
    embeddings = EmbeddingCache(Path(root) / cfg.index_dir / "embeddings")  # also serves rankers' own encoders
    cache = embeddings if encoder is not None else None
    sources: dict[str, SourceIndex] = {}
    graph = None
    rows: list[dict[str, Any]] = []
    for source in cfg.sources:
        started = time.perf_counter()
        corpus = load_source(cfg, source)
        base_dir.mkdir(parents=True, exist_ok=True)  # once a source has read: an unreadable corpus leaves none
        if source == "graph":
            graph, row = _graph(cfg, corpus, base_dir)
        else:
            sources[source], row = _text_source(cfg, corpus, base_dir, encoder, cache, progress)
        row["seconds"] = round(time.perf_counter() - started, 2)
        rows.append(row)
    if report is not None:
        report.extend(rows)
    reranker = build_reranker(cfg, encoder) if cfg.rerank.enabled else None
    base_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(base_dir / "manifest.json", {
        "name": cfg.name,
        "config": dataclasses.asdict(cfg),
        "sources": {row["source"]: Path(row["directory"]).name for row in rows},
        "encoder": encoder.fingerprint if encoder is not None else None,
    })
    return KnowledgeBase(cfg, sources, graph=graph, encoder=encoder, reranker=reranker, directory=base_dir,
                         embeddings=embeddings)


# ------------------------------------------------------------------------------------------------- graph
def _graph(cfg: KnowledgeConfig, corpus: SourceCorpus, base_dir: Path):
    from omnimed.knowledge.graph_store import GraphStore

    path = base_dir / f"graph-{settings_key([corpus.fingerprint()])}.sqlite"
    row = {"source": "graph", "directory": str(path), "concepts": len(corpus)}
    if path.is_file():
        row["built"] = []
        return GraphStore.open(path), row
    store = GraphStore.build(corpus.graph, path, meta={"knowledge": cfg.name, "origin": corpus.origin})
    row["built"] = ["graph"]
    return store, row


# ------------------------------------------------------------------------------------------------- text
def _text_source(cfg, corpus: SourceCorpus, base_dir: Path, encoder, cache, progress: bool):
    from omnimed.knowledge.chunking import ChunkConfig, chunk_passages

    source = corpus.source
    if source not in TEXT_SOURCES:
        raise KnowledgeError(f"source {source!r} is not a text source")
    chunking = dataclasses.asdict(cfg.chunking_for(source))
    fingerprint = corpus.fingerprint()
    src_dir = base_dir / f"{source}-{settings_key([fingerprint, chunking])}"
    src_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = src_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    built: list[str] = []

    passages_file = src_dir / "passages.jsonl"
    if manifest.get("passages") and passages_file.is_file():
        passages = read_records(passages_file, Passage)
    else:
        manifest = {}
        passages = chunk_passages(corpus.passages, ChunkConfig(**chunking))
        write_records(passages_file, passages)
        _write_manifest(manifest_path, manifest, passages=len(passages), documents=len(corpus.passages),
                        corpus_fingerprint=fingerprint, origin=corpus.origin, chunking=chunking, source=source)
        built.append("passages")
    texts = [index_text(p) for p in passages]
    index = SourceIndex(source, passages)

    if "bm25" in cfg.indexes:
        from omnimed.knowledge.sparse import BM25Index

        params = dataclasses.asdict(cfg.sparse)
        bm25_dir = src_dir / f"bm25-{settings_key([params])}"
        if _complete(manifest, bm25_dir):
            index.bm25 = BM25Index.load(bm25_dir, mmap=True)
            _use(manifest_path, manifest, "bm25", bm25_dir)
        else:
            t0 = time.perf_counter()
            index.bm25 = BM25Index.build(texts, **params)
            index.bm25.save(bm25_dir)
            _finish(manifest_path, manifest, "bm25", {"dir": bm25_dir.name, "params": params,
                                                       "seconds": round(time.perf_counter() - t0, 2)})
            built.append("bm25")

    if "dense" in cfg.indexes:
        index.dense, made = _dense(cfg, src_dir, manifest, manifest_path, texts, encoder, cache, progress)
        built += made
    return index, {"source": source, "directory": str(src_dir), "documents": len(corpus.passages),
                   "passages": len(passages), "built": built}


def _dense(cfg, src_dir: Path, manifest: dict, manifest_path: Path, texts, encoder, cache, progress: bool):
    from omnimed.knowledge.faiss_index import FaissIndex
    from omnimed.knowledge.qdrant import QdrantIndex, collection_name

    d = cfg.dense
    settings = {k: v for k, v in dataclasses.asdict(d).items()
                if k not in ("batch_size", "embed_shard_size", "qdrant_url")}
    dense_dir = src_dir / f"dense-{settings_key([encoder.fingerprint_id, settings])}"
    kind = d.index
    if _complete(manifest, dense_dir):
        _use(manifest_path, manifest, "dense", dense_dir)
        if kind == "qdrant":
            return QdrantIndex.load(dense_dir, encoder.fingerprint, url=d.qdrant_url), []
        return FaissIndex.load(dense_dir, encoder.fingerprint, ef_search=d.ef_search, nprobe=d.nprobe), []
    t0 = time.perf_counter()
    vectors = cache.embed(encoder, texts, batch_size=d.embed_shard_size, progress=progress)
    embed_s = time.perf_counter() - t0
    if kind == "qdrant":
        # Named by the dense key (encoder + index settings) as well as the source key: on a server every index
        # of this source shares one namespace, and a second encoder must get a collection of its own.
        index = QdrantIndex.build(vectors, directory=dense_dir, url=d.qdrant_url, encoder=encoder.fingerprint,
                                  collection=collection_name("omnimed", cfg.name, src_dir.name, dense_dir.name))
    else:
        index = FaissIndex.build(
            vectors, kind=kind, hnsw_m=d.hnsw_m, ef_construction=d.ef_construction, ef_search=d.ef_search,
            nlist=d.nlist, pq_m=d.pq_m, nprobe=d.nprobe, auto_threshold=d.auto_threshold,
            encoder=encoder.fingerprint,
        )
        index.save(dense_dir)
    _finish(manifest_path, manifest, "dense", {
        "dir": dense_dir.name, "encoder": encoder.fingerprint, "index": getattr(index, "kind", kind),
        "settings": settings, "embed_seconds": round(embed_s, 2),
        "seconds": round(time.perf_counter() - t0, 2),
    })
    return index, ["dense"]


def _complete(manifest: dict, directory: Path) -> bool:
    """Whether ``directory`` holds a finished index of this source (any setting built before, not only the last)."""
    return directory.name in manifest.get("complete", {}) and directory.is_dir()


def _use(path: Path, manifest: dict, kind: str, directory: Path) -> None:
    """Make an already finished index the one the manifest names as current for ``kind``."""
    if (manifest.get(kind) or {}).get("dir") != directory.name:
        _write_manifest(path, manifest, **{kind: manifest["complete"][directory.name]})


def _finish(path: Path, manifest: dict, kind: str, info: dict) -> None:
    """Record a finished index: current for ``kind`` and remembered among the source's complete indexes."""
    _write_manifest(path, manifest, **{kind: info, "complete": {**manifest.get("complete", {}), info["dir"]: info}})


def _write_manifest(path: Path, manifest: dict, **updates: Any) -> None:
    """Record a finished step; each step is written as soon as it is complete, so a crash loses only the step
    that was running."""
    manifest.update(updates)
    manifest.setdefault("versions", package_versions())
    atomic_write_json(path, manifest)

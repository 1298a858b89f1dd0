"""``omnimed-bench retrieval``: index build and query throughput of BM25, FAISS flat and HNSW, in one run, with
rank-bm25 on the same corpus and the same tokens as the reference.

Targets (reported, never asserted): BM25 >= 100 queries/s on one thread and >= 50x rank-bm25 at 100k passages;
HNSW p95 <= 10 ms per query with recall@10 >= 0.95 of flat.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = {"bm25_qps": 100.0, "bm25_vs_rank_bm25": 50.0, "hnsw_p95_ms": 10.0, "hnsw_recall_vs_flat": 0.95}


def hardware() -> dict[str, Any]:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return {"cpu": model, "cores": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}


def _threads(n: int) -> None:
    import faiss
    import torch

    faiss.omp_set_num_threads(n)
    torch.set_num_threads(n)


def world_corpus(size: str, seed: int = 0) -> tuple[list[str], list[str]]:
    """Passage texts (as the index sees them) and question texts of a synthetic world."""
    from omnimed.data.world import build_world
    from omnimed.knowledge.build import index_text

    world = build_world(seed, size)
    queries = [q.question for q in [*world.questions, *world.open_questions]]
    return [index_text(p) for p in world.passages], queries


def realdata_corpus(root: Path) -> tuple[list[str], list[str]]:
    """The real text sources chunked as ``knowledge=realdata`` chunks them; PubMedQA and MedQuAD questions."""
    import json

    from omnimed.data.loaders.benchmarks import load_pubmedqa_corpus
    from omnimed.data.loaders.corpora import load_book, load_guideline, load_wiki
    from omnimed.knowledge.build import index_text
    from omnimed.knowledge.chunking import ChunkConfig, chunk_passages

    passages = [*load_book(root), *load_guideline(root), *load_wiki(root),
                *load_pubmedqa_corpus(root / "research/pubmedqa/data/ori_pqal.json")]
    chunks = chunk_passages(passages, ChunkConfig("chars", 1000, 0))
    pubmedqa = json.loads((root / "research/pubmedqa/data/ori_pqal.json").read_text())
    queries = [v["QUESTION"] for v in pubmedqa.values()]
    queries += [p.metadata.get("question", "") for p in passages if p.source == "wiki"][:2000]
    return [index_text(p) for p in chunks], [q for q in queries if q]


def _latencies(index, vectors: np.ndarray, k: int) -> dict[str, float]:
    times = []
    for v in vectors:
        t0 = time.perf_counter()
        index.search(v[None, :], k)
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "qps": float(len(ms) / ms.sum() * 1000)}


def bench_corpus(
    name: str,
    texts: Sequence[str],
    queries: Sequence[str],
    *,
    encoder,
    cache,
    n_queries: int = 1000,
    n_reference: int = 20,
    threads: int = 1,
    k: int = 10,
    progress: bool = True,
) -> dict[str, Any]:
    """Every measurement for one corpus; see the module docstring."""
    from rank_bm25 import BM25Okapi

    from omnimed.knowledge.dense import FaissIndex
    from omnimed.knowledge.sparse import BM25Index, tokenize_for_reference

    rng = np.random.default_rng(0)
    qs = [queries[i] for i in rng.choice(len(queries), size=min(n_queries, len(queries)), replace=False)]
    _threads(threads)
    out: dict[str, Any] = {"corpus": name, "passages": len(texts), "queries": len(qs)}

    t0 = time.perf_counter()
    bm25 = BM25Index.build(texts)
    out["bm25_build_s"] = time.perf_counter() - t0
    out["bm25_build_passages_per_s"] = len(texts) / out["bm25_build_s"]
    bm25.search(qs[:20], k)  # warm-up
    t0 = time.perf_counter()
    ours = bm25.search(qs, k, n_threads=1)
    out["bm25_qps"] = len(qs) / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    reference = BM25Okapi([tokenize_for_reference(t) for t in texts])
    out["rank_bm25_build_s"] = time.perf_counter() - t0
    ref_qs = qs[:n_reference]
    t0 = time.perf_counter()
    ref_top = [np.argsort(-reference.get_scores(tokenize_for_reference(q)))[:k] for q in ref_qs]
    out["rank_bm25_qps"] = len(ref_qs) / (time.perf_counter() - t0)
    out["bm25_vs_rank_bm25"] = out["bm25_qps"] / out["rank_bm25_qps"]
    out["bm25_top10_overlap_with_rank_bm25"] = float(np.mean(
        [len({r for r, _ in ours[i]} & set(ref_top[i].tolist())) / k for i in range(len(ref_qs))]))

    already = cache.count(encoder)
    _threads(os.cpu_count() or 1)  # embedding is preparation, not a timed query path: all cores
    t0 = time.perf_counter()
    vectors = cache.embed(encoder, list(texts), progress=progress)
    embed_s = time.perf_counter() - t0
    new = cache.count(encoder) - already
    out["embedded_now"] = new
    out["embed_passages_per_s"] = new / embed_s if new else None
    qvec = encoder.encode_queries(qs)
    _threads(threads)

    t0 = time.perf_counter()
    flat = FaissIndex.build(vectors, kind="flat")
    out["flat_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hnsw = FaissIndex.build(vectors, kind="hnsw")
    out["hnsw_build_s"] = time.perf_counter() - t0
    out["hnsw_build_passages_per_s"] = len(texts) / out["hnsw_build_s"]
    for kind, index in (("flat", flat), ("hnsw", hnsw)):
        out.update({f"{kind}_{key}": v for key, v in _latencies(index, qvec, k).items()})
    exact = flat.search(qvec, k)
    approx = hnsw.search(qvec, k)
    out["hnsw_recall_vs_flat"] = float(np.mean(
        [len({r for r, _ in a} & {r for r, _ in e}) / max(1, len(e)) for a, e in zip(approx, exact)]))
    t0 = time.perf_counter()
    hnsw.search(encoder.encode_queries(qs), k)
    out["dense_end_to_end_qps"] = len(qs) / (time.perf_counter() - t0)

    out["targets"] = {
        "bm25_qps >= 100": out["bm25_qps"] >= TARGETS["bm25_qps"],
        "bm25 >= 50x rank-bm25": out["bm25_vs_rank_bm25"] >= TARGETS["bm25_vs_rank_bm25"],
        "hnsw p95 <= 10 ms": out["hnsw_p95_ms"] <= TARGETS["hnsw_p95_ms"],
        "hnsw recall@10 >= 0.95 of flat": out["hnsw_recall_vs_flat"] >= TARGETS["hnsw_recall_vs_flat"],
    }
    return out


def bench_retrieval(
    corpora: Sequence[str] = ("world", "realdata"),
    *,
    world_size: str = "large",
    realdata_root: str | None = None,
    cache_dir: str | Path = "indexes/embeddings",
    n_queries: int = 1000,
    n_reference: int = 20,
    threads: int = 1,
    progress: bool = True,
    log=print,
) -> dict[str, Any]:
    """Benchmark each corpus; realdata is skipped (and says so) when its folder is not given or set."""
    from omnimed.knowledge.dense import EmbeddingCache
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.models.config import named_model_config

    encoder = TextEncoder(named_model_config("minilm-l6"))
    cache = EmbeddingCache(Path(cache_dir))
    result: dict[str, Any] = {"hardware": hardware(), "threads": threads, "encoder": "minilm-l6", "corpora": []}
    for name in corpora:
        if name == "world":
            texts, queries = world_corpus(world_size)
            label = f"world-{world_size}"
        elif name == "realdata":
            root = realdata_root or os.environ.get("OMNIMED_REALDATA")
            if not root:
                log("realdata skipped: set OMNIMED_REALDATA (../shared/realdata) to benchmark the real corpora")
                continue
            texts, queries = realdata_corpus(Path(root))
            label = "realdata"
        else:
            raise ValueError(f"unknown corpus {name!r}; expected world or realdata")
        log(f"{label}: {len(texts)} passages, {len(queries)} candidate queries")
        result["corpora"].append(bench_corpus(label, texts, queries, encoder=encoder, cache=cache,
                                              n_queries=n_queries, n_reference=n_reference, threads=threads,
                                              progress=progress))
    result["hardware"]["load_avg_1m_end"] = os.getloadavg()[0]
    return result

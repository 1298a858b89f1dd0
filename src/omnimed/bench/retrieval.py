"""``omnimed-bench retrieval``: index build and query throughput of BM25, FAISS flat and HNSW, in one run, with
rank-bm25 on the same corpus and the same tokens as the reference.

For each corpus (the synthetic world, ``large`` by default with >= 100k passages, and the real text corpora) the
run measures:

- BM25 (bm25s through :class:`~omnimed.knowledge.sparse.BM25Index`): build passages/s and queries/s on one thread
  for a batch of questions; rank-bm25's ``BM25Okapi`` fed the very same tokens, timed on a few of those questions
  (it scores every passage in Python and is slow), the speed ratio, and the top-10 overlap of the two rankings
  as a sanity check (their formulas differ slightly: Lucene idf vs. Okapi idf with an epsilon floor, so overlap
  below 1.0 is expected);
- dense (MiniLM-L6 through the shared :class:`~omnimed.knowledge.embedding_cache.EmbeddingCache`, so a rerun
  reuses the vectors): embedding passages/s over the texts not yet cached and over a fixed sample encoded
  afresh (so a rerun still reports a rate), FAISS flat and HNSW build time, one-query-at-a-time latency
  p50/p95 and queries/s on pre-encoded vectors (this isolates the index), HNSW recall@10 relative to flat, and
  end-to-end queries/s including query encoding (one query at a time, and as one batch).

Timed query and build paths run with ``threads`` torch / FAISS threads; embedding the corpus is preparation and
uses every usable core. Targets (checked and reported as pass/fail, never asserted): BM25 >= 100 queries/s on
one thread and >= 50x rank-bm25 at 100k passages; HNSW p95 <= 10 ms per query with recall@10 >= 0.95 of flat.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from omnimed.bench.sampling import BackgroundSampler

TARGETS = {"bm25_qps": 100.0, "bm25_vs_rank_bm25": 50.0, "hnsw_p95_ms": 10.0, "hnsw_recall_vs_flat": 0.95}
WORLD_SIZES = ("tiny", "small", "large")
DEFAULT_CACHE = "indexes/embeddings"  # the embedding cache omnimed-index uses (<paths.root>/<index_dir>/embeddings)
PUBMEDQA_FILE = "research/pubmedqa/data/ori_pqal.json"
ENCODER = "minilm-l6"


# -- environment ----------------------------------------------------------------------------------------------


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def hardware() -> dict[str, Any]:
    """CPU model, usable cores, load average at the start and library versions: what the numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    model = platform.processor() or "unknown"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("bm25s", "rank-bm25", "faiss-cpu", "torch", "sentence-transformers"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {"cpu": model, "cores": usable_cores(), "load_avg_1m": os.getloadavg()[0],
            "load_avg": [round(x, 2) for x in os.getloadavg()], "versions": versions}


class LoadSampler(BackgroundSampler):
    """Samples the 1-minute load average every ``every`` seconds in a daemon thread while the bench runs.

    On a shared machine the load during the run says how much the numbers may be depressed by other work;
    the start and end values alone miss what happened in between.
    """

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = []
        super().__init__(every, "load-sampler")

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        s = np.asarray(self.samples)
        return {"load_avg_1m_mean": round(float(s.mean()), 2), "load_avg_1m_max": round(float(s.max()), 2),
                "load_samples": len(s)}


@contextmanager
def kept_threads() -> Iterator[None]:
    """Give torch and FAISS back the thread counts they had: a benchmark run in-process (a test, a notebook) must
    not leave its setting behind, since a different count changes float reductions in whatever runs next."""
    import faiss
    import torch

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


def set_threads(n: int) -> None:
    """Set torch's and FAISS's (OpenMP) thread counts; the timed parts run with the count asked for."""
    import faiss
    import torch

    faiss.omp_set_num_threads(n)
    torch.set_num_threads(n)


# -- corpora --------------------------------------------------------------------------------------------------


def world_corpus(size: str, seed: int = 0) -> tuple[list[str], dict[str, list[str]]]:
    """Passage texts (as the index sees them) and question texts, by kind, of a synthetic world."""
    from omnimed.data.world import build_world
    from omnimed.knowledge.types import index_text

    world = build_world(seed, size)
    queries = {"mcq": [q.question for q in world.questions], "open": [q.question for q in world.open_questions]}
    return [index_text(p) for p in world.passages], queries


def realdata_corpus(root: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The real text sources (OpenStax, NGC, MedQuAD, PubMedQA abstracts) chunked as ``knowledge=realdata``
    chunks them (<= 1000 characters), as one corpus; PubMedQA questions and MedQuAD questions as queries.

    The graph source is left out: it is a concept store, not text that BM25 or the encoder indexes.
    """
    from omnimed.data.loaders.pubmedqa_bioasq import load_pubmedqa_corpus
    from omnimed.data.loaders.text_corpora import load_book, load_guideline, load_wiki
    from omnimed.knowledge.chunking import ChunkConfig, chunk_passages
    from omnimed.knowledge.types import index_text

    wiki = load_wiki(root)
    passages = [*load_book(root), *load_guideline(root), *wiki, *load_pubmedqa_corpus(root / PUBMEDQA_FILE)]
    chunks = chunk_passages(passages, ChunkConfig("chars", 1000, 0))
    pubmedqa = json.loads((root / PUBMEDQA_FILE).read_text(encoding="utf-8"))
    queries = {
        "pubmedqa": list(dict.fromkeys(v["QUESTION"] for v in pubmedqa.values() if v.get("QUESTION"))),
        "medquad": list(dict.fromkeys(q for p in wiki if (q := p.metadata.get("question")))),
    }
    return [index_text(p) for p in chunks], queries


def sample_queries(groups: dict[str, list[str]], n: int, seed: int = 0) -> list[str]:
    """``n`` distinct queries drawn evenly from the groups (a small group gives all it has), in shuffled order.

    Even shares keep one question style (e.g. MedQuAD's "What are the symptoms of X ?") from dominating.
    """
    rng = np.random.default_rng(seed)
    pools = {name: list(dict.fromkeys(qs)) for name, qs in groups.items() if qs}
    picked: list[str] = []
    remaining = n
    for i, (name, pool) in enumerate(sorted(pools.items(), key=lambda kv: len(kv[1]))):
        share = min(len(pool), remaining // (len(pools) - i))
        picked += [pool[j] for j in rng.choice(len(pool), size=share, replace=False)]
        remaining -= share
    rng.shuffle(picked)
    return picked


# -- measurements ---------------------------------------------------------------------------------------------


def _percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "qps": float(len(ms) / ms.sum() * 1000)}


def one_at_a_time(search: Callable[[Any], Any], items: Sequence[Any]) -> dict[str, float]:
    """Latency p50/p95 (ms) and queries/s of calling ``search`` on each item in turn."""
    times = []
    for item in items:
        t0 = time.perf_counter()
        search(item)
        times.append(time.perf_counter() - t0)
    return _percentiles(times)


def overlap_at_k(a: Sequence[int], b: Sequence[int]) -> float:
    """|a & b| / max(|a|, |b|): 1.0 for two equal top-k lists, and for two empty ones (no term matched)."""
    if not a and not b:
        return 1.0
    return len(set(a) & set(b)) / max(len(a), len(b))


@kept_threads()
def bench_corpus(
    name: str,
    texts: Sequence[str],
    queries: dict[str, list[str]] | Sequence[str],
    *,
    encoder: Any,
    cache: Any,
    n_queries: int = 1000,
    n_reference: int = 20,
    threads: int = 1,
    k: int = 10,
    seed: int = 0,
    embed_sample: int = 256,
    progress: bool = True,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Every measurement for one corpus (see the module docstring); returns a flat dict of numbers + targets."""
    from rank_bm25 import BM25Okapi

    from omnimed.knowledge.faiss_index import FaissIndex
    from omnimed.knowledge.sparse import BM25Index, tokenize_for_reference

    groups = queries if isinstance(queries, dict) else {"all": list(queries)}
    qs = sample_queries(groups, n_queries, seed)
    ref_qs = qs[:n_reference]
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    out: dict[str, Any] = {"corpus": name, "passages": len(texts), "queries": len(qs),
                           "reference_queries": len(ref_qs), "query_pools": {g: len(v) for g, v in groups.items()},
                           "threads": threads, "k": k}
    set_threads(threads)

    # -- BM25: ours (bm25s) ------------------------------------------------------------------------------------
    log(f"{name}: BM25 build over {len(texts):,} passages")
    t0 = time.perf_counter()
    bm25 = BM25Index.build(texts)
    out["bm25_build_s"] = time.perf_counter() - t0
    out["bm25_build_passages_per_s"] = len(texts) / out["bm25_build_s"]
    bm25.search(qs[:20], k)  # warm-up: first-touch of the score matrix, analyser caches
    t0 = time.perf_counter()
    ours = bm25.search(qs, k, n_threads=1)
    out["bm25_qps"] = len(qs) / (time.perf_counter() - t0)
    repeats = max(1, 200 // max(1, len(ref_qs)))  # the reference queries alone are too few to time once
    t0 = time.perf_counter()
    for _ in range(repeats):
        bm25.search(ref_qs, k, n_threads=1)
    bm25_qps_ref = repeats * len(ref_qs) / (time.perf_counter() - t0)

    # -- BM25: rank-bm25 on the same tokens --------------------------------------------------------------------
    log(f"{name}: rank-bm25 build and {len(ref_qs)} reference queries")
    t0 = time.perf_counter()
    reference = BM25Okapi([tokenize_for_reference(t) for t in texts])
    out["rank_bm25_build_s"] = time.perf_counter() - t0
    out["rank_bm25_build_passages_per_s"] = len(texts) / out["rank_bm25_build_s"]
    ref_top: list[list[int]] = []
    t0 = time.perf_counter()
    for q in ref_qs:
        scores = reference.get_scores(tokenize_for_reference(q))
        top = np.argsort(-scores, kind="stable")[:k]  # stable: equal scores go to the lower row, as in ours
        ref_top.append([int(i) for i in top if scores[i] > 0])
    out["rank_bm25_qps"] = len(ref_qs) / (time.perf_counter() - t0)
    out["bm25_vs_rank_bm25"] = out["bm25_qps"] / out["rank_bm25_qps"]
    out["bm25_vs_rank_bm25_same_queries"] = bm25_qps_ref / out["rank_bm25_qps"]
    out["bm25_top10_overlap_with_rank_bm25"] = float(np.mean(
        [overlap_at_k([r for r, _ in ours[i]], ref_top[i]) for i in range(len(ref_qs))]))
    del reference

    # -- dense: embed (cached), flat and HNSW ------------------------------------------------------------------
    already = cache.count(encoder)
    out["embed_threads"] = usable_cores()
    set_threads(out["embed_threads"])  # embedding is preparation, not a timed query path: all cores
    log(f"{name}: embedding passages with {ENCODER} ({already:,} vectors already in the cache)")
    t0 = time.perf_counter()
    vectors = cache.embed(encoder, list(texts), progress=progress)
    embed_s = time.perf_counter() - t0
    new = cache.count(encoder) - already
    out["embedded_now"] = new
    out["embed_s"] = embed_s
    out["embed_passages_per_s"] = new / embed_s if new else None  # None: every vector came from the cache
    # the cache makes the corpus rate vanish on a rerun; a fixed, evenly spaced sample is always encoded afresh
    sample = list(texts[:: max(1, len(texts) // max(1, embed_sample))][:embed_sample])
    if sample:
        t0 = time.perf_counter()
        encoder.encode_docs(sample)
        out["embed_sample_passages_per_s"] = len(sample) / (time.perf_counter() - t0)
    out["embed_sample"] = len(sample)
    set_threads(threads)
    encoder.encode_queries(qs[:4])  # warm-up (loads the query model when it differs from the doc model)
    qvec = encoder.encode_queries(qs)

    log(f"{name}: FAISS flat and HNSW builds, {len(qs)} queries one at a time")
    t0 = time.perf_counter()
    flat = FaissIndex.build(vectors, kind="flat")
    out["flat_build_s"] = time.perf_counter() - t0
    out["flat_build_passages_per_s"] = len(texts) / out["flat_build_s"]
    t0 = time.perf_counter()
    hnsw = FaissIndex.build(vectors, kind="hnsw")
    out["hnsw_build_s"] = time.perf_counter() - t0
    out["hnsw_build_passages_per_s"] = len(texts) / out["hnsw_build_s"]
    out["hnsw_params"] = hnsw.params
    for kind, index in (("flat", flat), ("hnsw", hnsw)):
        index.search(qvec[:8], k)  # warm-up
        stats = one_at_a_time(lambda v, index=index: index.search(v[None, :], k), qvec)
        out.update({f"{kind}_{key}": v for key, v in stats.items()})
    exact, approx = flat.search(qvec, k), hnsw.search(qvec, k)
    out["hnsw_recall_vs_flat"] = float(np.mean(
        [len({r for r, _ in a} & {r for r, _ in e}) / max(1, len(e)) for a, e in zip(approx, exact)]))

    # -- dense end to end: encode the query text, then search HNSW -------------------------------------------
    stats = one_at_a_time(lambda q: hnsw.search(encoder.encode_queries([q]), k), qs)
    out.update({f"dense_end_to_end_{key}": v for key, v in stats.items()})
    t0 = time.perf_counter()
    hnsw.search(encoder.encode_queries(qs), k)
    out["dense_end_to_end_batch_qps"] = len(qs) / (time.perf_counter() - t0)

    out["targets"] = {
        "bm25_qps >= 100": out["bm25_qps"] >= TARGETS["bm25_qps"],
        "bm25 >= 50x rank-bm25": out["bm25_vs_rank_bm25"] >= TARGETS["bm25_vs_rank_bm25"],
        "hnsw p95 <= 10 ms": out["hnsw_p95_ms"] <= TARGETS["hnsw_p95_ms"],
        "hnsw recall@10 >= 0.95 of flat": out["hnsw_recall_vs_flat"] >= TARGETS["hnsw_recall_vs_flat"],
    }
    out["load_avg_1m_start"], out["load_avg_1m_end"] = load0, os.getloadavg()[0]
    out["wall_s"] = time.perf_counter() - start
    return out


def parse_corpus(name: str, world_size: str) -> tuple[str, str | None]:
    """``world`` -> (``world``, ``world_size``); ``world-large`` -> (``world``, ``large``); ``realdata`` as is."""
    if name == "world":
        return "world", world_size
    if name.startswith("world-") and name[len("world-"):] in WORLD_SIZES:
        return "world", name[len("world-"):]
    if name == "realdata":
        return "realdata", None
    raise ValueError(f"unknown corpus {name!r}; expected world, world-<{'|'.join(WORLD_SIZES)}> or realdata")


def bench_retrieval(
    corpora: Sequence[str] = ("world", "realdata"),
    *,
    world_size: str = "large",
    realdata_root: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] = DEFAULT_CACHE,
    n_queries: int = 1000,
    n_reference: int = 20,
    threads: int = 1,
    seed: int = 0,
    k: int = 10,
    embed_sample: int = 256,
    progress: bool = True,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Benchmark each corpus in turn and return ``{hardware, threads, encoder, corpora: [...], skipped}``.

    ``corpora``: ``world`` (of ``world_size``), ``world-<size>`` or ``realdata``. Realdata is read from
    ``realdata_root`` or ``$OMNIMED_REALDATA``; with neither it is skipped, logged and listed in ``skipped``.
    """
    from omnimed.knowledge.embedding_cache import EmbeddingCache
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.models.config import named_model_config

    plan = [parse_corpus(c, world_size) for c in corpora]  # fail on a bad name before any slow work
    encoder = TextEncoder(named_model_config(ENCODER))
    cache = EmbeddingCache(Path(cache_dir))
    result: dict[str, Any] = {"hardware": hardware(), "threads": threads, "encoder": ENCODER, "seed": seed,
                              "cache_dir": str(cache_dir), "targets": TARGETS, "corpora": [], "skipped": {}}
    started = time.perf_counter()
    with LoadSampler() as load:
        for kind, size in plan:
            if kind == "world":
                assert size is not None
                label = f"world-{size}"
                texts, queries = world_corpus(size, seed)
            else:
                root = realdata_root or os.environ.get("OMNIMED_REALDATA")
                if not root:
                    reason = "OMNIMED_REALDATA is not set (e.g. /work/shared/realdata)"
                    log(f"realdata skipped: {reason}; set it to benchmark the real corpora")
                    result["skipped"]["realdata"] = reason
                    continue
                label = "realdata"
                texts, queries = realdata_corpus(Path(root))
            log(f"{label}: {len(texts):,} passages, {sum(map(len, queries.values())):,} candidate queries")
            result["corpora"].append(bench_corpus(
                label, texts, queries, encoder=encoder, cache=cache, n_queries=n_queries, n_reference=n_reference,
                threads=threads, k=k, seed=seed, embed_sample=embed_sample, progress=progress, log=log))
    result["hardware"]["load_avg_1m_end"] = os.getloadavg()[0]
    result["hardware"].update(load.summary())
    result["wall_s"] = time.perf_counter() - started
    return result

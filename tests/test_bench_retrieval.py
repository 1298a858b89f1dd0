"""``omnimed-bench retrieval`` on the tiny world: every measurement is there, counts match the corpus, recall is a
fraction, realdata is skipped without ``OMNIMED_REALDATA``, and the CLI reuses the embedding cache and writes the
JSON. No timing is asserted: the numbers depend on the machine and its load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.bench.retrieval import bench_retrieval, overlap_at_k, parse_corpus, sample_queries
from omnimed.data.world import build_world

BIN = Path(sys.executable).parent
TARGETS = {"bm25_qps >= 100", "bm25 >= 50x rank-bm25", "hnsw p95 <= 10 ms", "hnsw recall@10 >= 0.95 of flat"}
NUMBERS = ("bm25_build_passages_per_s", "bm25_qps", "rank_bm25_qps", "bm25_vs_rank_bm25",
           "bm25_vs_rank_bm25_same_queries", "embed_passages_per_s", "embed_sample_passages_per_s", "flat_build_s",
           "flat_p50_ms", "flat_p95_ms", "flat_qps", "hnsw_build_s", "hnsw_p50_ms", "hnsw_p95_ms", "hnsw_qps",
           "dense_end_to_end_p95_ms", "dense_end_to_end_qps", "dense_end_to_end_batch_qps")


def test_helpers():
    assert parse_corpus("world", "tiny") == ("world", "tiny")
    assert parse_corpus("world-large", "tiny") == ("world", "large")
    assert parse_corpus("realdata", "tiny") == ("realdata", None)
    with pytest.raises(ValueError, match="unknown corpus"):
        parse_corpus("world-huge", "tiny")
    assert overlap_at_k([], []) == 1.0 and overlap_at_k([1, 2], [2, 3]) == 0.5 and overlap_at_k([1], []) == 0.0
    qs = sample_queries({"a": ["a1", "a2"], "b": [f"b{i}" for i in range(50)]}, 10, seed=0)
    assert len(qs) == len(set(qs)) == 10 and {"a1", "a2"} <= set(qs)  # the small pool gives all it has
    assert qs == sample_queries({"a": ["a1", "a2"], "b": [f"b{i}" for i in range(50)]}, 10, seed=0)


def test_bench_retrieval_on_the_tiny_world_then_the_cli_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("OMNIMED_REALDATA", raising=False)
    import torch

    cache, messages = tmp_path / "emb", []
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else threads)  # not the benchmark's 1: its setting must not stay behind
    before = torch.get_num_threads()
    result = bench_retrieval(["world", "realdata"], world_size="tiny", cache_dir=cache, n_queries=20, n_reference=5,
                             embed_sample=16, progress=False, log=messages.append)
    assert torch.get_num_threads() == before  # later tests' float reductions see the threads they had
    torch.set_num_threads(threads)
    world = build_world(0, "tiny")
    (corpus,) = result["corpora"]
    assert corpus["corpus"] == "world-tiny" and corpus["passages"] == len(world.passages)
    assert corpus["queries"] == 20 and corpus["reference_queries"] == 5 and corpus["threads"] == 1
    assert corpus["query_pools"] == {"mcq": len(world.questions), "open": len(world.open_questions)}
    assert corpus["embedded_now"] == len(world.passages)  # a fresh cache embeds every passage once
    assert 0.0 <= corpus["hnsw_recall_vs_flat"] <= 1.0 and 0.0 <= corpus["bm25_top10_overlap_with_rank_bm25"] <= 1.0
    for key in NUMBERS:
        assert corpus[key] > 0, key
    assert set(corpus["targets"]) == TARGETS and all(isinstance(v, bool) for v in corpus["targets"].values())
    assert "realdata" in result["skipped"] and any("realdata skipped" in m for m in messages)
    assert result["hardware"]["cores"] >= 1 and result["hardware"]["load_samples"] >= 2

    # the CLI on the same cache: nothing is embedded again, the table is printed and the JSON written
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "OMNIMED_REALDATA"} | {"COLUMNS": "200"}
    res = subprocess.run([str(BIN / "omnimed-bench"), "retrieval", "--corpora", "world-tiny,realdata",
                          "--queries", "10", "--reference-queries", "3", "--embed-sample", "8", "--cache", str(cache), "--out", str(out)],
                         check=False, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    written = json.loads(out.read_text())
    (again,) = written["corpora"]
    assert again["corpus"] == "world-tiny" and again["passages"] == len(world.passages) and again["queries"] == 10
    assert again["embedded_now"] == 0 and again["embed_passages_per_s"] is None  # all from the cache...
    assert again["embed_sample"] == 8 and again["embed_sample_passages_per_s"] > 0  # ...yet a rate is measured
    assert set(again["targets"]) == TARGETS and "realdata" in written["skipped"]
    printed = res.stdout + res.stderr
    assert "HNSW recall@10 vs flat" in printed and "realdata skipped" in printed
    assert not list(tmp_path.glob(".bench.json*"))  # the atomic write left no temporary file

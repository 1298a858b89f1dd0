"""`omnimed-bench retrieval` on the tiny world: the result holds every measurement and the JSON is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_bench_retrieval_cli_on_the_tiny_world(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([str(BIN / "omnimed-bench"), "retrieval", "--corpora", "world", "--world-size", "tiny",
                          "--queries", "20", "--reference-queries", "5", "--cache", str(tmp_path / "emb"),
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    (corpus,) = result["corpora"]
    assert corpus["corpus"] == "world-tiny" and corpus["passages"] == 201 and corpus["queries"] == 20
    assert corpus["embedded_now"] == 201  # a fresh cache embeds every passage once
    assert 0.0 <= corpus["hnsw_recall_vs_flat"] <= 1.0 and 0.0 <= corpus["bm25_top10_overlap_with_rank_bm25"] <= 1.0
    for key in ("bm25_qps", "rank_bm25_qps", "flat_p95_ms", "hnsw_p95_ms", "dense_end_to_end_qps"):
        assert corpus[key] > 0, key
    assert set(corpus["targets"]) == {"bm25_qps >= 100", "bm25 >= 50x rank-bm25", "hnsw p95 <= 10 ms",
                                      "hnsw recall@10 >= 0.95 of flat"}
    assert "HNSW recall@10 vs flat" in res.stdout + res.stderr

"""Retrieval metrics on hand-made cases, and `omnimed-evaluate task=retrieval` / `omnimed-index` end to end:
metrics.json, per-query predictions, the W&B offline run, index reuse, and real PubMedQA question -> abstract."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.data.records import Passage
from omnimed.evaluation.retrieval import RetrievalQuery, ir_metrics
from omnimed.knowledge.types import Hit

BIN = Path(sys.executable).parent


def _hit(pid: str, rank: int, chunk_of: str | None = None) -> Hit:
    meta = {"chunk_of": chunk_of} if chunk_of else {}
    return Hit(Passage(id=pid, source="wiki", text="t", metadata=meta), 1.0 / rank, rank, "bm25")


def test_ir_metrics_on_a_hand_computed_case():
    queries = [RetrievalQuery("a", "wiki", "q", {"d1"}), RetrievalQuery("b", "wiki", "q", {"d2"})]
    hits = {
        "a": [_hit("d1", 1), _hit("d9", 2)],
        # two chunks of d8 count once: d2 is the second distinct passage
        "b": [_hit("d8#0", 1, "d8"), _hit("d8#1", 2, "d8"), _hit("d2", 3)],
    }
    m = ir_metrics(queries, hits, ks=(1, 2))
    assert m["hit@1"] == pytest.approx(0.5) and m["hit@2"] == pytest.approx(1.0)
    assert m["mrr"] == pytest.approx((1 + 1 / 2) / 2)
    assert m["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 2)


def run(tmp: Path, exe: str, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / exe), f"paths.root={tmp}", *overrides], cwd=tmp, capture_output=True,
                          text=True, timeout=timeout)


def test_evaluate_retrieval_writes_metrics_predictions_and_wandb(tmp_path):
    res = run(tmp_path, "omnimed-evaluate", "task=retrieval", "knowledge=world_tiny", "task.split=null",
              f"hydra.run.dir={tmp_path}/eval")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    for method in ("bm25", "dense", "hybrid", "hybrid+rerank", "graph"):
        for name in ("hit@1", "hit@10", "ndcg@10", "recall@10", "mrr"):
            assert 0.0 <= metrics[f"{method}/{name}"] <= 1.0, (method, name)
        assert method in res.stderr + res.stdout
    assert metrics["bm25/hit@10"] > 0.8  # the tiny world's gold passages are easy to find
    rows = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    text_queries = int(metrics["bm25/queries"])
    assert sum(r["method"] == "bm25" for r in rows) == text_queries
    assert all(r["gold"] and len(r["hits"]) <= 10 for r in rows)
    (run_file,) = (tmp_path / "eval" / "wandb").glob("offline-run-*/run-*.wandb")
    summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json", str(run_file)],
                                        capture_output=True, text=True, check=True).stdout)
    assert summary["summary"]["bm25/ndcg@10"] == pytest.approx(metrics["bm25/ndcg@10"])
    assert summary["config"]["group"] == "retrieval-world_tiny"

    index = run(tmp_path, "omnimed-index", "knowledge=world_tiny", f"hydra.run.dir={tmp_path}/index")
    assert index.returncode == 0, index.stderr[-2000:]
    assert (index.stdout + index.stderr).count("nothing (reused)") == 5  # the evaluation built them already


def test_unknown_knowledge_option_lists_the_choices(tmp_path):
    res = run(tmp_path, "omnimed-index", "knowledge=nope", f"hydra.run.dir={tmp_path}/x")
    assert res.returncode != 0
    assert "world_small" in res.stderr and "realdata" in res.stderr


@pytest.mark.realdata
def test_bm25_finds_real_pubmedqa_abstracts(tmp_path, realdata):
    res = run(tmp_path, "omnimed-evaluate", "task=retrieval", "knowledge=realdata", f"knowledge.realdata_root={realdata}",
              "task.queries=pubmedqa", "task.split=null", "knowledge.sources=[research]", "knowledge.indexes=[bm25]",
              "knowledge.retriever=bm25", "task.methods=[bm25]", "logger=none", f"hydra.run.dir={tmp_path}/real")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "real" / "metrics.json").read_text())
    assert metrics["bm25/queries"] == 1000
    # measured 2026-11-22: hit@1 0.955, hit@10 0.988, ndcg@10 0.973, MRR 0.968
    assert metrics["bm25/hit@10"] > 0.9 and metrics["bm25/mrr"] > 0.85

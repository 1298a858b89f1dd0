"""Retrieval in PolyEVAL's setting (every method ranks the same candidate pool per question) and on real relevance
labels users bring: a BioASQ golden file of any year (its snippets are the corpus) and MedQuAD question -> answer
passages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from omnimed.data.records import Passage
from omnimed.knowledge.pools import PoolRanker, with_gold

BIN = Path(sys.executable).parent


def run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), f"paths.root={tmp}", *args[1:]], cwd=tmp, capture_output=True,
                          text=True, timeout=600, check=False, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"})


def _p(pid: str, text: str) -> Passage:
    return Passage(id=pid, source="research", text=text)


# ------------------------------------------------------------------------------------------------ pools
def test_gold_joins_a_pool_once_at_a_position_fixed_by_its_key():
    table = {f"d{i}": _p(f"d{i}", f"text {i}") for i in range(8)}
    cands = [table[f"d{i}"] for i in range(5)]
    a = with_gold(cands, ["d6", "d2"], table, "q1")  # d2 is already a candidate: not added twice
    assert sorted(p.id for p in a) == ["d0", "d1", "d2", "d3", "d4", "d6"]
    assert [p.id for p in with_gold(cands, ["d6", "d2"], table, "q1")] == [p.id for p in a]
    positions = {[p.id for p in with_gold(cands, ["d6"], table, f"q{i}")].index("d6") for i in range(40)}
    assert len(positions) > 3  # not always appended: where a gold sits says nothing about it


def test_pool_bm25_ranks_every_passage_and_puts_the_lexical_match_first():
    kb = SimpleNamespace(cfg=SimpleNamespace(sparse=SimpleNamespace(method="lucene", k1=1.5, b=0.75,
                                                                    stemmer="english", stopwords="en"),
                                             fusion_k=60, name="tiny"), encoder=None, reranker=None)
    pool = [_p("a", "insulin lowers blood glucose"), _p("b", "the femur is a bone of the thigh"),
            _p("c", "aspirin inhibits platelet aggregation")]
    hits = PoolRanker(kb).rank("which bone is in the thigh", pool, "bm25", 3)
    assert hits[0].passage.id == "b" and len(hits) == 3  # no-overlap passages come last, not dropped
    with pytest.raises(Exception, match="dense encoder"):
        PoolRanker(kb).rank("thigh bone", pool, "dense", 3)
    with pytest.raises(Exception, match="unknown pool ranking 'bm26'"):
        PoolRanker(kb).rank("thigh bone", pool, "bm26", 3)


def test_every_method_ranks_the_same_pool_holding_the_gold(tmp_path):
    res = run(tmp_path, "omnimed-evaluate", "task=retrieval", "knowledge=world_tiny", "task.split=null",
              "task.candidates=4", "task.methods=[bm25,dense,hybrid]", "logger=none", f"hydra.run.dir={tmp_path}/e")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert rows and all(r["query_id"].endswith("@pool") and r["source"] == "pool" for r in rows)
    for method in ("bm25", "dense", "hybrid"):
        # a pool is 4 searched passages per source fused to 4, plus the gold: all of it fits in k=10
        assert metrics[f"{method}/hit@10"] == pytest.approx(1.0), method
    orders: dict[str, list[list[str]]] = {}
    for r in rows:  # the same passages, in each method's own order
        orders.setdefault(r["query_id"], []).append([h["id"] for h in r["hits"]])
    assert all(len(v) == 3 and sorted(v[0]) == sorted(v[1]) == sorted(v[2]) for v in orders.values())
    assert any(v[0] != v[1] for v in orders.values())  # bm25 and dense order them differently


# ------------------------------------------------------------------------------------------------ BioASQ
GOLDEN = {"questions": [
    {"id": "q1", "type": "yesno", "body": "Does drizolamab block the quorvex receptor?", "exact_answer": "yes",
     "ideal_answer": ["Yes."], "documents": ["http://www.ncbi.nlm.nih.gov/pubmed/111"],
     "snippets": [{"text": "Drizolamab binds and blocks the quorvex receptor in cultured cells.",
                   "document": "http://www.ncbi.nlm.nih.gov/pubmed/111", "offsetInBeginSection": 0,
                   "offsetInEndSection": 66, "beginSection": "abstract"}]},
    {"id": "q2", "type": "factoid", "body": "Which enzyme cleaves plantosin?", "exact_answer": [["lumase"]],
     "ideal_answer": ["Lumase."], "documents": ["http://www.ncbi.nlm.nih.gov/pubmed/222"],
     "snippets": [{"text": "Plantosin is cleaved by lumase, a serine protease of the gut.",
                   "document": "http://www.ncbi.nlm.nih.gov/pubmed/222", "offsetInBeginSection": 10,
                   "offsetInEndSection": 70, "beginSection": "abstract"},
                  {"text": "Lumase knockout mice accumulate plantosin.",
                   "document": "http://www.ncbi.nlm.nih.gov/pubmed/223", "offsetInBeginSection": 0,
                   "offsetInEndSection": 42, "beginSection": "abstract"}]},
    {"id": "q3", "type": "summary", "body": "What is the role of tervexin in sleep?", "ideal_answer": ["It..."],
     "documents": ["http://www.ncbi.nlm.nih.gov/pubmed/333"],
     "snippets": [{"text": "Tervexin neurons fire during sleep onset and promote slow-wave sleep.",
                   "document": "http://www.ncbi.nlm.nih.gov/pubmed/333", "offsetInBeginSection": 5,
                   "offsetInEndSection": 74, "beginSection": "abstract"}]},
]}


def test_a_bioasq_golden_file_is_its_own_corpus_and_relevance_labels(tmp_path):
    golden = tmp_path / "my_golden.json"
    golden.write_text(json.dumps(GOLDEN))
    args = ("omnimed-evaluate", "task=retrieval", "knowledge=world_tiny", "knowledge.indexes=[bm25]",
            "knowledge.retriever=bm25", "task.queries=bioasq", f"task.file={golden}", "task.methods=[bm25]",
            "logger=none")
    res = run(tmp_path, *args, f"hydra.run.dir={tmp_path}/e")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["bm25/queries"] == 3 and metrics["bm25/hit@1"] == pytest.approx(1.0)
    assert metrics["bm25/recall@5"] == pytest.approx(1.0)  # q2's two snippets both found
    rows = [json.loads(line) for line in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert {r["query_id"] for r in rows} == {"bioasq/q1@research", "bioasq/q2@research", "bioasq/q3@research"}
    # only the file's snippets are searched: no world passage is ever a hit
    assert all(h["id"].startswith("pubmed/") for r in rows for h in r["hits"])

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"questions": [{"id": "x", "type": "yesno", "body": "b?", "exact_answer": "perhaps",
                                              "snippets": []}]}))
    from omnimed.data.errors import RecordError
    from omnimed.evaluation.retrieval import bioasq_knowledge

    with pytest.raises(RecordError, match=r"bad\.json.*exact_answer"):
        bioasq_knowledge(SimpleNamespace(file=str(bad)), None, tmp_path)
    with pytest.raises(ValueError, match="set task.file=PATH"):
        bioasq_knowledge(SimpleNamespace(file=None), None, tmp_path)


# ------------------------------------------------------------------------------------------------ MedQuAD
@pytest.mark.realdata
def test_medquad_questions_find_their_answer_passages(tmp_path, realdata):
    res = run(tmp_path, "omnimed-evaluate", "task=retrieval", "knowledge=realdata",
              f"knowledge.realdata_root={realdata}", "task.queries=medquad", "task.split=null",
              "task.max_queries=300", "knowledge.sources=[wiki]", "knowledge.indexes=[bm25]",
              "knowledge.retriever=bm25", "task.methods=[bm25]", "logger=none", f"hydra.run.dir={tmp_path}/m")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert metrics["bm25/queries"] == 300
    rows = [json.loads(line) for line in (tmp_path / "m" / "predictions.jsonl").read_text().splitlines()]
    assert all(r["source"] == "wiki" and r["gold"] for r in rows)
    # measured 2026-11-26 (300 sampled questions, answers chunked at <= 1000 chars): hit@1 0.280, hit@10 0.870,
    # MRR 0.466 (many questions share a template across diseases); the floors sit 0.15 below
    assert metrics["bm25/hit@10"] > 0.72 and metrics["bm25/mrr"] > 0.31


def test_a_retrained_export_at_the_same_path_gets_a_new_encoder_fingerprint(tmp_path):
    """Rankers' passage vectors are cached on disk by encoder fingerprint: a local model folder's fingerprint
    follows its weights, so retraining into the same folder cannot serve the old vectors."""
    from omnimed.knowledge.encoders import _model_entry
    from omnimed.models.config import named_model_config

    export = tmp_path / "hf"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"first weights")
    cfg = named_model_config(str(export))
    first = _model_entry(cfg)
    assert first["weights"] == _model_entry(cfg)["weights"]
    (export / "model.safetensors").write_bytes(b"retrained weights")
    assert _model_entry(cfg)["weights"] != first["weights"]
    assert "weights" not in _model_entry(named_model_config("minilm-l6"))  # a packaged model has its version

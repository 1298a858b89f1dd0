"""``omnimed-evaluate task=world_calibration``: its pieces on hand-made hits (a wrong source without a leaking
passage scores 0, recency, the targets) and one end-to-end run on world_tiny with the oracle reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.data.records import Passage
from omnimed.evaluation.calibration import (
    check_targets,
    kind_of,
    leaks,
    means,
    outdated_first,
    question_hits,
    source_rates,
)
from omnimed.evaluation.retrieval import RetrievalQuery
from omnimed.knowledge.types import Hit

BIN = Path(sys.executable).parent
KINDS = ("diagnosis", "treatment", "mechanism", "research_finding", "examination")


def _hit(pid: str, rank: int, source: str = "book", **meta) -> Hit:
    return Hit(Passage(id=pid, source=source, text="t", metadata=meta), 10.0 - rank, rank, "bm25")


# ------------------------------------------------------------------------------------------------ pieces
def test_a_wrong_source_without_a_leaking_passage_scores_zero():
    # the subject alone, the answer alone, or a leaking passage below the top k: no leak
    clean = [_hit("book:1", 1, entities=["DIS1"]), _hit("book:2", 2, entities=["DRG1"]),
             _hit("book:3", 3), _hit("book:4", 4, entities=["DIS1", "DRG1"])]
    assert not leaks(clean, "DIS1", "DRG1", {}, k=3)
    rates = source_rates({"q1": True}, {"q1": {"book": leaks(clean, "DIS1", "DRG1", {}, k=3)}}, k=3)
    assert rates["source/wrong_hit@3"] == 0.0 and rates["source/any_wrong_hit@3"] == 0.0
    assert rates["source/gold_hit@3"] == 1.0 and rates["source/wrong_pairs"] == 1.0
    # a passage naming both leaks; its entities are read from the passage it was cut from when given
    assert leaks(clean, "DIS1", "DRG1", {}, k=4)
    assert leaks([_hit("wiki:9#0", 1, chunk_of="wiki:9")], "DIS1", "DRG1", {"wiki:9": ["DRG1", "DIS1"]}, k=3)
    rates = source_rates({"q1": True, "q2": False}, {"q1": {"book": False, "wiki": True}, "q2": {"book": False}}, 3)
    assert rates["source/wrong_hit@3"] == pytest.approx(1 / 3) and rates["source/any_wrong_hit@3"] == 0.5
    assert rates["source/wiki/wrong_hit@3"] == 1.0 and rates["source/book/wrong_hit@3"] == 0.0
    assert rates["source/gold_hit@3"] == 0.5


def test_question_hits_take_any_gold_source_and_means_go_per_kind():
    queries = [RetrievalQuery("q1@wiki", "wiki", "x", {"wiki:1"}), RetrievalQuery("q1@book", "book", "x", {"book:1"}),
               RetrievalQuery("q2@wiki", "wiki", "y", {"wiki:2"})]
    hits = {"q1@wiki": [_hit("wiki:7", 1)], "q1@book": [_hit("book:5", 1), _hit("book:1#0", 2, chunk_of="book:1")],
            "q2@wiki": [_hit("wiki:8", 1), _hit("wiki:9", 2), _hit("wiki:2", 3)]}
    assert question_hits(queries, hits, k=2) == {"q1": True, "q2": False}
    assert question_hits(queries, hits, k=3) == {"q1": True, "q2": True}
    m = means({"q1": 1.0, "q2": 0.0, "q3": 1.0}, {"q1": "research finding", "q2": "treatment", "q3": "treatment"},
              "bm25", "hit@3")
    assert m == {"bm25/hit@3": pytest.approx(2 / 3), "bm25/research_finding/hit@3": 1.0, "bm25/treatment/hit@3": 0.5}


def test_recency_looks_at_the_first_current_or_superseded_guideline_of_the_disease():
    meta = {"g:old": {"about": ["DIS1"], "status": "superseded"}, "g:new": {"about": ["DIS1"], "status": "current"},
            "g:adopt": {"about": "DIS1", "status": "adoption"}, "g:other": {"about": ["DIS2"], "status": "current"}}
    ranked = [_hit(pid, r, "guideline") for r, pid in enumerate(("g:other", "g:adopt", "g:old", "g:new"), 1)]
    assert outdated_first(ranked, "DIS1", meta)
    assert not outdated_first([ranked[3], ranked[2]], "DIS1", meta)
    assert not outdated_first(ranked[:2], "DIS1", meta)  # neither is there


def test_targets_pass_and_fail_on_their_bounds_and_skip_what_was_not_measured():
    m = {"bm25/hit@3": 0.5, "bm25/diagnosis/hit@3": 0.4, "dense/diagnosis/hit@3": 0.46, "dense/hit@3": 0.5,
         "source/wrong_hit@3": 0.25, "reader/gold/accuracy": 0.8, "reader/retrieved/accuracy": 0.5,
         "reader/none/accuracy": 0.3, "reader/none/knowledge_accuracy": 0.34, "reader/knowledge_chance": 0.25}
    got = {name: ok for name, _, _, ok in check_targets(m, 3)}
    assert got == {"bm25_hit": True, "method_gap": True, "wrong_source": False, "reader_gold": True,
                   "reader_none": True, "reader_retrieved": True}
    retrieval_only = {"bm25/hit@3": 0.8, "bm25/diagnosis/hit@3": 0.8, "hybrid/diagnosis/hit@3": 0.82}
    assert {name: ok for name, _, _, ok in check_targets(retrieval_only, 3)} == {"bm25_hit": False,
                                                                                "method_gap": False}


# ------------------------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One ``omnimed-evaluate task=world_calibration`` run on every world_tiny question, read by the oracle."""
    tmp = tmp_path_factory.mktemp("calibration")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    res = subprocess.run([str(BIN / "omnimed-evaluate"), f"paths.root={tmp}", "task=world_calibration",
                          "knowledge=world_tiny", "backend=oracle", "logger=none", "task.split=null",
                          f"hydra.run.dir={tmp}/eval"], cwd=tmp, capture_output=True, text=True, timeout=400, env=env,
                         check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics = json.loads((tmp / "eval" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp / "eval" / "predictions.jsonl").read_text().splitlines()]
    return res, metrics, rows


def test_the_report_writes_every_part_and_its_targets(calibrated, world_tiny):
    res, m, _ = calibrated
    kinds = {kind_of(q).replace(" ", "_") for q in world_tiny.questions}
    knowledge = [q for q in world_tiny.questions if q.gold_passages]  # self-contained ones are not searched
    assert set(KINDS) <= kinds
    for method in ("bm25", "dense", "hybrid"):
        for key in (f"{method}/hit@3", *(f"{method}/{kind_of(q).replace(' ', '_')}/hit@3" for q in knowledge)):
            assert 0.0 <= m[key] <= 1.0, key
    for key in ("source/gold_hit@3", "source/wrong_hit@3", "source/any_wrong_hit@3", "recency/outdated_above_current"):
        assert 0.0 <= m[key] <= 1.0, key
    assert 0 < m["retrieval/questions"] == m["source/questions"] <= len(knowledge)
    assert m["reader/questions"] == len(world_tiny.questions) and m["recency/questions"] > 0
    for condition in ("gold", "retrieved", "none"):
        assert all(0.0 <= m[f"reader/{condition}/{kind}/accuracy"] <= 1.0 for kind in kinds)
    assert m["reader/chance"] == pytest.approx(sum(1 / len(q.options) for q in world_tiny.questions)
                                               / len(world_tiny.questions))
    targets = {k.removeprefix("targets/"): v for k, v in m.items() if k.startswith("targets/")}
    assert set(targets) == {"bm25_hit", "method_gap", "wrong_source", "reader_gold", "reader_none",
                            "reader_retrieved"} and set(targets.values()) <= {0.0, 1.0}
    failed = {name for name, v in targets.items() if v == 0.0}
    output = res.stdout + res.stderr
    assert "targets (world size small)" in output
    summary = next(line for line in output.splitlines() if line.startswith(("targets failed:", "all ")))
    assert set(summary.removeprefix("targets failed: ").split(", ")) == failed if failed else "met" in summary


def test_the_oracle_reader_given_the_gold_passages_is_always_right(calibrated, world_tiny):
    _, m, rows = calibrated
    assert m["reader/gold/accuracy"] == 1.0 and m["targets/reader_gold"] == 1.0
    gold = {q.id: q.gold_passages for q in world_tiny.questions}
    shown = {r["question_id"]: r["evidence"] for r in rows if r["part"] == "reader" and r["condition"] == "gold"}
    assert shown == gold  # the reader was handed exactly the gold passages
    assert all(not r["evidence"] for r in rows if r["part"] == "reader" and r["condition"] == "none")


def test_reader_false_is_a_retrieval_only_calibration(tmp_path, world_tiny):
    """In process, BM25 alone and no reader: no reader keys, and only the targets it measured."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from omnimed.conf import conf_dir
    from omnimed.evaluation.calibration import run_calibration
    from omnimed.evaluation.config import register_evaluate_configs

    register_evaluate_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("evaluate", overrides=[
            "task=world_calibration", "knowledge=world_tiny", "knowledge.indexes=[bm25]", "knowledge.retriever=bm25",
            "task.methods=[bm25]", "task.source_method=bm25", "task.reader=false", "task.kinds=[treatment]",
            "task.split=null", "logger=none", f"paths.root={tmp_path}", f"paths.output_dir={tmp_path}"])
    result = run_calibration(OmegaConf.to_object(cfg), tmp_path)
    m = result.metrics
    assert not any(key.startswith(("reader/", "dense/", "hybrid/")) for key in m)
    assert set(k for k in m if k.startswith("targets/")) == {"targets/bm25_hit", "targets/wrong_source"}
    treatment = [q for q in world_tiny.questions if q.metadata["kind"] == "treatment"]
    assert m["retrieval/questions"] == m["retrieval/treatment/questions"] <= len(treatment)
    assert 0.0 <= m["bm25/treatment/hit@3"] <= 1.0 and m["recency/questions"] > 0
    assert (tmp_path / "metrics.json").is_file()

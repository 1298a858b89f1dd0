"""Retrieval evaluation: the IR metrics on hand-computed cases, the world's (query, gold) sets, and
``omnimed-evaluate task=retrieval`` / ``omnimed-index`` end to end on world_tiny (metrics.json, one prediction row
per method and query, the W&B offline run, the printed table, index reuse), plus BM25 on real PubMedQA
question -> abstract pairs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.data.records import Passage
from omnimed.data.world import build_world
from omnimed.evaluation.retrieval import RetrievalQuery, ir_metrics, prediction_rows, world_queries
from omnimed.knowledge.types import Hit

BIN = Path(sys.executable).parent
WORLD_METHODS = ("bm25", "dense", "hybrid", "hybrid+rerank", "graph")
METRICS = ("hit@1", "hit@5", "hit@10", "ndcg@10", "recall@10", "mrr")


def _hit(pid: str, rank: int, chunk_of: str | None = None) -> Hit:
    meta = {"chunk_of": chunk_of} if chunk_of else {}
    return Hit(Passage(id=pid, source="wiki", text="t", metadata=meta), 10.0 - rank, rank, "bm25")


# ------------------------------------------------------------------------------------------------ metrics
def test_ir_metrics_on_a_hand_computed_case():
    queries = [RetrievalQuery("a", "wiki", "q", {"d1"}), RetrievalQuery("b", "wiki", "q", {"d2"})]
    hits = {
        "a": [_hit("d1", 1), _hit("d9", 2)],
        # two chunks of d8 count once: d2 is the second distinct passage, not the third
        "b": [_hit("d8#0", 1, "d8"), _hit("d8#1", 2, "d8"), _hit("d2", 3)],
    }
    m = ir_metrics(queries, hits, ks=(1, 2))
    assert m["hit@1"] == pytest.approx(0.5) and m["hit@2"] == pytest.approx(1.0)
    assert m["mrr"] == pytest.approx(0.75)
    assert m["ndcg@1"] == pytest.approx(0.5)
    assert m["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert m["recall@2"] == pytest.approx(1.0)
    assert set(m) == {"hit@1", "hit@2", "ndcg@1", "ndcg@2", "recall@1", "recall@2", "mrr"}


def test_ir_metrics_recall_of_several_golds_and_a_query_without_hits():
    queries = [
        RetrievalQuery("a", "wiki", "q", {"g1", "g2"}),  # one of two golds found, at rank 2
        RetrievalQuery("b", "wiki", "q", {"g3"}),  # nothing retrieved: counts as a miss, not left out
    ]
    hits = {"a": [_hit("x", 1), _hit("g1#0", 2, "g1"), _hit("g1#1", 3, "g1")], "b": []}
    m = ir_metrics(queries, hits, ks=(1, 3))
    assert m["recall@3"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["hit@1"] == 0.0 and m["hit@3"] == pytest.approx(0.5)
    assert m["mrr"] == pytest.approx((0.5 + 0.0) / 2)
    ideal = 1 + 1 / math.log2(3)  # two golds: ideal DCG@3
    assert m["ndcg@3"] == pytest.approx((1 / math.log2(3)) / ideal / 2)


def test_prediction_rows_give_the_first_gold_rank():
    queries = [RetrievalQuery("a", "wiki", "qa", {"d2"}), RetrievalQuery("b", "wiki", "qb", {"zz"})]
    hits = {"bm25": {"a": [_hit("d1", 1), _hit("d2#0", 2, "d2")], "b": [_hit("d1", 1)]}}
    rows = prediction_rows(queries, hits)
    assert [(r["query_id"], r["first_gold_rank"]) for r in rows] == [("a", 2), ("b", None)]
    assert rows[0]["hits"][1] == {"id": "d2#0", "doc_id": "d2", "score": 8.0} and rows[0]["gold"] == ["d2"]


def test_world_queries_split_by_gold_source_and_name_the_graph_subject():
    world = build_world(0, "tiny")
    names = {e.id: e.name for e in world.model.entities.values()}
    question = world.questions[0]  # gold in wiki and graph
    assert {p.split(":", 1)[0] for p in question.gold_passages} == {"wiki", "graph"}
    queries = {q.source: q for q in world_queries([question], ["wiki", "graph"], entity_names=names)}
    assert queries["wiki"].text == question.question and queries["wiki"].id == f"{question.id}@wiki"
    assert queries["graph"].text == f"{names[question.metadata['subject']]} , {question.question}"
    assert queries["graph"].gold == {p for p in question.gold_passages if p.startswith("graph:")}
    assert [q.source for q in world_queries([question], ["wiki"], entity_names=names)] == ["wiki"]


# ------------------------------------------------------------------------------------------------ CLIs
def run(tmp: Path, exe: str, *overrides: str, timeout: int = 400) -> subprocess.CompletedProcess:
    # one torch thread: on a shared 2-core machine two spinning threads make MiniLM several times slower
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run([str(BIN / exe), f"paths.root={tmp}", *overrides], cwd=tmp, capture_output=True,
                          text=True, timeout=timeout, env=env)


def index_files(root: Path) -> dict[str, int]:
    """Every index file of world_tiny with its mtime (the base's own manifest.json is rewritten by design)."""
    base = root / "indexes" / "world_tiny"
    return {str(p.relative_to(base)): p.stat().st_mtime_ns for p in base.rglob("*")
            if p.is_file() and p != base / "manifest.json"}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One ``omnimed-evaluate task=retrieval knowledge=world_tiny`` run over every world question (W&B offline)."""
    tmp = tmp_path_factory.mktemp("retrieval")
    res = run(tmp, "omnimed-evaluate", "task=retrieval", "knowledge=world_tiny", "task.split=null",
              f"hydra.run.dir={tmp}/eval")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics = json.loads((tmp / "eval" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp / "eval" / "predictions.jsonl").read_text().splitlines()]
    return tmp, res, metrics, rows


def test_the_report_keeps_every_header_whole_at_80_columns():
    from types import SimpleNamespace

    from rich.console import Console

    from omnimed.evaluation.retrieval import SHOWN, RetrievalResult, report

    row = {"queries": 500, **dict.fromkeys(METRICS, 0.123)}
    result = RetrievalResult({m: row for m in ("bm25", "dense", "hybrid+rerank")}, "out", None)
    console = Console(width=80, record=True)
    report(result, SimpleNamespace(knowledge=SimpleNamespace(name="world_table"),
                                   task=SimpleNamespace(queries="world_treatment")), console)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    header = next(line for line in text.splitlines() if "method" in line)
    assert header.split() == ["method", *SHOWN] and "…" not in text


def test_building_and_searching_the_indexes_prints_no_library_chatter(evaluated):
    """The evaluation builds BM25, FAISS and the graph and searches them without bm25s's DEBUG lines or FAISS's
    loader narrating the instruction sets it could not load."""
    _, res, _, _ = evaluated
    output = res.stdout + res.stderr
    for chatter in ("[bm25s][DEBUG]", "faiss.loader", "ModuleNotFoundError"):
        assert chatter not in output, chatter


def test_evaluate_writes_metrics_of_every_method(evaluated):
    _, _, metrics, _ = evaluated
    for method in WORLD_METHODS:
        assert metrics[f"{method}/queries"] > 0
        for name in METRICS:
            assert 0.0 <= metrics[f"{method}/{name}"] <= 1.0, (method, name)
    for source in ("book", "guideline", "research", "wiki"):  # per-source breakdown of the text methods
        assert 0.0 <= metrics[f"hybrid/{source}/ndcg@10"] <= 1.0
    # every world question has its text gold in the tiny sources, and the base finds them
    assert metrics["bm25/queries"] == metrics["dense/queries"] == metrics["hybrid+rerank/queries"]
    assert metrics["bm25/hit@10"] > 0.9 and metrics["hybrid/hit@10"] > 0.9 and metrics["graph/hit@1"] > 0.9


def test_evaluate_writes_one_prediction_row_per_method_and_query(evaluated):
    _, _, metrics, rows = evaluated
    keys = [(r["method"], r["query_id"]) for r in rows]
    assert len(keys) == len(set(keys))
    for method in WORLD_METHODS:
        mine = [r for r in rows if r["method"] == method]
        assert len(mine) == metrics[f"{method}/queries"], method
        for r in mine:
            assert r["gold"] and r["query"] and 0 < len(r["hits"]) <= 10
            doc_ids = [h["doc_id"] for h in r["hits"]]
            first = next((i for i, d in enumerate(doc_ids, start=1) if d in r["gold"]), None)
            assert r["first_gold_rank"] == first
            assert all(h["id"] and isinstance(h["score"], float) for h in r["hits"])
        # the rows are the evidence behind the numbers: HIT@10 and MRR recomputed from them agree
        ranks = [r["first_gold_rank"] for r in mine]
        assert sum(r is not None for r in ranks) / len(ranks) == pytest.approx(metrics[f"{method}/hit@10"])
        assert sum(1 / r for r in ranks if r) / len(ranks) == pytest.approx(metrics[f"{method}/mrr"])
    assert all(r["source"] == "graph" and " , " in r["query"] for r in rows if r["method"] == "graph")


def test_evaluate_logs_the_same_numbers_to_wandb_and_prints_every_method(evaluated):
    tmp, res, metrics, _ = evaluated
    (run_file,) = (tmp / "eval" / "wandb").glob("offline-run-*/run-*.wandb")
    summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json", str(run_file)],
                                        capture_output=True, text=True, check=True).stdout)
    assert summary["summary"]["bm25/ndcg@10"] == pytest.approx(metrics["bm25/ndcg@10"], rel=1e-9)
    assert summary["summary"]["graph/mrr"] == pytest.approx(metrics["graph/mrr"], rel=1e-9)
    assert summary["config"]["config"]["knowledge"]["name"] == "world_tiny"
    output = res.stdout + res.stderr
    for method in WORLD_METHODS:
        row = re.search(rf"^\s*{re.escape(method)}\s+(\d+)\s+([\d.]+)", output, re.M)
        assert row, (method, output[-3000:])
        assert int(row.group(1)) == metrics[f"{method}/queries"]
        assert float(row.group(2)) == pytest.approx(metrics[f"{method}/hit@1"], abs=5e-4)
    assert "metrics.json and predictions.jsonl in" in output


def test_index_cli_reuses_what_the_evaluation_built(evaluated):
    tmp, _, _, _ = evaluated
    before = index_files(tmp)
    assert any(name.endswith(".sqlite") for name in before) and any("/dense-" in name for name in before)
    res = run(tmp, "omnimed-index", "knowledge=world_tiny", f"hydra.run.dir={tmp}/index")
    assert res.returncode == 0, res.stderr[-3000:]
    output = res.stdout + res.stderr
    assert "omnimed-index: world_tiny" in output
    for source in ("book", "guideline", "research", "wiki", "graph"):
        assert re.search(rf"│ {source}\s+│.*nothing \(reused\)", output), (source, output[-3000:])
    assert index_files(tmp) == before  # no index file was rewritten


def test_unknown_knowledge_option_lists_the_available_ones():
    from hydra import compose, initialize_config_dir
    from hydra.errors import MissingConfigException

    from omnimed.conf import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.knowledge.config import register_index_configs

    register_evaluate_configs()
    register_index_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        assert compose("index", overrides=["knowledge=world_tiny"]).knowledge.world_size == "tiny"
        for config in ("index", "evaluate"):
            with pytest.raises(MissingConfigException) as info:
                compose(config, overrides=["knowledge=world_huge"])
            message = str(info.value)
            assert "world_huge" in message
            for option in ("world_tiny", "world_small", "world_large", "realdata", "medomnikb"):
                assert option in message, message


# ------------------------------------------------------------------------------------------------ real data
@pytest.mark.realdata
def test_bm25_finds_real_pubmedqa_abstracts(tmp_path, realdata):
    res = run(tmp_path, "omnimed-evaluate", "task=retrieval", "knowledge=realdata",
              f"knowledge.realdata_root={realdata}", "task.queries=pubmedqa", "task.split=null",
              "knowledge.sources=[research]", "knowledge.indexes=[bm25]", "knowledge.retriever=bm25",
              "task.methods=[bm25]", "logger=none", f"hydra.run.dir={tmp_path}/real")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "real" / "metrics.json").read_text())
    assert metrics["bm25/queries"] == 1000
    # measured 2026-11-22 (PubMedQA ori_pqal, abstracts chunked at <= 1000 chars): hit@1 0.955, hit@10 0.988,
    # ndcg@10 0.973, MRR 0.968; the floors sit 0.15 below
    assert metrics["bm25/hit@1"] > 0.80 and metrics["bm25/hit@10"] > 0.83
    assert metrics["bm25/ndcg@10"] > 0.82 and metrics["bm25/mrr"] > 0.81
    rows = [json.loads(line) for line in (tmp_path / "real" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 1000 and all(len(r["gold"]) == 1 and r["source"] == "research" for r in rows)
    assert not list(tmp_path.glob("real/wandb"))  # logger=none


def test_each_job_of_an_in_process_sweep_has_its_own_wandb_run(tmp_path):
    """Hydra's basic launcher runs a sweep's jobs in one process: each job's W&B run must be its own, in its own
    folder, with its own numbers (an unfinished run would swallow the next job's logging)."""
    res = subprocess.run([str(BIN / "omnimed-evaluate"), "-m", f"paths.root={tmp_path}", "task=retrieval",
                          "knowledge=world_tiny", "task.split=null", "task.methods=[bm25],[dense]",
                          f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    jobs = sorted((tmp_path / "sweep").glob("*_*"))
    assert len(jobs) == 2
    for job, method, other in zip(jobs, ("bm25", "dense"), ("dense", "bm25")):
        (run_file,) = job.glob("wandb/offline-run-*/run-*.wandb")  # exactly one run per job folder
        summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json",
                                             str(run_file)], capture_output=True, text=True, check=True).stdout)
        metrics = json.loads((job / "metrics.json").read_text())
        assert summary["summary"][f"{method}/ndcg@10"] == pytest.approx(metrics[f"{method}/ndcg@10"], rel=1e-9)
        assert not any(k.startswith(f"{other}/") for k in summary["summary"]), (job.name, sorted(summary["summary"]))


def test_an_evaluation_logs_to_wandb_without_importing_lightning(tmp_path):
    """Jobs that do not train log through a plain W&B run: importing Lightning for its logger took 6 of a BM25
    evaluation's 13 s (and 380 MB). The run still holds the config and the metrics."""
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('lightning imported:', 'lightning' in sys.modules))\n"
             "from omnimed.cli.evaluate import main\n"
             "main()\n")
    res = subprocess.run([sys.executable, "-c", probe, f"paths.root={tmp_path}", "task=retrieval",
                          "knowledge=world_tiny", "knowledge.indexes=[bm25]", "knowledge.retriever=bm25",
                          "task.methods=[bm25]", "logger=wandb", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "lightning imported: False" in res.stdout
    (run_file,) = (tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb")
    summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json",
                                         str(run_file)], capture_output=True, text=True, check=True).stdout)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert summary["summary"]["bm25/book/ndcg@10"] == pytest.approx(metrics["bm25/book/ndcg@10"], rel=1e-9)
    assert summary["config"]["config"]["task"]["methods"] == ["bm25"]

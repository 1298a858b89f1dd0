"""``omnimed-bench polyview`` (PolyRAG's per-query latency with every view) and ``omnimed-bench distill`` (our
distillation step against ``SentenceTransformerTrainer``) on the tiny world, one thread, a few queries and steps."""

from __future__ import annotations

import json
import math

import pytest
import torch


@pytest.fixture
def keep_threads():
    """The benches set torch's thread count in this process: put it back for the tests after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_cli_reads_the_polyview_and_distill_options(monkeypatch):
    from omnimed.cli.bench import _parser, run_distill

    v = _parser().parse_args(["polyview"])
    assert (v.queries, v.warmup, v.candidates, v.threads, v.goal_ms) == (20, 2, 15, 2, 200.0)
    assert (v.relevance_judge, v.supplement_judge, v.utility_encoder) == ("smollm2-135m", "smollm2-135m", "minilm-l6")
    v = _parser().parse_args(["polyview", "--relevance-judge", "/exports/judge", "--utility-encoder", "/exports/u"])
    assert v.relevance_judge == "/exports/judge" and v.utility_encoder == "/exports/u"
    assert (v.device, v.dtype, v.batch_size) == ("cpu", None, 8)
    v = _parser().parse_args(["polyview", "--device", "cuda", "--dtype", "bfloat16", "--batch-size", "16"])
    assert (v.device, v.dtype, v.batch_size) == ("cuda", "bfloat16", 16)
    d = _parser().parse_args(["distill"])
    assert (d.steps, d.warmup, d.batch_size, d.window, d.threads) == (20, 3, 4, 8, 2)
    assert d.dropout and d.isolate and d.sides == ["ours", "st"] and d.goal_ratio == 1.0
    assert (d.model, d.accelerator, d.precision, d.gradient_checkpointing, d.data) == (
        "minilm-l6", "cpu", "32-true", False, None)
    d = _parser().parse_args(["distill", "--no-dropout", "--no-isolate", "--sides", "st"])
    assert not d.dropout and not d.isolate and d.sides == ["st"]
    d = _parser().parse_args(["distill", "--model", "bge-m3-shape", "--accelerator", "cuda", "--precision",
                              "bf16-mixed", "--gradient-checkpointing", "--data", ".gpu-data/utility"])
    assert (d.model, d.accelerator, d.precision, d.gradient_checkpointing, d.data) == (
        "bge-m3-shape", "cuda", "bf16-mixed", True, ".gpu-data/utility")
    # every option reaches the bench's config (--encode-batch-size once parsed and dropped: a GPU run timed the default)
    seen = []

    def bench(cfg, log=None):
        seen.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr("omnimed.bench.distill.bench_distill", bench)
    for argv, chunk in (([], None), (["--encode-batch-size", "0"], 0), (["--encode-batch-size", "64"], 64)):
        with pytest.raises(KeyboardInterrupt):
            run_distill(_parser().parse_args(["distill", "--max-length", "128", *argv]))
        assert (seen[-1].encode_batch_size, seen[-1].max_length) == (chunk, 128)


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_polyview_times_fifteen_candidates_per_cold_query_with_every_view(tmp_path, keep_threads):
    """Two timed queries (no warm-up: the models load before the clock starts), each a different question with 15
    candidates; the judges and the encoder really run on every query (their time is > 0), the parts add up to the
    query's time, and the goal is judged on the median."""
    from omnimed.cli.bench import main
    from omnimed.methods.polyrag.views import VIEWS

    out = tmp_path / "polyview.json"
    assert main(["polyview", "--queries", "2", "--warmup", "0", "--world-size", "tiny", "--threads", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["queries"] == 2 and result["candidates_per_query"] == 15 and result["threads"] == 1
    rows = result["per_query"]
    assert len(rows) == 2 and len({r["question_id"] for r in rows}) == 2
    for r in rows:
        assert r["candidates"] == 15 and r["ms"] > 0 and r["views"] == sorted(VIEWS)
        for part in ("relevance_judge", "supplement_judge", "utility_encoder", "timeliness", "topics"):
            assert r["parts_ms"][part] > 0, part
        assert sum(r["parts_ms"].values()) == pytest.approx(r["ms"], abs=0.05)
    assert 0 < result["median_ms"] <= result["p90_ms"] <= result["max_ms"]
    assert result["judges"]["call_cache"] is False and result["cold"] is True
    assert result["goal_ms"] == 200.0 and result["meets_goal"] == (result["median_ms"] <= 200.0)
    # the arithmetic floor: a third, untimed question; two LM judges over 15 passages cost well over a GFLOP
    arith = result["arithmetic"]
    assert arith["question_id"] not in {r["question_id"] for r in rows}
    assert arith["gflop_per_query"] > 1 and arith["matmul_gflops"] > 0
    assert arith["floor_ms"] == pytest.approx(1000 * arith["gflop_per_query"] / arith["matmul_gflops"], rel=1e-2)
    assert arith["goal_reachable"] == (arith["floor_ms"] <= 200.0)


@pytest.mark.timeout(240)
def test_distill_both_sides_train_on_the_same_batches_with_the_same_losses(keep_threads):
    """Without dropout, ours (Lightning + DistillModule) and SentenceTransformerTrainer with the listwise KL see the
    same first batch and agree on the loss at every step (same weights, optimizer, schedule and clipping)."""
    from omnimed.bench.distill import bench_distill

    result = bench_distill(world_size="tiny", steps=2, warmup=1, batch_size=2, dropout=False, isolate=False,
                           threads=1)
    for side in ("ours", "st"):
        r = result[side]
        assert r["side"] == side and r["timed_steps"] == 2 and r["samples"] == 4 and r["threads"] == 1
        assert r["samples_per_s"] > 0 and r["peak_rss_mb"] > 0 and math.isfinite(r["first_step_loss"])
        assert r["optimizer"] == "AdamW" and len(r["losses"]) == 3
    comp = result["comparison"]
    assert comp["same_first_batch"]
    assert comp["init_loss_match"] and comp["first_step_loss_match"], comp
    assert comp["first_step_loss_abs_diff"] < 1e-5 and comp["max_step_loss_abs_diff"] < 1e-4
    assert comp["ratio_samples_per_s"] > 0 and comp["meets_goal"] == (comp["ratio_samples_per_s"] >= 1.0)
    assert len(result["ratios_per_repeat"]) == 1 and result["data"]["examples"] == 6


@pytest.mark.timeout(240)
def test_distill_of_a_bge_m3_shaped_encoder_with_checkpointing_matches_sentence_transformers(keep_threads):
    """The GPU check's code path on CPU: an XLM-RoBERTa encoder in BGE-M3's folder layout ([CLS] pooling,
    normalisation), built here with random weights, trained by both sides with gradient checkpointing on; every
    step's loss agrees, so checkpointing changes neither side's arithmetic."""
    from omnimed.bench.distill import bench_distill

    result = bench_distill(world_size="tiny", steps=1, warmup=1, batch_size=2, dropout=False, isolate=False,
                           threads=1, model="tiny-xlm-roberta", gradient_checkpointing=True)
    comp = result["comparison"]
    assert result["config"]["model"] == "tiny-xlm-roberta" and comp["same_first_batch"]
    assert comp["init_loss_match"] and comp["init_loss_eval"]["ours"] > 0.1, comp
    assert comp["max_step_loss_abs_diff"] < 1e-4 and comp["ratio_peak_gpu_allocated"] is None


def test_distill_refuses_bf16_on_the_cpu():
    from omnimed.bench.distill import bench_distill

    with pytest.raises(ValueError, match="bf16-mixed is for accelerator=cuda"):
        bench_distill(world_size="tiny", precision="bf16-mixed", isolate=False)


def test_distill_refuses_too_few_training_queries_before_loading_a_model():
    from omnimed.bench.distill import bench_distill

    with pytest.raises(ValueError, match=r"the tiny world gives \d+ training queries with >= 8 passages \(--window\); "
                                         r".* = 400 are needed"):
        bench_distill(world_size="tiny", steps=97, warmup=3, isolate=False)

"""``omnimed-bench train`` and ``omnimed-bench dpo`` on tiny-llama: both sides run in their own process, same first
batch, same first loss."""

from __future__ import annotations

import math

import pytest

from omnimed.bench.train import bench_train
from omnimed.bench.train_config import TrainBenchConfig
from omnimed.bench.train_measure import StepLog


def test_step_log_times_only_the_steps_after_warmup() -> None:
    log = StepLog(start=0.0, cpu_start=0.0, ends=[1.0, 3.0, 4.0, 6.0], cpu_ends=[2.0, 6.0, 8.0, 12.0],
                  real=[10, 20, 30, 40, 99], total=[16, 24, 32, 48, 128], losses=[2.0, 1.5, 1.2, 1.0])
    s = log.summary(warmup=1, steps=3)
    assert s["timed_seconds"] == 5.0 and s["mean_step_s"] == pytest.approx(5 / 3, abs=1e-4)
    assert s["step_times_s"] == [2.0, 1.0, 2.0] and s["median_step_s"] == 2.0
    assert s["real_tokens"] == 90 and s["total_tokens"] == 104  # the prefetched 5th batch is not counted
    assert s["tokens_per_s_real"] == 18.0 and s["cpu_seconds_per_step"] == pytest.approx(10 / 3, abs=1e-4)
    assert s["first_step_loss"] == 2.0
    with pytest.raises(RuntimeError, match="steps ran"):
        log.summary(warmup=2, steps=3)


@pytest.mark.timeout(180)
def test_bench_train_tiny_model_both_sides() -> None:
    result = bench_train(TrainBenchConfig(model="tiny-llama", steps=2, warmup=1, max_examples=120))
    for side in ("ours", "trl"):
        r = result[side]
        assert r["side"] == side and r["timed_steps"] == 2
        assert r["tokens_per_s_real"] > 0 and r["tokens_per_s_total"] >= r["tokens_per_s_real"]
        assert r["peak_rss_mb"] > 0 and r["threads"] == 2
        assert math.isfinite(r["first_step_loss"])
    comp = result["comparison"]
    assert comp["same_first_batch"], "TRL should train on exactly our first batch in matched order"
    assert comp["first_step_loss_match"], (result["ours"]["first_step_loss"], result["trl"]["first_step_loss"])
    assert comp["ratio_tokens_per_s_real"] > 0
    data = result["data"]
    assert 0 < data["pad_to_max_length"]["real_fraction_epoch"] < data["per_batch_padding"]["real_fraction_epoch"] <= 1
    assert 0 < data["packing"]["real_fraction_epoch"] <= 1


@pytest.mark.timeout(180)
def test_bench_dpo_cli_tiny_model_both_sides(tmp_path) -> None:
    """``omnimed-bench dpo`` on tiny-llama: ours (DPOModule) and TRL's DPOTrainer each run in their own process on
    the same pairs, TRL on exactly our first batch; the first-step losses agree to 1e-5 (both log 2: the policy is
    its reference at step 0) and the JSON holds every side's measurements and the comparison."""
    import json

    from omnimed.cli.bench import main

    out = tmp_path / "dpo.json"
    assert main(["dpo", "--model", "tiny-llama", "--pairs", "24", "--steps", "2", "--warmup", "1", "--repeats", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["beta"] == 0.1 and result["data"]["pairs"] == 24
    assert [r["side"] for r in result["runs"]] == ["ours", "trl"]
    for side in ("ours", "trl"):
        r = result[side]
        assert r["side"] == side and r["timed_steps"] == 2 and r["threads"] == 2
        for key in ("tokens_per_s_real", "mean_step_s", "cpu_seconds_per_step", "peak_rss_mb"):
            assert r[key] > 0, (side, key)
        assert r["first_step_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert result["trl"]["loop"] == "trl.DPOTrainer.train()" and result["trl"]["trl_bf16"] is False
    comp = result["comparison"]
    assert comp["same_first_batch"], "TRL should train on exactly our first batch"
    assert comp["first_step_loss_match"] and comp["first_step_loss_abs_diff"] <= 1e-5
    assert comp["ratio_tokens_per_s_real"] > 0 and len(result["ratios_per_repeat"]) == 1
    assert {"peak_rss_not_higher", "ratio_peak_rss", "meets_ratio_target"} <= set(comp)


@pytest.mark.timeout(240)
def test_bench_dpo_under_deepspeed_zero3_both_sides_take_the_same_steps(tmp_path) -> None:
    """``--strategy deepspeed_zero3`` (fp32 on CPU; the GPU scenario is the same code with bf16): ours runs under
    Lightning's DeepSpeed strategy and TRL's DPOTrainer under ``TrainingArguments.deepspeed``, from the same resolved
    dict; on the same batches both take the same three optimizer steps (equal losses at every step, so the
    optimizer, clipping and schedule agree, not only the first forward pass). bf16 on CPU is refused by name."""
    import json

    from omnimed.bench.dpo_config import DPOBenchConfig
    from omnimed.cli.bench import main

    out = tmp_path / "dpo-zero3.json"
    assert main(["dpo", "--model", "tiny-llama", "--pairs", "24", "--steps", "2", "--warmup", "1", "--repeats", "1",
                 "--strategy", "deepspeed_zero3", "--lr", "1e-2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ours"]["strategy"] == "CPUDeepSpeedStrategy" and result["trl"]["strategy"] == "deepspeed"
    assert result["trl"]["optimizer"] == "DeepSpeedOptimizerWrapper"
    ours, trl = result["ours"]["losses"], result["trl"]["losses"]
    assert len(ours) == len(trl) == 3 and ours[-1] != ours[0], (ours, trl)  # the weights moved
    assert ours == pytest.approx(trl, abs=1e-4), (ours, trl)
    with pytest.raises(ValueError, match="precision"):
        DPOBenchConfig(precision="bf16-mixed").validate()


@pytest.mark.timeout(300)
def test_bench_scoring_cli_times_each_backend_and_the_caches_change_no_score(tmp_path) -> None:
    import json

    from omnimed.cli.bench import main

    out = tmp_path / "scoring.json"
    assert main(["scoring", "--world-size", "tiny", "--questions", "1", "--top-k", "2", "--shots", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["questions"] == 1 and result["model"] == "smollm2-135m"
    for name in ("alone", "shared", "kept"):
        assert result[f"{name}_s_per_question"] > 0
    assert result["shared_max_score_diff"] < 1e-3 and result["kept_max_score_diff"] < 1e-3


def test_bench_plan_times_the_planner_and_names_a_backend_it_cannot_run(tmp_path):
    """``omnimed-bench plan`` on SmolLM2 (the tiny test model has 512 positions, shorter than the prompt): seconds per sample and generated tokens/s for hf, vLLM skipped
    with its reason where it is not installed, the JSON written."""
    import importlib.util
    import json

    from omnimed.cli.bench import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--planner", "smollm2-135m", "--world-size", "tiny", "--questions", "2", "--max-new-tokens",
                 "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    hf = result["backends"]["hf"]
    assert result["questions"] == 2 and hf["s_per_sample"] > 0 and 0 < hf["mean_generated_tokens"] <= 6
    assert 0 <= hf["parsed_without_problems"] <= 1
    if importlib.util.find_spec("vllm") is None:
        assert "vllm" in result["skipped"] and "not installed" in result["skipped"]["vllm"]
    with pytest.raises(RuntimeError, match="max_length"):  # a failed call is no timing: tiny-llama's 512 positions
        main(["plan", "--planner", "tiny-llama", "--world-size", "tiny", "--questions", "1", "--backends", "hf",
              "--max-new-tokens", "4", "--out", str(tmp_path / "no.json")])
    assert not (tmp_path / "no.json").exists()

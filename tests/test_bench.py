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


def test_step_log_profiles_the_one_warmup_step_asked_for() -> None:
    """``--profile-step 1`` runs torch.profiler over the second step only (the first is set-up noise, the timed ones
    must stay unprofiled) and keeps its operator table; a step outside the warmup is refused by name."""
    import torch

    log = StepLog(profile_step=1)
    log.begin()
    torch.ones(8, 8) @ torch.ones(8, 8)  # step 0: not profiled
    log.step_end()
    torch.ones(16, 16).sum()  # step 1: profiled
    log.step_end()
    torch.ones(4, 4) @ torch.ones(4, 4)  # step 2: not profiled
    log.step_end()
    assert log.profile and "aten::sum" in log.profile and "aten::mm" not in log.profile
    with pytest.raises(ValueError, match="profile_step"):
        TrainBenchConfig(warmup=2, profile_step=2).validate()


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


def test_mfu_reproduces_a_published_llm_foundry_row() -> None:
    """llm-foundry's H100 bf16 table, MPT-1b (24 layers, d_model 2048, 1,315,950,592 parameters), seq 2048 on 8
    GPUs: 363,645 tokens/s is 41.82% MFU and 4.138134e14 model FLOP/s per GPU; an unknown chip gets no MFU."""
    from omnimed.bench.mfu import flops_per_token, peak_flops

    per_gpu = flops_per_token(1_315_950_592, 24, 2048, 2048) * 363_645 / 8
    assert per_gpu == pytest.approx(4.138134e14, rel=1e-5)
    assert per_gpu / peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(0.4182, abs=5e-5)
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA H100 80GB HBM3") and peak_flops("Tesla T4") is None


def test_mfu_counts_tied_embeddings_once() -> None:
    from omnimed.bench.mfu import mfu_fields
    from omnimed.bench.train_config import model_config
    from omnimed.models.loading import load_causal_lm, load_tokenizer

    mcfg = model_config(TrainBenchConfig(model="tiny-llama", lora_r=0))
    assert not mcfg.lora.enabled
    model = load_causal_lm(mcfg, load_tokenizer(mcfg), for_training=True)
    fields = mfu_fields(model, seq_len=128, tokens_per_s=1000.0, device_name="NVIDIA H200")
    unique = sum(p.numel() for p in model.parameters())
    assert model.config.tie_word_embeddings and fields["model_params"] == unique
    assert fields["flops_per_token"] == 6 * unique + 12 * 2 * 64 * 128
    assert fields["mfu"] == pytest.approx(fields["flops_per_token"] * 1000.0 / 989.5e12, abs=1e-4)
    with pytest.raises(ValueError, match="lora_r"):
        TrainBenchConfig(lora_r=-1).validate()


def test_the_train_bench_turns_our_lean_mlp_off_on_request() -> None:
    """``--no-lean-mlp`` (a GPU with memory to spare: the recomputation costs 2-3% of a step there) reaches our
    side's model config; TRL's side never has it."""
    from omnimed.bench.train_config import TrainBenchConfig, model_config, trl_model_config
    from omnimed.cli.bench import _parser

    assert _parser().parse_args(["train"]).lean_mlp and not _parser().parse_args(["train", "--no-lean-mlp"]).lean_mlp
    on, off = (model_config(TrainBenchConfig(model=m, lean_mlp=lean)) for m, lean in
               (("tiny-llama", True), ("smollm2-135m", False)))
    assert on.lean_mlp and not off.lean_mlp and not trl_model_config(on).lean_mlp


def test_the_train_bench_gives_each_side_liger_kernels_its_own_way_and_only_on_a_gpu() -> None:
    """``--fused-kernels`` reaches our model config (``model.fused_kernels``) and never TRL's model, whose kernels come
    from ``--trl-liger`` through TRL's own ``use_liger_kernel``; on the CPU both are refused before anything loads."""
    from omnimed.bench.train_config import model_config, trl_model_config
    from omnimed.bench.train_trl import trainer_args
    from omnimed.cli.bench import _parser

    args = _parser().parse_args(["train", "--fused-kernels", "--trl-liger"])
    assert args.fused_kernels and args.trl_liger
    plain = _parser().parse_args(["train"])
    assert not plain.fused_kernels and not plain.trl_liger
    cfg = TrainBenchConfig(model="llama3.2-1b-shape", accelerator="cuda", precision="bf16-mixed", fused_kernels=True,
                           trl_liger=True)
    cfg.validate()
    ours = model_config(cfg)
    assert ours.fused_kernels and not trl_model_config(ours).fused_kernels
    assert trainer_args(cfg, "/tmp/x")["use_liger_kernel"] is True
    assert trainer_args(TrainBenchConfig(), "/tmp/x")["use_liger_kernel"] is False
    for flag in ("fused_kernels", "trl_liger"):
        with pytest.raises(ValueError, match="accelerator=cuda"):
            TrainBenchConfig(**{flag: True}).validate()


def test_the_chunked_lm_head_reaches_our_sft_and_dpo_tasks_and_full_fine_tuning_dpo_refuses_it() -> None:
    from omnimed.bench.dpo_config import DPOBenchConfig
    from omnimed.bench.train_config import task_config
    from omnimed.cli.bench import _parser, _side_by_side_fields
    from omnimed.conf import load_option
    from omnimed.training.config import TaskConfig

    chunk = _parser().parse_args(["train", "--head-chunk", "512"]).head_chunk
    assert task_config(TrainBenchConfig(head_chunk_positions=chunk)).head_chunk_positions == 512
    sft = load_option("task", "sft", TaskConfig)  # the bench's defaults are the default job's
    default = task_config(TrainBenchConfig())
    assert (default.head_chunk_positions, default.micro_batch_tokens) == (sft.head_chunk_positions,
                                                                          sft.micro_batch_tokens) == (1024, 320)
    assert _parser().parse_args(["train", "--head-chunk", "0"]).head_chunk == 0  # run_train: 0 -> the whole head
    dpo = _parser().parse_args(["dpo", "--head-chunk", "64"])
    assert DPOBenchConfig(**_side_by_side_fields(dpo)).head_chunk_positions == 64
    assert DPOBenchConfig(**_side_by_side_fields(_parser().parse_args(["dpo"]))).head_chunk_positions is None
    assert task_config(DPOBenchConfig(head_chunk_positions=64)).head_chunk_positions == 64
    with pytest.raises(ValueError, match="head_chunk_positions.*LoRA"):  # full fine-tuning trains the head
        DPOBenchConfig(head_chunk_positions=512, lora_r=0).validate()


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_bench_train_full_fine_tuning_under_zero3_trains_every_weight_alike(tmp_path) -> None:
    """``--lora-r 0 --strategy deepspeed_zero3 --packing`` (the GPU scenario's options, fp32 on CPU): both sides
    train every parameter of the model from the same packed batches and take the same optimizer steps, ours through
    the chunked LM head (``--head-chunk``: the partitioned, tied head's gradient included)."""
    import json

    from transformers import AutoModelForCausalLM

    from omnimed.cli.bench import main
    from omnimed.models.tiny import tiny_model_path

    out = tmp_path / "train-zero3.json"
    assert main(["train", "--model", "tiny-llama", "--lora-r", "0", "--strategy", "deepspeed_zero3", "--packing",
                 "--max-length", "256", "--batch-size", "2", "--steps", "2", "--warmup", "1", "--lr", "1e-3",
                 "--micro-batch-tokens", "0", "--head-chunk", "96", "--max-examples", "200", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["lora_r"] == 0 and result["config"]["micro_batch_tokens"] is None
    assert result["ours"]["head_chunk_positions"] == 96
    assert result["ours"]["strategy"] == "CPUDeepSpeedStrategy" and result["trl"]["strategy"] == "deepspeed"
    full = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_path("tiny-llama")).parameters())
    assert result["ours"]["trainable_params"] == result["trl"]["trainable_params"] == full
    ours, trl = result["ours"]["losses"], result["trl"]["losses"]
    assert result["comparison"]["same_first_batch"] and result["ours"]["real_fraction"] > 0.99
    assert len(ours) == 3 and ours[-1] != ours[0] and ours == pytest.approx(trl, abs=1e-4), (ours, trl)


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
@pytest.mark.slow
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

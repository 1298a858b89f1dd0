"""The README's multi-GPU recipes compose to what they claim (ZeRO-3 on 8 GPUs of a node, N nodes through SLURM), and
its memory table is what omnimed.training.memory_plan computes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from omnimed.cli.common import conf_dir
from omnimed.training.config import register_train_configs
from omnimed.training.memory_plan import GB, SHAPES, per_gpu, table

REPO = Path(__file__).resolve().parents[1]


def compose_train(*overrides: str, hydra: bool = False):
    register_train_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra)


@pytest.mark.parametrize("overrides", [
    ["+preset=selfbiorag_generator_paper", "data.path=builds/generator_data"],
    ["strategy=deepspeed_zero3", "trainer=paper", "trainer.devices=8", "model=llama2-7b"],
])
def test_one_node_recipes_are_zero3_on_eight_gpus_in_bf16(overrides):
    cfg = compose_train(*overrides)
    assert cfg.strategy.name == "deepspeed" and cfg.strategy.deepspeed.zero_optimization.stage == 3
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.num_nodes) == ("gpu", 8, 1)
    assert cfg.trainer.precision == "bf16-mixed"


def test_the_slurm_recipe_asks_for_one_task_per_gpu_on_each_node():
    cfg = compose_train("hydra/launcher=slurm_gpus", "trainer=paper", "strategy=deepspeed_zero3_8xa100",
                        "trainer.num_nodes=2", "hydra.launcher.partition=gpu", hydra=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (2, 8, 8)
    assert launcher["partition"] == "gpu" and cfg.trainer.num_nodes == 2


def test_the_readme_memory_table_is_the_plan_and_the_plan_is_the_zero_arithmetic():
    assert table() in (REPO / "README.md").read_text()
    seven = SHAPES["7B"]
    full = per_gpu(seven, gpus=8, micro_batch=4, seq=2048)
    # 16 bytes per parameter of model states, split over 8 GPUs
    assert full["weights"] + full["gradients"] + full["optimizer"] == pytest.approx(16 * seven.params / 8)
    lora = per_gpu(seven, gpus=8, micro_batch=4, seq=2048, lora_r=16, checkpointing=True)
    assert 35e6 < seven.lora_params(16) < 45e6  # ~40M: PEFT's count for Llama-2-7B, r=16, all projections
    assert lora["weights"] == pytest.approx(2 * (seven.params + seven.lora_params(16)) / 8)
    assert lora["activations"] < full["activations"] / 10 and lora["total"] < 8 * GB
    chunked = per_gpu(seven, gpus=8, micro_batch=4, seq=2048, lora_r=16, checkpointing=True, head_chunk=1024)
    assert chunked["logits"] == pytest.approx(6 * 1024 * seven.vocab) and lora["logits"] == 8 * chunked["logits"]
    assert lora["total"] - chunked["total"] == pytest.approx(7 * chunked["logits"])

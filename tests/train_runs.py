"""What the `omnimed-train` tests share: the tiny model's overrides, a run of the CLI in its own process (as a user
starts it) and the train config composed in this one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from omnimed.cli.common import conf_dir
from omnimed.training.config import register_train_configs

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TINY = ["model=tiny-llama", "data=world_tiny", "trainer.checkpoint_every_n_steps=4", "trainer.val_check_interval=4",
        "trainer.max_epochs=-1"]


def train(tmp: Path, *overrides: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`omnimed-train` with ``paths.root`` and Hydra's run folder under ``tmp``; asserts it succeeded unless
    ``check`` is off (then the caller reads the failure)."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    res = subprocess.run(
        [str(BIN / "omnimed-train"), f"paths.root={tmp}", f"hydra.run.dir={tmp}/hydra_run", *overrides],
        cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env,
    )
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def compose_train(*overrides: str):
    """The train config ``omnimed-train`` would run with ``overrides``, composed without running."""
    register_train_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=list(overrides))

"""The learning-rate schedules ``task.scheduler`` names, as the optimizer sees them step by step."""

import pytest
import torch

from omnimed.training.config import TaskConfig, TrainConfig, config_problems
from omnimed.training.schedules import lr_schedule


def _lrs(task: TaskConfig, steps: int) -> list[float]:
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([weight], lr=task.lr)
    scheduler = lr_schedule(optimizer, task, steps)["scheduler"]
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_wsd_holds_the_peak_then_decays_to_zero_over_the_last_decay_ratio_of_the_steps():
    lrs = _lrs(TaskConfig(lr=2e-3, scheduler="wsd", warmup_ratio=0.05, decay_ratio=0.3), 300)
    assert lrs[0] == 0.0 and lrs[15] == pytest.approx(2e-3)  # warmup: ceil(0.05 * 300) steps
    assert lrs[15:211] == pytest.approx([2e-3] * 196)  # stable until the last ceil(0.3 * 300) = 90 steps
    decay = lrs[211:]
    assert all(a > b for a, b in zip(decay, decay[1:])) and decay[-1] < 1e-3 * 2e-3


def test_every_named_schedule_warms_up_and_an_unknown_one_is_named():
    for name in ("cosine", "linear", "constant", "wsd"):
        lrs = _lrs(TaskConfig(lr=1e-3, scheduler=name, warmup_ratio=0.1), 50)
        assert lrs[0] == 0.0 and lrs[5] == pytest.approx(1e-3), name
    with pytest.raises(ValueError, match="task.scheduler must be one of"):
        _lrs(TaskConfig(scheduler="bogus"), 10)


def test_a_decay_that_does_not_fit_after_the_warmup_is_refused_naming_the_key():
    cfg = TrainConfig()
    cfg.task.scheduler, cfg.task.warmup_ratio, cfg.task.decay_ratio = "wsd", 0.5, 0.6
    assert "task.decay_ratio=0.6: expected a share in (0, 1 - task.warmup_ratio = 0.5]" in " ; ".join(
        config_problems(cfg))
    cfg.task.scheduler = "cosine"  # the ratio is read by wsd only
    assert not config_problems(cfg)

"""The learning-rate schedules every objective shares: ``task.scheduler`` names one, transformers builds it."""

from __future__ import annotations

import math
from typing import Any

from torch.optim import Optimizer

#: ``TaskConfig.scheduler`` -> ``transformers.get_scheduler`` name; every one warms up linearly first. ``wsd`` holds
#: the peak, then decays to 0 over the last ``task.decay_ratio`` of the steps (warmup-stable-decay): a constant lr's
#: fast learning without its unstable last steps.
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup",
              "wsd": "warmup_stable_decay"}


def lr_schedule(optimizer: Optimizer, task_cfg: Any, total_steps: int) -> dict[str, Any]:
    """Lightning's ``lr_scheduler`` entry (stepped every optimizer step) for ``task_cfg.scheduler`` over
    ``total_steps``, warming up over ``task_cfg.warmup_ratio`` of them."""
    from transformers import get_scheduler

    name = task_cfg.scheduler
    if name not in SCHEDULERS:
        raise ValueError(f"task.scheduler must be one of {sorted(SCHEDULERS)}, got {name!r}")
    total = max(int(total_steps), 1)
    warmup = math.ceil(task_cfg.warmup_ratio * total)
    extra = {"num_decay_steps": min(math.ceil(task_cfg.decay_ratio * total), total - warmup)} if name == "wsd" else None
    scheduler = get_scheduler(SCHEDULERS[name], optimizer, num_warmup_steps=warmup, num_training_steps=total,
                              scheduler_specific_kwargs=extra)
    return {"scheduler": scheduler, "interval": "step", "frequency": 1}

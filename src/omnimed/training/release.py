"""Drop what a finished fit no longer needs before Lightning's teardown copies it to host memory.

At the end of every ``fit`` Lightning's ``Strategy.teardown`` moves the optimizer state and the LightningModule,
parameters *with their gradients*, to the CPU. On a GPU that adds three copies of the model to host memory under
full fine-tuning with Adam (fp32 gradients, ``exp_avg``, ``exp_avg_sq``): on an H200, Llama-3.2-1B's shape
(1.24B parameters), our side of ``omnimed-bench train`` peaked at 21.6 GB of RSS inside that ``.cpu()`` call, against
6.0 GB once the model was loaded and 2.1-2.8 GB during the training steps (``scripts/rss_trace.py``); TRL's trainer,
which leaves the model where it is, peaked at 8.1 GB. For a 7B model that copy would be over 100 GB of host memory.

By the module's ``on_train_end`` every checkpoint of the run is written (Lightning calls the callbacks' hook first,
``StepCheckpoint``'s final save among them) and a later ``fit`` builds a new optimizer, so the gradients and the
optimizer state are dropped there. Only where the model is on an accelerator: on the CPU the teardown copies nothing,
and the state stays for whoever saves a checkpoint after ``fit``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn


def release_training_state(model: nn.Module, optimizers: Iterable[Any]) -> None:
    """Set every gradient of ``model`` to None and empty each optimizer's per-parameter state (in place; DeepSpeed's
    ZeRO optimizers expose their inner optimizer's state dict as ``state``)."""
    model.zero_grad(set_to_none=True)
    for optimizer in optimizers:
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            state.clear()


def release_after_fit(module: Any) -> None:
    """:func:`release_training_state` for a LightningModule at the end of its fit, where its parameters are on an
    accelerator (the case Lightning's teardown would copy to host memory)."""
    if module.device.type != "cpu":
        release_training_state(module, module.trainer.optimizers)

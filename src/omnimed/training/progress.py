"""Training progress bars that count what the command asked for, and the epoch a run resumed in.

A run with a step budget (``trainer.max_steps``, ``max_epochs`` -1: the default trainer) counts the whole run's
batches (``max_steps`` x ``accumulate_grad_batches``) on one bar, so ``max_steps=10`` on a 6-batch dataset reads
``7/10`` in its second epoch instead of starting a ``4/4`` bar, and the ETA is the run's. Lightning skips
``on_train_epoch_start`` when it resumes a run in the middle of an epoch, so its bars never learn that epoch's
length: outside a terminal the resumed run showed ``Training: 0/?`` until the epoch ended. These bars set the epoch
up at the first resumed batch, with the batches done before the checkpoint counted.
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


def step_budget(trainer: Any) -> int | None:
    """How many batches the run trains when its step budget decides (``max_epochs`` -1), else None."""
    if trainer.max_epochs == -1 and trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps * trainer.accumulate_grad_batches)
    return None


class _ResumedEpoch:
    """Mixin over a Lightning progress bar: shows the resumed epoch like any other."""

    _resumed = False  # the run restarted mid-epoch and its epoch is not on the bar yet

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self._resumed = bool(getattr(trainer.fit_loop, "restarted_mid_epoch", False))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._resumed:
            self._resumed = False
            self.on_train_epoch_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if step_budget(trainer) is not None:  # the bar counts the run's batches, across epochs and resumes
            batch_idx = trainer.fit_loop.epoch_loop.total_batch_idx
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @property
    def total_train_batches(self) -> int | float:
        """The run's batches under a step budget; else Lightning's count (the epoch's batches)."""
        budget = step_budget(self.trainer)
        return budget if budget is not None else super().total_train_batches


class ResumedEpochTQDMBar(_ResumedEpoch, TQDMProgressBar):
    """Lightning's tqdm bar (logs and other non-terminals), resumed epochs included."""


class ResumedEpochRichBar(_ResumedEpoch, RichProgressBar):
    """Lightning's rich bar (terminals), resumed epochs included."""


def progress_bar() -> TQDMProgressBar | RichProgressBar:
    """A rich bar in a terminal, a tqdm bar refreshed every 10 batches elsewhere (a log file keeps few lines)."""
    return ResumedEpochRichBar() if sys.stderr.isatty() else ResumedEpochTQDMBar(refresh_rate=10)

"""Training progress bars that also count the epoch a run resumed in.

Lightning skips ``on_train_epoch_start`` when it resumes a run in the middle of an epoch, so its bars never learn
that epoch's length: outside a terminal the resumed run showed ``Training: 0/?`` until the epoch ended. These bars
set the epoch up at the first resumed batch, with the batches done before the checkpoint counted.
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class _ResumedEpoch:
    """Mixin over a Lightning progress bar: shows the resumed epoch like any other."""

    _resumed = False  # the run restarted mid-epoch and its epoch is not on the bar yet
    _done = 0  # batches of that epoch trained before the checkpoint

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self._resumed = bool(getattr(trainer.fit_loop, "restarted_mid_epoch", False))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._resumed:
            self._resumed, self._done = False, batch_idx
            try:
                self.on_train_epoch_start(trainer, pl_module)
            finally:
                self._done = 0

    @property
    def total_train_batches(self) -> int | float:
        """Lightning's count (the epoch's batches, or the steps left when fewer) counted from the epoch's start."""
        trainer = self.trainer
        if self._done and trainer.max_epochs == -1 and trainer.max_steps and trainer.max_steps > 0:
            return min(trainer.num_training_batches, self._done + trainer.max_steps - trainer.global_step)
        return super().total_train_batches


class ResumedEpochTQDMBar(_ResumedEpoch, TQDMProgressBar):
    """Lightning's tqdm bar (logs and other non-terminals), resumed epochs included."""


class ResumedEpochRichBar(_ResumedEpoch, RichProgressBar):
    """Lightning's rich bar (terminals), resumed epochs included."""


def progress_bar() -> TQDMProgressBar | RichProgressBar:
    """A rich bar in a terminal, a tqdm bar refreshed every 10 batches elsewhere (a log file keeps few lines)."""
    return ResumedEpochRichBar() if sys.stderr.isatty() else ResumedEpochTQDMBar(refresh_rate=10)

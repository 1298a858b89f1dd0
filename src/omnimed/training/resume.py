"""What makes an interrupted run resume to the same weights as an uninterrupted one.

Lightning restores model, optimizer, scheduler and loop progress from a checkpoint; two things it leaves to us:
- the data order: :class:`ResumableBatchSampler` shuffles per epoch from ``(seed, epoch)`` and, restored through the
  DataLoader's ``state_dict``/``load_state_dict`` (Lightning's ``_Stateful`` protocol), skips the batches already
  trained on in the interrupted epoch;
- random number generators (dropout, LoRA dropout): :class:`RNGStateCallback` stores and restores them.
:class:`LoaderPositionCallback` makes sure the restored position reaches the loader whenever Lightning built it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices, reshuffled each epoch from ``(seed, epoch)``, split across ranks, resumable mid-epoch.

    ``batches`` is a fixed list of index batches (e.g. length-grouped); each epoch permutes their order. Lightning
    calls ``set_epoch``; the loop position comes from :meth:`consumed` at checkpoint time.
    """

    def __init__(
        self, batches: Sequence[list[int]], *, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1
    ):
        usable = len(batches) - len(batches) % world_size
        self.batches = [list(b) for b in batches[:usable]]
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skip = 0  # batches of the current epoch already trained on (set by a restore)
        self.yielded = 0

    @property
    def sampler(self) -> ResumableBatchSampler:
        """Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``; pointing it here makes that reach us."""
        return self

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0
        self.epoch = epoch

    def _order(self) -> list[int]:
        order = list(range(len(self.batches)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()[self.skip :]
        self.yielded = self.skip
        self.skip = 0
        for i in order:
            self.yielded += 1
            yield self.batches[i]

    def __len__(self) -> int:
        return len(self.batches) // self.world_size


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position Lightning saves in checkpoints and restores on resume.

    The position saved is the number of batches the *training loop* finished in this epoch, read from the trainer
    (the loader itself runs ahead because Lightning prefetches a batch).
    """

    def __init__(self, *args: Any, progress=None, **kwargs: Any):
        # its own generator: starting an epoch's iterator draws a base seed, which must not come from torch's global
        # RNG (the one dropout draws from), or a resumed run would draw its dropout masks one step apart
        kwargs.setdefault("generator", torch.Generator())
        super().__init__(*args, **kwargs)
        self._progress = progress  # callable -> (epoch, batches finished in epoch)

    def state_dict(self) -> dict[str, int]:
        sampler: ResumableBatchSampler = self.batch_sampler  # type: ignore[assignment]
        epoch, done = self._progress() if self._progress else (sampler.epoch, sampler.yielded)
        return {"epoch": int(epoch), "batches_done": int(done)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: ResumableBatchSampler = self.batch_sampler  # type: ignore[assignment]
        sampler.epoch = state["epoch"]
        done = state["batches_done"]
        sampler.skip = done if done < len(sampler) else 0


def data_parallel_ranks(trainer) -> tuple[int, int]:
    """Data-parallel ``(num_replicas, rank)`` of a trainer's strategy, ``(1, 0)`` without a trainer or when not
    distributed: the training entry point turns Lightning's distributed sampler off, so our loaders shard."""
    kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None) if trainer is not None else None
    if not kwargs:
        return 1, 0
    return int(kwargs.get("num_replicas", 1)), int(kwargs.get("rank", 0))


def trainer_progress(trainer) -> tuple[int, int]:
    """(epoch, batches processed in it) of a running Lightning trainer."""
    loop = trainer.fit_loop
    return loop.epoch_progress.current.processed, loop.epoch_loop.batch_progress.current.processed


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` always holds the final step, saved from inside the loop.

    Lightning's own last save at the end of fit comes after it has closed the epoch, so a run stopped by
    ``max_steps`` mid-epoch would record that epoch as finished: continuing it with a larger ``max_steps`` would skip
    the rest of the epoch's batches. Saving at the step that reaches ``max_steps`` records the true position
    (continuing then matches one longer run); the end-of-fit save only runs when that step was not saved yet.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if 0 < trainer.max_steps <= trainer.global_step:
            self._save_final(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_final(trainer)

    def _save_final(self, trainer) -> None:
        if self._last_global_step_saved == trainer.global_step or self._should_skip_saving_checkpoint(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)


class LoaderPositionCallback(Callback):
    """Puts the training loader at the checkpoint's position when Lightning does not. Lightning gives a loader its
    saved state only if it builds the loader after restoring the checkpoint; an objective whose
    ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` (to size its schedule) has it built
    before, and the resumed epoch would start again from its first batch. Loading the same state twice is harmless:
    nothing has been iterated before training starts."""

    def __init__(self) -> None:
        self._states: list[dict[str, int]] = []

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._states = list(fit_loop.get("state_dict", {}).get("combined_loader", []))

    def on_train_start(self, trainer, pl_module) -> None:
        states, self._states = self._states, []
        loaders = trainer.train_dataloader
        loaders = list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
        for loader, state in zip(loaders, states):
            if isinstance(loader, ResumableDataLoader):
                loader.load_state_dict(state)


class RNGStateCallback(Callback):
    """Saves Python, NumPy and torch RNG states in checkpoints and restores them on resume."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        # plain types and tensors only, so checkpoints load with torch.load(weights_only=True)
        checkpoint["omnimed_rng"] = {
            "python": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        state = checkpoint.get("omnimed_rng")
        if not state:
            return
        random.setstate(state["python"])
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        if state["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def find_last_checkpoint(task_dir: str | Path, run_name: str | None) -> Path:
    """``last.ckpt`` of ``run_name`` under ``task_dir``, or of the most recently written run when no name is given."""
    task_dir = Path(task_dir)
    if run_name:
        candidates = [task_dir / run_name / "lightning" / "last.ckpt"]
    else:
        candidates = sorted(task_dir.glob("*/lightning/last.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for c in candidates:
        if c.exists():
            return c
    where = task_dir / (run_name or "*") / "lightning" / "last.ckpt"
    raise FileNotFoundError(f"ckpt_path=last: no checkpoint at {where}; start without ckpt_path or set run_name")

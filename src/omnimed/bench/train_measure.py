"""What a side of ``omnimed-bench train`` measures in its own process: per-step wall clock, CPU time, real and total
tokens and losses (:class:`StepLog`, and the step-time / tokens-per-second summary of the timed steps), peak
resident memory (:class:`PeakRSS`) and, on a GPU, peak device memory (:func:`peak_gpu_memory`)."""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omnimed.bench.sampling import BackgroundSampler


def real_fraction(real: int, total: int) -> float:
    """``real / total`` (0.0 when ``total`` is 0): the share of positions in a batch that are real tokens."""
    return real / total if total else 0.0


class PeakRSS(BackgroundSampler):
    """Peak resident set size of this process: the kernel's high-water mark (``ru_maxrss``) and a psutil sample
    taken every ``interval`` seconds by a daemon thread (the sampled peak can miss short spikes)."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process()
        self.sampled_peak = 0
        super().__init__(interval, "rss-sampler")

    def sample(self) -> None:
        self.sampled_peak = max(self.sampled_peak, self._proc.memory_info().rss)

    def current_mb(self) -> float:
        return self._proc.memory_info().rss / 2**20

    def result(self) -> dict[str, float]:
        kernel_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        return {"peak_rss_mb": round(kernel_peak_mb, 1), "peak_rss_sampled_mb": round(self.sampled_peak / 2**20, 1)}


@dataclass
class StepLog:
    """Per-step wall-clock end times, real/total tokens and losses, filled in by the trainer hooks."""

    start: float = 0.0
    cpu_start: float = 0.0
    ends: list[float] = field(default_factory=list)
    cpu_ends: list[float] = field(default_factory=list)
    real: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    threads_in_loop: int | None = None
    sync: Callable[[], None] | None = None  # torch.cuda.synchronize on a GPU: a step ends when its kernels have run
    profile_step: int | None = None  # 0-based index of an (untimed warmup) step to run under torch.profiler
    profile: str | None = None  # its operator table, the most expensive first
    _profiler: Any = None

    def begin(self) -> None:
        """Mark the start of training (wall clock and this process's CPU time, all threads)."""
        if self.sync is not None:
            self.sync()
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def step_end(self) -> None:
        """Mark the end of an optimizer step (after the device's queued work, on a GPU)."""
        if self.sync is not None:
            self.sync()
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())
        if self.profile_step is not None:
            self._profile_around(len(self.ends))

    def _profile_around(self, steps_done: int) -> None:
        """Start torch.profiler when step ``profile_step`` begins and keep its operator table when it ends."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.sync is not None  # a GPU run
        if steps_done == self.profile_step:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            self._profiler = profile(activities=activities, record_shapes=False)
            self._profiler.__enter__()
        elif steps_done == self.profile_step + 1 and self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            self.profile = self._profiler.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=60)
            self._profiler = None

    def record_batch(self, batch: Any) -> None:
        """Count a batch's real tokens (attention mask; a padding-free batch: all its positions) and positions."""
        ids = batch["input_ids"]
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        self.real.append(int(mask.sum()) if mask is not None else ids.numel())
        self.total.append(ids.numel())

    def summary(self, warmup: int, steps: int) -> dict[str, Any]:
        """Mean step time and tokens/s over steps ``warmup+1 .. warmup+steps`` (from the end of step ``warmup``)."""
        n = warmup + steps
        if len(self.ends) < n or len(self.real) < n:
            raise RuntimeError(f"only {len(self.ends)} steps ran ({len(self.real)} batches seen); {n} were needed")
        begin = self.ends[warmup - 1] if warmup > 0 else self.start
        seconds = self.ends[n - 1] - begin
        stamps = [begin, *self.ends[warmup:n]]
        step_times = [b - a for a, b in itertools.pairwise(stamps)]
        real, total = sum(self.real[warmup:n]), sum(self.total[warmup:n])
        cpu_seconds = self.cpu_ends[n - 1] - (self.cpu_ends[warmup - 1] if warmup > 0 else self.cpu_start)
        return {
            "timed_steps": steps,
            "warmup_steps": warmup,
            "timed_seconds": round(seconds, 4),
            "mean_step_s": round(seconds / steps, 4),
            "median_step_s": round(statistics.median(step_times), 4),
            "stdev_step_s": round(statistics.stdev(step_times), 4) if len(step_times) > 1 else 0.0,
            "step_times_s": [round(t, 4) for t in step_times],
            "real_tokens": real,
            "total_tokens": total,
            "tokens_per_s_real": round(real / seconds, 2),
            "tokens_per_s_total": round(total / seconds, 2),
            # robust to the multi-second stalls a shared machine inserts: mean tokens per step / median step time
            "tokens_per_s_real_median_step": round(real / steps / statistics.median(step_times), 2),
            "real_fraction": round(real_fraction(real, total), 4),
            "cpu_seconds_per_step": round(cpu_seconds / steps, 4),
            "real_tokens_per_cpu_s": round(real / cpu_seconds, 2) if cpu_seconds > 0 else None,
            "first_step_loss": self.losses[0] if self.losses else None,
            "losses": [round(v, 5) for v in self.losses[:n]],
            "first_step_s": round(self.ends[0] - self.start, 4),
            "profile": self.profile,
        }


def step_log(accelerator: str, profile_step: int | None = None) -> StepLog:
    """A :class:`StepLog` that waits for the GPU before each time stamp when ``accelerator`` is ``cuda`` and profiles
    step ``profile_step`` (0-based; None: none)."""
    import torch

    return StepLog(sync=torch.cuda.synchronize if accelerator == "cuda" else None, profile_step=profile_step)


def peak_gpu_memory(accelerator: str) -> dict[str, float]:
    """The process's peak GPU memory (MB) as torch's caching allocator counts it: allocated by tensors and reserved
    from the driver; empty on CPU."""
    import torch

    if accelerator != "cuda":
        return {}
    return {"peak_gpu_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "peak_gpu_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 1)}

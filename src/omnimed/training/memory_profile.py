"""Where a training run's memory goes: resident memory (RSS) sampled in the background and charged to the phase the
run is in (model load, tokenization, forward, backward, optimizer step, validation, checkpoint, export).

``debug.memory=true`` turns it on; the run writes ``memory.json`` beside ``metrics.json`` (per phase: the highest
RSS seen and how far it rose above the phase's start) and prints the phases, so a peak is found without a profiler
that slows the run tenfold. RSS counts what the allocator holds, freed-but-kept memory included: that is what the
operating system, and a laptop, feel.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psutil
from lightning.pytorch.callbacks import Callback

MB = 2**20


class MemoryPhases(Callback):
    """Samples this process's RSS every ``interval`` seconds in a thread; the engine and the Lightning hooks name
    the phase, each phase keeps its peak."""

    def __init__(self, interval: float = 0.02) -> None:
        self._proc = psutil.Process()
        self._interval = interval
        self._lock = threading.Lock()
        self._phase = "start"
        self.phases: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="omnimed-memory", daemon=True)
        self.mark("start")
        self._thread.start()

    # ------------------------------------------------------------------------------------------- sampling
    def _rss(self) -> float:
        return self._proc.memory_info().rss / MB

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            rss = self._rss()
            with self._lock:
                self._raise_peak(rss)

    def _raise_peak(self, rss: float) -> None:
        """Charge ``rss`` to the current phase (the caller holds the lock)."""
        entry = self.phases[self._phase]
        entry["peak_mb"] = max(entry["peak_mb"], rss)

    def mark(self, phase: str) -> None:
        """Enter ``phase`` (a phase entered again keeps its first start and its highest peak)."""
        rss = self._rss()
        with self._lock:
            if self._phase in self.phases:  # the phase being left ends at this reading
                self._raise_peak(rss)
            self._phase = phase
            self.phases.setdefault(phase, {"start_mb": rss, "peak_mb": rss})

    def stop(self) -> dict[str, Any]:
        """End sampling; the report: per phase start, peak and rise (MB), the phase of the run's peak."""
        self.mark("end")
        self._stop.set()
        self._thread.join()
        phases = {name: {**e, "rise_mb": e["peak_mb"] - e["start_mb"]} for name, e in self.phases.items()}
        peak = max(phases, key=lambda n: phases[n]["peak_mb"])
        return {"phases": phases, "peak_mb": phases[peak]["peak_mb"], "peak_phase": peak}

    # ------------------------------------------------------------------------------------------- hooks
    def setup(self, trainer, pl_module, stage) -> None:
        self.mark("strategy setup")  # after the data module's setup (tokenization)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.mark("forward")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.mark("backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.mark("optimizer step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.mark("between steps (logging, checkpoint)")

    def on_validation_start(self, trainer, pl_module) -> None:
        self.mark("validation")

    def on_validation_end(self, trainer, pl_module) -> None:
        self.mark("between steps (logging, checkpoint)")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.mark("checkpoint")


def write_report(report: dict[str, Any], path: Path) -> str:
    """Write ``memory.json``; returns the phases as lines for the console."""
    from omnimed.data.artifacts import atomic_write_json

    atomic_write_json(path, report)
    lines = [f"{name:<40} start {e['start_mb']:8.0f} MB  peak {e['peak_mb']:8.0f} MB  rise {e['rise_mb']:+8.0f} MB"
             for name, e in report["phases"].items()]
    return "\n".join([*lines, f"peak RSS {report['peak_mb']:.0f} MB in {report['peak_phase']}"])

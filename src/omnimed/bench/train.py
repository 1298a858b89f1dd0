"""Training-step throughput of our SFT stack against TRL's ``SFTTrainer``, on the same model, data and settings.

:func:`bench_train` (the parent) runs one child process per side, ``python -m omnimed.bench.train_child --side
ours|trl`` (:mod:`omnimed.bench.train_child`), back to back (with ``repeats`` > 1 the order alternates: ours, trl,
trl, ours, ...), so each side's peak RSS is its own and the two sides see the same machine load as far as
back-to-back runs can. The parent also records the hardware and versions, and measures, without a model, the
real-token fraction per step of our two batching modes (packing and length-grouped per-batch padding) against
random-order pad-to-longest batches and padding everything to ``max_length``.

The benchmark's modules, one job each:

* :mod:`omnimed.bench.train_config`: :class:`~omnimed.bench.train_config.TrainBenchConfig` and the model and task
  configs both sides load;
* :mod:`omnimed.bench.train_data`: the instruction rows, our data module, its batch order, the real-token fractions;
* :mod:`omnimed.bench.train_measure`: the step log (step times, tokens/s) and peak RSS of a side;
* :mod:`omnimed.bench.train_ours` and :mod:`omnimed.bench.train_trl`: the two sides;
* :mod:`omnimed.bench.train_child`: the entry point of a side's process;
* :mod:`omnimed.bench.train_report`: each side's median run, the ratios ours/TRL, the loss check;
* this module: the runs (processes, alternation, repeats) and the result (:func:`run_bench`, which
  ``omnimed-bench dpo`` shares: :mod:`omnimed.bench.dpo`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnimed.bench.train_config import TrainBenchConfig
from omnimed.bench.train_data import data_stats
from omnimed.bench.train_report import summarise_runs


def hardware() -> dict[str, Any]:
    """CPU model, core counts, load average, and the versions that decide the numbers."""
    import importlib.metadata as md

    import psutil

    cpu_model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("torch", "transformers", "trl", "peft", "lightning", "accelerate", "datasets"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "cpu_model": cpu_model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
    }


def _run_child(side: str, cfg: TrainBenchConfig, workdir: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its JSON result (raising with its log tail on failure)."""
    cfg_path = workdir / f"config-{side}.json"
    out_path = workdir / f"result-{side}.json"
    log_path = workdir / f"log-{side}.txt"
    cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    threads = str(cfg.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"), WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    if cfg.accelerator == "cpu" and cfg.strategy.startswith("deepspeed"):
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed picks its accelerator per process; none would be found here
    cmd = [sys.executable, "-m", "omnimed.bench.train_child", "--bench", cfg.bench, "--side", side,
           "--config", str(cfg_path), "--out", str(out_path)]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=cfg.child_timeout_s)
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"benchmark side {side!r} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out_path.read_text())


def run_bench(cfg: TrainBenchConfig, data: Callable[[TrainBenchConfig], dict[str, Any]]) -> dict[str, Any]:
    """Run every side of ``cfg.bench`` in its own process, ``cfg.repeats`` times in alternating order, and
    summarise; ``data(cfg)`` gives the result's model-free ``data`` section. Returns a JSON-ready dict: ``config``,
    ``hardware`` (with the load average after), ``data``, ``runs`` (every child's result, in run order), ``ours``
    and ``trl`` (the run with the median real tokens/s of each side), ``comparison`` and ``ratios_per_repeat``
    (see :func:`~omnimed.bench.train_report.summarise_runs`), ``wall_s``."""
    cfg.validate()
    started = time.time()
    hw = hardware()
    data_section = data(cfg)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="omnimed-bench-") as tmp:
        for rep in range(max(cfg.repeats, 1)):
            order = list(cfg.sides) if rep % 2 == 0 else list(reversed(cfg.sides))
            for side in order:
                result = _run_child(side, cfg, Path(tmp))
                result["repeat"] = rep
                runs.append(result)
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "hardware": hw, "data": data_section, "runs": runs}
    result.update(summarise_runs(runs, cfg))
    result["hardware"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.time() - started, 1)
    return result


def bench_train(cfg: TrainBenchConfig | None = None, **overrides: Any) -> dict[str, Any]:
    """Benchmark our SFT training step against TRL's ``SFTTrainer``; returns a JSON-ready dict.

    ``cfg`` fields can be overridden by keyword (``bench_train(steps=2, model="tiny-llama")``). Keys: those of
    :func:`run_bench`, with ``data`` the real-token fractions of :func:`~omnimed.bench.train_data.data_stats`.
    """
    return run_bench(dataclasses.replace(cfg or TrainBenchConfig(), **overrides), data_stats)

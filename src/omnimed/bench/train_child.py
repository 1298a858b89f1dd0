"""One side of ``omnimed-bench train`` (ours or TRL's), one run, in a fresh process started by the parent.

``python -m omnimed.bench.train_child --side ours|trl --config CFG.json --out RESULT.json``, spawned by
:func:`omnimed.bench.train.bench_train`, so each side's peak RSS is its own. Each child:

* sets ``torch.set_num_threads(threads)`` (and ``OMP_NUM_THREADS``) before anything runs;
* formats the synthetic world's instruction examples into prompt/completion strings with
  :func:`omnimed.training.tokenize.format_example` (the chat template for SmolLM2), keeping the examples that have a
  supervised token within ``max_length`` (so neither side drops any);
* loads the model through :func:`omnimed.models.loading.load_causal_lm` (SmolLM2-135M + LoRA r16 on the same
  target modules for both sides; LoRA B starts at zero, so the first forward pass is the base model's);
* trains ``warmup + steps`` optimizer steps, stamping the wall clock at the end of every step, and reports the
  mean step time over the last ``steps`` (the interval between the end of warmup step W and the end of step W+N:
  data loading, forward, backward, clipping, AdamW, LR schedule and per-step logging all included, i.e. what a user
  waits for), real (non-padding) and total tokens per second over those steps, first-step loss and peak RSS.

The sides themselves are :func:`omnimed.bench.train_ours.run_ours` and :func:`omnimed.bench.train_trl.run_trl`.
``--bench dpo`` runs ``omnimed-bench dpo``'s sides instead (:func:`omnimed.bench.dpo_ours.run_dpo_ours`,
:func:`omnimed.bench.dpo_trl.run_dpo_trl`: preference pairs, DPO) on a
:class:`~omnimed.bench.dpo_config.DPOBenchConfig`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omnimed.bench.dpo_config import DPOBenchConfig
from omnimed.bench.dpo_ours import run_dpo_ours
from omnimed.bench.dpo_trl import run_dpo_trl
from omnimed.bench.train_config import SIDES, TrainBenchConfig
from omnimed.bench.train_ours import run_ours
from omnimed.bench.train_trl import run_trl

#: bench name -> (its config class, {side: the function that runs it})
BENCHES: dict[str, tuple[type[TrainBenchConfig], dict[str, Callable[[Any], dict[str, Any]]]]] = {
    TrainBenchConfig.bench: (TrainBenchConfig, {"ours": run_ours, "trl": run_trl}),
    DPOBenchConfig.bench: (DPOBenchConfig, {"ours": run_dpo_ours, "trl": run_dpo_trl}),
}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omnimed.bench.train_child [--bench train|dpo] --side ours|trl --config CFG.json --out
    RESULT.json``: one side, one run, its result written atomically to ``--out`` for the parent to read."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", choices=sorted(BENCHES), default=TrainBenchConfig.bench)
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--config", required=True, help="the bench's config (a TrainBenchConfig or subclass) as JSON")
    parser.add_argument("--out", required=True, help="where to write this side's result JSON")
    args = parser.parse_args(argv)
    config_cls, runners = BENCHES[args.bench]
    cfg = config_cls(**json.loads(Path(args.config).read_text()))
    cfg.validate()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = runners[args.side](cfg)
    # imported only now, as before the split: importing ``omnimed.data`` up front would move its import out of
    # the side's measured set-up time
    from omnimed.data.artifacts import atomic_write_json

    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

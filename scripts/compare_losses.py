"""Compare the per-step losses of two ``omnimed-bench train`` results (our side): a reference run (fp32 on the CPU)
and a candidate (bf16 on a GPU), trained on the same batches from the same weights. Prints every step and exits 1
when a loss differs by more than ``--rtol`` relative to the reference.

    python scripts/compare_losses.py REFERENCE.json CANDIDATE.json [--rtol 0.02] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--rtol", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    runs = [json.loads(Path(p).read_text())["ours"] for p in (args.reference, args.candidate)]
    ref, cand = (r["losses"][: args.steps] for r in runs)
    if len(ref) < args.steps or len(cand) < args.steps:
        print(f"need {args.steps} losses, got {len(ref)} and {len(cand)}")
        return 1
    worst = 0.0
    print(f"step  {Path(args.reference).stem:>12}  {Path(args.candidate).stem:>12}  rel. diff")
    for step, (a, b) in enumerate(zip(ref, cand), start=1):
        rel = abs(b - a) / abs(a)
        worst = max(worst, rel)
        print(f"{step:>4}  {a:>12.5f}  {b:>12.5f}  {rel:9.4%}")
    ok = worst <= args.rtol
    print(f"largest relative difference {worst:.4%}: {'within' if ok else 'OVER'} {args.rtol:.0%} "
          f"({runs[0].get('precision')} vs {runs[1].get('precision')})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``omnimed-bench``: measurements that compare us with the reference stack, or time a pipeline stage.

    omnimed-bench train [--steps 20 --warmup 3 --batch-size 4 --max-length 256 --threads 2 --packing/--no-packing
                         --repeats 1 --trl-order matched|native --micro-batch-tokens 320 --lora-r 16 --profile-step K
                         --accelerator cpu|cuda --precision 32-true|bf16-mixed --strategy single|deepspeed_zero3
                         --head-chunk 1024 --lean-mlp/--no-lean-mlp --out outputs/bench/train.json]
    omnimed-bench dpo [--steps 10 --warmup 2 --batch-size 4 --max-length 256 --threads 2 --repeats 3 --pairs N
                       --beta 0.1 --model smollm2-135m --sides ours trl --head-chunk 0 --out outputs/bench/dpo.json]
    omnimed-bench world [--size large --seed 0]
    omnimed-bench retrieval [--corpora world,realdata --world-size large --queries 1000 --reference-queries 20
                             --threads 1 --seed 0 --cache indexes/embeddings --out outputs/bench/retrieval.json]
    omnimed-bench scoring [--model smollm2-135m --world-size small --questions 12 --top-k 5 --shots 3
                           --out outputs/bench/scoring.json]
    omnimed-bench plan [--planner smollm2-135m --backends hf vllm openai --world-size table --questions 16
                        --max-new-tokens 256 --base-url http://127.0.0.1:8000/v1 --out outputs/bench/plan.json]
    omnimed-bench polyview [--queries 20 --warmup 2 --candidates 15 --world-size small --threads 2
                            --relevance-judge smollm2-135m --supplement-judge smollm2-135m --utility-encoder minilm-l6
                            --domain inquiry --batch-size 8 --device cpu --dtype float32 --goal-ms 200
                            --out outputs/bench/polyview.json]
    omnimed-bench distill [--model minilm-l6 --accelerator cpu --precision 32-true --gradient-checkpointing
                           --steps 20 --warmup 3 --batch-size 4 --window 8 --threads 2 --repeats 1 --world-size small
                           --dropout/--no-dropout --isolate/--no-isolate --sides ours st
                           --out outputs/bench/distill.json]

``train`` runs our SFT step (Lightning + ``SFTModule``) and TRL's ``SFTTrainer`` on the same model, data and
settings, each side in its own child process, and prints tokens/s, step time, peak RSS, first-step loss and the
ratio ours/TRL (see ``omnimed.bench.train``); the full result goes to a JSON file. ``dpo`` does the same for DPO:
our ``DPOModule`` against TRL's ``DPOTrainer`` on the same preference pairs built from the synthetic world (batch =
pairs; tokens/s count the real tokens of the chosen and rejected rows; see ``omnimed.bench.dpo``). ``world`` times a
world build. ``retrieval`` times BM25 (against rank-bm25 on the same tokens), FAISS flat and HNSW on the world
corpus and the real corpora (``$OMNIMED_REALDATA``; skipped when unset) and checks the targets (see
``omnimed.bench.retrieval``). ``scoring`` times Self-BioRAG's branch scoring on the hf backend with and without its
prompt caches (see ``omnimed.bench.scoring``). ``plan`` times Omni-RAG's planner, seconds per sample on each backend
(see ``omnimed.bench.plan``). ``polyview`` times PolyRAG scoring one query's 15 candidates with every view (LM
relevance and supplement judges on the hf backend, the utility encoder, authority, timeliness, the mixture and the
DBSCAN selection), cold, milliseconds per query against the 200 ms goal (see ``omnimed.bench.polyview``).
``distill`` runs our utility-distillation step (Lightning + ``DistillModule``) and sentence-transformers'
``SentenceTransformerTrainer`` with the same listwise KL on the same model, batches and settings, each side in its
own process, and compares samples/s (see ``omnimed.bench.distill``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from omnimed.cli.bench_tables import dpo_table, fmt, side_by_side, train_table
from omnimed.cli.common import console

DEFAULT_TRAIN_OUT = "outputs/bench/train.json"
DEFAULT_DPO_OUT = "outputs/bench/dpo.json"


def _add_side_by_side_args(parser: argparse.ArgumentParser, d: Any, models: Sequence[str],
                           batch_help: str | None) -> None:
    """The options ``train`` and ``dpo`` share (ours against TRL's trainer), defaulting to ``d``'s values."""
    from omnimed.bench.train_config import ACCELERATORS, PRECISIONS, STRATEGIES

    parser.add_argument("--steps", type=int, default=d.steps, help="timed steps (after warmup)")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="untimed warmup steps")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help=batch_help)
    parser.add_argument("--max-length", type=int, default=d.max_length)
    parser.add_argument("--threads", type=int, default=d.threads, help="torch.set_num_threads in each side")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--model", choices=models, default=d.model)
    parser.add_argument("--lora-r", type=int, default=d.lora_r, help="LoRA rank on both sides; 0: full fine-tuning")
    parser.add_argument("--profile-step", type=int, default=None,
                        help="profile this warmup step (1 .. warmup-1) on both sides; the table goes into the JSON")
    parser.add_argument("--world-size", default=d.world_size, help="synthetic world size (tiny | small | ...)")
    parser.add_argument("--repeats", type=int, default=d.repeats,
                        help="run both sides this many times, alternating the order; medians are compared")
    parser.add_argument("--sides", nargs="+", choices=("ours", "trl"), default=list(d.sides))
    parser.add_argument("--accelerator", choices=ACCELERATORS, default=d.accelerator)
    parser.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                        help="bf16-mixed: TRL gets bf16=True (needs --accelerator cuda)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=d.strategy,
                        help="deepspeed_zero3: conf/strategy/deepspeed_zero3.yaml for both sides (fp32 on CPU)")
    parser.add_argument("--head-chunk", type=int, default=d.head_chunk_positions or 0, metavar="POSITIONS",
                        help="ours: task.head_chunk_positions (the LM head and its loss, or DPO's token log-probs, "
                             "this many positions at a time, no whole logits held; 0: the whole head at once)")


def _side_by_side_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields of :func:`_add_side_by_side_args`'s options."""
    return {"model": args.model, "lora_r": args.lora_r, "profile_step": args.profile_step, "steps": args.steps,
            "warmup": args.warmup, "batch_size": args.batch_size, "max_length": args.max_length,
            "threads": args.threads, "lr": args.lr, "seed": args.seed,
            "world_size": args.world_size, "repeats": args.repeats, "sides": list(args.sides),
            "accelerator": args.accelerator, "precision": args.precision, "strategy": args.strategy,
            "head_chunk_positions": args.head_chunk or None}


def _parser() -> argparse.ArgumentParser:
    from omnimed.bench.train_config import MODELS, TrainBenchConfig

    d = TrainBenchConfig()
    parser = argparse.ArgumentParser(prog="omnimed-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="our SFT step against TRL's SFTTrainer (tokens/s, step time, RSS, loss)")
    _add_side_by_side_args(train, d, MODELS, batch_help=None)
    train.add_argument("--packing", action=argparse.BooleanOptionalAction, default=d.packing,
                       help="pack examples into max-length blocks (default: length-grouped per-batch padding)")
    train.add_argument("--max-examples", type=int, default=None)
    train.add_argument("--trl-order", choices=("matched", "native"), default=d.trl_order,
                       help="matched: TRL trains on our batches; native: TRL's own sampler (and packing)")
    train.add_argument("--micro-batch-tokens", type=int, default=d.micro_batch_tokens,
                       help="ours: task.micro_batch_tokens (a longer batch runs as chunks of rows in one step; 0: "
                            "whole batches)")
    train.add_argument("--lean-mlp", action=argparse.BooleanOptionalAction, default=d.lean_mlp,
                       help="ours: model.lean_mlp (the MLP's activation and product recomputed in backward)")
    train.add_argument("--fused-kernels", action=argparse.BooleanOptionalAction, default=d.fused_kernels,
                       help="ours: model.fused_kernels (Liger's RMSNorm, SwiGLU and rotary kernels; CUDA only)")
    train.add_argument("--trl-liger", action=argparse.BooleanOptionalAction, default=d.trl_liger,
                       help="TRL: use_liger_kernel=True (the same Liger kernels, applied by TRL; CUDA only)")
    train.add_argument("--out", default=DEFAULT_TRAIN_OUT, help="result JSON (written atomically)")

    from omnimed.bench.dpo_config import DPOBenchConfig

    p = DPOBenchConfig()
    dpo = sub.add_parser("dpo", help="our DPO step against TRL's DPOTrainer (tokens/s, step time, RSS, loss)")
    _add_side_by_side_args(dpo, p, MODELS, batch_help="pairs per step")
    dpo.add_argument("--beta", type=float, default=p.beta)
    dpo.add_argument("--pairs", type=int, default=None, help="preference pairs to build (default: all that fit)")
    dpo.add_argument("--out", default=DEFAULT_DPO_OUT, help="result JSON (written atomically)")

    world = sub.add_parser("world", help="time a synthetic world build")
    world.add_argument("--size", default="large")
    world.add_argument("--seed", type=int, default=0)

    retrieval = sub.add_parser("retrieval", help="BM25 / FAISS flat / HNSW build and query speed, rank-bm25 reference")
    retrieval.add_argument("--corpora", default="world,realdata",
                           help="comma-separated: world (of --world-size), world-<tiny|small|large>, realdata "
                                "(needs OMNIMED_REALDATA)")
    retrieval.add_argument("--world-size", default="large", help="tiny | small | large (>= 100k passages)")
    retrieval.add_argument("--queries", type=int, default=1000, help="timed queries per corpus")
    retrieval.add_argument("--reference-queries", type=int, default=20, help="queries timed on rank-bm25 (slow)")
    retrieval.add_argument("--threads", type=int, default=1, help="torch / FAISS threads for the timed parts")
    retrieval.add_argument("--seed", type=int, default=0, help="world seed and query sample")
    retrieval.add_argument("--embed-sample", type=int, default=256,
                           help="passages encoded afresh to time MiniLM even when the cache holds them all")
    retrieval.add_argument("--cache", default="indexes/embeddings",
                           help="embedding cache (shared with omnimed-index; a rerun reuses the vectors)")
    retrieval.add_argument("--out", default="outputs/bench/retrieval.json", help="result JSON (written atomically)")

    scoring = sub.add_parser("scoring", help="Self-BioRAG's branch scoring on the hf backend, prompt caches on / off")
    scoring.add_argument("--model", default="smollm2-135m", help="a conf/model name")
    scoring.add_argument("--world-size", default="small")
    scoring.add_argument("--questions", type=int, default=12, help="world test MCQs judged")
    scoring.add_argument("--top-k", type=int, default=5, help="passages per question")
    scoring.add_argument("--shots", type=int, default=3)
    scoring.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    scoring.add_argument("--out", default="outputs/bench/scoring.json", help="result JSON (written atomically)")

    plan = sub.add_parser("plan", help="Omni-RAG planner inference: seconds per sample on each backend")
    plan.add_argument("--planner", default="smollm2-135m", help="a conf/model name or an omnimed-train export")
    plan.add_argument("--backends", nargs="+", default=["hf", "vllm"],
                      help="hf, vllm (in this environment) and / or openai (a vLLM server at --base-url)")
    plan.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the openai backend's server")
    plan.add_argument("--served-model", default=None, help="the openai backend's model name (default: --planner)")
    plan.add_argument("--world-size", default="table")
    plan.add_argument("--questions", type=int, default=16, help="world test MCQs planned for")
    plan.add_argument("--max-new-tokens", type=int, default=256)
    plan.add_argument("--batch-size", type=int, default=8)
    plan.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    plan.add_argument("--out", default="outputs/bench/plan.json", help="result JSON (written atomically)")

    from omnimed.bench.polyview import PolyviewBenchConfig

    v = PolyviewBenchConfig()
    polyview = sub.add_parser("polyview", help="PolyRAG with every view: milliseconds per query (15 candidates, cold)")
    polyview.add_argument("--queries", type=int, default=v.queries, help="queries timed (distinct world questions)")
    polyview.add_argument("--warmup", type=int, default=v.warmup, help="untimed queries first (models load there)")
    polyview.add_argument("--candidates", type=int, default=v.candidates, help="first-stage passages per query")
    polyview.add_argument("--world-size", default=v.world_size)
    polyview.add_argument("--relevance-judge", default=v.relevance_judge,
                          help="a conf/model name or a trained relevance judge's export (hf backend)")
    polyview.add_argument("--supplement-judge", default=v.supplement_judge,
                          help="a conf/model name or a trained supplement judge's export (hf backend)")
    polyview.add_argument("--utility-encoder", default=v.utility_encoder,
                          help="a conf/model encoder name or the distilled embedder's export")
    polyview.add_argument("--domain", choices=("inquiry", "policy", "care"), default=v.domain,
                          help="the paper's view weights of this domain")
    polyview.add_argument("--batch-size", type=int, default=v.batch_size, help="the judges' rows per forward pass")
    polyview.add_argument("--device", default=v.device, help="where the judges run (cpu | cuda)")
    polyview.add_argument("--dtype", default=v.dtype, help="the judges' dtype (default: float32 for an export folder)")
    polyview.add_argument("--threads", type=int, default=v.threads, help="torch.set_num_threads")
    polyview.add_argument("--goal-ms", type=float, default=v.goal_ms, help="latency goal for the median query")
    polyview.add_argument("--out", default="outputs/bench/polyview.json", help="result JSON (written atomically)")

    from omnimed.bench.distill import SIDES as DISTILL_SIDES
    from omnimed.bench.distill import DistillBenchConfig
    from omnimed.bench.train_config import ACCELERATORS, PRECISIONS

    k = DistillBenchConfig()
    distill = sub.add_parser("distill", help="our distillation step against SentenceTransformerTrainer (samples/s)")
    distill.add_argument("--model", default=k.model,
                         help="a conf/model encoder (bge-m3-shape: BGE-M3's shape, random weights)")
    distill.add_argument("--accelerator", choices=ACCELERATORS, default=k.accelerator)
    distill.add_argument("--precision", choices=PRECISIONS, default=k.precision,
                         help="bf16-mixed: autocast on both sides (GPU only)")
    distill.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                         default=k.gradient_checkpointing, help="activation checkpointing in both encoders")
    distill.add_argument("--max-length", type=int, default=k.max_length, help="tokens per query or passage")
    distill.add_argument("--encode-batch-size", type=int, default=k.encode_batch_size,
                         help="ours: texts per encoder pass, sorted by length (task.encode_batch_size; 0: one "
                              "pass; unset: 32 on the CPU, one pass on a GPU)")
    distill.add_argument("--data", default=k.data,
                         help="a utility record set built beforehand (stage polyrag_utility) instead of labelling one")
    distill.add_argument("--steps", type=int, default=k.steps, help="timed steps (after warmup)")
    distill.add_argument("--warmup", type=int, default=k.warmup, help="untimed warmup steps")
    distill.add_argument("--batch-size", type=int, default=k.batch_size, help="queries per step")
    distill.add_argument("--window", type=int, default=k.window, help="passages per query")
    distill.add_argument("--threads", type=int, default=k.threads, help="torch.set_num_threads in each side")
    distill.add_argument("--lr", type=float, default=k.lr)
    distill.add_argument("--temperature", type=float, default=k.temperature, help="the student's softmax temperature")
    distill.add_argument("--teacher-temperature", type=float, default=k.teacher_temperature)
    distill.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=k.dropout,
                         help="train with the model's dropout (--no-dropout: every step's loss must match)")
    distill.add_argument("--seed", type=int, default=k.seed)
    distill.add_argument("--world-size", default=k.world_size, help="the world whose oracle labels the queries")
    distill.add_argument("--repeats", type=int, default=k.repeats,
                         help="run both sides this many times, alternating the order; medians are compared")
    distill.add_argument("--sides", nargs="+", choices=DISTILL_SIDES, default=list(k.sides))
    distill.add_argument("--st-optim", default=k.st_optim,
                         help="the st side's TrainingArguments.optim (adamw_torch: torch's AdamW, as ours)")
    distill.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=k.isolate,
                         help="each side in its own process (--no-isolate: both in this one, one after the other)")
    distill.add_argument("--goal-ratio", type=float, default=k.goal_ratio, help="ours/st samples/s goal")
    distill.add_argument("--out", default="outputs/bench/distill.json", help="result JSON (written atomically)")
    return parser


RETRIEVAL_ROWS: list[tuple[str, str | tuple[str, ...], int]] = [
    ("passages", "passages", 0), ("queries timed (rank-bm25: reference queries)", ("queries", "reference_queries"), 0),
    ("BM25 build (passages/s)", "bm25_build_passages_per_s", 0), ("BM25 queries/s, 1 thread", "bm25_qps", 0),
    ("rank-bm25 build (passages/s)", "rank_bm25_build_passages_per_s", 0),
    ("rank-bm25 queries/s", "rank_bm25_qps", 2), ("BM25 / rank-bm25", "bm25_vs_rank_bm25", 0),
    ("BM25 / rank-bm25, same queries", "bm25_vs_rank_bm25_same_queries", 0),
    ("top-10 overlap with rank-bm25", "bm25_top10_overlap_with_rank_bm25", 2),
    ("MiniLM embedding (passages/s), texts not cached", "embed_passages_per_s", 0),
    ("MiniLM embedding (passages/s), fixed sample", "embed_sample_passages_per_s", 0),
    ("FAISS flat build (s)", "flat_build_s", 2),
    ("FAISS flat: p50 / p95 ms", ("flat_p50_ms", "flat_p95_ms"), 2), ("FAISS flat queries/s", "flat_qps", 0),
    ("HNSW build (s)", "hnsw_build_s", 1), ("HNSW build (passages/s)", "hnsw_build_passages_per_s", 0),
    ("HNSW: p50 / p95 ms", ("hnsw_p50_ms", "hnsw_p95_ms"), 2), ("HNSW queries/s", "hnsw_qps", 0),
    ("HNSW recall@10 vs flat", "hnsw_recall_vs_flat", 3),
    ("dense end to end: p50 / p95 ms (encode + HNSW)", ("dense_end_to_end_p50_ms", "dense_end_to_end_p95_ms"), 2),
    ("dense end to end queries/s, one at a time", "dense_end_to_end_qps", 0),
    ("dense end to end queries/s, one batch", "dense_end_to_end_batch_qps", 0),
    ("load avg 1m: start / end", ("load_avg_1m_start", "load_avg_1m_end"), 2),
]


def _cell(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def retrieval_table(result: dict[str, Any]) -> Table:
    """One column per corpus: the measurements of ``bench_retrieval``, then the targets as pass / FAIL."""
    hw = result["hardware"]
    embed = {c.get("embed_threads") for c in result["corpora"]} - {None}
    table = Table(
        title=f"omnimed-bench retrieval ({result['threads']} thread(s) timed, embedding on "
              f"{'/'.join(map(str, sorted(embed))) or '-'}; {result['encoder']})",
        caption=f"{hw['cpu']}, {hw['cores']} usable cores; load avg 1m {hw['load_avg_1m']:.2f} at start, "
                f"{hw.get('load_avg_1m_end', float('nan')):.2f} at end, mean {hw.get('load_avg_1m_mean', float('nan'))}"
                f" / max {hw.get('load_avg_1m_max', float('nan'))} during the run",
    )
    table.add_column("metric")
    for c in result["corpora"]:
        table.add_column(c["corpus"], justify="right")
    for label, key, digits in RETRIEVAL_ROWS:
        cells = []
        for c in result["corpora"]:
            if isinstance(key, tuple):
                cells.append(" / ".join(_cell(c.get(k), digits) for k in key))
            else:
                cells.append(_cell(c.get(key), digits))
        table.add_row(label, *cells)
    table.add_section()
    for target in (result["corpora"][0]["targets"] if result["corpora"] else {}):
        table.add_row(f"target: {target}", *["pass" if c["targets"][target] else "FAIL" for c in result["corpora"]])
    return table


def run_retrieval(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench retrieval``: run :func:`~omnimed.bench.retrieval.bench_retrieval`, print, write JSON."""
    from omnimed.bench.retrieval import bench_retrieval
    from omnimed.data.artifacts import atomic_write_json

    cons = out_console or console
    result = bench_retrieval([c.strip() for c in args.corpora.split(",") if c.strip()], world_size=args.world_size,
                             cache_dir=args.cache, n_queries=args.queries, n_reference=args.reference_queries,
                             threads=args.threads, seed=args.seed, embed_sample=args.embed_sample,
                             log=cons.print)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)
    cons.print(retrieval_table(result))
    for name, reason in result["skipped"].items():
        cons.print(f"[yellow]{name} skipped[/]: {reason}")
    cons.print(f"wrote [bold]{out}[/] ({result['wall_s']:.0f} s)")
    return result


def _publish(result: dict[str, Any], table: Table, out: str, cons: Console, suffix: str = "") -> None:
    """Write ``result`` to ``out`` atomically, then print ``table`` and where the JSON went."""
    from omnimed.data.artifacts import atomic_write_json

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)
    cons.print(table)
    cons.print(f"wrote [bold]{path}[/]{suffix}")


def run_train(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench train``: run :func:`~omnimed.bench.train.bench_train`, print the table, write the JSON."""
    from omnimed.bench.train import bench_train
    from omnimed.bench.train_config import TrainBenchConfig

    cfg = TrainBenchConfig(**_side_by_side_fields(args), packing=args.packing, max_examples=args.max_examples,
                           trl_order=args.trl_order, micro_batch_tokens=args.micro_batch_tokens or None,
                           lean_mlp=args.lean_mlp, fused_kernels=args.fused_kernels, trl_liger=args.trl_liger)
    cons = out_console or console
    cons.print(f"benchmarking {', '.join(cfg.sides)} ({cfg.repeats} repeat(s)); each side runs in its own process")
    result = bench_train(cfg)
    _publish(result, train_table(result), args.out, cons, f" ({result['wall_s']} s)")
    return result


def run_dpo(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench dpo``: run :func:`~omnimed.bench.dpo.bench_dpo`, print the table, write the JSON."""
    from omnimed.bench.dpo import bench_dpo
    from omnimed.bench.dpo_config import DPOBenchConfig

    cfg = DPOBenchConfig(**_side_by_side_fields(args), beta=args.beta, pairs=args.pairs)
    cons = out_console or console
    cons.print(f"benchmarking DPO: {', '.join(cfg.sides)} ({cfg.repeats} repeat(s)); each side runs in its own process")
    result = bench_dpo(cfg)
    _publish(result, dpo_table(result), args.out, cons, f" ({result['wall_s']} s)")
    return result


def run_world(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench world``: time one world build and print the result."""
    from omnimed.data.world.bench import bench_world

    result = bench_world(seed=args.seed, size=args.size)
    table = Table(title=f"omnimed-bench world: size={args.size} seed={args.seed}", show_header=False)
    for key, value in result.items():
        table.add_row(str(key), fmt(value, 6))
    (out_console or console).print(table)
    return result


def run_scoring(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench scoring``: run :func:`~omnimed.bench.scoring.bench_scoring`, print, write JSON."""
    from omnimed.bench.scoring import bench_scoring

    result = bench_scoring(args.model, args.world_size, args.questions, args.top_k, args.shots, args.threads)
    hw = result["hardware"]
    table = Table(title=f"omnimed-bench scoring: {result['model']}, {result['questions']} questions x top-"
                        f"{result['top_k']}, {result['shots']}-shot, {result['threads']} threads",
                  caption=f"{hw['cpu']}, {hw['cores']} usable cores; load avg 1m {hw['load_avg_1m']:.2f} at start")
    for column in ("backend", "s / question", "speed-up", "max score diff"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    table.add_row("alone (every row in full)", fmt(result["alone_s_per_question"]), "1", "-")
    for name, label in (("shared", "shared prompt per call"), ("kept", "kept caches (default)")):
        table.add_row(label, fmt(result[f"{name}_s_per_question"]), fmt(result[f"{name}_speedup"], 3),
                      fmt(result[f"{name}_max_score_diff"], 2))
    _publish(result, table, args.out, out_console or console)
    return result


def run_plan(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench plan``: run :func:`~omnimed.bench.plan.bench_plan`, print, write JSON."""
    from omnimed.bench.plan import bench_plan

    result = bench_plan(args.planner, tuple(args.backends), args.world_size, args.questions, args.max_new_tokens,
                        args.batch_size, args.threads, base_url=args.base_url, served_model=args.served_model)
    hw = result["hardware"]
    table = Table(title=f"omnimed-bench plan: {result['planner']}, {result['questions']} questions, batch "
                        f"{result['batch_size']}, at most {result['max_new_tokens']} new tokens, "
                        f"{result['threads']} threads",
                  caption=f"{hw['cpu']}, {hw['cores']} usable cores; load avg 1m {hw['load_avg_1m']:.2f} at start")
    for column in ("backend", "s / sample", "generated tokens/s", "tokens / plan", "plans without problems"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for name, r in result["backends"].items():
        table.add_row(name, fmt(r["s_per_sample"]), fmt(r["generated_tokens_per_s"]),
                      fmt(r["mean_generated_tokens"]), fmt(r["parsed_without_problems"], 3))
    for name, reason in result["skipped"].items():
        table.add_row(name, "skipped", reason, "", "")
    _publish(result, table, args.out, out_console or console)
    return result


def polyview_table(result: dict[str, Any]) -> Table:
    """Milliseconds per query, each part's median and share, the goal."""
    cfg, hw = result["config"], result["hardware"]
    table = Table(
        title=f"omnimed-bench polyview: PolyRAG rank, {result['queries']} cold queries x "
              f"{result['candidates_per_query']} candidates, every view; judges {cfg['relevance_judge']} / "
              f"{cfg['supplement_judge']} (hf, {result['device']}, {result.get('dtype') or 'float32'}), "
              f"utility {cfg['utility_encoder']}, "
              f"{result['threads']} threads",
        caption=f"{hw['cpu']}, {hw['cores']} usable cores; load avg 1m {hw['load_avg_1m']:.2f} at start, "
                f"{hw.get('load_avg_1m_end', float('nan')):.2f} at end")
    table.add_column("metric")
    table.add_column("ms", justify="right")
    table.add_column("share of the median", justify="right")
    table.add_row("median per query", fmt(result["median_ms"], 5), "")
    table.add_row("p90 per query", fmt(result["p90_ms"], 5), "")
    table.add_row("mean / min / max", " / ".join(fmt(result[k], 5) for k in ("mean_ms", "min_ms", "max_ms")), "")
    table.add_row("median per candidate", fmt(result["ms_per_candidate"], 4), "")
    table.add_section()
    for part, ms in result["parts_median_ms"].items():
        table.add_row(f"  {part} (median)", fmt(ms, 4), fmt(result["parts_share"].get(part), 3))
    table.add_section()
    table.add_row(f"goal: median <= {fmt(result['goal_ms'])} ms", "", "met" if result["meets_goal"] else "NOT met")
    arith = result.get("arithmetic")
    if arith:
        table.add_row(f"floor: {fmt(arith['gflop_per_query'], 4)} GFLOP a query at {fmt(arith['matmul_gflops'], 4)} "
                      "GFLOP/s (best fp32 matmul)", fmt(arith["floor_ms"], 4),
                      "goal within reach" if arith["goal_reachable"] else "goal out of reach here")
    return table


def run_polyview(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench polyview``: run :func:`~omnimed.bench.polyview.bench_polyview`, print, write JSON."""
    from omnimed.bench.polyview import PolyviewBenchConfig, bench_polyview

    cfg = PolyviewBenchConfig(queries=args.queries, warmup=args.warmup, candidates=args.candidates,
                              world_size=args.world_size, relevance_judge=args.relevance_judge,
                              supplement_judge=args.supplement_judge, utility_encoder=args.utility_encoder,
                              domain=args.domain, batch_size=args.batch_size, device=args.device,
                              dtype=args.dtype, threads=args.threads, goal_ms=args.goal_ms)
    cons = out_console or console
    result = bench_polyview(cfg, log=cons.print)
    _publish(result, polyview_table(result), args.out, cons, f" ({result['wall_s']} s)")
    return result


DISTILL_ROWS: list[tuple[str, str, int]] = [
    ("samples/s (queries)", "samples_per_s", 5),
    ("samples/s at median step time", "samples_per_s_median_step", 5),
    ("mean step time (s)", "mean_step_s", 4),
    ("median step time (s)", "median_step_s", 4),
    ("CPU s per step (all threads)", "cpu_seconds_per_step", 4),
    ("first-step loss", "first_step_loss", 7),
    ("loss at init, eval mode, first batch", "init_loss_eval", 7),
    ("peak RSS (MB)", "peak_rss_mb", 5),
    ("RSS after model load (MB)", "rss_after_model_load_mb", 5),
    ("peak GPU memory allocated (MB)", "peak_gpu_allocated_mb", 5),
    ("threads in loop", "threads", 4),
    ("setup (s)", "setup_s", 4),
    ("optimizer", "optimizer", 4),
]


def distill_table(result: dict[str, Any]) -> Table:
    """Ours and sentence-transformers' median runs side by side, then the ratios, loss checks and goal."""
    cfg, hw, data = result["config"], result["hardware"], result["data"]
    versions = hw["versions"]
    device = f"{hw['gpu']} ({cfg['precision']}); " if cfg["accelerator"] == "cuda" and hw.get("gpu") else ""
    table = side_by_side(
        result, ("ours", "st"), DISTILL_ROWS,
        title=f"omnimed-bench distill: {cfg['model']}, batch {cfg['batch_size']} queries x window {cfg['window']}, "
              f"{cfg['threads']} threads, W={cfg['warmup']} N={cfg['steps']}, {cfg['repeats']} repeat(s), dropout "
              f"{'on' if cfg['dropout'] else 'off'}, {'a process per side' if cfg['isolate'] else 'one process'}; "
              f"{data['examples']} queries ({data.get('path') or data['world_size'] + ' world oracle'})",
        caption=f"{device}{hw['cpu_model']}, {hw['usable_cores']} usable cores, torch {versions['torch']}, lightning "
                f"{versions['lightning']}, sentence-transformers {versions['sentence-transformers']}; load avg "
                f"before {hw['load_average']} after {hw.get('load_average_after')}")
    comp = result.get("comparison")
    if comp:
        table.add_section()
        table.add_row("ours / st samples/s", fmt(comp["ratio_samples_per_s"]),
                      f"goal >= {comp['goal_ratio']}: {'met' if comp['meets_goal'] else 'NOT met'}")
        table.add_row("ours / st samples/s (median step)", fmt(comp["ratio_samples_per_s_median_step"]), "")
        if len(result.get("ratios_per_repeat", [])) > 1:
            table.add_row("ratio per repeat", ", ".join(map(str, result["ratios_per_repeat"])), "")
        table.add_row("ours / st peak RSS", fmt(comp["ratio_peak_rss"]), "")
        if comp["ratio_peak_gpu_allocated"] is not None:
            table.add_row("ours / st peak GPU memory", fmt(comp["ratio_peak_gpu_allocated"]), "")
        table.add_row("loss at init |diff|", fmt(comp["init_loss_abs_diff"], 3),
                      f"match: {fmt(comp['init_loss_match'])}")
        table.add_row("first-step loss |diff|", fmt(comp["first_step_loss_abs_diff"], 3),
                      f"match: {fmt(comp['first_step_loss_match'])}" if comp["first_step_loss_match"] is not None
                      else "dropout on: masks differ")
        table.add_row("same first batch", fmt(comp["same_first_batch"]), "")
    return table


def run_distill(args: argparse.Namespace, out_console: Console | None = None) -> dict[str, Any]:
    """``omnimed-bench distill``: run :func:`~omnimed.bench.distill.bench_distill`, print, write JSON."""
    from omnimed.bench.distill import DistillBenchConfig, bench_distill

    cfg = DistillBenchConfig(steps=args.steps, warmup=args.warmup, batch_size=args.batch_size, window=args.window,
                             threads=args.threads, lr=args.lr, temperature=args.temperature,
                             teacher_temperature=args.teacher_temperature, dropout=args.dropout, seed=args.seed,
                             world_size=args.world_size, repeats=args.repeats, sides=list(args.sides),
                             st_optim=args.st_optim, isolate=args.isolate, goal_ratio=args.goal_ratio,
                             model=args.model, accelerator=args.accelerator, precision=args.precision,
                             gradient_checkpointing=args.gradient_checkpointing, max_length=args.max_length,
                             encode_batch_size=args.encode_batch_size, data=args.data)
    cons = out_console or console
    result = bench_distill(cfg, log=cons.print)
    _publish(result, distill_table(result), args.out, cons, f" ({result['wall_s']} s)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "train":
        run_train(args)
    elif args.command == "dpo":
        run_dpo(args)
    elif args.command == "world":
        run_world(args)
    elif args.command == "retrieval":
        run_retrieval(args)
    elif args.command == "scoring":
        run_scoring(args)
    elif args.command == "plan":
        run_plan(args)
    elif args.command == "polyview":
        run_polyview(args)
    elif args.command == "distill":
        run_distill(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

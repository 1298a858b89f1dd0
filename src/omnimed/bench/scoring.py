"""``omnimed-bench scoring``: what the hf backend's prompt caches save on Self-BioRAG's branch scoring.

Self-BioRAG (logprob mode) judges each question with ``top_k`` passages in four calls, each continuing the last:
REL after the passage, the option letter after "The answer is", SUP after the answer, USE after SUP; every
branch repeats the 3-shot prompt. The same questions, passages and demonstrations (the synthetic world's test
MCQs; passages drawn from its corpus, a fixed set per question) run through :class:`SelfBioRAG` on three backends:

- ``alone``: one request per backend call with no kept caches, so every row is computed in full (what the
  backend did before it shared prompts);
- ``shared``: whole calls, a prompt shared by a call's rows computed once (``prefix_cache_mb=0``);
- ``kept``: the default, caches kept so each call continues the rows of the one before.

Reported: seconds per question for each, the speed-ups over ``alone``, and the largest difference of any branch
score from ``alone`` (caching must not change a result).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any


class _FixedPassages:
    """A knowledge-base stand-in: ``k`` passages per question, fixed by the question's position in the pass."""

    def __init__(self, passages: Sequence[Any]) -> None:
        self.passages = list(passages)
        self.calls = 0

    def search_sources(self, queries: Sequence[str], k: int, **_: Any) -> list[list[Any]]:
        out = []
        for i, _query in enumerate(queries):
            start = (self.calls + i) * k
            out.append([self.passages[(start + j) % len(self.passages)] for j in range(k)])
        self.calls += len(queries)
        return out


class _OneAtATime:
    """The backend with each request sent alone."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def next_token_logprobs(self, requests: Sequence[Any], tokens: Sequence[str]) -> list[dict[str, float]]:
        return [self.backend.next_token_logprobs([r], tokens)[0] for r in requests]


def bench_scoring(model: str = "smollm2-135m", world_size: str = "small", questions: int = 12, top_k: int = 5,
                  shots: int = 3, threads: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Time one Self-BioRAG pass over ``questions`` world MCQs on each backend setting; see the module doc."""
    import torch

    from omnimed.bench.retrieval import hardware
    from omnimed.data.world import build_world
    from omnimed.generation.hf import HFBackend
    from omnimed.methods.selfbiorag.inference import SelfBioRAG, SelfBioRAGConfig
    from omnimed.methods.selfbiorag.tokens import SPECIAL_TOKENS
    from omnimed.models.config import named_model_config

    if threads:
        torch.set_num_threads(threads)
    world = build_world(seed, world_size)
    mcqs = [q for q in world.questions if hasattr(q, "options")]
    test = [q for q in mcqs if q.split == "test"][:questions]
    pool = [q for q in mcqs if q.split == "train"]
    cfg = SelfBioRAGConfig(retrieval="always", top_k=top_k, shots=shots, answer_mode="logprob")
    model_cfg = dataclasses.replace(named_model_config(model), special_tokens=list(SPECIAL_TOKENS))
    settings = {"alone": 0, "shared": 0, "kept": 2048}
    result: dict[str, Any] = {"model": model, "world_size": world_size, "questions": len(test), "top_k": top_k,
                              "shots": shots, "threads": torch.get_num_threads(), "hardware": hardware()}
    scores: dict[str, list[float]] = {}
    for name, megabytes in settings.items():
        torch.manual_seed(seed)  # the added tokens' rows are drawn at load: the same draw for every backend
        backend = HFBackend(model_cfg, prefix_cache_mb=megabytes)
        served = _OneAtATime(backend) if name == "alone" else backend
        method = SelfBioRAG(cfg, served, _FixedPassages(world.passages), demonstrations=pool)
        start = time.perf_counter()
        outputs = method.answer(test)
        result[f"{name}_s_per_question"] = (time.perf_counter() - start) / max(1, len(test))
        scores[name] = [c.score for o in outputs for c in o.candidates]
    for name in ("shared", "kept"):
        result[f"{name}_speedup"] = result["alone_s_per_question"] / result[f"{name}_s_per_question"]
        result[f"{name}_max_score_diff"] = max(abs(a - b) for a, b in zip(scores[name], scores["alone"]))
    return result

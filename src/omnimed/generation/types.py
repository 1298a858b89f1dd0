"""The generation contract every backend implements, and the request / result types it exchanges.

A :class:`Request` carries the prompt (plain text, or chat messages rendered with the model's chat template) and
``meta``: structured facts about what is asked (task kind, question id, passage ids, ...). Model backends ignore
``meta``; the oracle backend answers from it exactly, which is how the synthetic world stands in for a teacher LLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

Messages = list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": "..."}]


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings; the defaults are greedy, as the papers evaluate."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class Request:
    prompt: Union[str, Messages]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """One completion (``n`` > 1 gives several per request). ``error`` is set, and ``text`` empty, when the
    backend failed on this request after its retries: a failed call is reported, never silently dropped."""

    text: str
    finish_reason: str = "stop"
    tokens: int = 0
    error: str | None = None


class GenerationError(RuntimeError):
    """A backend could not be built or called; the message names the backend, model and what to fix."""


class Backend(Protocol):
    """What pipelines call. ``name`` and ``model_id`` key the on-disk cache."""

    name: str
    model_id: str

    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        """``n`` generations per request, in request order."""
        ...

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        """Sum of the log-probabilities of each continuation's tokens given its request's prompt."""
        ...

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        """Log-probability of each of ``tokens`` (single tokens of the vocabulary, e.g. reflective tokens) as the
        next token after each prompt; the full-vocabulary distribution, restricted to the set."""
        ...

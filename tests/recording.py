"""A generation backend wrapper that keeps the prompt text of every request it is sent, for tests that check what a
pipeline asks its model (the rendered prompt, per request task)."""

from __future__ import annotations


class RecordingBackend:
    """Wraps a backend with ``render``; ``prompts`` holds ``(request task, rendered prompt)`` in the order sent."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.model_id = inner, inner.name, inner.model_id
        self.prompts: list[tuple[str, str]] = []

    def sent(self, task: str) -> list[str]:
        """The rendered prompts of the requests whose task is ``task``."""
        return [text for kind, text in self.prompts if kind == task]

    def next_token_logprobs(self, requests, tokens):
        self.prompts += [(r.meta["task"], self.inner.render(r)) for r in requests]
        return self.inner.next_token_logprobs(requests, tokens)

    def generate(self, requests, params):
        self.prompts += [(r.meta["task"], self.inner.render(r)) for r in requests]
        return self.inner.generate(requests, params)

    def score(self, requests, continuations):
        return self.inner.score(requests, continuations)

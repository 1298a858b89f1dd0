"""How a :class:`Request` becomes prompt text, shared by the backends so they all see the same prompt.

- A plain string is the prompt, as it is.
- Chat messages go through the model's chat template with the assistant turn opened (``add_generation_prompt``).
- ``meta["assistant_prefix"]`` (e.g. ``"<answer>"``) is appended after that: the reply is started for the model,
  which is how a pipeline asks for the next token of a fixed answer format.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from omnimed.generation.types import Messages, Request

PREFIX_KEY = "assistant_prefix"
T = TypeVar("T")


def is_chat(request: Request) -> bool:
    return not isinstance(request.prompt, str)


def assistant_prefix(request: Request) -> str:
    prefix = request.meta.get(PREFIX_KEY, "")
    if not isinstance(prefix, str):
        raise TypeError(f"meta[{PREFIX_KEY!r}] must be a string, got {type(prefix).__name__}")
    return prefix


def plain_chat(messages: Messages) -> str:
    """A template-free rendering for models without a chat template: ``Role: content`` blocks, then
    ``Assistant:`` (so base models still see who speaks)."""
    blocks = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join([*blocks, "Assistant:"]) + " "


def render_with(request: Request, template: Any | None) -> str:
    """Prompt text of ``request``; ``template`` is a tokenizer with a chat template, or ``None`` for
    :func:`plain_chat`."""
    if isinstance(request.prompt, str):
        text = request.prompt
    elif template is not None:
        text = template.apply_chat_template(request.prompt, tokenize=False, add_generation_prompt=True)
    else:
        text = plain_chat(request.prompt)
    return text + assistant_prefix(request)


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), max(1, size)):
        yield items[start : start + size]

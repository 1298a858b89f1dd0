"""Prompt templates of the shared reader, as chat messages.

The wording is ours; the formats follow the papers: reason step by step, then put the final answer inside
``<answer>...</answer>`` (Omni-RAG's reader), evidence passages numbered with their source and title. The
statement judge's prompt is :mod:`omnimed.evaluation.judge_prompt`.

Bump :data:`PROMPT_VERSION` whenever a template's wording changes: the prompt text is part of every cached call's
key, and the version is recorded with each run so numbers from different wordings are never mixed silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.generation.types import Messages

PROMPT_VERSION = "reader-v2"

#: the tag the reader's final answer goes in
ANSWER_TAG = "answer"

READER_SYSTEM = (
    "You are a careful medical expert. Work through the question one step at a time, lean on the evidence when "
    "it is relevant and set it aside when it is not, and finish with your final answer inside "
    "<answer></answer> tags."
)



def _clip(text: str, max_chars: int | None) -> str:
    """``text`` cut to at most ``max_chars`` characters at a word boundary, with `` ...`` marking the cut."""
    if max_chars is None or len(text) <= max_chars:
        return text
    head = text[:max_chars]
    if " " in head:
        head = head.rsplit(" ", 1)[0]
    return head.rstrip() + " ..."


def evidence_block(passages: Sequence[Passage], max_chars: int | None = 1200) -> str:
    """Passages numbered ``[1]``, ``[2]``, ... with their source and title, each text cut to ``max_chars``."""
    blocks = []
    for i, p in enumerate(passages, start=1):
        head = f"[{i}] source: {p.source}" + (f" | title: {p.title}" if p.title else "")
        blocks.append(f"{head}\n{_clip(p.text, max_chars)}")
    return "\n\n".join(blocks)


def options_block(options: Mapping[str, str]) -> str:
    """One ``X. text`` line per option, in the options' order."""
    return "\n".join(f"{letter}. {text}" for letter, text in options.items())


def _with_evidence(passages: Sequence[Passage], max_chars: int | None, rest: list[str]) -> str:
    parts = []
    if passages:
        parts.append("Evidence passages:\n" + evidence_block(passages, max_chars))
    return "\n\n".join(parts + rest)


def mcq_messages(q: MultipleChoiceQuestion, passages: Sequence[Passage] = (),
                 max_chars: int | None = 1200) -> Messages:
    """Reader prompt for a multiple-choice question; a question with several correct options asks for all of
    their letters, comma-separated, in one tag."""
    letters = ", ".join(q.options)
    if len(q.answer) > 1:
        ask = ("More than one option may be correct. Think it through step by step, then give the letters of all "
               f"correct options ({letters}), separated by commas, in one tag such as <answer>A, C</answer>.")
    else:
        ask = ("Think it through step by step, then give the letter of the single best option "
               f"({letters}) as <answer>X</answer>.")
    user = _with_evidence(passages, max_chars, [f"Question: {q.question}", f"Options:\n{options_block(q.options)}",
                                                ask])
    return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}]


def open_messages(q: OpenQuestion, passages: Sequence[Passage] = (), max_chars: int | None = 1200) -> Messages:
    """Reader prompt for an open question: a short free-text answer inside the tag."""
    ask = ("Think it through step by step, then write your answer in a few plain sentences inside "
           "<answer></answer>.")
    user = _with_evidence(passages, max_chars, [f"Question: {q.question}", ask])
    return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}]

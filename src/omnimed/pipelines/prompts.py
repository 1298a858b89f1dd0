"""Prompt templates of the shared reader and judges, in our own words, in the formats the papers specify
(step-by-step reasoning, then the final answer inside ``<answer>...</answer>``). Bump ``PROMPT_VERSION`` whenever
the wording changes: it is part of every cached call's key through the prompt text, and of the run's metadata."""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage

PROMPT_VERSION = "reader-v1"

SYSTEM = ("You are a careful medical expert. Think the question through step by step, use the evidence when it "
          "helps and say so when it does not, then give your final answer inside <answer></answer> tags.")


def evidence_block(passages: Sequence[Passage], max_chars: int = 1200) -> str:
    """Passages numbered [1], [2], ... with their source and title, each cut to ``max_chars`` characters."""
    lines = []
    for i, p in enumerate(passages, start=1):
        head = f"[{i}] ({p.source}" + (f": {p.title}" if p.title else "") + ")"
        text = p.text if len(p.text) <= max_chars else p.text[:max_chars].rsplit(" ", 1)[0] + " ..."
        lines.append(f"{head}\n{text}")
    return "\n\n".join(lines)


def mcq_messages(q: MultipleChoiceQuestion, passages: Sequence[Passage] = (), max_chars: int = 1200) -> list[dict]:
    options = "\n".join(f"{letter}. {text}" for letter, text in q.options.items())
    parts = []
    if passages:
        parts.append("Evidence:\n" + evidence_block(passages, max_chars))
    parts.append(f"Question: {q.question}\n\nOptions:\n{options}")
    parts.append("Reason step by step, then write only the letter of the best option as <answer>X</answer>.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def open_messages(q: OpenQuestion, passages: Sequence[Passage] = (), max_chars: int = 1200) -> list[dict]:
    parts = []
    if passages:
        parts.append("Evidence:\n" + evidence_block(passages, max_chars))
    parts.append(f"Question: {q.question}")
    parts.append("Answer in a few sentences, inside <answer></answer>.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def statement_judge_messages(reference: str, statement: str) -> list[dict]:
    """PolyRAG-style statement check: is one statement of an answer correct, incorrect or not mentioned with
    respect to the reference answer?"""
    return [
        {"role": "system", "content": "You compare one statement with a reference answer written by experts."},
        {"role": "user", "content": (
            f"Reference answer:\n{reference}\n\nStatement:\n{statement}\n\n"
            "If the reference confirms the statement, reply <label>correct</label>; if it contradicts it, "
            "<label>incorrect</label>; if it says nothing about it, <label>not_mentioned</label>."
        )},
    ]

"""How a record reads as text, shared by the prompt layouts (:mod:`omnimed.models.layout`) and the TRL-format
datasets (:mod:`omnimed.data.hf`): evidence as Self-RAG's ``<paragraph>`` segments, and an instruction example's
user turn."""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.data.records import Passage


def index_text(passage: Passage) -> str:
    """What BM25, the encoder, the reranker and an embedder in training see of a passage: its title, then its text."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def render_evidence(passages: Sequence[Passage]) -> str:
    """Evidence as Self-RAG writes it: one ``<paragraph>TITLE\\nTEXT</paragraph>`` segment per passage (the title
    line only when there is a title), segments separated by newlines."""
    segments = []
    for p in passages:
        body = f"{p.title}\n{p.text}" if p.title else p.text
        segments.append(f"<paragraph>{body}</paragraph>")
    return "\n".join(segments)


def user_text(instruction: str, input_text: str = "", evidence: Sequence[Passage] = ()) -> str:
    """The chat layout's user turn: the instruction, then the input, then the evidence, blank-line separated."""
    return "\n\n".join([instruction, *([input_text] if input_text else []),
                        *([render_evidence(evidence)] if evidence else [])])

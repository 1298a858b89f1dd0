"""The one record every method returns for a question, whatever the paper: what it answered, whether that is
right, why there is no answer when there is none, which evidence it read, its raw output, and its own extras
(Self-BioRAG's critique scores, a planner's plan, ...), which the evaluators store beside each prediction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """One answered question. ``prediction``: an option letter (``"A,C"`` for several), or an open answer's text;
    None when no usable answer came back, and then ``problem`` says why (it counts as wrong, never as dropped).
    ``evidence``: ids of the passages the answer was given with. ``extras``: JSON-able, method-specific fields.
    ``error``: set when a backend call for this question failed (connection, timeout, server error): the method
    could not answer at all, which evaluations count apart from answers that could not be read, and a run with too
    many of them fails instead of reporting a score."""

    question_id: str
    prediction: str | None
    correct: bool
    problem: str | None = None
    evidence: list[str] = field(default_factory=list)
    raw: str = ""
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

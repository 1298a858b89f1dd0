"""The statement judge's prompt (PolyRAG's long-form evaluation): one statement of an answer against the reference
answer, a three-way verdict (correct / incorrect / not mentioned) inside ``<label>...</label>``. Our wording.

Its text is part of every cached judge call's key; the version recorded with runs is the reader's
:data:`omnimed.methods.prompts.PROMPT_VERSION`, bumped for a change of either wording.
"""

from __future__ import annotations

from omnimed.generation.types import Messages

#: the tag the judge's verdict goes in
JUDGE_TAG = "label"

JUDGE_SYSTEM = (
    "You check single statements against a reference answer written by medical experts. Judge only what the "
    "reference says or clearly implies, not your own knowledge."
)


def statement_judge_messages(reference: str, statement: str, question: str | None = None) -> Messages:
    """Judge prompt for one statement of a long-form answer against the reference answer (and, when given, the
    question both answer). The verdict is one of ``correct``, ``incorrect``, ``not_mentioned``."""
    parts = [f"Question: {question}"] if question else []
    parts += [
        f"Reference answer:\n{reference}",
        f"Statement:\n{statement}",
        ("Decide how the reference answer relates to the statement:\n"
         "- correct: the reference states it or clearly implies it, with nothing contradicting it;\n"
         "- incorrect: the reference covers the same point and shows the statement is wrong;\n"
         "- not_mentioned: the reference does not address it, so it cannot be checked.\n"
         "Reply with exactly one of <label>correct</label>, <label>incorrect</label> or "
         "<label>not_mentioned</label>."),
    ]
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

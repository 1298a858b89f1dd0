"""Self-BioRAG's prompts, in our own words, following the formats of self-biorag.txt Appendix 7 (Tables 11-14).

Two audiences:

- the **teacher** (GPT-4 in the paper; any backend here, the world's oracle in miniature) rates one token type of
  an (instruction, output, evidence) triple and ends with ``Rating: [TOKEN]``; its prompts explain the scale;
- the **critic** LM learns to answer the *same* question with the token alone. Its prompt is short (a small model
  reads it thousands of times) and names the choices, so one trained critic serves all four types.

The generator sees an instruction exactly as training formatted it: the instruction, then its input, separated by a
blank line (:func:`omnimed.models.layout.user_text`), as a chat user turn.

Bump :data:`PROMPT_VERSION` when wording changes: prompts are part of every cached call's key and of each build's
manifest.
"""

from __future__ import annotations

from omnimed.data.records import Passage
from omnimed.generation.types import Messages
from omnimed.methods.selfbiorag.tokens import CRITIC_CHOICES

PROMPT_VERSION = "selfbiorag-prompts-v1"

TEACHER_SYSTEM = ("You grade training data for a biomedical assistant. Give a short reason, then the rating on the "
                  "last line as `Rating: [TOKEN]`, using exactly one of the tokens offered.")

TEACHER_TASKS: dict[str, str] = {
    "retrieval": (
        "Decide whether the task below can be done well from general knowledge alone, or whether it needs facts "
        "that would have to be looked up in documents (a specific disease, drug, gene, trial or guideline). Answer "
        "[Retrieval] when looking facts up is needed and [No Retrieval] when it is not."
    ),
    "relevance": (
        "Decide whether the evidence passage is about the subject of the task and gives information that helps "
        "complete it. Answer [Relevant] or [Irrelevant]."
    ),
    "support": (
        "Judge only from the evidence, not from what you know, how much of the response the evidence backs up. "
        "[Fully supported]: every claim of the response is stated in the evidence. [Partially supported]: the "
        "evidence backs some of it but a main claim is missing from it. [No support / Contradictory]: the evidence "
        "does not back the response, is about something else, or says the opposite."
    ),
    "utility": (
        "Rate how useful the response is as an answer to the task, whatever its sources. [Utility:5]: complete, "
        "correct and clearly stated. [Utility:4]: correct but terse or missing a small detail. [Utility:3]: "
        "acceptable but needs a major addition. [Utility:2]: on the topic but wrong or incomplete. [Utility:1]: "
        "off topic or empty."
    ),
}

CRITIC_QUESTIONS: dict[str, str] = {
    "retrieval": "Does this task need facts looked up in documents?",
    "relevance": "Is the evidence relevant to the task?",
    "support": "How well does the evidence support the response?",
    "utility": "How useful is the response?",
}

#: which parts of the triple each type reads (Table 3: RET x, REL x+e, SUP x+e+y, USE x+y)
NEEDS: dict[str, tuple[str, ...]] = {
    "retrieval": (),
    "relevance": ("evidence",),
    "support": ("evidence", "output"),
    "utility": ("output",),
}


def evidence_text(passage: Passage) -> str:
    """A passage as the generator and critic read it: its title line (when it has one), then its text."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def passage_ref(passage: Passage) -> str:
    """The id a teacher knows a passage by: the source passage of a chunk that is its only chunk, else the id."""
    meta = passage.metadata
    return str(meta.get("chunk_of") or passage.id) if meta.get("n_chunks", 1) == 1 else passage.id


def _triple(kind: str, task: str, output: str | None, evidence: str | None) -> str:
    parts = [f"Task: {task}"]
    if "evidence" in NEEDS[kind]:
        if evidence is None:
            raise ValueError(f"a {kind} judgement needs evidence")
        parts.append(f"Evidence: {evidence}")
    if "output" in NEEDS[kind]:
        if output is None:
            raise ValueError(f"a {kind} judgement needs the response")
        parts.append(f"Response: {output}")
    return "\n\n".join(parts)


def teacher_messages(kind: str, task: str, output: str | None = None, evidence: str | None = None) -> Messages:
    """The teacher's request for one token type of one triple."""
    body = f"{TEACHER_TASKS[kind]}\n\n{_triple(kind, task, output, evidence)}\n\nRating:"
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": body}]


def critic_instruction(kind: str, task: str, output: str | None = None, evidence: str | None = None) -> str:
    """The critic's instruction for one token type of one triple; it answers with one of the type's tokens."""
    choices = " ".join(CRITIC_CHOICES[kind])
    return f"{CRITIC_QUESTIONS[kind]} Answer with one of: {choices}\n\n{_triple(kind, task, output, evidence)}"

"""Omni-RAG's prompts as chat messages: the planner's (Prompt E.7), the expert's exploration (E.3) and the judge's
(E.4), with the source descriptions (E.1) and query formats (E.2) they share.

The wording is ours; the formats are the paper's: one tag per source, ``;`` between queries, graph queries as
``term , question``, the judge's verdict as ``<answer>yes</answer>`` or ``<answer>no</answer>``. Bump
:data:`PROMPT_VERSION` when a wording changes: it is part of every stage's settings key and of the cached calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.data.records import SOURCE_KINDS, MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.generation.types import Messages
from omnimed.methods.prompts import evidence_block, options_block

PROMPT_VERSION = "omnirag-v1"

#: what each source holds (Prompt E.1, our words)
SOURCE_DESCRIPTIONS: dict[str, str] = {
    "book": "medical textbooks and teaching material: mechanisms, pathophysiology and pharmacology.",
    "guideline": "clinical practice guidelines issued by health organisations: recommended care and treatment.",
    "research": "biomedical research articles: clinical trials, genetic association studies and their results.",
    "wiki": "an encyclopaedia of general knowledge: overviews, signs and symptoms, epidemiology and history.",
    "graph": "a knowledge graph of medical concepts: each term's definition, other names and related concepts.",
}

_TEXT_FORMAT = "{query0} ; {query1} ; ..."
_GRAPH_FORMAT = "{term0} , {question about term0} ; {term1} , {question about term1} ; ..."


def question_text(q: MultipleChoiceQuestion | OpenQuestion) -> str:
    """The question as a planner sees it: the stem and, for a multiple-choice question, its options."""
    if isinstance(q, MultipleChoiceQuestion):
        return f"{q.question}\n{options_block(q.options)}"
    return q.question


def _sources_block(sources: Sequence[str]) -> str:
    return "\n".join(f"{s}: {SOURCE_DESCRIPTIONS[s]}" for s in sources)


def _formats_block(sources: Sequence[str], count: str) -> str:
    lines = []
    for s in sources:
        fmt = _GRAPH_FORMAT if s == "graph" else _TEXT_FORMAT
        note = f" ({count}, separated by ';'" + ("; a ',' between the term and its question)" if s == "graph" else ")")
        lines.append(f"<{s}>{fmt}</{s}>{note}")
    return "\n".join(lines)


def planning_messages(q: MultipleChoiceQuestion | OpenQuestion,
                      sources: Sequence[str] = SOURCE_KINDS) -> Messages:
    """The planner's prompt (E.7): 0 to 3 queries per source, an empty tag for a source it would not search."""
    user = (
        "Write search queries that would find the knowledge needed to answer the question below.\n"
        "1. Use the query format shown for each source. A source takes at most 3 queries, separated by ';', and they "
        "should not repeat each other. If a source would not help, leave its tag empty, e.g. <book></book>.\n"
        "2. Fit each source's queries to what that source holds.\n\n"
        f"# Question\n{question_text(q)}\n\n"
        f"# Sources\n{_sources_block(sources)}\n\n"
        f"# Query format\n{_formats_block(sources, '0 to 3 queries')}"
    )
    return [{"role": "user", "content": user}]


def exploration_messages(q: MultipleChoiceQuestion | OpenQuestion, n: int,
                         sources: Sequence[str] = SOURCE_KINDS) -> Messages:
    """The expert's exploration prompt (E.3): exactly ``n`` varied queries for every source."""
    user = (
        "Write search queries that would find the knowledge needed to answer the question below.\n"
        f"1. Every source listed under # Sources gets exactly {n} queries, in the format shown, separated by ';'.\n"
        "2. Make a source's queries differ from each other: each should look for the needed knowledge from another "
        "angle.\n"
        "3. Fit each source's queries to what that source holds.\n\n"
        f"# Question\n{question_text(q)}\n\n"
        f"# Sources\n{_sources_block(sources)}\n\n"
        f"# Query format\n{_formats_block(sources, f'{n} queries')}"
    )
    return [{"role": "user", "content": user}]


def gold_text(q: MultipleChoiceQuestion | OpenQuestion) -> str:
    """The gold answer as the judge is shown it: ``B. option text`` or the reference answer."""
    if isinstance(q, MultipleChoiceQuestion):
        return "; ".join(f"{letter}. {q.options[letter]}" for letter in q.answer)
    return q.reference_answer


def judge_messages(q: MultipleChoiceQuestion | OpenQuestion, documents: Sequence[Passage]) -> Messages:
    """The judge's prompt (E.4): do the documents one query retrieved support the gold answer to the question?"""
    docs = evidence_block(documents) if documents else "(the query retrieved nothing)"
    user = (
        "You are a medical expert. Decide whether the documents below back up the gold answer to the question: "
        "would a reader of these documents find support for that answer? Judge the documents, not whether the gold "
        "answer is right. Reason briefly (at most 100 words), then end with <answer>yes</answer> or "
        "<answer>no</answer>.\n\n"
        f"# Question\n{question_text(q)}\n\n# Gold answer\n{gold_text(q)}\n\n# Documents\n{docs}"
    )
    return [{"role": "user", "content": user}]

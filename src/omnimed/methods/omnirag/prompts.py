"""Omni-RAG's prompts as chat messages: the planner's (Prompt E.7), the expert's exploration (E.3) and the judge's
(E.4), with the source descriptions (E.1) and query formats (E.2) they share; and the table 4 baselines' (E.5 graph
terms, E.6 Query2Doc's pseudo-documents, E.8 / E.9 Reflexion's and SeRTS's revision and feedback), with the readers
of their replies.

The wording is ours; the formats are the paper's: one tag per source, ``;`` between queries, graph queries as
``term , question``, the judge's verdict as ``<answer>yes</answer>`` or ``<answer>no</answer>``, ``<term>``,
``<passage>``, ``<suggestion>`` and ``<score>`` tags. Bump :data:`PROMPT_VERSION` when a wording changes: it is part
of every stage's settings key and of the cached calls.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    return _plan_request(q, sources)


#: the planner's rules (E.7, E.8)
_PLAN_RULES = (
    "1. Use the query format shown for each source. A source takes at most 3 queries, separated by ';', and they "
    "should not repeat each other. If a source would not help, leave its tag empty, e.g. <book></book>.\n"
    "2. Fit each source's queries to what that source holds.\n\n"
)


def _plan_request(q: MultipleChoiceQuestion | OpenQuestion, sources: Sequence[str],
                  feedback: str | None = None) -> Messages:
    """E.7's request, or E.8's with the earlier plans' ``feedback``."""
    ask = "Write search queries that would find the knowledge needed to answer the question below."
    if feedback is not None:
        ask += (" Earlier plans and what a reviewer said about the documents they found are under # Feedback: "
                "write a better plan.")
    user = (
        f"{ask}\n{_PLAN_RULES}# Question\n{question_text(q)}\n\n"
        + (f"# Feedback\n{feedback}\n\n" if feedback is not None else "")
        + f"# Sources\n{_sources_block(sources)}\n\n"
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


def _tag_content(text: str, tag: str) -> str | None:
    """The content of the first ``<tag>...</tag>`` in ``text`` (an unclosed tag: up to the end), else None."""
    found = re.search(rf"<\s*{tag}\s*>(.*?)(?:<\s*/\s*{tag}\s*>|$)", text, re.IGNORECASE | re.DOTALL)
    return " ".join(found.group(1).split()) if found else None


#: Prompt E.5's limit: fewer than 4 terms
MAX_GRAPH_TERMS = 3


def graph_terms_messages(q: MultipleChoiceQuestion | OpenQuestion) -> Messages:
    """Prompt E.5: the question's medical terms, the graph queries of Original Question and Query2Doc."""
    user = (
        "You are a medical expert. List the medical terms that appear in the question below, at most "
        f"{MAX_GRAPH_TERMS}, separated by ',' inside one tag: <term>term0 , term1</term>.\n\n"
        f"# Question\n{q.question}"
    )
    return [{"role": "user", "content": user}]


def read_graph_terms(text: str) -> list[str]:
    """The terms of an E.5 reply (``,`` or ``;`` between them), at most :data:`MAX_GRAPH_TERMS`; none when the
    reply has no ``<term>`` tag."""
    content = _tag_content(text, "term")
    if content is None:
        return []
    terms = [" ".join(t.split()) for t in re.split(r"[,;]", content)]
    return list(dict.fromkeys(t for t in terms if t))[:MAX_GRAPH_TERMS]


def pseudo_document_messages(q: MultipleChoiceQuestion | OpenQuestion, source: str) -> Messages:
    """Prompt E.6 (Query2Doc): a passage of at most 200 words, written as ``source`` would, that answers the
    question; it becomes that source's query."""
    user = (
        "You are a medical expert. Write a passage that answers the question below, as it would read in the "
        "source described under # Source. Put it inside <passage></passage> and keep it to 200 words at most.\n\n"
        f"# Question\n{question_text(q)}\n\n# Source\n{source}: {SOURCE_DESCRIPTIONS[source]}"
    )
    return [{"role": "user", "content": user}]


def read_pseudo_document(text: str) -> str:
    """The passage of an E.6 reply: the ``<passage>`` tag's content, or the whole reply when it has none."""
    content = _tag_content(text, "passage")
    return content if content is not None else " ".join(text.split())


def revision_messages(q: MultipleChoiceQuestion | OpenQuestion, feedback: str,
                      sources: Sequence[str] = SOURCE_KINDS) -> Messages:
    """Prompt E.8 (Reflexion, SeRTS): a new plan in the planner's format that takes the earlier plans' feedback
    into account."""
    return _plan_request(q, sources, feedback)


#: the additive 5-point rubric of Prompt E.9 (the paper does not print its criteria; these are ours)
FEEDBACK_RUBRIC = (
    "- add 1 point if the documents are about the question's subject;\n"
    "- add 1 point if they name the entities the question and its options turn on;\n"
    "- add 1 point if they state facts that bear on choosing between the options;\n"
    "- add 1 point if those facts favour one answer over the others;\n"
    "- add 1 point if they settle the question so that no further search is needed."
)
#: the score that ends a Reflexion / SeRTS loop (E.9's maximum)
MAX_FEEDBACK_SCORE = 5


def feedback_messages(q: MultipleChoiceQuestion | OpenQuestion,
                      found: Sequence[tuple[str, str, Sequence[Passage]]],
                      sources: Sequence[str] = SOURCE_KINDS) -> Messages:
    """Prompt E.9 (Reflexion, SeRTS): score the documents a plan found (``found``: source, query, its documents)
    on the additive rubric and suggest better queries per source."""
    blocks = [f"## source: {source}; query: {query}\n{evidence_block(docs, 600) if docs else '(nothing found)'}"
              for source, query, docs in found]
    user = (
        "You are a medical expert reviewing a search. The documents below were found for the question with the "
        "source and query shown above each group.\n"
        f"1. Score the documents from 0 to {MAX_FEEDBACK_SCORE}, adding points as follows:\n{FEEDBACK_RUBRIC}\n"
        "2. Suggest how to search better, source by source: queries to change, sources to start or to stop "
        "using.\n\n"
        f"# Question\n{question_text(q)}\n\n"
        f"# Documents\n{chr(10).join(blocks) if blocks else '(the plan searched nothing)'}\n\n"
        f"# Sources\n{_sources_block(sources)}\n\n"
        "Write the suggestion in at most 100 words as <suggestion>...</suggestion>, then the score as "
        "<score>N</score>."
    )
    return [{"role": "user", "content": user}]


@dataclass(frozen=True)
class Feedback:
    """An E.9 reply read: the score (0 when unreadable, so an unreadable review never ends a loop), the
    suggestion, and what could not be read."""

    score: int
    suggestion: str
    problems: list[str] = field(default_factory=list)


def read_feedback(text: str) -> Feedback:
    """The score (an integer 0-5 in ``<score>``) and suggestion of an E.9 reply; what is missing or out of range is
    named in ``problems``."""
    problems: list[str] = []
    suggestion = _tag_content(text, "suggestion")
    if suggestion is None:
        problems.append("no <suggestion> tag")
    raw = _tag_content(text, "score")
    number = re.fullmatch(r"\d+(?:\.0+)?", raw or "")
    score = int(float(raw)) if number and raw is not None else 0
    if raw is None:
        problems.append("no <score> tag (scored 0)")
    elif not number or not 0 <= score <= MAX_FEEDBACK_SCORE:
        problems.append(f"score {raw!r} is not an integer 0-{MAX_FEEDBACK_SCORE} (scored 0)")
        score = 0
    return Feedback(score, suggestion or "", problems)

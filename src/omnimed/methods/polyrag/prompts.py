"""PolyRAG's prompts (appendix A.1), in our own words: the two utility-teacher prompts of Table 3 (answer with a
passage, answer without), the relevance judge of Table 4 (grades A-E) and the supplement judge of Table 5 (Yes /
No). The teacher prompts are plain text that ends where the answer starts, so a backend's ``score`` of the answer
is the teacher's log-likelihood of it."""

from __future__ import annotations

from omnimed.data.records import Passage
from omnimed.knowledge.types import index_text

PROMPT_VERSION = "polyrag-1"

#: relevance grades, best first: A the passage answers the query fully, E not at all (Table 4)
RELEVANCE_GRADES: tuple[str, ...] = ("A", "B", "C", "D", "E")
#: the grades that count as relevant when the judge's probability is read as one score
RELEVANT_GRADES: tuple[str, ...] = ("A", "B")
SUPPLEMENT_LABELS: tuple[str, ...] = ("Yes", "No")


def utility_with_passage(question: str, passage: Passage) -> str:
    """Table 3, first prompt: the question answered from one retrieved passage."""
    return (f"Answer the question using the passage below.\nQuestion: {question}\n"
            f"Passage: {index_text(passage)}\nAnswer:")


def utility_without_passage(question: str) -> str:
    """Table 3, second prompt: the question answered directly."""
    return f"Answer the question.\nQuestion: {question}\nAnswer:"


def relevance_messages(query: str, passage: Passage) -> list[dict[str, str]]:
    """Table 4: grade how well the content answers the query, one letter."""
    instruction = (
        "Grade how well the Content answers the Query, with one letter.\n"
        "A: the Content answers the Query completely.\n"
        "B: the Content answers the Query, with some extra text or a small detail missing.\n"
        "C: the Content does not answer the Query but is about the same subject.\n"
        "D: the Content shares only a few words with the Query.\n"
        "E: the Content has nothing to do with the Query.\n"
        "Reply with the letter only."
    )
    return [{"role": "user", "content": f"{instruction}\n\nQuery: {query}\nContent: {index_text(passage)}"}]


def supplement_messages(query: str, passage: Passage) -> list[dict[str, str]]:
    """Table 5: does the content add useful background to an answer of the query (Yes / No)."""
    instruction = (
        "Decide whether the Content adds useful background for answering the Query: facts about the same "
        "subject, its mechanism, history or alternatives, even if it does not state the answer itself.\n"
        "Reply with Yes or No only."
    )
    return [{"role": "user", "content": f"{instruction}\n\nQuery: {query}\nContent: {index_text(passage)}"}]

"""Shared result types of the knowledge package: what every index returns and what the facade hands out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnimed.data.records import Passage
from omnimed.data.text import index_text  # noqa: F401 (what every index sees of a passage; re-exported here)

# One ranked list per query: (row index into the source's passage table, score), best first.
Ranking = list[tuple[int, float]]


class KnowledgeError(ValueError):
    """Bad knowledge-base input or state; the message names the file, source, key or model involved."""


class IndexMismatchError(KnowledgeError):
    """An index on disk was built with another encoder, dimension or corpus than the one asked for."""


@dataclass(frozen=True)
class Hit:
    """One retrieved passage with its score and where it came from.

    ``retriever`` says which stage produced the final score (``bm25``, ``dense``, ``hybrid``, ``rerank``,
    ``graph``); ``rank`` is 1-based; ``query`` is the query text that found it.
    """

    passage: Passage
    score: float
    rank: int
    retriever: str
    query: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.passage.source

    @property
    def doc_id(self) -> str:
        """The id of the passage this hit was chunked from (the hit's own id when it was not chunked)."""
        return str(self.passage.metadata.get("chunk_of", self.passage.id))

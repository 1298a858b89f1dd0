"""The candidate passages PolyRAG's views judge: what the first-stage search of the knowledge base returns for a
query (PolyEVAL gives 14.7 candidates a query), and for labelling stages also the question's gold passages, so
that a window always holds the passages a teacher should rank first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.knowledge import pools


def labelled_questions(cfg: Any, knowledge: Any) -> list[MultipleChoiceQuestion | OpenQuestion]:
    """A labelling stage's questions: ``cfg.n_questions`` of each of ``cfg.splits`` (each split drawn on its own,
    so a test set does not depend on how many training questions are asked for); where ``cfg.open_questions`` is
    set, every open question of the world's splits (and ``cfg.kinds``) besides."""
    from omnimed.methods.stages import select_questions

    chosen = [q for split in cfg.splits for q in select_questions(cfg.questions, knowledge, split=split,
                                                                    kinds=cfg.kinds, n=cfg.n_questions, seed=cfg.seed)]
    if getattr(cfg, "open_questions", False):
        if cfg.questions != "world":
            raise ValueError(f"stage.open_questions=true reads the synthetic world's open questions; "
                             f"stage.questions={cfg.questions!r} is a records file (multiple-choice questions only)")
        from omnimed.knowledge.corpus import world_of

        chosen += sorted((q for q in world_of(knowledge).open_questions if q.split in cfg.splits
                          and (cfg.kinds is None or q.metadata.get("kind") in cfg.kinds)), key=lambda q: q.id)
    return chosen


def text_sources(kb: Any, sources: Optional[Sequence[str]], key: str) -> list[str]:
    """The text sources to search: ``sources`` (each must be a text source of ``kb``) or all of them."""
    names = list(sources) if sources else list(kb.text_sources)
    unknown = [s for s in names if s not in kb.text_sources]
    if unknown:
        raise ValueError(f"{key}={list(sources or [])}: {unknown} not among the text sources of "
                         f"{kb.cfg.name} ({', '.join(kb.text_sources)})")
    return names


def search_candidates(kb: Any, queries: Sequence[str], n: int, *, sources: Sequence[str],
                      method: Optional[str] = None) -> list[list[Passage]]:
    """The first-stage candidates of each query: ``n`` passages fused across ``sources``."""
    return kb.search_sources(list(queries), n, sources=sources, per_source_k=n, method=method)


def with_gold(candidates: list[Passage], question: MultipleChoiceQuestion, table: dict[str, Passage],
              seed: int) -> list[Passage]:
    """``candidates`` plus the question's gold text passages, at positions drawn with ``seed``
    (:func:`omnimed.knowledge.pools.with_gold`)."""
    return pools.with_gold(candidates, question.gold_passages, table, f"{seed}:{question.id}")


def labelling_windows(kb: Any, questions: Sequence[MultipleChoiceQuestion], cfg: Any, *, sources: Sequence[str],
                      table: dict[str, Passage], add_gold: bool = True) -> list[list[Passage]]:
    """What a labelling stage judges for each question: its ``cfg.candidates`` first-stage passages (found with
    ``cfg.retriever``), plus its gold passages with ``add_gold``."""
    found = search_candidates(kb, [q.question for q in questions], cfg.candidates, sources=sources,
                              method=cfg.retriever)
    return [with_gold(c, q, table, cfg.seed) if add_gold else c for q, c in zip(questions, found)]

"""All four corpora of a ``shared/realdata`` folder at once (book, guideline, wiki, graph), by source kind.

The corpus loaders themselves live in :mod:`~omnimed.data.loaders.text_corpora` and
:mod:`~omnimed.data.loaders.graph_corpus`; :data:`CORPUS_LOADERS` names them by kind for callers that pick
one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omnimed.data.errors import LoadReport
from omnimed.data.loaders.graph_corpus import DEFAULT_MAX_RELATIONS, load_graph
from omnimed.data.loaders.realdata_layout import GRAPH_DIR
from omnimed.data.loaders.text_corpora import load_book, load_guideline, load_wiki
from omnimed.data.records import Passage

__all__ = ["CORPUS_LOADERS", "load_realdata"]

CORPUS_LOADERS: dict[str, Callable[..., list[Passage]]] = {
    "book": load_book,
    "guideline": load_guideline,
    "wiki": load_wiki,
    "graph": load_graph,
}


def load_realdata(
    root: str | Path,
    *,
    skip_invalid: bool = False,
    reports: dict[str, LoadReport] | None = None,
    max_relations: int = DEFAULT_MAX_RELATIONS,
) -> dict[str, list[Passage]]:
    """All four corpora of a realdata folder (book, guideline, wiki, graph) keyed by source kind.

    ``reports``, when given, receives one LoadReport per kind. PubMedQA ("research") is loaded by
    :func:`~omnimed.data.loaders.pubmedqa_bioasq.load_pubmedqa_corpus`.
    """
    root = Path(root)
    out: dict[str, list[Passage]] = {}
    for kind, loader in CORPUS_LOADERS.items():
        report = LoadReport()
        options = {"max_relations": max_relations} if kind == "graph" else {}
        target = root / GRAPH_DIR if kind == "graph" else root
        out[kind] = loader(target, skip_invalid=skip_invalid, report=report, **options)
        if reports is not None:
            reports[kind] = report
    return out

"""Registry of the input formats that ``omnimed-data convert format=NAME`` reads, one loader each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omnimed.data.errors import LoadReport
from omnimed.data.records import Record

Loader = Callable[..., list[Record]]


def _loaders() -> dict[str, Loader]:
    from omnimed.data.loaders.graph_corpus import load_graph
    from omnimed.data.loaders.instructions import load_selfbiorag_instructions
    from omnimed.data.loaders.longform import load_longform
    from omnimed.data.loaders.multiple_choice import (
        load_biomedmcqs,
        load_medmcqa,
        load_medqa,
        load_mirage,
        load_mmlu,
    )
    from omnimed.data.loaders.pubmedqa_bioasq import load_bioasq, load_pubmedqa, load_pubmedqa_corpus
    from omnimed.data.loaders.text_corpora import load_book, load_guideline, load_wiki

    return {
        "mirage": load_mirage,
        "medqa": load_medqa,
        "medmcqa": load_medmcqa,
        "mmlu": load_mmlu,
        "pubmedqa": load_pubmedqa,
        "bioasq": load_bioasq,
        "selfbiorag_instructions": load_selfbiorag_instructions,
        "longform": load_longform,
        "biomedmcqs": load_biomedmcqs,
        # the corpus kinds of ../shared/realdata, as passages
        "book": load_book,
        "guideline": load_guideline,
        "research": load_pubmedqa_corpus,
        "wiki": load_wiki,
        "graph": load_graph,
    }


FORMAT_NAMES: tuple[str, ...] = (
    "mirage", "medqa", "medmcqa", "mmlu", "pubmedqa", "bioasq", "selfbiorag_instructions", "longform",
    "biomedmcqs",
    "book", "guideline", "research", "wiki", "graph",
)  # fmt: skip


def load_format(
    name: str, path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None, **options
) -> list[Record]:
    """Read ``path`` in format ``name``; an unknown name lists the known ones."""
    loaders = _loaders()
    if name not in loaders:
        raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMAT_NAMES)}")
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such file or folder (format={name})")
    try:
        return loaders[name](path, skip_invalid=skip_invalid, report=report, **options)
    except IsADirectoryError as exc:  # a folder where the format reads one file: say which format expected it
        raise IsADirectoryError(f"{exc} (format={name})") from None

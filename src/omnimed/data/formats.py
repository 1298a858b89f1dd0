"""Registry of the input formats that ``omnimed-data convert format=NAME`` reads, one loader each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omnimed.data.errors import LoadReport
from omnimed.data.records import Record

Loader = Callable[..., list[Record]]


def _loaders() -> dict[str, Loader]:
    from omnimed.data.loaders import benchmarks as b
    from omnimed.data.loaders import corpora as c

    return {
        "mirage": b.load_mirage,
        "medqa": b.load_medqa,
        "medmcqa": b.load_medmcqa,
        "mmlu": b.load_mmlu,
        "pubmedqa": b.load_pubmedqa,
        "bioasq": b.load_bioasq,
        "selfbiorag": b.load_selfbiorag,
        "longform": b.load_longform,
        "biomedmcqs": b.load_biomedmcqs,
        # the corpus kinds of ../shared/realdata, as passages
        "book": c.load_book,
        "guideline": c.load_guideline,
        "research": b.load_pubmedqa_corpus,
        "wiki": c.load_wiki,
        "graph": c.load_graph,
    }


FORMAT_NAMES: tuple[str, ...] = (
    "mirage", "medqa", "medmcqa", "mmlu", "pubmedqa", "bioasq", "selfbiorag", "longform", "biomedmcqs",
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
    return loaders[name](path, skip_invalid=skip_invalid, report=report, **options)

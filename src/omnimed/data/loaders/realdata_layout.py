"""Where the knowledge corpora live in the ``shared/realdata`` layout, and how a corpus loader finds them.

Every corpus loader takes the file itself or any folder above it in the realdata layout (the realdata root,
the kind folder, the repository folder, ...); :func:`locate` resolves such a path to the file or folder it
means, and :func:`find_graph_dir` to the ``graph/`` folder. The corpus loaders share one signature;
:func:`reject_options` makes an option a loader does not know a ``TypeError`` instead of ignoring it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "BOOK_FILE",
    "DO_OBO",
    "GRAPH_DIR",
    "GUIDELINE_FILE",
    "HETIONET_EDGES",
    "HETIONET_NODES",
    "WIKI_FILE",
    "find_graph_dir",
    "locate",
    "reject_options",
]

#: where each corpus lives, relative to the realdata root
BOOK_FILE = "book/osbooks-anatomy-physiology/derived/ap2e_sections.jsonl"
GUIDELINE_FILE = "guideline/national-guideline-clearinghouse/derived/ngc_summaries.jsonl"
WIKI_FILE = "wiki/MedQuAD/derived/medquad_with_answers.jsonl"
GRAPH_DIR = "graph"
#: relative to the graph folder
HETIONET_NODES = "hetionet/hetnet/tsv/hetionet-v1.0-nodes.tsv"
HETIONET_EDGES = "chizy7-HetioNet/data/edges"
DO_OBO = "HumanDiseaseOntology/src/ontology/doid.obo"


def locate(path: str | Path, layout: str, *, want_dir: bool = False) -> Path:
    """Find ``layout`` (a path relative to some root) from ``path``: the target itself or any folder above it.

    ``path / tail`` is tried for every tail of ``layout``, longest first, so the realdata root, the kind folder,
    the repository folder and the file's own folder all work.
    """
    path = Path(path)
    parts = Path(layout).parts
    if not want_dir and path.is_file():
        return path
    if path.is_dir():
        for i in range(len(parts)):
            candidate = path.joinpath(*parts[i:])
            if candidate.is_dir() if want_dir else candidate.is_file():
                return candidate
        if want_dir and path.name == parts[-1]:
            return path
    raise FileNotFoundError(f"{path}: expected {layout!r} (or a folder on the way to it) here; not found")


def find_graph_dir(path: str | Path) -> Path:
    """The realdata ``graph/`` folder, given it or the realdata root."""
    path = Path(path)
    if (path / GRAPH_DIR).is_dir() and not (path / Path(HETIONET_NODES).parts[0]).exists():
        return path / GRAPH_DIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: expected the realdata graph folder (or the realdata root); not a folder"
        )
    return path


def reject_options(options: dict[str, Any], loader: str) -> None:
    """Loaders share one signature; an option a loader does not know is a mistake worth saying."""
    if options:
        raise TypeError(f"{loader}() got unexpected options {sorted(options)}")

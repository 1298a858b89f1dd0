"""The passages (and the concept graph) a knowledge base is built from, read as the config says.

A corpus is loaded per source so that a build touches only the sources it indexes; its fingerprint (sha256 over
every passage's content) keys the index directory, so an unchanged corpus is never indexed twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnimed.data.loaders.knowledge_graph import KnowledgeGraph
from omnimed.data.loaders.realdata_layout import (
    BOOK_FILE,
    DO_OBO,
    GRAPH_DIR,
    GUIDELINE_FILE,
    HETIONET_EDGES,
    HETIONET_NODES,
    WIKI_FILE,
    find_graph_dir,
    locate,
)
from omnimed.data.records import SOURCE_KINDS, Passage
from omnimed.knowledge.config import CORPORA, KnowledgeConfig
from omnimed.knowledge.types import KnowledgeError

PUBMEDQA_FILE = "research/pubmedqa/data/ori_pqal.json"
#: the file each text source (but research) reads in the realdata layout
REALDATA_FILES = {"book": BOOK_FILE, "guideline": GUIDELINE_FILE, "wiki": WIKI_FILE}


@dataclass
class SourceCorpus:
    """One source's passages (or, for ``graph``, its concept graph) and where they came from."""

    source: str
    passages: list[Passage] = field(default_factory=list)
    graph: KnowledgeGraph | None = None
    origin: str = ""
    graph_xrefs: dict[str, str] = field(default_factory=dict)  # concept key -> passage id (the world's graph)

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.source.encode())
        if self.graph is not None:
            for key in sorted(self.graph.concepts):
                c = self.graph.concepts[key]
                h.update(json.dumps([key, c.name, c.definition, c.synonyms], ensure_ascii=False).encode())
            for t in self.graph.triples:
                h.update(f"{t.subject}\t{t.relation}\t{t.object}".encode())
        for p in self.passages:
            h.update(json.dumps([p.id, p.title, p.text, p.date, p.authority, p.url], ensure_ascii=False).encode())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self.graph.concepts) if self.graph is not None else len(self.passages)


def check_sources(sources: list[str]) -> None:
    unknown = [s for s in sources if s not in SOURCE_KINDS]
    if unknown:
        raise KnowledgeError(f"knowledge.sources: unknown source(s) {unknown}; known: {', '.join(SOURCE_KINDS)}")


def check_inputs(cfg: KnowledgeConfig) -> None:
    """Fail, naming the config key, when a file or folder that a source of ``cfg`` reads is missing: cheap checks
    (no parsing) so that a build refuses bad inputs before it loads a model or creates an index folder. The
    loaders still check the contents (an empty or malformed file)."""
    check_sources(list(cfg.sources))
    if cfg.corpus not in CORPORA:
        raise KnowledgeError(f"knowledge.corpus={cfg.corpus!r}; expected one of {', '.join(CORPORA)}")
    if cfg.corpus == "realdata":
        root = realdata_root(cfg)
        for source in cfg.sources:
            try:
                if source == "graph":
                    _check_graph_files(root / GRAPH_DIR)
                elif source == "research":
                    if not (root / PUBMEDQA_FILE).is_file():
                        raise FileNotFoundError(f"{root}: expected {PUBMEDQA_FILE!r} here; not found")
                else:
                    locate(root, REALDATA_FILES[source])
            except FileNotFoundError as exc:
                raise KnowledgeError(f"knowledge.realdata_root={root}: source {source}: {exc}") from None
    elif cfg.corpus == "files":
        for source in cfg.sources:
            if source != "graph":
                _file_paths(cfg, source)  # each listed path exists; its format is the loader's to check
                continue
            try:
                _check_graph_files(_graph_dir(cfg))
            except FileNotFoundError as exc:
                raise KnowledgeError(f"knowledge.graph_dir={cfg.graph_dir}: {exc}") from None


def _check_graph_files(where: Path) -> None:
    """The Disease Ontology and Hetionet files that :func:`realdata_graph` reads from ``where`` exist."""
    locate(where, f"{GRAPH_DIR}/{DO_OBO}")
    graph = find_graph_dir(where)
    locate(graph, HETIONET_NODES)
    locate(graph, HETIONET_EDGES, want_dir=True)


def load_source(cfg: KnowledgeConfig, source: str) -> SourceCorpus:
    """Read ``source`` of ``cfg``'s corpus; an empty result is an error naming where it was read from."""
    check_sources([source])
    if cfg.corpus not in CORPORA:
        raise KnowledgeError(f"knowledge.corpus={cfg.corpus!r}; expected one of {', '.join(CORPORA)}")
    loader: Callable[[KnowledgeConfig, str], SourceCorpus] = {
        "world": _world_source,
        "realdata": _realdata_source,
        "files": _files_source,
    }[cfg.corpus]
    corpus = loader(cfg, source)
    if len(corpus) == 0:
        raise KnowledgeError(f"knowledge {cfg.name!r}: source {source!r} is empty (read from {corpus.origin})")
    return corpus


# ------------------------------------------------------------------------------------------------- world
_WORLDS: dict[tuple, Any] = {}


def world_of(cfg: KnowledgeConfig):
    """The synthetic world of the config (built once per process: every source of a build shares it)."""
    from omnimed.data.world import build_world
    from omnimed.data.world.difficulty import world_knobs

    knobs = world_knobs(getattr(cfg, "world_difficulty", None))
    key = (cfg.world_seed, cfg.world_size, tuple(sorted(knobs.items())))
    if key not in _WORLDS:
        _WORLDS.clear()
        _WORLDS[key] = build_world(cfg.world_seed, cfg.world_size, knobs)
    return _WORLDS[key]


def _world_source(cfg: KnowledgeConfig, source: str) -> SourceCorpus:
    from omnimed.knowledge.graph_sources import world_graph

    world = world_of(cfg)
    origin = f"world seed={cfg.world_seed} size={cfg.world_size} {world.difficulty}"
    if source == "graph":
        graph = world_graph(world)
        xrefs = {
            key: next((x for x in c.xrefs if x.startswith("graph:")), "") for key, c in graph.concepts.items()
        }
        return SourceCorpus(source, graph=graph, origin=origin, graph_xrefs={k: v for k, v in xrefs.items() if v})
    return SourceCorpus(source, [p for p in world.passages if p.source == source], origin=origin)


# ------------------------------------------------------------------------------------------------- realdata
def realdata_root(cfg: KnowledgeConfig) -> Path:
    root = cfg.realdata_root or os.environ.get("OMNIMED_REALDATA")
    if not root:
        raise KnowledgeError(
            "knowledge.realdata_root is unset and OMNIMED_REALDATA is not in the environment: point either at "
            "the folder of real files (../shared/realdata)"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        raise KnowledgeError(f"knowledge.realdata_root={root}: no such folder")
    return path


def _realdata_source(cfg: KnowledgeConfig, source: str) -> SourceCorpus:
    from omnimed.data.loaders.pubmedqa_bioasq import load_pubmedqa_corpus
    from omnimed.data.loaders.realdata import CORPUS_LOADERS
    from omnimed.knowledge.graph_sources import realdata_graph

    root = realdata_root(cfg)
    if source == "graph":
        graph_dir = root / GRAPH_DIR
        return SourceCorpus(source, graph=realdata_graph(graph_dir), origin=str(graph_dir))
    if source == "research":
        file = root / PUBMEDQA_FILE
        return SourceCorpus(source, load_pubmedqa_corpus(file), origin=str(file))
    return SourceCorpus(source, CORPUS_LOADERS[source](root), origin=str(root))


# ------------------------------------------------------------------------------------------------- files
def _files_source(cfg: KnowledgeConfig, source: str) -> SourceCorpus:
    from omnimed.data.formats import load_format
    from omnimed.data.io import load_record_set
    from omnimed.knowledge.graph_sources import realdata_graph

    if source == "graph":
        return SourceCorpus(source, graph=realdata_graph(_graph_dir(cfg)), origin=str(cfg.graph_dir))
    passages: list[Passage] = []
    for path in _file_paths(cfg, source):
        if (path / "manifest.json").is_file():
            records = [p for p in load_record_set(path, Passage) if p.source == source]
        else:
            try:
                records = [r for r in load_format(source, path) if isinstance(r, Passage)]
            except (FileNotFoundError, IsADirectoryError) as exc:  # a folder without the file: name the key too
                raise KnowledgeError(f"knowledge.files.{source}: {exc}") from None
        if not records:
            raise KnowledgeError(f"knowledge.files.{source}: {path} holds no {source} passages")
        passages.extend(records)
    return SourceCorpus(source, passages, origin=", ".join(cfg.files.get(source) or []))


def _graph_dir(cfg: KnowledgeConfig) -> Path:
    """``knowledge.graph_dir`` of a files corpus, which must be set."""
    if not cfg.graph_dir:
        raise KnowledgeError("knowledge.graph_dir is unset: the graph source of corpus=files needs a folder "
                             "laid out like realdata's graph/ (Disease Ontology + Hetionet)")
    return Path(cfg.graph_dir).expanduser()


def _file_paths(cfg: KnowledgeConfig, source: str) -> list[Path]:
    """The paths ``knowledge.files.<source>`` lists, each of which must exist."""
    listed = cfg.files.get(source) or []
    if not listed:
        raise KnowledgeError(f"knowledge.files.{source} lists no files; expected paths in the {source} format "
                             "or omnimed record sets (folders with manifest.json)")
    paths = [Path(raw).expanduser() for raw in listed]
    for path in paths:
        if not path.exists():
            raise KnowledgeError(f"knowledge.files.{source}: {path}: no such file or folder")
    return paths

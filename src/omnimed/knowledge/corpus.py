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
from omnimed.data.records import SOURCE_KINDS, Passage
from omnimed.knowledge.config import CORPORA, KnowledgeConfig
from omnimed.knowledge.types import KnowledgeError

PUBMEDQA_FILE = "research/pubmedqa/data/ori_pqal.json"


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
_WORLDS: dict[tuple[int, str], Any] = {}


def world_of(cfg: KnowledgeConfig):
    """The synthetic world of the config (built once per process: every source of a build shares it)."""
    from omnimed.data.world import build_world

    key = (cfg.world_seed, cfg.world_size)
    if key not in _WORLDS:
        _WORLDS.clear()
        _WORLDS[key] = build_world(cfg.world_seed, cfg.world_size)
    return _WORLDS[key]


def _world_source(cfg: KnowledgeConfig, source: str) -> SourceCorpus:
    from omnimed.knowledge.graph_sources import world_graph

    world = world_of(cfg)
    origin = f"world seed={cfg.world_seed} size={cfg.world_size}"
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
    from omnimed.data.loaders.realdata_layout import GRAPH_DIR
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
        if not cfg.graph_dir:
            raise KnowledgeError("knowledge.graph_dir is unset: the graph source of corpus=files needs a folder "
                                 "laid out like realdata's graph/ (Disease Ontology + Hetionet)")
        return SourceCorpus(source, graph=realdata_graph(Path(cfg.graph_dir)), origin=cfg.graph_dir)
    paths = cfg.files.get(source) or []
    if not paths:
        raise KnowledgeError(f"knowledge.files.{source} lists no files; expected paths in the {source} format "
                             "or omnimed record sets (folders with manifest.json)")
    passages: list[Passage] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise KnowledgeError(f"knowledge.files.{source}: {path}: no such file or folder")
        if (path / "manifest.json").is_file():
            records = [p for p in load_record_set(path, Passage) if p.source == source]
        else:
            records = [r for r in load_format(source, path) if isinstance(r, Passage)]
        if not records:
            raise KnowledgeError(f"knowledge.files.{source}: {path} holds no {source} passages")
        passages.extend(records)
    return SourceCorpus(source, passages, origin=", ".join(paths))

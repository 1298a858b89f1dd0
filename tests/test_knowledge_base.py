"""The knowledge-base facade on the tiny world: every source searchable with provenance, graph queries, Omni-RAG
plans, clear errors, rebuilds that do nothing, per-setting rebuilds, file corpora, and an interrupted embedding
run that continues where it stopped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from omnimed.data.world import build_world
from omnimed.knowledge.build import build_knowledge_base
from omnimed.knowledge.config import ChunkingConfig, KnowledgeConfig
from omnimed.knowledge.types import KnowledgeError

TEXT = ("book", "guideline", "research", "wiki")


@pytest.fixture(scope="module")
def world():
    return build_world(0, "tiny")


@pytest.fixture(scope="module")
def kb_root(tmp_path_factory):
    return tmp_path_factory.mktemp("kb")


@pytest.fixture(scope="module")
def kb(kb_root):
    cfg = KnowledgeConfig(name="world_tiny", world_size="tiny")
    cfg.rerank.enabled = True
    return build_knowledge_base(cfg, kb_root, progress=False)


def test_gold_passages_are_found_by_every_method_with_provenance(kb, world):
    found = 0
    for q in world.questions:
        for gold in q.gold_passages:
            source = gold.split(":", 1)[0]
            if source not in TEXT:
                continue
            for method in ("bm25", "dense", "hybrid"):
                hits = kb.search(source, q.question, 3, method=method, rerank=False)
                assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
                assert all(h.retriever == method and h.source == source for h in hits)
                found += gold in {h.doc_id for h in hits}
    assert found >= 0.8 * 3 * sum(1 for q in world.questions for g in q.gold_passages if g.split(":")[0] in TEXT)
    hit = kb.search("guideline", world.questions[0].question, 1, method="bm25", rerank=False)[0]
    original = next(p for p in world.passages if p.id == hit.doc_id)
    assert (hit.passage.title, hit.passage.date, hit.passage.authority) == (original.title, original.date,
                                                                            original.authority)
    reranked = kb.search("wiki", world.questions[0].question, 4, method="hybrid", rerank=True)
    assert len(reranked) == 4 and all(h.retriever == "hybrid+rerank" for h in reranked)


def test_graph_query_returns_definition_and_relations_mapped_to_the_world_passage(kb, world):
    disease = world.model.diseases[5]
    (hit,) = kb.search("graph", f"{disease.entity.name} , what are its symptoms", 1)
    lines = hit.passage.text.splitlines()
    assert lines[0].startswith(disease.entity.name)
    assert any(" | has symptom | " in line for line in lines[1:4])  # symptom relations ranked first
    assert hit.doc_id == f"graph:{disease.entity.id}#1"
    assert kb.search("graph", "no such concept at all , anything", 1) == []


def test_search_plan_parses_what_is_valid_and_reports_the_rest(kb_root, world):
    name = world.model.diseases[2].entity.name
    plan = (f"<book>{name}</book><wiki>{name} symptoms ; treatment of {name}</wiki>"
            f"<graph>{name} , symptoms</graph><bogus>x</bogus><research>{name}")
    cfg = KnowledgeConfig(name="world_tiny", world_size="tiny", sources=["wiki", "graph"], indexes=["bm25"],
                          retriever="bm25")
    small = build_knowledge_base(cfg, kb_root, progress=False)
    result = small.search_plan(plan, k=3)
    assert len(result.hits["wiki"]) == 2 and all(1 <= len(h) <= 3 for h in result.hits["wiki"])
    assert len(result.hits["graph"]) == 1 and result.hits["graph"][0][0].passage.title == name
    problems = " ".join(result.problems)
    assert "bogus" in problems and "book" in problems  # unknown tag; a source this base lacks
    assert "research" in problems  # the unclosed tag
    assert len({h.passage.id for h in result.passages()}) == len(result.passages())


def test_errors_name_what_is_wrong(kb, kb_root):
    with pytest.raises(KnowledgeError, match=r"unknown source 'pubmed'.*known: book, guideline, research, wiki, graph"):
        kb.search("pubmed", "x")
    only_bm25 = build_knowledge_base(KnowledgeConfig(name="world_tiny", world_size="tiny", sources=["wiki"],
                                                     indexes=["bm25"], retriever="bm25"), kb_root, progress=False)
    with pytest.raises(KnowledgeError, match=r"method 'dense' is not available for source 'wiki'; built: bm25"):
        only_bm25.search("wiki", "x", method="dense")
    with pytest.raises(KnowledgeError, match=r"knowledge.indexes: unknown \['splade'\]"):
        build_knowledge_base(KnowledgeConfig(indexes=["bm25", "splade"]), kb_root)
    with pytest.raises(KnowledgeError, match=r"knowledge.sources: unknown source\(s\) \['pubmed'\]"):
        build_knowledge_base(KnowledgeConfig(sources=["pubmed"]), kb_root)


def test_rebuilds_do_only_what_changed(kb, kb_root):
    cfg = KnowledgeConfig(name="world_tiny", world_size="tiny")
    report: list[dict] = []
    build_knowledge_base(cfg, kb_root, progress=False, report=report)
    assert [r["built"] for r in report] == [[]] * 5  # unchanged corpus and settings: nothing rebuilt
    manifest = json.loads((kb_root / "indexes" / "world_tiny" / "manifest.json").read_text())
    assert set(manifest["sources"]) == {"book", "guideline", "research", "wiki", "graph"}

    report = []
    cfg.dense.query_prefix = "query: "  # another encoder setting: only the dense index is rebuilt
    build_knowledge_base(dataclasses.replace(cfg, sources=["wiki"]), kb_root, progress=False, report=report)
    assert report[0]["built"] == ["dense"]
    report = []
    chunked = dataclasses.replace(cfg, sources=["wiki"], chunking={"default": ChunkingConfig("words", 16, 4)})
    build_knowledge_base(chunked, kb_root, progress=False, report=report)
    assert report[0]["built"] == ["passages", "bm25", "dense"] and report[0]["passages"] > report[0]["documents"]


def _wiki_line(i: int) -> str:
    return json.dumps({"id": f"q{i}", "doc_id": f"d{i}", "source": "NIH", "url": f"https://example.org/{i}",
                       "focus": f"Topic {i}", "qtype": "information", "question": f"What is topic {i}?",
                       "answer": f"Topic {i} is a made-up condition number {i} used in a test."})


def test_file_corpora_build_and_bad_files_are_named(tmp_path):
    good = tmp_path / "wiki.jsonl"
    good.write_text(_wiki_line(1) + "\n" + _wiki_line(2) + "\n")
    cfg = KnowledgeConfig(name="files", corpus="files", sources=["wiki"], indexes=["bm25"], retriever="bm25",
                          files={"wiki": [str(good)]})
    kb = build_knowledge_base(cfg, tmp_path, progress=False)
    assert kb.search("wiki", "topic 2 condition", 1)[0].doc_id.startswith("q2")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(KnowledgeError, match=r"empty\.jsonl"):
        build_knowledge_base(dataclasses.replace(cfg, files={"wiki": [str(empty)]}), tmp_path)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(_wiki_line(1) + "\n{not json\n")
    with pytest.raises(Exception, match=r"broken\.jsonl:2"):
        build_knowledge_base(dataclasses.replace(cfg, files={"wiki": [str(broken)]}), tmp_path)


class _Interrupting:
    """The real encoder, interrupted (as by Ctrl-C) on its third batch of documents; counts texts encoded."""

    def __init__(self, inner, fail_on: int | None):
        self.inner, self.fail_on, self.calls, self.texts = inner, fail_on, 0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode_docs(self, texts, progress=False):
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise KeyboardInterrupt
        self.texts += len(texts)
        return self.inner.encode_docs(texts, progress)


def test_interrupted_embedding_continues_where_it_stopped(tmp_path, monkeypatch):
    import omnimed.knowledge.build as build

    real = build.build_encoder
    cfg = KnowledgeConfig(name="world_tiny", world_size="tiny", sources=["wiki"], indexes=["dense"],
                          retriever="dense")
    cfg.dense.embed_shard_size = 8
    first = _Interrupting(real(cfg), fail_on=3)
    monkeypatch.setattr(build, "build_encoder", lambda c: first)
    with pytest.raises(KeyboardInterrupt):
        build_knowledge_base(cfg, tmp_path, progress=False)
    assert first.texts == 16  # two shards of 8 were finished and stored
    second = _Interrupting(real(cfg), fail_on=None)
    monkeypatch.setattr(build, "build_encoder", lambda c: second)
    kb = build_knowledge_base(cfg, tmp_path, progress=False)
    n = len(kb.text_sources["wiki"].passages)
    assert second.texts == n - 16  # only the rest was encoded
    fresh = build_knowledge_base(cfg, tmp_path / "fresh", progress=False)
    query = "which symptoms and findings"
    assert [(h.doc_id, round(h.score, 5)) for h in kb.search("wiki", query, 5)] == \
        [(h.doc_id, round(h.score, 5)) for h in fresh.search("wiki", query, 5)]

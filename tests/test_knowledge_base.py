"""``KnowledgeBase`` and ``build_knowledge_base`` on the tiny synthetic world (~200 passages): every source is
searchable with every method and finds the world's gold passages, hits carry their provenance, graph queries
return a concept's definition and relations, Omni-RAG plans are searched source by source, errors name what is
wrong, and the on-disk indexes are reused, rebuilt only in the part a config change touches, and resumed after an
interrupted embedding. The full world_tiny base is built once per module; other bases share its root (and so its
embedding cache) under other names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from omnimed.data.records import SOURCE_KINDS
from omnimed.data.world import build_world
from omnimed.knowledge import build as build_module
from omnimed.knowledge.base import KnowledgeBase, PlanSearch
from omnimed.knowledge.build import build_knowledge_base
from omnimed.knowledge.config import TEXT_SOURCES, ChunkingConfig, DenseConfig, KnowledgeConfig, RerankConfig
from omnimed.knowledge.types import Hit, KnowledgeError

METHODS = ("bm25", "dense", "hybrid")
GRAPH_QUERY = "Vaistomemia , what are its symptoms"  # DIS00006 of world seed 0 / tiny
GRAPH_PASSAGE = "graph:DIS00006#1"


def tiny(**overrides) -> KnowledgeConfig:
    overrides.setdefault("name", "world_tiny")
    return KnowledgeConfig(corpus="world", world_seed=0, world_size="tiny", **overrides)


def build(cfg: KnowledgeConfig, root: Path) -> tuple[KnowledgeBase, list[dict]]:
    report: list[dict] = []
    kb = build_knowledge_base(cfg, root, progress=False, report=report)
    return kb, report


def built(report: list[dict]) -> dict[str, list[str]]:
    return {row["source"]: row["built"] for row in report}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """MiniLM on one thread: on a shared 2-core machine two spinning threads make it several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world():
    return build_world(0, "tiny")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("knowledge")


@pytest.fixture(scope="module")
def tiny_kb(root) -> tuple[KnowledgeBase, list[dict]]:
    """world_tiny with every source, BM25 + MiniLM/FAISS (conf/knowledge/world_tiny.yaml's defaults)."""
    return build(tiny(), root)


@pytest.fixture(scope="module")
def rerank_kb(tiny_kb, root) -> KnowledgeBase:
    """The same base with the bi-encoder reranker switched on: reranking is a search setting, nothing is rebuilt."""
    kb, report = build(tiny(rerank=RerankConfig(enabled=True)), root)
    assert all(row["built"] == [] for row in report), report
    return kb


@pytest.fixture(scope="module")
def kb(tiny_kb) -> KnowledgeBase:
    return tiny_kb[0]


def text_golds(world) -> list[tuple[str, str, str]]:
    """(question, gold passage id, its source) for every world question's gold in a text source."""
    out = []
    for q in [*world.questions, *world.open_questions]:
        for pid in q.gold_passages:
            source = pid.split(":", 1)[0]
            if source in TEXT_SOURCES:
                out.append((q.question, pid, source))
    return out


# ------------------------------------------------------------------------------------------------ search
def test_every_source_is_built_and_searchable(tiny_kb, world):
    kb, report = tiny_kb
    assert kb.sources == list(SOURCE_KINDS)
    rows = {row["source"]: row for row in report}
    assert set(rows) == set(SOURCE_KINDS)
    for source in TEXT_SOURCES:
        assert rows[source]["built"] == ["passages", "bm25", "dense"]
        assert rows[source]["documents"] == sum(p.source == source for p in world.passages)
        assert Path(rows[source]["directory"], "manifest.json").is_file()
        first = next(p for p in world.passages if p.source == source)
        for method in METHODS:
            hits = kb.search(source, first.title, 5, method=method, rerank=False)
            assert 1 <= len(hits) <= 5 and all(h.source == source for h in hits), (source, method)
            assert first.id in {h.doc_id for h in hits}, (source, method)
    assert rows["graph"]["built"] == ["graph"] and Path(rows["graph"]["directory"]).is_file()
    assert kb.search("graph", GRAPH_QUERY)


def test_world_gold_passages_are_in_the_top_3_of_every_method(kb, world):
    golds = text_golds(world)
    assert {source for _, _, source in golds} == set(TEXT_SOURCES)
    missed = []
    for source in TEXT_SOURCES:
        mine = [(question, pid) for question, pid, s in golds if s == source]
        for method in METHODS:
            results = kb.search_batch(source, [q for q, _ in mine], 3, method=method, rerank=False)
            for (_, pid), hits in zip(mine, results):
                if pid not in [h.doc_id for h in hits]:
                    missed.append((method, pid, [h.doc_id for h in hits]))
    assert not missed, missed


def test_hits_carry_rank_score_retriever_and_provenance(kb, world):
    question, pid, source = text_golds(world)[0]
    by_id = {p.id: p for p in world.passages}
    for method in METHODS:
        hits = kb.search(source, question, 5, method=method, rerank=False)
        assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
        assert all(isinstance(h, Hit) and h.retriever == method and h.query == question for h in hits)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True) and all(isinstance(s, float) for s in scores)
        for h in hits:
            original = by_id[h.doc_id]
            assert h.source == source == original.source
            assert h.passage.title == original.title and h.passage.title
            assert h.passage.parent_id == original.parent_id and h.passage.parent_id
        assert hits[0].doc_id == pid  # every method ranks this question's gold first


def test_search_batch_equals_search_one_by_one(kb, world):
    questions = [q for q, _, source in text_golds(world) if source == "wiki"][:4]
    batch = kb.search_batch("wiki", questions, 5, method="hybrid", rerank=False)
    for question, hits in zip(questions, batch):
        single = kb.search("wiki", question, 5, method="hybrid", rerank=False)
        assert [h.passage.id for h in hits] == [h.passage.id for h in single]
    with pytest.raises(TypeError):
        kb.search_batch("wiki", questions[0], 5)


def test_reranked_hits_are_labelled_and_at_most_k(rerank_kb, kb, world):
    question, pid, source = text_golds(world)[0]
    with pytest.raises(KnowledgeError, match="rerank.enabled"):
        kb.search(source, question, 3, rerank=True)  # the plain base has no reranker
    assert {h.retriever for h in kb.search(source, question)} == {"hybrid"}  # its default: hybrid, no rerank
    kb = rerank_kb
    hits = kb.search(source, question, 3, method="hybrid", rerank=True)
    assert 0 < len(hits) <= 3
    assert all(h.retriever == "hybrid+rerank" for h in hits) and [h.rank for h in hits] == [1, 2, 3]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    candidates = {h.passage.id for h in kb.search(source, question, 20, method="hybrid", rerank=False)}
    assert {h.passage.id for h in hits} <= candidates  # reranking reorders the hybrid candidates
    assert pid in {h.doc_id for h in hits}
    default = kb.search(source, question)  # rerank.enabled makes reranking the default
    assert 0 < len(default) <= kb.cfg.k and {h.retriever for h in default} == {"hybrid+rerank"}
    bm25 = kb.search(source, question, 2, method="bm25")
    assert len(bm25) == 2 and {h.retriever for h in bm25} == {"bm25+rerank"}


class RecordingReranker:
    def __init__(self, inner) -> None:
        self.inner, self.texts = inner, []

    def rerank(self, query, texts, top_k):
        self.texts.append(list(texts))
        return self.inner.rerank(query, texts, top_k)


def test_reranker_reads_the_text_the_indexes_were_built_from(rerank_kb, world):
    """Bug: BM25 and the dense index see ``title + text`` of each passage, but search_batch hands the reranker
    only ``passage.text``, dropping the title (for the world's wiki and book passages: the disease or drug name).
    Measured on world_tiny's 34 text-gold queries, the bi-encoder rerank keeps the gold at rank 1 for 22 with
    the text alone and 25 with title + text (hybrid alone: 26)."""
    question, pid, source = next(g for g in text_golds(world) if g[2] == "wiki")
    recorder = RecordingReranker(rerank_kb.reranker)
    rerank_kb.reranker = recorder
    try:
        hits = rerank_kb.search(source, question, 3, method="hybrid", rerank=True)
    finally:
        rerank_kb.reranker = recorder.inner
    gold = next(p for p in world.passages if p.id == pid)
    (texts,) = recorder.texts
    assert hits and any(gold.text in t for t in texts)
    assert f"{gold.title}\n{gold.text}" in texts, "the reranker did not see the passage title"


# ------------------------------------------------------------------------------------------------ graph
def test_graph_query_returns_definition_and_relations_with_the_world_passage_id(kb, world):
    hits = kb.search("graph", GRAPH_QUERY)
    assert hits and hits[0].rank == 1 and hits[0].retriever == "graph" and hits[0].source == "graph"
    top = hits[0]
    assert top.doc_id == GRAPH_PASSAGE
    lines = top.passage.text.splitlines()
    world_lines = next(p for p in world.passages if p.id == GRAPH_PASSAGE).text.splitlines()
    assert lines[0] == world_lines[0] and lines[0].startswith("Vaistomemia: ")  # the definition first
    symptoms = [line for line in world_lines if " | has symptom | " in line]
    relations = [line for line in world_lines[1:] if " | is a | " not in line]
    assert len(symptoms) == 3 and set(relations) <= set(lines[1:])
    # relations are ranked against the question: the symptom lines come first
    assert set(lines[1 : 1 + len(symptoms)]) == set(symptoms)
    assert kb.search("graph", "no such concept at all , anything", 1) == []


# ------------------------------------------------------------------------------------------------ plans
def test_search_plan_searches_every_source_and_reports_problems(kb):
    plan = ("<think>which sources?</think><book>Groshulide mechanism of action</book>"
            "<wiki>Vaistomemia symptoms ; ; Katrin syndrome treatment</wiki>"
            f"<graph>{GRAPH_QUERY}</graph><research>Groshulide trial")
    result = kb.search_plan(plan, 3, method="bm25")
    assert isinstance(result, PlanSearch)
    assert set(result.hits) == {"book", "wiki", "graph", "research"}
    assert len(result.hits["wiki"]) == 2 and all(1 <= len(hits) <= 3 for hits in result.hits["wiki"])
    assert {h.query for h in result.hits["wiki"][1]} == {"Katrin syndrome treatment"}
    assert result.hits["book"][0][0].retriever == "bm25" and len(result.hits["research"]) == 1
    assert all(h.query == "Groshulide mechanism of action" for h in result.hits["book"][0])
    assert result.hits["graph"][0][0].doc_id == GRAPH_PASSAGE
    problems = " | ".join(result.problems)
    for expected in ("<think>", "empty query", "unclosed <research>", "<guideline>"):
        assert expected in problems, (expected, result.problems)
    ids = [h.passage.id for h in result.passages()]
    assert len(ids) == len(set(ids)) and len(ids) >= 4


def test_search_plan_reports_a_source_the_base_lacks(root):
    kb, _ = build(tiny(name="wiki_graph", sources=["wiki", "graph"], indexes=["bm25"], retriever="bm25"), root)
    assert kb.sources == ["wiki", "graph"]
    result = kb.search_plan(f"<book>Groshulide</book><wiki>Vaistomemia</wiki><graph>{GRAPH_QUERY}</graph>", 2)
    assert set(result.hits) == {"wiki", "graph"} and len(result.hits["wiki"][0]) == 2
    assert any("'book'" in p and "wiki_graph" in p for p in result.problems), result.problems
    with pytest.raises(KnowledgeError, match="book"):
        kb.search("book", "Groshulide")


# ------------------------------------------------------------------------------------------------ errors
def test_unknown_source_lists_the_known_ones(kb):
    with pytest.raises(KnowledgeError) as info:
        kb.search("pubmed", "anything")
    message = str(info.value)
    assert "pubmed" in message and all(s in message for s in SOURCE_KINDS)
    with pytest.raises(KnowledgeError, match="k must be >= 1"):
        kb.search("wiki", "anything", 0)


def test_method_that_was_not_built_is_named(root):
    kb, _ = build(tiny(name="bm25_only", sources=["wiki"], indexes=["bm25"], retriever="bm25"), root)
    assert kb.encoder is None and kb.text_sources["wiki"].dense is None
    for method in ("dense", "hybrid"):
        with pytest.raises(KnowledgeError) as info:
            kb.search("wiki", "Vaistomemia", method=method)
        assert repr(method) in str(info.value) and "knowledge.indexes" in str(info.value)
    with pytest.raises(KnowledgeError, match="rerank"):
        kb.search("wiki", "Vaistomemia", rerank=True)


def test_bad_config_is_refused_before_building(root, tmp_path):
    with pytest.raises(KnowledgeError) as info:
        build(tiny(indexes=["bm25", "splade"]), tmp_path)
    assert "knowledge.indexes" in str(info.value) and "splade" in str(info.value)
    with pytest.raises(KnowledgeError, match="knowledge.retriever"):
        build(tiny(indexes=["bm25"], retriever="dense"), tmp_path)
    with pytest.raises(KnowledgeError) as info:
        build(tiny(sources=["wiki", "pubmed"]), tmp_path)
    assert "pubmed" in str(info.value) and "guideline" in str(info.value)
    assert not (tmp_path / "indexes").exists()


# ------------------------------------------------------------------------------------------------ reuse
def test_second_build_of_an_unchanged_corpus_builds_nothing(tiny_kb, root):
    first, first_report = tiny_kb
    kb, report = build(tiny(), root)
    assert all(row["built"] == [] for row in report), report
    assert [r["directory"] for r in report] == [r["directory"] for r in first_report]
    question = "Groshulide mechanism of action"
    for method in METHODS:
        a = first.search("book", question, 5, method=method, rerank=False)
        b = kb.search("book", question, 5, method=method, rerank=False)
        assert [h.passage.id for h in a] == [h.passage.id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-5)


def test_changed_chunking_builds_a_new_directory(tiny_kb, root, world):
    _, original = tiny_kb
    cfg = tiny(sources=["book"], indexes=["bm25"], retriever="bm25",
               chunking={"default": ChunkingConfig(unit="words", size=32, overlap=8)})
    kb, report = build(cfg, root)
    (row,) = report
    book_dir = next(r["directory"] for r in original if r["source"] == "book")
    assert row["directory"] != book_dir and Path(book_dir, "passages.jsonl").is_file()
    assert row["built"] == ["passages", "bm25"]
    assert row["passages"] > row["documents"]  # ~60-word book sections cut into 32-word windows
    # chunk hits point back at the passage they were cut from, so the world's gold ids still match
    question, pid, _ = next(g for g in text_golds(world) if g[2] == "book")
    hits = kb.search("book", question, 3)
    assert pid in [h.doc_id for h in hits]
    assert all(h.passage.id != h.doc_id and h.doc_id in {p.id for p in world.passages} for h in hits)
    again = build(dataclasses.replace(cfg, chunking={"default": ChunkingConfig(unit="words", size=64, overlap=16)}),
                  root)[1][0]
    assert again["built"] == ["passages", "bm25"] and again["directory"] not in (row["directory"], book_dir)


def _wiki_only(**dense) -> KnowledgeConfig:
    return tiny(name="wiki_only", sources=["wiki"], dense=DenseConfig(**dense))


def test_changed_encoder_setting_rebuilds_only_the_dense_index(root):
    _, first = build(_wiki_only(), root)
    assert built(first)["wiki"] in (["passages", "bm25", "dense"], [])
    kb, report = build(_wiki_only(query_prefix="q: "), root)
    assert built(report) == {"wiki": ["dense"]} and report[0]["directory"] == first[0]["directory"]
    assert kb.encoder.fingerprint["query_prefix"] == "q: "
    manifest = json.loads(Path(report[0]["directory"], "manifest.json").read_text())
    assert manifest["dense"]["settings"]["query_prefix"] == "q: " and manifest["bm25"]["dir"]
    assert kb.search("wiki", "Vaistomemia", 3, method="dense")


def test_switching_back_to_an_earlier_setting_reuses_its_index(root):
    """Bug: the source manifest remembers only the last dense (and bm25) directory, so going back to a setting
    whose complete index is still on disk indexes the unchanged corpus again."""
    build(_wiki_only(), root)
    build(_wiki_only(query_prefix="q: "), root)
    _, report = build(_wiki_only(), root)
    dense_dirs = sorted(p.name for p in Path(report[0]["directory"]).glob("dense-*"))
    assert len(dense_dirs) == 2  # both complete indexes are on disk
    assert built(report) == {"wiki": []}, "the index of the first setting was rebuilt although it exists"


# ------------------------------------------------------------------------------------------------ files
WIKI_LINES = [
    {"id": "0000001-1", "doc_id": "0000001", "source": "ExampleHealth", "url": "https://example.org/gout",
     "focus": "Gout", "cui": ["C0018099"], "semantic_type": ["T047"], "qtype": "information",
     "question": "What is (are) Gout ?",
     "answer": "Gout is a painful joint disease caused by uric acid crystals. Attacks often start in the big toe."},
    {"id": "0000002-1", "doc_id": "0000002", "source": "ExampleHealth", "url": "https://example.org/asthma",
     "focus": "Asthma", "cui": [], "semantic_type": [], "qtype": "treatment",
     "question": "What are the treatments for Asthma ?",
     "answer": "Inhaled corticosteroids control airway inflammation; a bronchodilator relieves an attack."},
]


def _files_cfg(path: Path) -> KnowledgeConfig:
    return KnowledgeConfig(name="files_wiki", corpus="files", files={"wiki": [str(path)]}, sources=["wiki"],
                           indexes=["bm25"], retriever="bm25")


def test_files_corpus_builds_from_a_wiki_jsonl(tmp_path):
    path = tmp_path / "medquad.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in WIKI_LINES))
    kb, report = build(_files_cfg(path), tmp_path)
    assert report[0]["documents"] == 2 and report[0]["built"] == ["passages", "bm25"]
    hits = kb.search("wiki", "uric acid crystals in the big toe", 2)
    assert hits[0].passage.id == "0000001-1" and hits[0].passage.title == "Gout"
    assert hits[0].passage.parent_id == "0000001" and hits[0].passage.authority == "ExampleHealth"


def test_files_corpus_errors_name_the_file_and_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(KnowledgeError) as info:
        build(_files_cfg(empty), tmp_path)
    assert str(empty) in str(info.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(WIKI_LINES[0]) + "\n" + '{"id": "x", "answer": \n')
    with pytest.raises(ValueError) as info:
        build(_files_cfg(bad), tmp_path)
    assert f"{bad}:2" in str(info.value)
    with pytest.raises(KnowledgeError, match="no such file"):
        build(_files_cfg(tmp_path / "missing.jsonl"), tmp_path)


# ------------------------------------------------------------------------------------------------ resume
class CountingEncoder:
    """The real encoder, counting the texts it embeds and interrupting the ``fail_on``-th encode_docs call."""

    def __init__(self, inner, fail_on: int | None = None) -> None:
        self.inner, self.fail_on = inner, fail_on
        self.calls, self.texts = 0, 0

    @property
    def dim(self):
        return self.inner.dim

    @property
    def fingerprint(self):
        return self.inner.fingerprint

    @property
    def fingerprint_id(self):
        return self.inner.fingerprint_id

    def encode_queries(self, texts):
        return self.inner.encode_queries(texts)

    def encode_docs(self, texts, progress=False):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt
        self.texts += len(texts)
        return self.inner.encode_docs(texts, progress=progress)


def test_interrupted_embedding_resumes_and_matches_a_fresh_build(kb, tmp_path, monkeypatch, world):
    real = build_module.build_encoder
    made: list[CountingEncoder] = []

    def patched(fail_on):
        def factory(cfg):
            made.append(CountingEncoder(real(cfg), fail_on))
            return made[-1]
        return factory

    cfg = tiny(sources=["wiki"], dense=DenseConfig(embed_shard_size=8))
    monkeypatch.setattr(build_module, "build_encoder", patched(3))
    with pytest.raises(KeyboardInterrupt):
        build(cfg, tmp_path)
    assert made[0].texts == 16  # two shards of 8 were embedded and stored before the interrupt

    monkeypatch.setattr(build_module, "build_encoder", patched(None))
    resumed, report = build(cfg, tmp_path)
    assert built(report) == {"wiki": ["dense"]}  # passages and BM25 were complete before the interrupt
    passages = resumed.text_sources["wiki"].passages
    distinct = {f"{p.title}\n{p.text}" if p.title else p.text for p in passages}
    assert made[1].texts == len(distinct) - 16  # only the texts the interrupted run had not stored

    questions = [q for q, _, source in text_golds(world) if source == "wiki"] + ["Vaistomemia", "gene TRXK2"]
    for method in ("dense", "hybrid"):
        fresh = kb.search_batch("wiki", questions, 10, method=method, rerank=False)
        again = resumed.search_batch("wiki", questions, 10, method=method)
        for a, b in zip(fresh, again):
            assert [h.passage.id for h in a] == [h.passage.id for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


# ------------------------------------------------------------------------------------------------ dense backends
def _close(kb: KnowledgeBase) -> None:
    """Release Qdrant clients (local storage allows one client at a time)."""
    for index in kb.text_sources.values():
        if hasattr(index.dense, "close"):
            index.dense.close()


@pytest.mark.parametrize("kind", ["qdrant", "ivfpq"])
def test_dense_backend_chosen_by_config_is_built_searched_and_reused(kb, root, world, kind):
    """``knowledge.dense.index`` selects Qdrant (local on-disk) or FAISS IVF-PQ; both are searched through the
    knowledge base like the default flat index, and a second build reopens them instead of rebuilding."""
    from omnimed.knowledge.faiss_index import FaissIndex
    from omnimed.knowledge.qdrant import QdrantIndex

    cfg = tiny(name=f"dense_{kind}", sources=["wiki", "book"], dense=DenseConfig(index=kind, nprobe=64))
    questions = {s: [q for q, _, source in text_golds(world) if source == s] for s in ("wiki", "book")}
    first, report = build(cfg, root)
    try:
        assert built(report) == {"wiki": ["passages", "bm25", "dense"], "book": ["passages", "bm25", "dense"]}
        for row in report:
            manifest = json.loads(Path(row["directory"], "manifest.json").read_text())
            assert manifest["dense"]["index"] == kind and manifest["dense"]["settings"]["index"] == kind
        for source, qs in questions.items():
            dense = first.text_sources[source].dense
            if kind == "qdrant":
                assert isinstance(dense, QdrantIndex) and dense.mode == "local"
                assert dense.storage.is_relative_to(root / "indexes" / cfg.name)
            else:
                assert isinstance(dense, FaissIndex) and dense.kind == "ivfpq"
            flat = kb.search_batch(source, qs, 5, method="dense", rerank=False)  # the module's flat FAISS base
            got = first.search_batch(source, qs, 5, method="dense", rerank=False)
            assert all(h.retriever == "dense" and h.source == source for hits in got for h in hits)
            if kind == "qdrant":  # exact search, cosine on unit vectors: the same ranking as flat inner product
                for a, b in zip(got, flat):
                    assert [h.passage.id for h in a] == [h.passage.id for h in b]
                    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
            else:  # compressed (on ~30 vectors: 1-bit PQ codes), yet its top hit is among flat search's top 5
                agree = sum(a[0].passage.id in {h.passage.id for h in b} for a, b in zip(got, flat))
                assert agree >= 0.8 * len(qs), (agree, len(qs))
            hybrid = first.search_batch(source, qs, 5, method="hybrid", rerank=False)
            golds = [pid for q, pid, s in text_golds(world) if s == source]
            assert sum(pid in {h.doc_id for h in hits} for pid, hits in zip(golds, hybrid)) >= 0.8 * len(golds)
        before = first.search_batch("wiki", questions["wiki"], 5, method="dense", rerank=False)
    finally:
        _close(first)
    again, report = build(cfg, root)
    try:
        assert all(row["built"] == [] for row in report), report
        after = again.search_batch("wiki", questions["wiki"], 5, method="dense", rerank=False)
        assert [[h.passage.id for h in hits] for hits in after] == [[h.passage.id for h in hits] for hits in before]
    finally:
        _close(again)


@pytest.fixture
def qdrant_server(tmp_path, monkeypatch):
    """A stand-in for a Qdrant server: every ``url=`` connection opens one shared local on-disk storage, so, as on
    a server, the indexes of every build share one collection namespace. Returns the urls connected to."""
    from qdrant_client import QdrantClient

    from omnimed.knowledge import qdrant as qdrant_module

    storage, urls = tmp_path / "qdrant-server", []

    def connect(url, api_key_env, timeout):
        urls.append(url)
        return QdrantClient(path=str(storage))

    monkeypatch.setattr(qdrant_module, "_open_server", connect)
    return urls


def test_qdrant_server_keeps_the_indexes_of_two_encoders_apart(root, world, qdrant_server):
    """Bug: on a server the collection was named from the source directory only, so building the same source
    with a second encoder overwrote the first encoder's collection; reopening the first index then passed the
    load checks (its meta.json and point count were unchanged) and searched the second encoder's vectors."""
    url = "http://qdrant.test:6333"

    def cfg(**dense):
        return tiny(name="qdrant_server", sources=["wiki"], indexes=["dense"], retriever="dense",
                    dense=DenseConfig(index="qdrant", qdrant_url=url, **dense))

    questions = [q for q, _, source in text_golds(world) if source == "wiki"]

    def ranked(kb):
        return [[(h.passage.id, h.score) for h in hits] for hits in kb.search_batch("wiki", questions, 5)]

    minilm, report = build(cfg(), root)
    try:
        assert built(report)["wiki"][-1] == "dense"
        first, first_collection = ranked(minilm), minilm.text_sources["wiki"].dense.collection
        assert minilm.text_sources["wiki"].dense.mode == "server"
    finally:
        _close(minilm)
    prefixed, report = build(cfg(doc_prefix="passage: "), root)  # another encoder: other document vectors
    try:
        assert built(report) == {"wiki": ["dense"]}
        second_collection = prefixed.text_sources["wiki"].dense.collection
        assert ranked(prefixed) != first
    finally:
        _close(prefixed)

    again, report = build(cfg(), root)  # back to the first encoder: its collection is intact and reused
    try:
        assert built(report) == {"wiki": []}
        after = ranked(again)
        assert [[i for i, _ in hits] for hits in after] == [[i for i, _ in hits] for hits in first]
        for hits, expected in zip(after, first):
            assert [s for _, s in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
    finally:
        _close(again)
    assert set(qdrant_server) == {url}
    assert first_collection != second_collection
    src_dir = Path(report[0]["directory"])
    for collection in (first_collection, second_collection):  # named by source key and dense key, valid for Qdrant
        dense_dir = collection.rsplit("-dense-", 1)[1]
        assert collection == f"omnimed-qdrant_server-{src_dir.name}-dense-{dense_dir}"
        assert (src_dir / f"dense-{dense_dir}" / "meta.json").is_file()


# ------------------------------------------------------------------------------------------------ chunking
def test_per_source_chunking_from_command_line_overrides(tmp_path):
    """Bug: ``knowledge.chunking`` was a free dict, so ``knowledge.chunking.book...`` could be set in a YAML file
    but every command-line form (``knowledge.chunking.book.size=16``, ``+knowledge.chunking.book={...}``) failed."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    from omnimed.conf import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.knowledge.config import register_index_configs

    overrides = ["knowledge=world_tiny", "knowledge.name=chunked", "knowledge.sources=[book,research,wiki]",
                 "knowledge.indexes=[bm25]", "knowledge.retriever=bm25",
                 "knowledge.chunking.book.size=16", "knowledge.chunking.book.overlap=4",
                 "knowledge.chunking.research={unit: chars, size: 120, overlap: 0}"]
    register_evaluate_configs()
    register_index_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        composed = {name: OmegaConf.to_object(compose(name, overrides=overrides).knowledge)
                    for name in ("index", "evaluate")}
        plain = OmegaConf.to_object(compose("index", overrides=["knowledge=realdata"]).knowledge)
        realdata_book = OmegaConf.to_object(
            compose("index", overrides=["knowledge=realdata", "knowledge.chunking.book.size=500"]).knowledge)
        with pytest.raises(ConfigCompositionException):
            compose("index", overrides=["knowledge=world_tiny", "knowledge.chunking.pubmed.size=16"])
    cfg = composed["index"]
    assert isinstance(cfg, KnowledgeConfig)
    for knowledge in composed.values():
        assert knowledge.chunking_for("book") == ChunkingConfig(unit="words", size=16, overlap=4)
        assert knowledge.chunking_for("research") == ChunkingConfig(unit="chars", size=120, overlap=0)
        assert knowledge.chunking_for("wiki") == ChunkingConfig()  # the default: 128 words, 32 overlap
    # a source's unset fields come from the YAML's default (realdata: chunks of at most 1000 characters)
    assert plain.chunking_for("book") == ChunkingConfig(unit="chars", size=1000, overlap=0)
    assert realdata_book.chunking_for("book") == ChunkingConfig(unit="chars", size=500, overlap=0)
    assert realdata_book.chunking_for("wiki") == ChunkingConfig(unit="chars", size=1000, overlap=0)

    kb, report = build(cfg, tmp_path)
    rows = {row["source"]: row for row in report}
    book, research = (kb.text_sources[s].passages for s in ("book", "research"))
    assert rows["book"]["passages"] > 2 * rows["book"]["documents"]  # ~25-60-word sections in 16-word windows
    assert max(len(p.text.split()) for p in book) <= 16
    assert rows["research"]["passages"] > rows["research"]["documents"]
    assert max(len(p.text) for p in research) <= 120 and max(len(p.text.split()) for p in research) > 16
    assert rows["wiki"]["passages"] == rows["wiki"]["documents"]  # <= 31 words: whole under the default
    for source, passages in (("book", book), ("research", research)):
        manifest = json.loads(Path(rows[source]["directory"], "manifest.json").read_text())
        assert manifest["chunking"] == dataclasses.asdict(cfg.chunking_for(source))
    hits = kb.search("book", "Groshulide mechanism of action", 3)
    assert hits and all(h.passage.id != h.doc_id and len(h.passage.text.split()) <= 16 for h in hits)


def test_chunking_accepts_the_older_dict_form_and_names_unknown_sources():
    cfg = tiny(chunking={"default": ChunkingConfig(unit="chars", size=300, overlap=0), "wiki": {"size": 50}})
    assert cfg.chunking_for("wiki") == ChunkingConfig(unit="chars", size=50, overlap=0)
    assert cfg.chunking_for("book") == ChunkingConfig(unit="chars", size=300, overlap=0)
    with pytest.raises(KnowledgeError, match=r"pubmed.*book"):
        tiny(chunking={"pubmed": {"size": 50}})

"""Dense retrieval: MiniLM encoder, resumable embedding cache, FAISS and Qdrant indexes, rerankers.

The real all-MiniLM-L6-v2 (from its PyPI package) is loaded once per module; index-only tests use random
unit vectors so they stay fast and exact comparisons are meaningful.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnimed.knowledge.dense import DenseRetriever
from omnimed.knowledge.embedding_cache import EmbeddingCache
from omnimed.knowledge.encoders import TextEncoder, fingerprint_id_of
from omnimed.knowledge.faiss_index import FaissIndex
from omnimed.knowledge.qdrant import QdrantIndex
from omnimed.knowledge.rerank import (
    BiEncoderReranker,
    CrossEncoderReranker,
    Reranker,
    build_reranker,
    top_k_ranking,
)
from omnimed.knowledge.types import IndexMismatchError, KnowledgeError
from omnimed.models.config import ModelConfig

PASSAGES = [
    "Metformin is the first-line oral drug for type 2 diabetes mellitus; it lowers hepatic glucose output.",
    "Acute myocardial infarction presents with crushing chest pain radiating to the left arm and ST elevation.",
    "Amoxicillin is a penicillin antibiotic used for otitis media, sinusitis and community-acquired pneumonia.",
    "Iron deficiency anemia causes fatigue, pallor and a microcytic hypochromic blood smear.",
    "Asthma is treated with inhaled corticosteroids and short-acting beta-2 agonists such as salbutamol.",
    "Hypothyroidism causes weight gain, cold intolerance and constipation; levothyroxine replaces the hormone.",
    "Migraine headaches are often unilateral, pulsating and accompanied by nausea and photophobia.",
    "Warfarin is a vitamin K antagonist anticoagulant monitored with the INR.",
    "Tuberculosis is caused by Mycobacterium tuberculosis and treated with isoniazid and rifampicin.",
    "Chronic kidney disease is staged by glomerular filtration rate and albuminuria.",
    "Appendicitis typically starts with periumbilical pain that migrates to the right lower quadrant.",
    "Osteoporosis lowers bone mineral density and raises the risk of hip and vertebral fractures.",
    "Parkinson disease features resting tremor, rigidity and bradykinesia; levodopa improves symptoms.",
    "Hand hygiene with alcohol-based rub is the most effective way to prevent hospital infections.",
    "The mortgage interest rate was fixed for ten years by the bank.",
    "The football team won the championship after a penalty shoot-out.",
]

MINILM = ModelConfig(name="minilm-l6", kind="encoder", source="packaged", name_or_path="minilm-l6")


@pytest.fixture(scope="module")
def minilm() -> TextEncoder:
    encoder = TextEncoder(MINILM, batch_size=32)
    assert encoder.dim == 384  # loads the model once for the whole module
    return encoder


def unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class CountingEncoder:
    """Delegates to a real encoder, records every text sent to ``encode_docs`` and can fail mid-way."""

    def __init__(self, inner: TextEncoder, fail_after: int | None = None) -> None:
        self.inner = inner
        self.fail_after = fail_after
        self.encoded: list[str] = []

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.inner.fingerprint

    @property
    def fingerprint_id(self) -> str:
        return self.inner.fingerprint_id

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.encode_queries(texts)

    def encode_docs(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        if self.fail_after is not None and len(self.encoded) + len(texts) > self.fail_after:
            raise KeyboardInterrupt("simulated Ctrl-C while embedding")
        self.encoded.extend(texts)
        return self.inner.encode_docs(texts)


# -- encoder + retriever --------------------------------------------------------------------------------------


def test_minilm_retrieves_the_matching_passage(minilm: TextEncoder) -> None:
    retriever = DenseRetriever.from_texts(minilm, PASSAGES)
    queries = {
        "first-line medication for type 2 diabetes": 0,
        "heart attack with chest pain": 1,
        "which drug thins the blood and needs INR checks?": 7,
        "symptoms of an underactive thyroid gland": 5,
    }
    rankings = retriever.search(list(queries), k=3)
    assert [ranking[0][0] for ranking in rankings] == list(queries.values())
    for ranking in rankings:
        assert len(ranking) == 3 and ranking[0][1] >= ranking[1][1] >= ranking[2][1]
    vectors = minilm.encode_docs(PASSAGES[:3])
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_the_fingerprint_reads_the_width_from_the_folder_without_loading_the_model(tmp_path: Path) -> None:
    """A BM25-only run over a knowledge base with a dense index checks the index's fingerprint, which holds the
    encoder's width: that width is read from the folder's config files (MiniLM: 384, the tiny XLM-RoBERTa: 64) and
    equals the loaded model's; a folder whose output is not the transformer's width (a Dense projection) is loaded."""
    import shutil

    from omnimed.knowledge.encoders import _model_dim, declared_dim
    from omnimed.models.config import named_model_config
    from omnimed.models.resolve import resolve_model_path

    for name, width in (("minilm-l6", 384), ("tiny-xlm-roberta", 64)):
        encoder = TextEncoder(named_model_config(name))
        assert encoder.fingerprint["dim"] == width and encoder._doc is None  # nothing loaded
        assert _model_dim(encoder.doc_model) == width
    folder = tmp_path / "projected"
    shutil.copytree(resolve_model_path(named_model_config("tiny-xlm-roberta")), folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    assert declared_dim(ModelConfig(name="projected", kind="encoder", source="hub", name_or_path=str(folder))) is None
    assert declared_dim(ModelConfig(name="remote", kind="encoder", source="hub", name_or_path="org/not-here")) is None


def test_fingerprint_tracks_what_changes_vectors(minilm: TextEncoder) -> None:
    fingerprint = minilm.fingerprint
    assert fingerprint["dim"] == 384 and fingerprint["doc_model"]["name"] == "minilm-l6"
    assert fingerprint["doc_model"] == fingerprint["query_model"] and fingerprint["normalize"] is True
    assert len(minilm.fingerprint_id) == 16 and minilm.fingerprint_id == fingerprint_id_of(fingerprint)
    json.dumps(fingerprint)  # stored in meta.json files

    prefixed = TextEncoder(MINILM, query_prefix="query: ")
    prefixed._doc = minilm.doc_model  # share the loaded weights; only the prefix differs
    assert prefixed.fingerprint["query_prefix"] == "query: "
    assert prefixed.fingerprint_id != minilm.fingerprint_id
    assert not np.allclose(prefixed.encode_queries(["aspirin"]), minilm.encode_queries(["aspirin"]))
    np.testing.assert_allclose(prefixed.encode_docs(["aspirin"]), minilm.encode_docs(["aspirin"]), atol=1e-6)
    with pytest.raises(TypeError, match="list of texts"):
        minilm.encode_queries("aspirin")
    assert minilm.encode_docs([]).shape == (0, 384)


def test_separate_query_and_document_models(minilm: TextEncoder) -> None:
    """MedCPT-style pairs: two models, one for each side, named apart in the fingerprint."""
    query_cfg = ModelConfig(name="minilm-query", kind="encoder", source="packaged", name_or_path="minilm-l6")
    pair = TextEncoder(MINILM, query_cfg, max_length=64)
    pair._doc = minilm.doc_model
    assert pair.query_model is not pair.doc_model
    assert pair.dim == 384 and pair.query_model.max_seq_length == 64
    assert pair.fingerprint["query_model"]["name"] == "minilm-query"
    assert pair.fingerprint["doc_model"]["name"] == "minilm-l6"
    np.testing.assert_allclose(pair.encode_queries(["fever"]), minilm.encode_queries(["fever"]), atol=1e-5)


# -- FAISS ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_2k() -> np.ndarray:
    return unit_vectors(2000, 64, seed=1)


def recall_at_k(approx: list, exact: list, k: int) -> float:
    hits = sum(len({i for i, _ in a[:k]} & {i for i, _ in e[:k]}) for a, e in zip(approx, exact))
    return hits / (k * len(exact))


def test_hnsw_matches_flat(random_2k: np.ndarray) -> None:
    flat = FaissIndex.build(random_2k, kind="flat")
    hnsw = FaissIndex.build(random_2k, kind="hnsw", hnsw_m=16, ef_construction=100, ef_search=64)
    rng = np.random.default_rng(2)
    near = random_2k[:50] + 0.05 * rng.standard_normal((50, 64)).astype(np.float32)
    assert [r[0][0] for r in hnsw.search(near, 1)] == [r[0][0] for r in flat.search(near, 1)]
    queries = unit_vectors(100, 64, seed=3)
    exact, approx = flat.search(queries, 10), hnsw.search(queries, 10)
    assert recall_at_k(approx, exact, 10) >= 0.95
    # Same metric: a row found by both has the same inner-product score.
    exact_scores = dict(exact[0])
    for row, score in approx[0]:
        if row in exact_scores:
            assert score == pytest.approx(exact_scores[row], abs=1e-5)
    np.testing.assert_allclose(exact[0][0][1], float(queries[0] @ random_2k[exact[0][0][0]]), atol=1e-5)


def test_ivfpq_builds_and_searches(random_2k: np.ndarray) -> None:
    index = FaissIndex.build(random_2k[:1000], kind="ivfpq", nprobe=8)
    assert index.kind == "ivfpq" and len(index) == 1000
    assert 64 % index.params["pq_m"] == 0 and 1 <= index.params["pq_nbits"] <= 8
    rankings = index.search(random_2k[:20], 10)
    assert all(len(r) == 10 for r in rankings)
    found = sum(row in {i for i, _ in r} for row, r in enumerate(rankings))
    assert found >= 18  # compressed vectors: each point should still be near the top of its own list


def test_search_edge_cases_and_kinds() -> None:
    vectors = unit_vectors(5, 8)
    flat = FaissIndex.build(vectors, kind="flat")
    assert flat.search(vectors[2], 100)[0][0][0] == 2  # a 1-d query is one query
    assert len(flat.search(vectors[:2], 100)[1]) == 5
    assert flat.search(vectors[:2], 0) == [[], []]
    hnsw = FaissIndex.build(vectors, kind="hnsw")
    assert all(row >= 0 for row, _ in hnsw.search(vectors[:1], 5)[0])  # no -1 padding
    assert FaissIndex.build(vectors, kind="auto", auto_threshold=10).kind == "flat"
    assert FaissIndex.build(vectors, kind="auto", auto_threshold=5).kind == "hnsw"
    cosine = FaissIndex.build(vectors * 3.0, metric="cosine")
    assert cosine.search(vectors[:1] * 7.0, 1)[0][0][1] == pytest.approx(1.0, abs=1e-5)
    l2 = FaissIndex.build(vectors, metric="l2")
    assert l2.search(vectors[:1], 2)[0][0] == (0, pytest.approx(0.0, abs=1e-5))
    with pytest.raises(KnowledgeError, match="flat.*hnsw.*ivfpq"):
        FaissIndex.build(vectors, kind="annoy")
    with pytest.raises(IndexMismatchError, match="8-d"):
        flat.search(np.ones((1, 9), dtype=np.float32), 1)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_save_load_round_trip(tmp_path: Path, random_2k: np.ndarray, kind: str) -> None:
    vectors = random_2k[:600]
    index = FaissIndex.build(vectors, kind=kind, ef_search=32)
    queries = unit_vectors(20, 64, seed=4)
    folder = index.save(tmp_path / "dense")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["kind"] == kind and meta["dim"] == 64 and meta["n"] == 600 and meta["metric"] == "ip"
    loaded = FaissIndex.load(folder)
    assert loaded.search(queries, 10) == index.search(queries, 10)
    assert not list(folder.glob(".*tmp*"))
    if kind == "hnsw":
        import faiss

        assert faiss.downcast_index(loaded.index).hnsw.efSearch == 32
        assert faiss.downcast_index(FaissIndex.load(folder, ef_search=200).index).hnsw.efSearch == 200


def test_load_refuses_another_encoder(tmp_path: Path, minilm: TextEncoder) -> None:
    vectors = minilm.encode_docs(PASSAGES)
    folder = FaissIndex.build(vectors, encoder=minilm.fingerprint).save(tmp_path / "dense")
    assert FaissIndex.load(folder, expect_encoder=minilm.fingerprint).encoder == minilm.fingerprint

    medcpt = json.loads(json.dumps(minilm.fingerprint))
    medcpt["doc_model"] = {
        "name": "medcpt-article",
        "source": "hub",
        "name_or_path": "ncbi/MedCPT-Article-Encoder",
    }
    medcpt["query_model"] = {
        "name": "medcpt-query",
        "source": "hub",
        "name_or_path": "ncbi/MedCPT-Query-Encoder",
    }
    with pytest.raises(IndexMismatchError) as excinfo:
        FaissIndex.load(folder, expect_encoder=medcpt)
    message = str(excinfo.value)
    assert "minilm-l6" in message and "medcpt-article" in message and str(folder) in message

    bge = dict(minilm.fingerprint, dim=1024)
    with pytest.raises(IndexMismatchError, match="384 != 1024"):
        FaissIndex.load(folder, expect_encoder=bge)

    prefixed = TextEncoder(MINILM, doc_prefix="passage: ")
    prefixed._doc = minilm.doc_model
    retriever = DenseRetriever(prefixed, FaissIndex.load(folder))
    with pytest.raises(IndexMismatchError, match="passage: "):
        retriever.search(["fever"], 3)


def test_missing_or_incomplete_index_folder(tmp_path: Path) -> None:
    with pytest.raises(KnowledgeError, match=r"nowhere.*does not exist"):
        FaissIndex.load(tmp_path / "nowhere")
    folder = FaissIndex.build(unit_vectors(10, 8)).save(tmp_path / "dense")
    (folder / "meta.json").unlink()  # what an interrupted save leaves
    with pytest.raises(KnowledgeError, match=r"dense.*meta\.json.*incomplete"):
        FaissIndex.load(folder)
    FaissIndex.build(unit_vectors(10, 8)).save(folder)
    (folder / "index.faiss").unlink()
    with pytest.raises(KnowledgeError, match=r"index\.faiss"):
        FaissIndex.load(folder)


# -- embedding cache ------------------------------------------------------------------------------------------


def test_cache_encodes_each_text_once(tmp_path: Path, minilm: TextEncoder) -> None:
    texts = PASSAGES + PASSAGES[:4]  # duplicates are encoded once
    counting = CountingEncoder(minilm)
    cache = EmbeddingCache(tmp_path / "cache")
    vectors = cache.embed(counting, texts, batch_size=5)
    assert sorted(counting.encoded) == sorted(PASSAGES)
    np.testing.assert_allclose(vectors, minilm.encode_docs(texts), atol=1e-5)
    assert len(list((tmp_path / "cache" / minilm.fingerprint_id).glob("shard-*.keys"))) == 4  # 16 texts / 5

    again = CountingEncoder(minilm)
    reordered = list(reversed(texts)) + ["Aspirin inhibits platelet aggregation."]
    out = EmbeddingCache(tmp_path / "cache").embed(again, reordered, batch_size=5)  # a fresh process
    assert again.encoded == ["Aspirin inhibits platelet aggregation."]
    np.testing.assert_allclose(out[: len(texts)], vectors[::-1], atol=1e-6)
    assert cache.count(minilm) == len(PASSAGES) + 1


def test_cache_resumes_after_interruption(tmp_path: Path, minilm: TextEncoder) -> None:
    interrupted = CountingEncoder(minilm, fail_after=10)
    with pytest.raises(KeyboardInterrupt):
        EmbeddingCache(tmp_path / "cache").embed(interrupted, PASSAGES, batch_size=4)
    assert interrupted.encoded == PASSAGES[:8]  # two shards of 4 finished before the third batch failed
    space = tmp_path / "cache" / minilm.fingerprint_id
    (space / "shard-orphan.npy").write_bytes(b"half-written")  # a shard killed before its keys file: ignored

    resumed = CountingEncoder(minilm)
    vectors = EmbeddingCache(tmp_path / "cache").embed(resumed, PASSAGES, batch_size=4)
    assert resumed.encoded == PASSAGES[8:]
    np.testing.assert_allclose(vectors, minilm.encode_docs(PASSAGES), atol=1e-5)


def test_cache_keeps_encoders_apart(tmp_path: Path, minilm: TextEncoder) -> None:
    cache = EmbeddingCache(tmp_path / "cache")
    cache.embed(minilm, PASSAGES[:3])
    prefixed = TextEncoder(MINILM, doc_prefix="passage: ")
    prefixed._doc = minilm.doc_model
    counting = CountingEncoder(prefixed)
    out = cache.embed(counting, PASSAGES[:3])
    assert counting.encoded == PASSAGES[:3]  # nothing reused from the other encoder
    np.testing.assert_allclose(out, prefixed.encode_docs(PASSAGES[:3]), atol=1e-5)
    folders = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert folders == sorted([minilm.fingerprint_id, prefixed.fingerprint_id])
    stored = json.loads((tmp_path / "cache" / prefixed.fingerprint_id / "fingerprint.json").read_text())
    assert stored["doc_prefix"] == "passage: "


# -- Qdrant ---------------------------------------------------------------------------------------------------


def test_qdrant_local_round_trip_matches_faiss(tmp_path: Path) -> None:
    vectors, queries = unit_vectors(300, 32, seed=5), unit_vectors(10, 32, seed=6)
    expected = FaissIndex.build(vectors, kind="flat").search(queries, 10)
    fingerprint = {"doc_model": {"name": "random"}, "dim": 32}
    folder = tmp_path / "qdrant-index"

    def check(rankings: list) -> None:
        assert [[i for i, _ in r] for r in rankings] == [[i for i, _ in r] for r in expected]
        np.testing.assert_allclose(
            [s for r in rankings for _, s in r], [s for r in expected for _, s in r], atol=1e-5
        )

    with QdrantIndex.build(
        vectors, directory=folder, collection="pubmed", batch_size=64, encoder=fingerprint
    ) as built:
        check(built.search(queries, 10))
        with pytest.raises(KnowledgeError, match="another QdrantIndex or process"):
            QdrantIndex.load(folder)  # local mode holds a lock until closed
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["collection"] == "pubmed" and meta["n"] == 300 and meta["mode"] == "local"
    with QdrantIndex.load(folder, expect_encoder=fingerprint) as loaded:
        check(loaded.search(queries, 10))
        assert len(loaded.search(queries[:1], 1000)[0]) == 300
    with pytest.raises(IndexMismatchError, match=r"random.*medcpt"):
        QdrantIndex.load(folder, expect_encoder={"doc_model": {"name": "medcpt"}, "dim": 32})

    with QdrantIndex.build(vectors) as memory:  # in memory, then saved to a folder
        memory.save(tmp_path / "saved")
    with QdrantIndex.load(tmp_path / "saved") as reloaded:
        check(reloaded.search(queries, 10))
    with pytest.raises(KnowledgeError, match=r"meta\.json"):
        QdrantIndex.load(tmp_path / "saved" / "qdrant")


def test_dense_retriever_over_qdrant(minilm: TextEncoder) -> None:
    with QdrantIndex.build(minilm.encode_docs(PASSAGES), encoder=minilm.fingerprint) as index:
        ranking = DenseRetriever(minilm, index).search(["antibiotic for ear infection"], 2)[0]
    assert ranking[0][0] == 2


# -- rerankers ------------------------------------------------------------------------------------------------


def test_bi_encoder_reranker_puts_relevant_text_first(minilm: TextEncoder) -> None:
    reranker = build_reranker("bi_encoder", encoder=minilm)
    assert isinstance(reranker, BiEncoderReranker) and isinstance(reranker, Reranker)
    candidates = [PASSAGES[14], PASSAGES[6], PASSAGES[8], PASSAGES[15]]
    ranking = reranker.rerank("drugs used against tuberculosis", candidates, top_k=3)
    assert ranking[0][0] == 2 and len(ranking) == 3
    assert ranking[0][1] > ranking[1][1] >= ranking[2][1]
    assert reranker.rerank("anything", [], top_k=3) == []


def test_reranker_factory_and_errors(tmp_path: Path) -> None:
    with pytest.raises(KnowledgeError, match=r"'colbert'.*bi_encoder.*cross_encoder"):
        build_reranker("colbert")
    cross = build_reranker("cross_encoder", model_name_or_path=str(tmp_path / "no-such-model"))
    assert isinstance(cross, CrossEncoderReranker)
    with pytest.raises(KnowledgeError, match="no-such-model does not exist"):
        cross.rerank("q", ["a"], 1)
    assert top_k_ranking(np.array([0.1, 0.9, 0.5]), 5) == [(1, 0.9), (2, 0.5), (0, 0.1)]


def test_cross_encoder_hub_unreachable_says_how_to_go_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cross = CrossEncoderReranker("cross-encoder/omnimed-test-not-cached")
    with pytest.raises(KnowledgeError, match=r"hub is unreachable.*local-dir.*model_name_or_path"):
        cross.rerank("q", ["a"], 1)


def same_ranking(got: list, expected: list) -> None:
    assert [[i for i, _ in r] for r in got] == [[i for i, _ in r] for r in expected]
    np.testing.assert_allclose([s for r in got for _, s in r], [s for r in expected for _, s in r], atol=1e-5)


@pytest.fixture
def qdrant_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in for a Qdrant server: every ``url=`` connection opens the same local on-disk storage, so, as on a
    server, all indexes share one collection namespace that outlives each client. Local mode allows one client at
    a time, so each index is closed before the next one connects. Returns the urls connected to."""
    from qdrant_client import QdrantClient

    from omnimed.knowledge import qdrant as qdrant_module

    storage, urls = tmp_path / "qdrant-server", []

    def connect(url: str, api_key_env: str | None, timeout: int | None) -> QdrantClient:
        urls.append(url)
        return QdrantClient(path=str(storage))

    monkeypatch.setattr(qdrant_module, "_open_server", connect)
    return urls


def test_qdrant_server_collection_replaced_by_another_encoder_is_refused(
    tmp_path: Path, qdrant_server: list[str]
) -> None:
    """Bug: on a server, ``meta.json`` is local while the collection is shared; load checked only ``meta.json``
    and the point count, so a collection rebuilt by another encoder (same passages, same count) was searched
    as if it held this index's vectors."""
    url = "http://qdrant.test:6333"
    minilm_fp = {"doc_model": {"name": "minilm-l6"}, "dim": 32}
    medcpt_fp = {"doc_model": {"name": "medcpt-article"}, "dim": 32}
    vectors, queries = unit_vectors(50, 32, seed=7), unit_vectors(3, 32, seed=8)
    QdrantIndex.build(vectors, directory=tmp_path / "a", url=url, collection="wiki", encoder=minilm_fp).close()
    with QdrantIndex.load(tmp_path / "a", minilm_fp) as index:  # untouched: loads and searches
        assert index.mode == "server"
        same_ranking(index.search(queries, 5), FaissIndex.build(vectors).search(queries, 5))
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["mode"] == "server" and not (tmp_path / "a" / "qdrant").exists()

    # another index (another encoder, the same number of points) is built into the same collection
    other = unit_vectors(50, 32, seed=9)
    QdrantIndex.build(other, directory=tmp_path / "b", url=url, collection="wiki", encoder=medcpt_fp).close()
    for expect in (minilm_fp, None):  # asked for minilm, or for whatever meta.json says
        with pytest.raises(IndexMismatchError) as info:
            QdrantIndex.load(tmp_path / "a", expect)
        message = str(info.value)
        assert "'wiki'" in message and "medcpt-article" in message and "minilm-l6" in message
    with QdrantIndex.load(tmp_path / "b", medcpt_fp) as index:
        same_ranking(index.search(queries, 5), FaissIndex.build(other).search(queries, 5))

    # ... or with another dimension: refused by the collection's own vector size
    QdrantIndex.build(unit_vectors(50, 16), url=url, collection="wiki", encoder=None).close()
    with pytest.raises(IndexMismatchError, match=r"16-d.*32-d"):
        QdrantIndex.load(tmp_path / "b", medcpt_fp)
    assert qdrant_server and set(qdrant_server) == {url}


def test_collection_names_are_valid_for_qdrant(tmp_path: Path) -> None:
    from omnimed.knowledge.qdrant import collection_name

    name = collection_name("omnimed", "my kb/v2:é", "wiki-0123456789ab", "dense-ba9876543210")
    assert name == "omnimed-my_kb_v2-wiki-0123456789ab-dense-ba9876543210"
    long = collection_name("omnimed", "x" * 400, "wiki-0123456789ab", "dense-ba9876543210")
    assert len(long) == 255 and long.endswith("-wiki-0123456789ab-dense-ba9876543210")
    with QdrantIndex.build(unit_vectors(5, 8), directory=tmp_path / "q", collection=name) as index:
        assert index.search(unit_vectors(1, 8), 1)[0]


# -- a real (tiny, random) cross-encoder ----------------------------------------------------------------------

QUERIES = ["first-line drug for diabetes", "antibiotic for pneumonia", "chest pain with ST elevation"]


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random BERT sequence classifier (one label) with a WordPiece tokenizer trained here: an ordinary
    cross-encoder folder, as ``hf download cross-encoder/...`` would leave, but built offline."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-cross-encoder")
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece.train_from_iterator(PASSAGES + QUERIES, trainers.WordPieceTrainer(vocab_size=400, special_tokens=special))
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    wordpiece.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=512, model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    pair = tokenizer(QUERIES[0], PASSAGES[0])
    assert tokenizer.unk_token_id not in pair["input_ids"] and set(pair["token_type_ids"]) == {0, 1}
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(  # initializer_range 0.1: random scores far enough apart to order every candidate
        vocab_size=wordpiece.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=1, initializer_range=0.1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def test_cross_encoder_reranks_by_its_own_scores(tiny_cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    reranker = build_reranker("cross_encoder", model_name_or_path=str(tiny_cross_encoder), batch_size=3)
    assert isinstance(reranker, CrossEncoderReranker) and isinstance(reranker, Reranker)
    reference = CrossEncoder(str(tiny_cross_encoder))  # the model called directly, not through our class
    candidates = PASSAGES[:10]
    for query in QUERIES:
        ranking = reranker.rerank(query, candidates, top_k=4)
        scores = np.asarray(reference.predict([(query, text) for text in candidates]), dtype=np.float64)
        # each candidate returned with its own score, and they are the 4 best, best first (a tie between two
        # candidates may come in either order: the random tiny model's tanh pooler can saturate to equal scores)
        got = [i for i, _ in ranking]
        assert len(set(got)) == 4
        np.testing.assert_allclose([s for _, s in ranking], scores[got], rtol=1e-5)
        np.testing.assert_allclose(scores[got], np.sort(scores)[::-1][:4], rtol=1e-5)
    # the random model's order is not the input order, so the comparison above is not trivially true
    assert [i for i, _ in reranker.rerank(QUERIES[0], candidates, 10)] != list(range(10))
    assert len(reranker.rerank(QUERIES[0], candidates[:2], 5)) == 2 and reranker.rerank("q", [], 3) == []
    assert reranker.model is reranker.model  # loaded once


def test_knowledge_base_reranks_with_a_local_cross_encoder(tmp_path: Path, tiny_cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.config import KnowledgeConfig, RerankConfig
    from omnimed.knowledge.types import index_text

    cfg = KnowledgeConfig(
        name="cross_encoder", corpus="world", world_size="tiny", sources=["wiki"], indexes=["bm25"],
        retriever="bm25",
        rerank=RerankConfig(enabled=True, kind="cross_encoder", model=str(tiny_cross_encoder), candidates=8),
    )
    kb = build_knowledge_base(cfg, tmp_path, progress=False)
    assert isinstance(kb.reranker, CrossEncoderReranker)
    assert kb.reranker.model_name_or_path == str(tiny_cross_encoder)
    reference = CrossEncoder(str(tiny_cross_encoder))
    query = "symptoms and treatment of the disease"
    candidates = kb.search("wiki", query, 8, rerank=False)
    assert len(candidates) == 8
    hits = kb.search("wiki", query, 3, rerank=True)
    assert [h.rank for h in hits] == [1, 2, 3] and {h.retriever for h in hits} == {"bm25+rerank"}
    scores = np.asarray(reference.predict([(query, index_text(h.passage)) for h in candidates]), dtype=np.float64)
    order = np.argsort(-scores)[:3]
    assert [h.passage.id for h in hits] == [candidates[i].passage.id for i in order]
    np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-5)
    # the random model does not score the 8 candidates in BM25's order, so the comparison above is not trivially
    # true (its top 3 may still be BM25's by chance: 1 in 336 for random scores, seen once in CI)
    assert np.any(np.diff(scores) > 0), scores

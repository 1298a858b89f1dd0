"""Chunking, BM25 and rank fusion: the behaviour retrieval code and experiments rely on."""

from __future__ import annotations

from itertools import pairwise

import pytest

from omnimed.data.records import Passage
from omnimed.knowledge.chunking import ChunkConfig, chunk_passages, chunk_text
from omnimed.knowledge.fusion import reciprocal_rank_fusion
from omnimed.knowledge.sparse import BM25Index, tokenize_for_reference
from omnimed.knowledge.types import KnowledgeError

CORPUS = [
    "Aspirin lowers the risk of myocardial infarction in adults with coronary disease.",
    "Metformin is the first-line treatment for type 2 diabetes mellitus.",
    "Pheochromocytoma presents with episodic headache, sweating and tachycardia.",
    "Hypertension treatment starts with lifestyle change and thiazide diuretics.",
    "Influenza vaccination is recommended every year for adults over 65.",
    "Insulin therapy is needed when diabetes is poorly controlled by oral drugs.",
]


# ----------------------------------------------------------------------------- chunking
def test_word_windows_follow_self_biorag_recipe() -> None:
    words = [f"w{i}" for i in range(300)]
    chunks = chunk_text(" ".join(words), ChunkConfig("words", 128, 32))
    split = [c.split() for c in chunks]
    assert [len(c) for c in split[:-1]] == [128] * (len(split) - 1)
    assert len(split[-1]) <= 128
    for prev, nxt in pairwise(split):
        assert prev[-32:] == nxt[:32]
    covered = {w for c in split for w in c}
    assert covered == set(words)
    assert split[-1][-1] == "w299"
    # the last window brings new words, it is not a tail made only of overlap
    assert not set(split[-1]) <= set(split[-2])


def test_short_text_is_one_unchanged_chunk() -> None:
    assert chunk_text("A short text.", ChunkConfig()) == ["A short text."]
    assert chunk_text("   ", ChunkConfig()) == []
    assert chunk_text("keep\n  as is", ChunkConfig("none")) == ["keep\n  as is"]


def test_char_chunks_stay_under_limit_and_keep_words() -> None:
    sentence = "Beta blockers reduce mortality after myocardial infarction in most patients. "
    text = (sentence * 40 + "\n") * 3 + "Final remark without a full stop"
    chunks = chunk_text(text, ChunkConfig("chars", 1000, 0))
    assert len(chunks) > 1
    assert all(0 < len(c) <= 1000 for c in chunks)
    assert " ".join(chunks).split() == text.split()
    # cut at sentence ends when possible
    assert all(c.endswith(".") for c in chunks[:-1])


def test_char_chunks_with_overlap_and_oversized_word() -> None:
    text = "alpha beta gamma delta " * 30 + "x" * 70 + " omega"
    chunks = chunk_text(text, ChunkConfig("chars", 50, 12))
    assert all(len(c) <= 50 for c in chunks)
    # consecutive pieces share whole words
    assert chunks[1].split()[0] in chunks[0].split()
    # only the 70-character word is ever cut
    pieces = {w for c in chunks for w in c.split()}
    assert pieces - set(text.split()) <= {"x" * 50, "x" * 20}


def test_chunk_passages_keeps_provenance() -> None:
    long = Passage(
        id="g1",
        source="guideline",
        title="Sepsis",
        text=" ".join(f"w{i}" for i in range(200)),
        date="2021-10",
        authority="SSC",
        url="https://example.org/sepsis",
        metadata={"lang": "en"},
    )
    short = Passage(id="b1", source="book", text="Short.", parent_id="book-7")
    out = chunk_passages([long, short], ChunkConfig("words", 128, 32))
    assert [p.id for p in out] == ["g1#0", "g1#1", "b1"]
    for i, p in enumerate(out[:2]):
        assert (p.source, p.title, p.date, p.authority, p.url) == (
            "guideline",
            "Sepsis",
            "2021-10",
            "SSC",
            "https://example.org/sepsis",
        )
        assert p.parent_id == "g1"
        assert p.metadata == {"lang": "en", "chunk_of": "g1", "chunk": i, "n_chunks": 2}
    assert out[2].parent_id == "book-7"
    assert out[2].metadata == {"chunk_of": "b1", "chunk": 0, "n_chunks": 1}
    assert long.metadata == {"lang": "en"}  # the input is not modified


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"size": 0}, "size"),
        ({"size": 10, "overlap": 10}, "overlap"),
        ({"overlap": -1}, "overlap"),
        ({"unit": "tokens"}, "unit"),
    ],
)
def test_invalid_chunk_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(KnowledgeError, match=rf"ChunkConfig\.{field}"):
        ChunkConfig(**kwargs)


# ----------------------------------------------------------------------------- BM25
@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(CORPUS)


def test_rare_term_passage_ranks_first(index: BM25Index) -> None:
    [ranking] = index.search(["What causes pheochromocytoma symptoms?"], k=3)
    assert ranking[0][0] == 2
    assert all(isinstance(r, int) and isinstance(s, float) and s > 0 for r, s in ranking)
    assert [s for _, s in ranking] == sorted((s for _, s in ranking), reverse=True)


def test_stemming_matches_inflections(index: BM25Index) -> None:
    [ranking] = index.search(["treatments"], k=10)
    assert {row for row, _ in ranking} == {1, 3}  # both say "treatment"
    assert tokenize_for_reference("The treatments") == ["treatment"]
    assert index.tokenize("Treatments of the DIABETES") == ["treatment", "diabet"]


def test_k_is_clipped_and_unknown_queries_are_empty(index: BM25Index) -> None:
    rankings = index.search(["diabetes", "zzzunknownterm", "the of and"], k=100)
    assert {row for row, _ in rankings[0]} == {1, 5}  # zero-score rows left out
    assert rankings[1] == [] and rankings[2] == []
    [everything] = index.search(["adults diabetes treatment aspirin headache vaccination"], k=100)
    assert len(everything) == len(CORPUS)


def test_save_load_mmap_gives_identical_results(index: BM25Index, tmp_path) -> None:
    queries = ["diabetes treatment", "adults over 65", "myocardial infarction aspirin"]
    target = tmp_path / "bm25"
    index.save(target)
    index.save(target)  # replacing an existing index works and leaves no temporary folders behind
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]
    loaded = BM25Index.load(target, mmap=True)
    assert loaded.info == index.info
    assert loaded.search(queries, k=4) == index.search(queries, k=4)
    assert loaded.search(queries, k=4, n_threads=2) == index.search(queries, k=4)


def test_build_keeps_tokenizer_settings() -> None:
    plain = BM25Index.build(CORPUS, stemmer=None, stopwords=None)
    assert plain.search(["treatments"], k=5) == [[]]
    assert (
        plain.info["stemmer"] is None
        and plain.info["vocab_size"] > BM25Index.build(CORPUS).info["vocab_size"]
    )


def test_empty_corpus_errors() -> None:
    with pytest.raises(KnowledgeError, match="empty corpus"):
        BM25Index.build([])
    with pytest.raises(KnowledgeError, match="all 2 texts are empty"):
        BM25Index.build(["", "the and of"])


def test_load_errors_name_directory_and_file(index: BM25Index, tmp_path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(KnowledgeError, match="nowhere"):
        BM25Index.load(missing)
    target = index.save(tmp_path / "bm25")
    (target / "vocab.index.json").unlink()
    with pytest.raises(KnowledgeError, match=r"bm25.*incomplete.*vocab\.index\.json"):
        BM25Index.load(target)


# ----------------------------------------------------------------------------- fusion
def test_rrf_matches_hand_computation() -> None:
    bm25 = [(7, 12.0), (3, 9.5), (5, 1.0)]
    dense = [(3, 0.91), (9, 0.80), (7, 0.20)]
    fused = reciprocal_rank_fusion([bm25, dense], k=60)
    expected = {
        3: 1 / 62 + 1 / 61,
        7: 1 / 61 + 1 / 63,
        9: 1 / 62,
        5: 1 / 63,
    }
    assert [row for row, _ in fused] == [3, 7, 9, 5]  # 3 is ranked well by both
    for row, score in fused:
        assert score == pytest.approx(expected[row])
    assert reciprocal_rank_fusion([bm25, dense], k=60, top=2) == fused[:2]
    # a zero weight silences a retriever: the order falls back to the BM25 ranking
    weighted = reciprocal_rank_fusion([bm25, dense], k=60, weights=[1.0, 0.0])
    assert [row for row, _ in weighted] == [7, 3, 5, 9]
    assert weighted[0][1] == pytest.approx(1 / 61)


def test_rrf_ties_keep_first_appearance() -> None:
    assert [r for r, _ in reciprocal_rank_fusion([[(4, 1.0)], [(2, 1.0)]])] == [4, 2]
    with pytest.raises(KnowledgeError, match="weights"):
        reciprocal_rank_fusion([[(1, 1.0)]], weights=[1.0, 2.0])

"""BM25 over a passage table, built on bm25s (sparse precomputed scores, memory-mappable on disk).

Texts are analysed one way at build and at query time: lower-cased, split into ``\\w\\w+`` tokens (the
scikit-learn / bm25s pattern), stopwords dropped, then stemmed with PyStemmer. The analyser settings are saved
beside bm25s' files (``omnimed_bm25.json``) and reused on load, so a loaded index never sees queries
tokenised differently from its corpus.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import bm25s
import Stemmer
from bm25s.tokenization import _infer_stopwords

from omnimed.data.artifacts import atomic_path
from omnimed.knowledge.types import KnowledgeError, Ranking

SETTINGS_FILE = "omnimed_bm25.json"
# the files bm25s.BM25.save writes (no corpus, no non-occurrence array for the methods we allow)
BM25S_FILES = (
    "params.index.json",
    "vocab.index.json",
    "data.csc.index.npy",
    "indices.csc.index.npy",
    "indptr.csc.index.npy",
)
# methods whose non-matching documents score exactly 0 (bm25l / bm25+ give every document a floor score)
METHODS = ("lucene", "robertson", "atire")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_FORMAT = "omnimed-bm25/1"


class Analyzer:
    """Text -> index terms: lower-case, ``\\w\\w+`` tokens, stopwords removed, stemmed.

    Stems are cached per raw token, which makes re-analysing repetitive text (queries, corpora) cheap.
    """

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en") -> None:
        try:
            self._stemmer = Stemmer.Stemmer(stemmer) if stemmer else None
        except KeyError:
            raise KnowledgeError(
                f"unknown stemmer {stemmer!r}; expected None or one of {Stemmer.algorithms()}"
            ) from None
        try:
            self._stopwords = frozenset(_infer_stopwords(stopwords) if stopwords else ())
        except ValueError:
            raise KnowledgeError(
                f"unknown stopword list {stopwords!r}; expected None or a language name/code such as 'en'"
            ) from None
        self.stemmer = stemmer
        self.stopwords = stopwords
        self._split = re.compile(TOKEN_PATTERN).findall
        self._cache: dict[str, str | None] = {}  # raw token -> stem, None for a stopword

    def _term(self, token: str) -> str | None:
        if token in self._stopwords:
            term = None
        elif self._stemmer is not None:
            term = self._stemmer.stemWord(token)
        else:
            term = token
        self._cache[token] = term
        return term

    def __call__(self, text: str) -> list[str]:
        cache, out = self._cache, []
        for token in self._split(text.lower()):
            term = cache[token] if token in cache else self._term(token)
            if term is not None:
                out.append(term)
        return out


def tokenize_for_reference(
    text: str, *, stemmer: str | None = "english", stopwords: str | None = "en"
) -> list[str]:
    """The terms :class:`BM25Index` indexes for ``text`` with the same settings.

    Meant for benchmarks: feeding these tokens to another BM25 (e.g. rank-bm25) compares scorers, not tokenisers.
    """
    return _shared_analyzer(stemmer, stopwords)(text)


@lru_cache(maxsize=8)
def _shared_analyzer(stemmer: str | None, stopwords: str | None) -> Analyzer:
    return Analyzer(stemmer, stopwords)


class BM25Index:
    """A BM25 index over a list of texts; search returns (row index, score) rankings, best first."""

    def __init__(self, model: bm25s.BM25, analyzer: Analyzer) -> None:
        self._model = model
        self._analyzer = analyzer
        self._vocab: dict[str, int] = model.vocab_dict

    # ------------------------------------------------------------------ build / persist
    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        *,
        method: str = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: str | None = "english",
        stopwords: str | None = "en",
        show_progress: bool = False,
    ) -> BM25Index:
        """Index ``texts``; row ``i`` of every ranking refers to ``texts[i]``."""
        if method not in METHODS:
            raise KnowledgeError(f"unknown BM25 method {method!r}; expected one of {list(METHODS)}")
        if len(texts) == 0:
            raise KnowledgeError("cannot build a BM25 index on an empty corpus (0 texts)")
        analyzer = Analyzer(stemmer, stopwords)
        vocab: dict[str, int] = {}
        doc_ids: list[list[int]] = []
        for text in texts:
            ids = []
            for term in analyzer(text):
                tid = vocab.get(term)
                if tid is None:
                    tid = vocab[term] = len(vocab)
                ids.append(tid)
            doc_ids.append(ids)
        if not vocab:
            raise KnowledgeError(
                f"cannot build a BM25 index: all {len(texts)} texts are empty or contain only stopwords"
            )
        model = bm25s.BM25(k1=k1, b=b, method=method, backend="numpy")
        # (ids, vocab) skips bm25s' own tokeniser; it adds an empty-string term used for term-less queries
        model.index((doc_ids, vocab), show_progress=show_progress)
        return cls(model, analyzer)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index to ``directory`` atomically and return its path.

        Files go into a temporary sibling folder that is then renamed into place, so readers see either the
        old complete index or the new one; an existing index there is swapped out and then deleted.
        """
        target = Path(directory)
        if target.exists() and not target.is_dir():
            raise KnowledgeError(f"cannot save a BM25 index to {target}: it exists and is not a directory")
        with atomic_path(target, is_dir=True) as tmp:
            self._model.save(tmp, show_progress=False)
            settings = {"format": _FORMAT, "token_pattern": TOKEN_PATTERN, "lowercase": True, **self.info}
            (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        return target

    @classmethod
    def load(cls, directory: str | os.PathLike[str], mmap: bool = True) -> BM25Index:
        """Open an index written by :meth:`save`; with ``mmap`` the score matrix stays on disk, paged in on use."""
        path = Path(directory)
        if not path.is_dir():
            raise KnowledgeError(f"BM25 index directory {path} does not exist")
        missing = [name for name in (SETTINGS_FILE, *BM25S_FILES) if not (path / name).is_file()]
        if missing:
            raise KnowledgeError(f"BM25 index directory {path} is incomplete: missing {', '.join(missing)}")
        try:
            settings = json.loads((path / SETTINGS_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise KnowledgeError(f"{path / SETTINGS_FILE} is not valid JSON: {exc}") from None
        if settings.get("format") != _FORMAT or settings.get("token_pattern") != TOKEN_PATTERN:
            raise KnowledgeError(
                f"{path / SETTINGS_FILE} describes format {settings.get('format')!r}; expected {_FORMAT!r}"
            )
        model = bm25s.BM25.load(path, mmap=mmap, load_corpus=False, show_progress=False)
        return cls(model, Analyzer(settings["stemmer"], settings["stopwords"]))

    # ------------------------------------------------------------------ query
    @property
    def n_docs(self) -> int:
        return int(self._model.scores["num_docs"])

    @property
    def info(self) -> dict[str, Any]:
        """Scoring and analysis settings plus corpus size, as saved next to the index."""
        return {
            "method": self._model.method,
            "k1": float(self._model.k1),
            "b": float(self._model.b),
            "stemmer": self._analyzer.stemmer,
            "stopwords": self._analyzer.stopwords,
            "n_docs": self.n_docs,
            "vocab_size": len(self._vocab) - ("" in self._vocab),
        }

    def tokenize(self, text: str) -> list[str]:
        """The index terms this index sees in ``text`` (unknown terms included)."""
        return self._analyzer(text)

    def search(self, queries: Sequence[str], k: int, n_threads: int = 1) -> list[Ranking]:
        """Top ``k`` rows per query as (row index, score), best first; equal scores go to the lower row.

        ``k`` is clipped to the corpus size; rows scoring 0 (sharing no term with the query) are left out, so a
        query with no indexed term gets ``[]``. ``n_threads`` > 1 scores queries in parallel threads.
        """
        if k < 1:
            raise KnowledgeError(f"k must be >= 1, got {k}")
        k = min(k, self.n_docs)
        vocab = self._vocab
        query_ids = [[vocab[t] for t in self._analyzer(q) if t in vocab] for q in queries]
        live = [i for i, ids in enumerate(query_ids) if ids]
        results: list[Ranking] = [[] for _ in queries]
        if not live:
            return results
        found = self._model.retrieve(
            [query_ids[i] for i in live],
            k=k,
            sorted=True,
            show_progress=False,
            n_threads=n_threads if n_threads > 1 else 0,  # 0 = plain loop in bm25s, no thread pool
        )
        for row, qi in enumerate(live):
            pairs = [(int(d), float(s)) for d, s in zip(found.documents[row], found.scores[row]) if s > 0]
            pairs.sort(key=lambda p: (-p[1], p[0]))
            results[qi] = pairs
        return results

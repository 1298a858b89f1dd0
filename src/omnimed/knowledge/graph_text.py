"""The text side of graph queries: name normalisation, the ``term , question`` query syntax, and the default
lexical scorer that ranks relation lines against a question.

Exact name matching compares :func:`normalise_name` forms; fuzzy matching and relation ranking compare stemmed
content words (:func:`content_terms`), so "treatment" meets "treats" and "Alzheimer's" meets "alzheimer".
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Any

__all__ = ["content_terms", "dice_overlap", "lexical_scores", "normalise_name", "parse_graph_query"]

_NON_WORD = re.compile(r"[\W_]+")
_POSSESSIVE = re.compile(r"['’]s\b")
_STOPWORD_TEXT = (
    "a an the of in on at to for from by with and or not no is are was were be been being what which who "
    "whom whose how why when where does do did done this that these those it its their there than then "
    "into about as can could would should may might most more any all some each other such one"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def normalise_name(text: str) -> str:
    """Lower-case, accents stripped, possessive ``'s`` dropped, every run of non-word characters one space.

    "Alzheimer's Disease" and "alzheimer disease" normalise alike, which is what exact name matching compares.
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = _POSSESSIVE.sub("", text.lower())
    return " ".join(_NON_WORD.sub(" ", text).split())


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer  # PyStemmer: a declared dependency (also used by bm25s)

    return Stemmer.Stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(token: str) -> str:
    stem = _stemmer().stemWord(token)
    # "treatment" should meet "treats" / "treated_by"; snowball keeps the -ment
    return stem[:-4] if stem.endswith("ment") and len(stem) > 7 else stem


def content_terms(text: str) -> list[str]:
    """Stemmed content tokens of ``text`` (stop words dropped), for scoring only: what fuzzy name matching and
    :func:`lexical_scores` compare."""
    return [_stem(t) for t in normalise_name(text).split() if t not in _STOPWORDS]


def lexical_scores(question: str, texts: list[str], *, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """BM25 of each text against ``question``, with the texts themselves as the collection.

    The default relation scorer: cheap, deterministic, and enough to put "X | has symptom | Y" first for "which
    symptoms does X cause?". Tokens are stemmed (snowball) and stop words dropped; a text sharing no term scores 0.
    """
    query = set(content_terms(question))
    docs = [content_terms(t) for t in texts]
    if not query or not docs:
        return [0.0] * len(docs)
    n = len(docs)
    avg_len = sum(len(d) for d in docs) / n or 1.0
    df = Counter(term for d in docs for term in set(d) if term in query)
    idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    out = []
    for d in docs:
        tf = Counter(term for term in d if term in idf)
        norm = k1 * (1.0 - b + b * len(d) / avg_len)
        out.append(sum(idf[t] * f * (k1 + 1.0) / (f + norm) for t, f in tf.items()))
    return out


def dice_overlap(a: set[str], b: set[str]) -> float:
    """Dice coefficient of two word sets (0 when either is empty): how much a name covers a term and back."""
    return 2.0 * len(a & b) / (len(a) + len(b)) if a and b else 0.0


def parse_graph_query(text: str) -> tuple[str, str]:
    """Split an Omni-RAG graph query ``term , question`` at its first comma into ``(term, question)``.

    Without a comma (or with one side empty) the whole text serves as both term and question, so a bare term
    still finds its concept and ranks relations by the term itself.
    """
    term, sep, question = (part.strip() for part in text.partition(","))
    whole = " ".join(text.split())
    if not sep:
        return whole, whole
    term, question = " ".join(term.split()), " ".join(question.split())
    return term or question, question or term


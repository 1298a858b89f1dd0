"""Sentence splitting for Self-BioRAG's per-sentence generator data (the reference splits outputs with spaCy's
sentence segmenter; pysbd is a rule-based one that needs no model download)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped, empty ones dropped; a text without a boundary is one sentence."""
    return [s.strip() for s in _segmenter().segment(text) if s.strip()] or ([text.strip()] if text.strip() else [])

"""Split long passages into retrieval-sized chunks while keeping where each chunk came from.

Two published recipes are covered by one config:

* Self-BioRAG (sec. 3.2): windows of 128 words sharing 32 words with the previous window,
  ``ChunkConfig("words", 128, 32)``;
* Omni-RAG (sec. 5.1.2): pieces of at most 1000 characters, ``ChunkConfig("chars", 1000, 0)``.

``unit="none"`` leaves texts whole (for sources that are already passage-sized).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from omnimed.data.records import Passage
from omnimed.knowledge.types import KnowledgeError

UNITS = ("words", "chars", "none")

# End of a sentence: terminal punctuation (plus closing quotes / brackets) followed by whitespace, or a line break.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)|\n")
_SPACE = re.compile(r"\s")
_NON_SPACE = re.compile(r"\S")


@dataclass(frozen=True)
class ChunkConfig:
    """How to cut texts: ``unit`` is ``words``, ``chars`` or ``none``; ``size`` and ``overlap`` are in that unit."""

    unit: str = "words"
    size: int = 128
    overlap: int = 32

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise KnowledgeError(f"ChunkConfig.unit must be one of {list(UNITS)}, got {self.unit!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise KnowledgeError(f"ChunkConfig.size must be an integer > 0, got {self.size!r}")
        if (
            isinstance(self.overlap, bool)
            or not isinstance(self.overlap, int)
            or not 0 <= self.overlap < self.size
        ):
            raise KnowledgeError(
                f"ChunkConfig.overlap must be an integer with 0 <= overlap < size ({self.size}), "
                f"got {self.overlap!r}"
            )


SELF_BIORAG = ChunkConfig("words", 128, 32)
OMNI_RAG = ChunkConfig("chars", 1000, 0)


def chunk_text(text: str, cfg: ChunkConfig) -> list[str]:
    """Cut ``text`` into chunks as ``cfg`` says; an empty or blank text gives no chunks."""
    if not text.strip():
        return []
    if cfg.unit == "none":
        return [text]
    if cfg.unit == "words":
        return _word_windows(text, cfg.size, cfg.overlap)
    return _char_pieces(text, cfg.size, cfg.overlap)


def _word_windows(text: str, size: int, overlap: int) -> list[str]:
    """Windows of ``size`` words, each starting ``size - overlap`` words after the previous one.

    The last window is the first one that reaches the end of the text, so it always brings at least one
    word the previous window lacked (no trailing window made only of already-seen overlap words).
    A text of at most ``size`` words is returned unchanged (its whitespace included).
    """
    words = text.split()
    if len(words) <= size:
        return [text.strip()]
    stride = size - overlap
    windows = []
    start = 0
    while True:
        windows.append(" ".join(words[start : start + size]))
        if start + size >= len(words):
            return windows
        start += stride


def _char_pieces(text: str, size: int, overlap: int) -> list[str]:
    """Pieces of at most ``size`` characters, cut at a sentence end when one lies in the second half of the
    window, else at the last whitespace; a word is split only when it alone is longer than ``size``.

    With ``overlap`` > 0 the next piece starts at the first whole word within the last ``overlap``
    characters of the previous piece (so the overlap is at most ``overlap`` characters, whole words only).
    """
    n = len(text.rstrip())
    pieces: list[str] = []
    pos = _skip_space(text, 0)
    while pos < n:
        if pos + size >= n:
            pieces.append(text[pos:n])
            break
        cut = _cut_point(text, pos, size)
        pieces.append(text[pos:cut].strip())
        nxt = _skip_space(text, cut)
        if overlap:
            back = _word_start_at_or_after(text, max(cut - overlap, pos + 1))
            if back < cut:
                nxt = back
        pos = nxt
    return [p for p in pieces if p]


def _cut_point(text: str, pos: int, size: int) -> int:
    """Where to end the piece that starts at ``pos`` (exclusive index, at most ``pos + size``)."""
    limit = pos + size
    sentence_cut = -1
    for m in _SENTENCE_END.finditer(text, pos, limit + 1):
        if m.end() <= limit:
            sentence_cut = m.end()
    if sentence_cut - pos >= size // 2:
        return sentence_cut
    # last whitespace at or before ``limit``: text[pos:i] then ends on a word boundary
    window = text[pos : limit + 1]
    for i in range(len(window) - 1, 0, -1):
        if window[i].isspace():
            return pos + i
    return limit  # one word longer than ``size``: cut inside it


def _skip_space(text: str, i: int) -> int:
    m = _NON_SPACE.search(text, i)
    return m.start() if m else len(text)


def _word_start_at_or_after(text: str, i: int) -> int:
    """First index >= i that starts a word (i itself when it already does)."""
    if i >= len(text):
        return len(text)
    if not text[i].isspace() and (i == 0 or text[i - 1].isspace()):
        return i
    m = _SPACE.search(text, i)
    return _skip_space(text, m.start()) if m else len(text)


def chunk_passages(passages: Iterable[Passage], cfg: ChunkConfig) -> list[Passage]:
    """Chunk every passage; each chunk keeps the passage's source, title, date, authority and url.

    ``parent_id`` is the passage's own parent (or the passage itself when it has none), and ``metadata``
    gains ``chunk_of`` (the passage id), ``chunk`` (0-based) and ``n_chunks`` so hits can be mapped back
    to whole documents. A passage cut into one chunk keeps its id; otherwise chunk ``i`` is ``"{id}#{i}"``.
    """
    out: list[Passage] = []
    for p in passages:
        chunks = chunk_text(p.text, cfg) or [p.text]
        parent = p.parent_id or p.id
        for i, chunk in enumerate(chunks):
            meta = {**p.metadata, "chunk_of": p.id, "chunk": i, "n_chunks": len(chunks)}
            cid = p.id if len(chunks) == 1 else f"{p.id}#{i}"
            # model_copy skips re-validation; every field set here already satisfies Passage's rules
            out.append(p.model_copy(update={"id": cid, "text": chunk, "parent_id": parent, "metadata": meta}))
    return out

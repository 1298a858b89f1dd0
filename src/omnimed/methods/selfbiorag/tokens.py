"""The reflective-token contract of Self-BioRAG (after Self-RAG), in one versioned place.

Four token types judge a generation (self-biorag.txt, Table 3): RET (does answering need evidence?), REL (is a
passage relevant to the instruction?), SUP (does the passage support the output?) and USE (how useful is the
output, 1-5). Evidence is written inline as ``<paragraph>...</paragraph>``. Every one of these strings is added to
the tokenizer as a special token, so each is exactly one id, is never split by BPE, and survives decoding with
``skip_special_tokens=False``.

The generator's output layout (the format Self-RAG trains on, Appendix 8 / Table 15)::

    [No Retrieval]OUTPUT[Utility:u]
    [Retrieval]<paragraph>EVIDENCE</paragraph>[Relevant]OUTPUT[Fully supported][Utility:u]
    [Retrieval]<paragraph>EVIDENCE</paragraph>[Irrelevant]OUTPUT[Utility:u]

An output written sentence by sentence (the paper's generator data, Appendix 8) repeats the part before USE once per
sentence, and a sentence that the evidence quoted before it already covers opens with ``[Continue to Use Evidence]``::

    [Retrieval]<paragraph>E1</paragraph>[Relevant]S1[Fully supported][Continue to Use Evidence]S2[Retrieval]...[Utility:u]

Bump :data:`CONTRACT_VERSION` whenever a token or the layout changes: it is recorded in every build manifest, so a
generator trained on one layout is never silently fed data of another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from omnimed.data.records import RELEVANCE_LABELS, RETRIEVAL_LABELS, SUPPORT_LABELS, UTILITY_LABELS

CONTRACT_VERSION = "selfbiorag-tokens-v2"

RETRIEVE, NO_RETRIEVE, CONTINUE = RETRIEVAL_LABELS
RELEVANT, IRRELEVANT = RELEVANCE_LABELS
FULLY, PARTIALLY, NO_SUPPORT = SUPPORT_LABELS
PARAGRAPH_OPEN, PARAGRAPH_CLOSE = "<paragraph>", "</paragraph>"

#: token type -> its tokens, in the order the papers list them
TYPES: dict[str, tuple[str, ...]] = {
    "retrieval": RETRIEVAL_LABELS,
    "relevance": RELEVANCE_LABELS,
    "support": SUPPORT_LABELS,
    "utility": UTILITY_LABELS,
}
#: the tokens a critic chooses among for each judgement: RET on the instruction alone is two-way (nothing has been
#: quoted yet); RET on one output sentence with the evidence quoted so far (``retrieval_three_way``, Table 12) may
#: also say that evidence still covers it
CRITIC_CHOICES: dict[str, tuple[str, ...]] = {
    "retrieval": (RETRIEVE, NO_RETRIEVE),
    "retrieval_three_way": RETRIEVAL_LABELS,
    "relevance": RELEVANCE_LABELS,
    "support": SUPPORT_LABELS,
    "utility": UTILITY_LABELS,
}
REFLECTIVE_TOKENS: tuple[str, ...] = tuple(t for tokens in TYPES.values() for t in tokens)
#: everything added to the tokenizer, reflective tokens first
SPECIAL_TOKENS: tuple[str, ...] = (*REFLECTIVE_TOKENS, PARAGRAPH_OPEN, PARAGRAPH_CLOSE)

#: appendix 4: SUP credits "fully" 1 and "partially" 0.5; USE weighs utility 1..5 as -1, -0.5, 0, 0.5, 1
SUPPORT_CREDIT: dict[str, float] = {FULLY: 1.0, PARTIALLY: 0.5, NO_SUPPORT: 0.0}
UTILITY_CREDIT: dict[str, float] = {t: w for t, w in zip(UTILITY_LABELS, (-1.0, -0.5, 0.0, 0.5, 1.0))}

_ANY = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))


def token_type(token: str) -> str | None:
    """The type (retrieval | relevance | support | utility) of a reflective token, or None."""
    return next((kind for kind, tokens in TYPES.items() if token in tokens), None)


def read_choice(text: str, kind: str) -> str | None:
    """The token a critic wrote for judgement ``kind`` (a key of :data:`CRITIC_CHOICES`): the first special token
    of ``text`` if it is one of that judgement's choices, else None (a prediction outside the defined tokens, which
    the paper filters out). Whitespace before it is allowed; any other text before it is not."""
    stripped = text.lstrip()
    match = _ANY.match(stripped)
    if match is None:
        return None
    token = match.group(0)
    return token if token in CRITIC_CHOICES[kind] else None


def normalised(probs: Mapping[str, float], tokens: tuple[str, ...]) -> dict[str, float]:
    """``p(t) / sum p(tokens)`` for each of ``tokens`` (missing ones count 0); uniform when all are 0."""
    values = {t: max(0.0, float(probs.get(t, 0.0))) for t in tokens}
    total = sum(values.values())
    if total <= 0.0:
        return {t: 1.0 / len(tokens) for t in tokens}
    return {t: v / total for t, v in values.items()}


def retrieval_score(probs: Mapping[str, float]) -> float:
    """Eq. 1: p([Retrieval]) / (p([Retrieval]) + p([No Retrieval])), compared with delta."""
    return normalised(probs, (RETRIEVE, NO_RETRIEVE))[RETRIEVE]


def relevance_score(probs: Mapping[str, float]) -> float:
    """Eq. 2: p([Relevant]) / (p([Relevant]) + p([Irrelevant]))."""
    return normalised(probs, RELEVANCE_LABELS)[RELEVANT]


def support_score(probs: Mapping[str, float]) -> float:
    """Eq. 3: (p(fully) + 0.5 p(partially)) / (p(fully) + p(partially) + p(no support))."""
    return sum(SUPPORT_CREDIT[t] * p for t, p in normalised(probs, SUPPORT_LABELS).items())


def utility_score(probs: Mapping[str, float]) -> float:
    """Eq. 4: sum_i w_i p(utility=i) / sum_t p(utility=t), with w = -1, -0.5, 0, 0.5, 1."""
    return sum(UTILITY_CREDIT[t] * p for t, p in normalised(probs, UTILITY_LABELS).items())


@dataclass(frozen=True)
class Segment:
    """One parsed generator output: its retrieval decision, the evidence it quoted, the judgements it wrote and
    the answer text with every special token removed."""

    retrieval: str | None
    evidence: str | None
    relevance: str | None
    support: str | None
    utility: str | None
    answer: str


@dataclass(frozen=True)
class Sentence:
    """One sentence of a generator target with the reflective tokens before and after it: its RET decision, and
    after ``[Retrieval]`` the evidence quoted, its REL and (for relevant evidence) its SUP."""

    text: str
    retrieval: str
    evidence: str | None = None
    relevance: str | None = None
    support: str | None = None

    def render(self) -> str:
        if self.retrieval == RETRIEVE:
            if self.evidence is None or self.relevance is None:
                raise ValueError("a [Retrieval] sentence needs its evidence and a relevance token")
            judged = self.support if self.relevance == RELEVANT else None
            if self.relevance == RELEVANT and judged is None:
                raise ValueError("evidence judged [Relevant] needs a support token")
            return f"{RETRIEVE}{PARAGRAPH_OPEN}{self.evidence}{PARAGRAPH_CLOSE}{self.relevance}{self.text}{judged or ''}"
        if self.retrieval not in (NO_RETRIEVE, CONTINUE):
            raise ValueError(f"retrieval token must be one of {', '.join(RETRIEVAL_LABELS)}, got {self.retrieval!r}")
        return f"{self.retrieval}{self.text}"


def format_sentences(sentences: list[Sentence], utility: str) -> str:
    """A generator target written sentence by sentence, USE once at the end (the paper's Appendix 8 layout).
    ``[Continue to Use Evidence]`` is only valid after evidence was quoted."""
    quoted = False
    for s in sentences:
        if s.retrieval == CONTINUE and not quoted:
            raise ValueError(f"{CONTINUE} before any evidence was quoted")
        quoted = quoted or s.retrieval == RETRIEVE
    return "".join(s.render() for s in sentences) + utility


def format_output(output: str, *, retrieval: str, utility: str, evidence: str | None = None,
                  relevance: str | None = None, support: str | None = None) -> str:
    """The generator's training target as one segment (see the module docstring). SUP is written only after
    evidence judged relevant, as Self-RAG does."""
    if retrieval == CONTINUE:
        raise ValueError(f"a one-segment output cannot open with {CONTINUE}")
    return format_sentences([Sentence(output, retrieval, evidence, relevance, support)], utility)


def parse_output(text: str) -> Segment:
    """Split a generator's output into its reflective tokens, evidence and answer (the inverse of
    :func:`format_output`; tolerant of missing parts, which come back as None)."""
    evidence = None
    start = text.find(PARAGRAPH_OPEN)
    end = text.find(PARAGRAPH_CLOSE, start + 1) if start >= 0 else -1
    if start >= 0 and end > start:
        evidence = text[start + len(PARAGRAPH_OPEN):end]
        text = text[:start] + text[end + len(PARAGRAPH_CLOSE):]
    found: dict[str, str] = {}
    for match in _ANY.finditer(text):
        kind = token_type(match.group(0))
        if kind is not None:
            found.setdefault(kind, match.group(0))
    answer = " ".join(_ANY.sub(" ", text).split())
    return Segment(found.get("retrieval"), evidence, found.get("relevance"), found.get("support"),
                   found.get("utility"), answer)

"""PolyRAG's document views (section 3.2), each a score in [0, 1] per candidate passage of a query.

* **Relevance** R (Eq. 3): a judge LM's probability that the passage answers the query (Table 4's A-E scale,
  read as P(A) + P(B)), or, without a judge, the cosine of the knowledge base's encoder (Eq. 3's "otherwise").
* **Utility** U (Eq. 4): the cosine of the utility embedder (distilled from an LLM's answer likelihood,
  :mod:`omnimed.training.distill`).
* **Supplement** S (Eq. 5): a judge LM's probability of "Yes" (Table 5); without a judge the view is absent (0).
* **Authority** A: the paper approximates A(d) by A(d's source), annotated by people; here a config table maps
  the passage's issuer (``Passage.authority``) by case-insensitive substring to a score, then its source kind,
  then a default (:class:`AuthorityConfig`).
* **Timeliness** T: the passage's date (``Passage.date``, else the first date dateparser finds in its text),
  mapped to ``0.5 ** (age / half_life_years)`` against a reference date: the newest date among the query's
  candidates (so the newest is 1.0 and a document ``half_life_years`` older 0.5) or a fixed one. Undated: ``undated``.

Cosines and judge probabilities are on no common scale across queries or models, so :func:`minmax` can put
R, U and S on [0, 1] within each query's candidates (``pipeline.normalize``); A and T are absolute already.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from typing import Any, Optional

from omnimed.data.records import Passage

VIEWS: tuple[str, ...] = ("relevance", "utility", "supplement", "authority", "timeliness")


@dataclass
class AuthorityConfig:
    """``issuers``: [substring, score] pairs, the first whose substring occurs in the passage's issuer (case
    ignored) decides; ``sources``: a score per source kind for passages no issuer entry matches; ``default``: the
    rest. Scores are in [0, 1], 1 the most authoritative."""

    issuers: list[list[Any]] = field(default_factory=list)
    sources: dict[str, float] = field(default_factory=dict)
    default: float = 0.5


@dataclass
class TimelinessConfig:
    """``half_life_years``: the age at which T halves; ``reference_date``: ISO date the age is counted from
    (null: the newest date among the query's candidates); ``undated``: T of a passage with no date found;
    ``from_text``: search the text for a date (dateparser) when the passage has no ``date``."""

    half_life_years: float = 5.0
    reference_date: Optional[str] = None
    undated: float = 0.5
    from_text: bool = True


def check_views(authority: AuthorityConfig, timeliness: TimelinessConfig) -> None:
    """Refuse values outside their ranges, naming the key."""
    for i, entry in enumerate(authority.issuers):
        if len(entry) != 2 or not isinstance(entry[0], str) or not 0 <= float(entry[1]) <= 1:
            raise ValueError(f"pipeline.authority.issuers[{i}]={entry!r}: expected [substring, score in [0, 1]]")
    for key, value in {**authority.sources, "default": authority.default}.items():
        if not 0 <= value <= 1:
            where = "default" if key == "default" else f"sources.{key}"
            raise ValueError(f"pipeline.authority.{where}={value}: expected a score in [0, 1]")
    if not timeliness.half_life_years > 0:
        raise ValueError(f"pipeline.timeliness.half_life_years={timeliness.half_life_years}: expected > 0")
    if not 0 <= timeliness.undated <= 1:
        raise ValueError(f"pipeline.timeliness.undated={timeliness.undated}: expected a score in [0, 1]")
    if timeliness.reference_date is not None:
        parse_date(timeliness.reference_date, key="pipeline.timeliness.reference_date")


def authority(passage: Passage, cfg: AuthorityConfig) -> float:
    """A(d): the first issuer entry whose substring the passage's issuer holds, else its source's score, else
    the default."""
    issuer = (passage.authority or passage.metadata.get("issuer") or "").lower()
    if issuer:
        for needle, score in cfg.issuers:
            if needle.lower() in issuer:
                return float(score)
    return float(cfg.sources.get(passage.source, cfg.default))


def parse_date(text: str, *, key: str = "date") -> date:
    """An ISO-like or written date (dateparser: ``2019``, ``2019-03``, ``March 2019``); the first of the month /
    year where it is not given. Unreadable text fails naming ``key``."""
    import dateparser

    parsed = dateparser.parse(str(text), settings=_SETTINGS)
    if parsed is None:
        raise ValueError(f"{key}={text!r}: not a date dateparser can read")
    return parsed.date()


_SETTINGS = {"PREFER_DAY_OF_MONTH": "first", "PREFER_MONTH_OF_YEAR": "first", "RETURN_AS_TIMEZONE_AWARE": False}


@lru_cache(maxsize=65536)
def _date_in_text(text: str) -> date | None:
    from dateparser.search import search_dates

    found = search_dates(text, languages=["en"], settings=_SETTINGS) or []
    # a bare number is a year only when it looks like one: dateparser also reads "4 weeks" or "12" as dates
    years = [d for s, d in found if any(c.isalpha() for c in s) or len(s.strip()) == 4]
    return min(years).date() if years else None


def document_date(passage: Passage, cfg: TimelinessConfig) -> date | None:
    """The passage's ``date`` (or ``metadata['date']``), else the first date its text names (when
    ``cfg.from_text``), else None."""
    given = passage.date or passage.metadata.get("date")
    if given:
        try:
            return parse_date(given)
        except ValueError:
            pass
    return _date_in_text(passage.text) if cfg.from_text else None


def timeliness(passages: Sequence[Passage], cfg: TimelinessConfig) -> list[float]:
    """T(d) for one query's candidates (the reference date may be their newest)."""
    dates = [document_date(p, cfg) for p in passages]
    known = [d for d in dates if d is not None]
    if cfg.reference_date is not None:
        ref = parse_date(cfg.reference_date)
    elif known:
        ref = max(known)
    else:
        return [cfg.undated] * len(passages)
    out = []
    for d in dates:
        if d is None:
            out.append(cfg.undated)
            continue
        age = max((ref - d).days / 365.25, 0.0)
        out.append(math.pow(0.5, age / cfg.half_life_years))
    return out


def minmax(values: Sequence[float]) -> list[float]:
    """``values`` rescaled to [0, 1] within the list (all equal: all 0.5)."""
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        return [0.5] * len(values)
    return [(v - lo) / (hi - lo) for v in values]

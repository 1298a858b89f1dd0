"""How hard the synthetic world is: the knobs that decide whether retrieval, source choice and reading matter.

An easy world names every question's subject by the invented word its gold passage uses, so the rarest token finds
the passage and no planner, reranker or view can show a gain. Each knob below removes one such shortcut; the
defaults are those of the ``small``, ``table`` and ``large`` presets (measured by ``omnimed-evaluate
task=world_calibration``); ``tiny`` keeps the easy world for unit tests (:data:`EASY`).

Every knob is a config value (``knowledge.world_difficulty.<knob>``, ``data.world_difficulty.<knob>``); unset
(``null``) means the size preset's default. A bad value fails when the config is turned into an object, naming the
key and what was expected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Difficulty:
    """The world's difficulty knobs, all shares in [0, 1].

    - ``aliases``: share of questions naming their subject (disease or drug) by an alias (an abbreviation, a
      synonym or a systematic name) that no gold passage uses; the graph source holds the synonym links.
    - ``twins``: diseases with a near-namesake twin, per disease: the twin shares a name word, the organ system and
      two of three symptoms, and its passages share most words with the original's while stating other facts.
    - ``restate``: share of concepts whose graph entry restates the facts other sources state (findings, genes,
      symptoms, mechanisms) in triples; the rest of the graph holds definitions, relations and names only.
    - ``superseded``: share of diseases whose current recommendation replaced an older one (from an issuer of
      equal or higher authority); the outdated drug is then a wrong option of the treatment question.
    - ``multihop``: share of the multiple-choice questions that need two facts from two sources.
    - ``self_contained``: share of the multiple-choice questions answerable from their own text (a stated
      reference range, a half-life and an elapsed time, doses to add up): retrieval only adds noise.
    - ``no_knowledge``: share of instruction examples that need no knowledge (define, compute, extract, rewrite,
      summarise).
    """

    aliases: float = 0.7
    twins: float = 0.3
    restate: float = 0.3
    superseded: float = 0.7
    multihop: float = 0.15
    self_contained: float = 0.1
    no_knowledge: float = 0.3

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"world_difficulty.{f.name}={value!r}: expected a share between 0 and 1")
        if self.multihop + self.self_contained > 0.9:
            raise ValueError(
                f"world_difficulty.multihop + world_difficulty.self_contained = "
                f"{self.multihop + self.self_contained:g}: expected at most 0.9 (the rest are single-fact questions)"
            )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


#: the world before the knobs: names as in the passages, no twins, every concept restated in the graph
EASY = Difficulty(aliases=0.0, twins=0.0, restate=1.0, superseded=0.7, multihop=0.0, self_contained=0.0,
                  no_knowledge=0.3)
DEFAULT = Difficulty()


@dataclass
class DifficultyConfig:
    """The config node of the knobs: ``null`` keeps the size preset's value (see :class:`Difficulty`)."""

    aliases: float | None = None
    twins: float | None = None
    restate: float | None = None
    superseded: float | None = None
    multihop: float | None = None
    self_contained: float | None = None
    no_knowledge: float | None = None

    def __post_init__(self) -> None:
        resolve(self, DEFAULT)  # a bad value fails where the config becomes an object


def resolve(config: DifficultyConfig | dict[str, Any] | Difficulty | None, base: Difficulty) -> Difficulty:
    """The knobs of a world: ``base`` (a size preset's) with the set values of ``config``."""
    if isinstance(config, Difficulty):
        return config
    values = world_knobs(config)
    unknown = sorted(set(values) - {f.name for f in fields(Difficulty)})
    if unknown:
        raise ValueError(f"world_difficulty: unknown knob(s) {unknown}; known: "
                         f"{', '.join(f.name for f in fields(Difficulty))}")
    return replace(base, **values)


def world_knobs(node: Any) -> dict[str, float]:
    """The set difficulty knobs of a config node (a DifficultyConfig, a DictConfig or a dict; unset ones left out)."""
    from omegaconf import DictConfig, OmegaConf

    if node is None:
        return {}
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node)
    items = node.items() if isinstance(node, dict) else vars(node).items()
    return {k: v for k, v in items if v is not None}

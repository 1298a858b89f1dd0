"""Assemble a world: ground truth -> passages -> questions -> instructions -> splits, and the oracle over them.

Deterministic by construction: every random choice comes from ``random.Random`` generators seeded from ``seed``,
collections are lists and insertion-ordered dicts (sets are only used for membership tests), and nothing reads the
clock, uuids or hash order. Two builds with the same seed and size give byte-identical records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnimed.data.records import InstructionExample, MultipleChoiceQuestion, OpenQuestion, Passage, Record
from omnimed.data.world.difficulty import DEFAULT, EASY, Difficulty, DifficultyConfig, resolve
from omnimed.data.world.instructions import GENERAL_KINDS, GENERAL_KINDS_HARD, make_instructions
from omnimed.data.world.model import Fact, WorldModel, build_model
from omnimed.data.world.oracle import Oracle
from omnimed.data.world.questions import (
    FactIndex,
    build_items,
    build_multihop_items,
    make_mcqs,
    make_open_questions,
    make_self_contained,
    pick_mixed,
)
from omnimed.data.world.render import FICTIONAL_NOTE, render_all

SPLITS: tuple[str, ...] = ("train", "dev", "test")
SPLIT_FRACTIONS: tuple[float, float] = (0.8, 0.9)  # cumulative: 80% train, 10% dev, 10% test


@dataclass(frozen=True)
class WorldSize:
    """How big a world is: diseases drive the passage count (about 16 passages per disease, more with twins);
    ``splits`` the cumulative train and dev fractions of subjects (the rest is test); ``difficulty`` its knobs."""

    diseases: int
    mcq: int
    open: int
    instructions: int
    splits: tuple[float, float] = SPLIT_FRACTIONS
    difficulty: Difficulty = DEFAULT


SIZES: dict[str, WorldSize] = {
    "tiny": WorldSize(diseases=10, mcq=25, open=6, instructions=40, difficulty=EASY),  # unit tests
    "small": WorldSize(diseases=240, mcq=2000, open=80, instructions=1500),  # default training job
    # the miniature tables: every question of 1000 diseases (+ twins), 40% of subjects held out for test, so
    # each question kind has >= 400 test questions
    "table": WorldSize(diseases=1000, mcq=14000, open=400, instructions=3000, splits=(0.5, 0.6)),
    "large": WorldSize(
        diseases=6600, mcq=5000, open=1000, instructions=20000
    ),  # benchmarks, >= 100k passages
}


@dataclass
class World:
    """A synthetic, entirely FICTIONAL medical world: invented diseases, drugs, genes, pathways and issuing bodies.

    Nothing in it is medical knowledge or advice; every record carries ``metadata["fictional"] = True``. It exists
    so that no pretrained model knows the answers and every label can be computed exactly by :attr:`oracle`.

    ``splits`` maps ``train``/``dev``/``test`` to ``{"mcq": ids, "open": ids, "instruction": ids}``; questions carry
    their split in the ``split`` field, instructions in ``metadata["split"]``. Splits are by subject (a disease or
    a drug), so no test question shares its subject with a training instruction.
    """

    seed: int
    size: str
    difficulty: Difficulty
    model: WorldModel
    passages: list[Passage]
    questions: list[MultipleChoiceQuestion]
    open_questions: list[OpenQuestion]
    instructions: list[InstructionExample]
    splits: dict[str, dict[str, list[str]]]
    oracle: Oracle
    note: str = field(default=FICTIONAL_NOTE)

    def __repr__(self) -> str:
        return f"World(seed={self.seed}, size={self.size!r}, {self.difficulty}, {self.counts()})"

    @property
    def facts(self) -> list[Fact]:
        return self.model.facts

    def records(self) -> list[Record]:
        """All records in a fixed order: passages, multiple-choice questions, open questions, instructions."""
        return [*self.passages, *self.questions, *self.open_questions, *self.instructions]

    def counts(self) -> dict[str, int]:
        by_source: dict[str, int] = {}
        for p in self.passages:
            by_source[p.source] = by_source.get(p.source, 0) + 1
        return {
            "passages": len(self.passages),
            **{f"passages_{k}": v for k, v in by_source.items()},
            "mcq": len(self.questions),
            "open": len(self.open_questions),
            "instructions": len(self.instructions),
            "facts": len(self.model.facts),
            "diseases": len(self.model.diseases),
            "drugs": len(self.model.drugs),
        }

    def save(self, out_dir: str | Path) -> dict[str, Any]:
        """Write the records as an omnimed record set (JSONL + HF dataset + manifest naming seed and size)."""
        from omnimed.data.io import save_record_set

        return save_record_set(
            out_dir,
            self.records(),
            extra={"world": {"seed": self.seed, "size": self.size, "difficulty": self.difficulty.as_dict(),
                             "fictional": True}},
        )


def build_world(seed: int = 0, size: str = "small",
                difficulty: Difficulty | DifficultyConfig | dict | None = None) -> World:
    """Build the synthetic world for ``seed`` at preset ``size`` (one of :data:`SIZES`); ``difficulty`` overrides
    knobs of the preset's :class:`~omnimed.data.world.difficulty.Difficulty`."""
    if size not in SIZES:
        raise ValueError(f"unknown world size {size!r}; expected one of {sorted(SIZES)}")
    preset = SIZES[size]
    knobs = resolve(difficulty, preset.difficulty)
    model = build_model(seed, preset.diseases, knobs)
    passages = render_all(model, seed, knobs.restate)
    index = FactIndex(passages)

    split_rng = random.Random(f"splits-{seed}")
    groups = [d.entity.id for d in model.diseases] + [d.entity.id for d in model.drugs]
    split_rng.shuffle(groups)
    cut_dev, cut_test = (int(len(groups) * f) for f in preset.splits)
    split_of_group = {
        g: ("train" if i < cut_dev else "dev" if i < cut_test else "test") for i, g in enumerate(groups)
    }

    def split_of(group: str) -> str:
        return split_of_group[group]

    def general_split(rng: random.Random) -> str:
        x = rng.random()
        return "train" if x < preset.splits[0] else "dev" if x < preset.splits[1] else "test"

    q_rng = random.Random(f"questions-{seed}")
    items = build_items(model, q_rng)
    hop_items = build_multihop_items(model, random.Random(f"multihop-{seed}")) if knobs.multihop else []
    picked, n_self = pick_mixed(items, hop_items, preset.mcq, knobs, q_rng)
    mcqs = make_mcqs(picked, model, index, q_rng, split_of, aliases=knobs.aliases,
                     alias_rng=random.Random(f"aliases-{seed}"))
    mcqs += make_self_contained(model, n_self, random.Random(f"self-contained-{seed}"), split_of, len(mcqs) + 1)
    opens = make_open_questions(model, index, q_rng, preset.open, split_of)
    oracle = Oracle(passages, [*mcqs, *opens])
    inst_rng = random.Random(f"instructions-{seed}")
    instructions = make_instructions(
        model, items, index, passages, oracle, inst_rng, preset.instructions, split_of, general_split,
        no_knowledge=knobs.no_knowledge, general_kinds=GENERAL_KINDS if knobs == EASY else GENERAL_KINDS_HARD,
    )
    for ex in instructions:
        oracle.register(ex)

    splits: dict[str, dict[str, list[str]]] = {s: {"mcq": [], "open": [], "instruction": []} for s in SPLITS}
    for q in mcqs:
        splits[q.split]["mcq"].append(q.id)
    for o in opens:
        splits[o.split]["open"].append(o.id)
    for ex in instructions:
        splits[ex.metadata["split"]]["instruction"].append(ex.id)
    return World(seed, size, knobs, model, passages, mcqs, opens, instructions, splits, oracle)

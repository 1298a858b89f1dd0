"""A toy method registered from outside ``src/`` (the walk-through of docs/adding-a-method.md, run by
tests/test_adding_a_method.py): it always answers the option letter its config names, has one data stage that keeps
the world's questions whose gold answer is that letter, and one metric of its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from omnimed.data.artifacts import StageResult, open_stage
from omnimed.methods import Answer, Method, Stage, register_method


@dataclass
class ToyConfig:
    """``pipeline=toy``: ``letter`` is the option the toy always answers."""

    name: str = "toy"
    letter: str = "A"


@dataclass
class ToyLettersConfig:
    """``omnimed-build stage=toy_letters``: keep the world's test questions whose gold answer is ``letter``."""

    name: str = "toy_letters"
    letter: str = "A"
    out: Optional[str] = None


def build_toy_letters(cfg: ToyLettersConfig, ctx: Any) -> StageResult:
    from omnimed.knowledge.corpus import world_of

    stage = open_stage(cfg.name, cfg, root=ctx.root, world=[ctx.knowledge.world_seed, ctx.knowledge.world_size])
    if stage.finished():
        return StageResult(stage.path, stage.manifest()["counts"], reused=True)
    stage.start()
    kept = [q for q in world_of(ctx.knowledge).questions if q.answer == [cfg.letter]]
    manifest = stage.finish(kept)
    return StageResult(stage.path, manifest["counts"], reused=False)


@register_method
class Toy(Method):
    name = "toy"
    config = ToyConfig
    question_kinds = ("mcq",)
    stages = (Stage("toy_letters", ToyLettersConfig, build_toy_letters),)

    def answer(self, questions: Sequence[Any], backend: Any, kb: Any, *, seed: int) -> list[Answer]:
        out = []
        for q in questions:
            letter = self.cfg.letter if self.cfg.letter in q.options else None
            problem = None if letter else f"option {self.cfg.letter} not among {', '.join(q.options)}"
            out.append(Answer(q.id, letter, letter in q.answer, problem, extras={"letter": self.cfg.letter}))
        return out

    def metrics(self, answers: Sequence[Answer]) -> dict[str, float]:
        return {"toy_answered": sum(a.prediction is not None for a in answers) / max(1, len(answers))}

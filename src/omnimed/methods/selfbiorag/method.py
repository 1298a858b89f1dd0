"""Self-BioRAG as a registered method (``pipeline=selfbiorag``): adaptive retrieval with critique-weighted evidence
(:mod:`.inference`), its two data stages (critic data by a teacher, generator data by the critic), the reflective
token types its critic predicts (Table 9), and its own metrics (retrieval rate, mean p([Retrieval]))."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from omnimed.methods.answer import Answer
from omnimed.methods.registry import Method, Stage, register_method
from omnimed.methods.selfbiorag.critic_data import CriticDataConfig, build_critic_data
from omnimed.methods.selfbiorag.generator_data import GeneratorDataConfig, build_generator_data
from omnimed.methods.selfbiorag.inference import SelfBioRAG, SelfBioRAGConfig
from omnimed.methods.selfbiorag.tokens import CRITIC_CHOICES, SPECIAL_TOKENS, read_choice

#: Table 9's columns, in its order: the critic's token types
LABEL_ORDER = ("utility", "retrieval", "relevance", "support")


def serving(path: str | None, backend_cfg: Any, model: Any) -> tuple[Any, Any]:
    """The backend config and model that serve a Self-BioRAG generator or critic: a trained checkpoint (``path``)
    as the backend's model, or else the run's model with the reflective tokens added (untrained rows, so its token
    probabilities can still be read)."""
    if path:
        return dataclasses.replace(backend_cfg, model=str(path)), model
    tokens = list(dict.fromkeys([*model.special_tokens, *SPECIAL_TOKENS]))
    return backend_cfg, dataclasses.replace(model, special_tokens=tokens)


def _critic_data(cfg: CriticDataConfig, ctx: Any) -> Any:
    kb = ctx.knowledge_base if cfg.evidence_k else None
    return build_critic_data(cfg, teacher=ctx.backend, kb=kb, knowledge=ctx.knowledge, root=str(ctx.root),
                             progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed)


def _generator_data(cfg: GeneratorDataConfig, ctx: Any) -> Any:
    kb = ctx.knowledge_base
    return build_generator_data(cfg, critic=ctx.backend, kb=kb, knowledge=ctx.knowledge, root=str(ctx.root),
                                progress=ctx.progress, log=ctx.log, max_failed=ctx.max_failed,
                                prompt_layout=ctx.cfg.model.prompt_layout)


@register_method
class SelfBioRAGMethod(Method):
    """Self-BioRAG (Jeong et al.): answers multiple-choice questions."""

    name = "selfbiorag"
    config = SelfBioRAGConfig
    question_kinds = ("mcq",)
    stages = (
        Stage("selfbiorag_critic_data", CriticDataConfig, _critic_data),
        Stage("selfbiorag_generator_data", GeneratorDataConfig, _generator_data),
    )
    labels: ClassVar[Mapping[str, tuple[str, ...]]] = {kind: CRITIC_CHOICES[kind] for kind in LABEL_ORDER}
    #: the generator's prompt layout, the served model's (:meth:`serve` reads it from the model config)
    prompt_layout = "chat"

    def needs_knowledge(self) -> bool:
        return self.cfg.retrieval != "never"

    def shots(self) -> int:
        return self.cfg.shots

    def serve(self, backend_cfg: Any, model: Any, role: str = "generator") -> tuple[Any, Any]:
        path = self.cfg.critic_model if role == "critic" else self.cfg.generator_model
        self.prompt_layout = model.prompt_layout  # the served family's layout: hub weights get the one they know
        return serving(path, backend_cfg, model)

    def answer(self, questions: Sequence[Any], backend: Any, kb: Any, *, seed: int) -> list[Answer]:
        return [Answer(o.question_id, o.prediction, o.correct, o.problem, o.passage_ids, o.raw,
                       {"retrieved": o.retrieved, "p_retrieve": o.p_retrieve,
                        "candidates": [vars(c) for c in o.candidates]}, o.error)
                for o in SelfBioRAG(self.cfg, backend, kb, self.prompt_layout, self.demonstrations).answer(questions)]

    def metrics(self, answers: Sequence[Answer]) -> dict[str, float]:
        out = {"retrieval_rate": sum(bool(a.extras["retrieved"]) for a in answers) / max(1, len(answers))}
        p = [a.extras["p_retrieve"] for a in answers if a.extras["p_retrieve"] is not None]
        if p:
            out["p_retrieve_mean"] = sum(p) / len(p)
        return out

    def read_label(self, text: str, kind: str) -> str | None:
        return read_choice(text, kind)

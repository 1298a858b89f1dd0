"""``pipeline=closed_book``: the shared reader answers from the question alone. Its config is also ``rag``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.methods.answer import Answer
from omnimed.methods.registry import Method, register_method

Question = MultipleChoiceQuestion | OpenQuestion


@dataclass
class PipelineConfig:
    """``name``: closed_book | rag. For ``rag``: each source in ``sources`` (None: every text source of the
    knowledge base) is searched with the question for ``per_source_k`` passages, the per-source lists are fused by
    reciprocal rank and the best ``top_k`` go to the reader."""

    name: str = "closed_book"
    top_k: int = 5
    per_source_k: int = 10
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    max_new_tokens: int = 512
    temperature: float = 0.0
    answer_mode: str = "generate"  # generate | logprob (see omnimed.methods.reader.Reader)


@register_method
class ClosedBook(Method):
    """The reader without evidence; multiple-choice and open questions may be mixed."""

    name = "closed_book"
    config = PipelineConfig

    def evidence(self, questions: Sequence[Question], kb: Any) -> list[list[Passage]] | None:
        """The passages each question is answered with (None: none at all)."""
        return None

    def answer(self, questions: Sequence[Question], backend: Any, kb: Any, *, seed: int,
               evidence: Sequence[Sequence[Passage]] | None = None) -> list[Answer]:
        """``evidence``: passages per question to read instead of :meth:`evidence`'s (an evaluation handing the
        reader chosen passages, e.g. the world's gold ones); None: the method's own (none, or retrieved)."""
        from omnimed.generation.types import SamplingParams
        from omnimed.methods.reader import Reader

        cfg = self.cfg
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed)
        reader = Reader(backend, params=params, answer_mode=cfg.answer_mode)
        evidence = self.evidence(questions, kb) if evidence is None else [list(ev) for ev in evidence]
        outputs: list = [None] * len(questions)
        for kind, read in (("mcq", reader.answer_mcq), ("open", reader.answer_open)):
            idx = [i for i, q in enumerate(questions) if isinstance(q, MultipleChoiceQuestion) == (kind == "mcq")]
            if idx:
                got = read([questions[i] for i in idx], [evidence[i] for i in idx] if evidence is not None else None)
                for i, out in zip(idx, got):
                    outputs[i] = out
        shown = evidence if evidence is not None else [[] for _ in questions]
        return [Answer(o.question_id, o.prediction, o.correct, o.problem, [p.id for p in ev], o.raw, error=o.error)
                for o, ev in zip(outputs, shown)]

"""The ``oracle`` backend: the synthetic world's exact teacher behind the generation interface.

It answers from ``Request.meta`` (never from the prompt text), so every pipeline and labelling stage runs
unchanged against it in the miniature setting. Each task names the ids it needs::

    answer_mcq   {question_id}                        -> "<answer>B</answer>"
    answer_open  {question_id}                        -> "<answer>reference answer</answer>"
    retrieval    {question_id}                        -> "[Retrieval]" | "[No Retrieval]"
    relevance    {question_id, passage_id}            -> "[Relevant]" | "[Irrelevant]"
    support      {question_id, passage_id, answer?}   -> "[Fully supported]" | ...
    utility      {question_id, answer}                -> "[Utility:1]" ... "[Utility:5]"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams

#: the log-probability the oracle gives to every token it would not emit
UNLIKELY = -30.0


class OracleBackend:
    name = "oracle"

    def __init__(self, world) -> None:
        """``world``: an ``omnimed.data.world.World`` (its oracle and its questions by id)."""
        self.oracle = world.oracle
        self.model_id = f"world-{world.seed}-{world.size}"
        self.questions = {q.id: q for q in [*world.questions, *world.open_questions, *world.instructions]}
        self.tasks: dict[str, Callable[[dict[str, Any]], str]] = {
            "answer_mcq": self._answer_mcq,
            "answer_open": lambda m: f"<answer>{self.oracle.answer(self._question(m))}</answer>",
            "retrieval": lambda m: self.oracle.retrieval_token(self._question(m)),
            "relevance": lambda m: self.oracle.relevance_token(self._question(m), m["passage_id"]),
            "support": lambda m: self.oracle.support_token(self._question(m), m.get("answer"), m["passage_id"]),
            "utility": lambda m: self.oracle.utility_token(self._question(m), m["answer"]),
        }

    def __repr__(self) -> str:
        return f"OracleBackend({self.model_id})"

    def _question(self, meta: dict[str, Any]):
        qid = meta.get("question_id")
        if qid not in self.questions:
            raise GenerationError(f"oracle: question_id {qid!r} is not a question of {self.model_id}")
        return self.questions[qid]

    def _answer_mcq(self, meta: dict[str, Any]) -> str:
        q = self._question(meta)
        return f"The evidence points to option {q.answer[0]}.\n<answer>{q.answer[0]}</answer>"

    def reply(self, request: Request) -> str:
        task = request.meta.get("task")
        if task not in self.tasks:
            raise GenerationError(f"oracle: cannot answer task {task!r} (meta={request.meta}); it answers "
                                  f"{', '.join(sorted(self.tasks))}")
        return self.tasks[task](request.meta)

    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        return [[Generation(text=self.reply(r), tokens=1)] * params.n for r in requests]

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        return [0.0 if self.reply(r).strip() == c.strip() else UNLIKELY for r, c in zip(requests, continuations)]

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        out = []
        for r in requests:
            # for a multiple-choice question the token that matters is the answer letter
            target = self._question(r.meta).answer[0] if r.meta.get("task") == "answer_mcq" else self.reply(r)
            out.append({t: 0.0 if t.strip() == target else UNLIKELY for t in tokens})
        return out

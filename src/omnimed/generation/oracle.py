"""The ``oracle`` backend: the synthetic world's exact teacher behind the generation interface.

It answers from ``Request.meta`` (never from the prompt text), so every labelling stage and pipeline runs unchanged
against it in the miniature setting. A task names the ids it needs::

    answer_mcq        {question_id}                       -> "<answer>B</answer>"
    answer_open       {question_id}                       -> "<answer>reference answer</answer>"
    retrieval         {question_id} or {text}             -> "[Retrieval]" | "[No Retrieval]"
    retrieval_three_way {question_id, passage_id, answer} -> that, or "[Continue to Use Evidence]" (of one sentence)
    relevance         {question_id, passage_id}           -> "[Relevant]" | "[Irrelevant]"
    support           {question_id, passage_id, answer?}  -> "[Fully supported]" | "[Partially supported]" | ...
    utility           {question_id, answer}               -> "[Utility:1]" ... "[Utility:5]" (of the answer)
    passage_utility   {question_id, passage_id}           -> "[Utility:1]" ... "[Utility:5]" (of the passage)
    judge_statement   {question_id, statement}            -> "<label>correct|incorrect|not_mentioned</label>"

(``question_id`` may name an instruction too.) More tasks plug in with :func:`register_task`.

It behaves as a deterministic model that always writes its reply: ``score`` is 0 for a continuation the reply
starts with and :data:`UNLIKELY` otherwise; ``next_token_logprobs`` is 0 for the candidate the reply continues
with (after ``meta["assistant_prefix"]``) and :data:`UNLIKELY` for every other one.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnimed.generation.render import assistant_prefix
from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams

#: the log-probability the oracle gives to anything it would not write (finite, so sums and JSON stay sane)
UNLIKELY = -1.0e4


@dataclass(frozen=True)
class Reply:
    """What the oracle writes, and ``key``: the deciding token (the option letter, the reflective token), which
    ``next_token_logprobs`` also accepts when a pipeline asks for it without the reply's opening."""

    text: str
    key: str


Handler = Callable[["OracleBackend", dict[str, Any]], Reply]
TASKS: dict[str, tuple[tuple[str, ...], Handler]] = {}


def register_task(name: str, needs: tuple[str, ...] = ()) -> Callable[[Handler], Handler]:
    """Register ``handler(backend, meta) -> Reply`` for ``meta["task"] == name``; ``needs``: required meta keys."""

    def deco(handler: Handler) -> Handler:
        TASKS[name] = (needs, handler)
        return handler

    return deco


def _token(text: str) -> Reply:
    return Reply(text, text)


@register_task("answer_mcq", ("question_id",))
def _answer_mcq(b: OracleBackend, m: dict[str, Any]) -> Reply:
    letter = b.mcq_letter(m["question_id"])
    return Reply(f"<answer>{letter}</answer>", letter)


@register_task("answer_open", ("question_id",))
def _answer_open(b: OracleBackend, m: dict[str, Any]) -> Reply:
    answer = b.oracle.answer(b.question(m["question_id"]))
    return Reply(f"<answer>{answer}</answer>", answer)


@register_task("retrieval")
def _retrieval(b: OracleBackend, m: dict[str, Any]) -> Reply:
    if "text" in m:  # any text: needs retrieval iff it names a concept of the world
        return _token(b.oracle.retrieval_token(str(m["text"])))
    if "question_id" not in m:
        raise GenerationError(f"oracle ({b.model_id}): task 'retrieval' needs meta question_id (or text)")
    return _token(b.oracle.retrieval_token(b.question(m["question_id"])))


@register_task("retrieval_three_way", ("question_id", "passage_id", "answer"))
def _retrieval_three_way(b: OracleBackend, m: dict[str, Any]) -> Reply:
    return _token(b.oracle.retrieval_three_way_token(b.question(m["question_id"]), m["answer"], m["passage_id"]))


@register_task("relevance", ("question_id", "passage_id"))
def _relevance(b: OracleBackend, m: dict[str, Any]) -> Reply:
    return _token(b.oracle.relevance_token(b.question(m["question_id"]), m["passage_id"]))


@register_task("support", ("question_id", "passage_id"))
def _support(b: OracleBackend, m: dict[str, Any]) -> Reply:
    return _token(b.oracle.support_token(b.question(m["question_id"]), m.get("answer"), m["passage_id"]))


@register_task("utility", ("question_id", "answer"))
def _utility(b: OracleBackend, m: dict[str, Any]) -> Reply:
    return _token(b.oracle.utility_token(b.question(m["question_id"]), m["answer"]))


@register_task("judge_statement", ("question_id", "statement"))
def _judge_statement(b: OracleBackend, m: dict[str, Any]) -> Reply:
    verdict = b.oracle.statement_verdict(b.question(m["question_id"]), str(m["statement"]))
    return Reply(f"<label>{verdict}</label>", verdict)


@register_task("passage_utility", ("question_id", "passage_id"))
def _passage_utility(b: OracleBackend, m: dict[str, Any]) -> Reply:
    return _token(b.oracle.passage_utility_token(b.question(m["question_id"]), m["passage_id"]))


@functools.cache
def rules_digest() -> str:
    """A digest of the oracle's rules: this module's and the world oracle's source."""
    from omnimed.data.world import oracle as world_oracle

    sources = (Path(__file__), Path(world_oracle.__file__))
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]


class OracleBackend:
    """``world_or_oracle``: a ``World`` (its oracle and its records), or a bare ``Oracle`` plus the ``questions``
    records (needed by ``answer_mcq`` to know option letters; other tasks work with ids alone)."""

    name = "oracle"

    def __init__(self, world_or_oracle: Any, *, questions: Iterable[Any] = (), model_id: str | None = None) -> None:
        records = list(questions)
        if hasattr(world_or_oracle, "oracle"):  # a World
            world = world_or_oracle
            self.oracle = world.oracle
            records = [*world.questions, *world.open_questions, *world.instructions, *records]
            self.model_id = model_id or f"world-{world.seed}-{world.size}"
            knobs = f" {world.difficulty}"
        else:
            self.oracle = world_or_oracle
            self.model_id = model_id or "oracle"
            knobs = ""
        self.records = {r.id: r for r in records}
        # what keys its replies in the call cache: the world's difficulty and the rules' code too, so that a reply
        # cached before a rule changed (or from a world built with other knobs) is never served as this one's
        self.cache_identity = f"{self.model_id}{knobs} rules {rules_digest()}"

    def __repr__(self) -> str:
        return f"OracleBackend({self.model_id})"

    # ------------------------------------------------------------------------------------------- lookups
    def question(self, qid: str) -> Any:
        """The record of ``qid``; without records (a bare ``Oracle``) the id itself, which the oracle resolves."""
        if qid in self.records:
            return self.records[qid]
        if self.records:
            raise GenerationError(f"oracle ({self.model_id}): {qid!r} is not a question of this world")
        return qid

    def mcq_letter(self, qid: str) -> str:
        record = self.records.get(qid)
        if record is None or not getattr(record, "options", None):
            raise GenerationError(f"oracle ({self.model_id}): {qid!r} is not a known multiple-choice question")
        return record.answer[0]

    def reply(self, request: Request) -> Reply:
        """The oracle's full reply to ``request`` (before any assistant prefix is taken off)."""
        meta = request.meta
        task = meta.get("task")
        if task not in TASKS:
            raise GenerationError(f"oracle ({self.model_id}): cannot answer task {task!r}; known tasks: "
                                  f"{', '.join(sorted(TASKS))} (set Request.meta['task'])")
        needs, handler = TASKS[task]
        missing = [k for k in needs if k not in meta]
        if missing:
            raise GenerationError(f"oracle ({self.model_id}): task {task!r} needs meta {', '.join(missing)}")
        try:
            return handler(self, meta)
        except KeyError as exc:  # the oracle's own lookups: an id that is not of this world
            raise GenerationError(f"oracle ({self.model_id}): task {task!r}: {exc.args[0]}") from None

    def _rest(self, request: Request) -> tuple[str, Reply]:
        """(what the oracle writes after the request's assistant prefix, its reply)."""
        reply = self.reply(request)
        prefix = assistant_prefix(request)
        text = reply.text[len(prefix):] if prefix and reply.text.startswith(prefix) else reply.text
        return text, reply

    # ------------------------------------------------------------------------------------------- contract
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        out = []
        for r in requests:
            text, _ = self._rest(r)
            cuts = [text.index(s) for s in params.stop if s and s in text]
            if cuts:
                text = text[: min(cuts)]
            out.append([Generation(text=text, tokens=len(text.split()) or 1) for _ in range(params.n)])
        return out

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        out = []
        for r, c in zip(requests, continuations):
            text, _ = self._rest(r)
            cont = c.lstrip()
            out.append(0.0 if cont and text.lstrip().startswith(cont) else UNLIKELY)
        return out

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        out = []
        for r in requests:
            text, reply = self._rest(r)
            text = text.lstrip()
            matches = [t for t in tokens if t.strip() and text.startswith(t.strip())]
            target = max(matches, key=lambda t: len(t.strip())) if matches else None
            if target is None:
                target = next((t for t in tokens if t.strip() == reply.key), None)
            out.append({t: 0.0 if t == target else UNLIKELY for t in tokens})
        return out

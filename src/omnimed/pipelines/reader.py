"""The reader: answers multiple-choice and open questions from the question and optional evidence.

Parsing is strict about what counts as an answer and loud about what does not: a missing or malformed answer is
a wrong answer with a ``problem`` saying why, never a dropped example.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.generation.types import Request, SamplingParams
from omnimed.pipelines import prompts

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?(?:[.:)\]]|\s|$)")


@dataclass
class ReaderOutput:
    question_id: str
    prediction: str | None
    correct: bool
    raw: str
    problem: str | None = None
    prompt_hash: str = ""


def parse_mcq_answer(text: str, options: dict[str, str]) -> tuple[str | None, str | None]:
    """(letter, None) or (None, problem). The last ``<answer>`` wins; the tag may hold a letter, ``(B)``,
    ``B. option text`` or the option's text itself."""
    found = _ANSWER.findall(text)
    if not found:
        return None, "no <answer> tag"
    inner = found[-1].strip()
    if not inner:
        return None, "empty <answer> tag"
    m = _LETTER.match(inner)
    if m:
        letter = m.group(1).upper()
        if letter in options:
            return letter, None
        if len(inner) <= 3:
            return None, f"answer {inner!r} is not an option ({', '.join(options)})"
    by_text = [k for k, v in options.items() if v.strip().lower() == inner.lower().rstrip(".")]
    if len(by_text) == 1:
        return by_text[0], None
    return None, f"answer {inner[:40]!r} names no option"


def parse_open_answer(text: str) -> tuple[str | None, str | None]:
    found = _ANSWER.findall(text)
    if not found:
        return None, "no <answer> tag"
    inner = found[-1].strip()
    return (inner, None) if inner else (None, "empty <answer> tag")


def _hash(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:12]


class Reader:
    """``backend`` answers; ``max_passages`` / ``max_passage_chars`` bound the evidence put in the prompt.

    ``answer_mode``: ``generate`` (reason, then ``<answer>X</answer>``, parsed) or ``logprob`` (the reply is
    started with ``<answer>`` and the option letter with the highest next-token log-probability is the answer:
    how small models such as SmolLM2-135M are scored, since they rarely finish the answer format on their own).
    """

    def __init__(self, backend, *, params: SamplingParams | None = None, max_passages: int = 10,
                 max_passage_chars: int = 1200, answer_mode: str = "generate") -> None:
        if answer_mode not in ("generate", "logprob"):
            raise ValueError(f"answer_mode={answer_mode!r}; expected generate or logprob")
        self.answer_mode = answer_mode
        self.backend = backend
        self.params = params or SamplingParams(max_new_tokens=512)
        self.max_passages = max_passages
        self.max_passage_chars = max_passage_chars

    def _ask(self, messages: list[list[dict]], metas: list[dict]) -> list:
        gens = self.backend.generate([Request(m, meta) for m, meta in zip(messages, metas)], self.params)
        return [g[0] for g in gens]

    def answer_mcq(self, questions: Sequence[MultipleChoiceQuestion],
                   evidence: Sequence[Sequence[Passage]] | None = None) -> list[ReaderOutput]:
        evidence = evidence or [[] for _ in questions]
        msgs = [prompts.mcq_messages(q, list(ev)[: self.max_passages], self.max_passage_chars)
                for q, ev in zip(questions, evidence)]
        metas = [{"task": "answer_mcq", "question_id": q.id, "passage_ids": [p.id for p in ev]}
                 for q, ev in zip(questions, evidence)]
        if self.answer_mode == "logprob":
            return self._mcq_by_logprob(questions, msgs, metas)
        out = []
        for q, m, gen in zip(questions, msgs, self._ask(msgs, metas)):
            if gen.error:
                letter, problem = None, f"generation failed: {gen.error}"
            else:
                letter, problem = parse_mcq_answer(gen.text, q.options)
            out.append(ReaderOutput(q.id, letter, letter is not None and letter in q.answer, gen.text, problem,
                                    _hash(m)))
        return out

    def _mcq_by_logprob(self, questions, msgs, metas) -> list[ReaderOutput]:
        out = []
        for q, m, meta in zip(questions, msgs, metas):
            letters = list(q.options)
            (lps,) = self.backend.next_token_logprobs([Request(m, {**meta, "assistant_prefix": "<answer>"})], letters)
            best = max(letters, key=lambda k: lps[k])
            out.append(ReaderOutput(q.id, best, best in q.answer, json.dumps(lps), None, _hash(m)))
        return out

    def answer_open(self, questions: Sequence[OpenQuestion],
                    evidence: Sequence[Sequence[Passage]] | None = None) -> list[ReaderOutput]:
        """Open answers are parsed, not scored: ``correct`` stays False until a long-form metric judges them."""
        evidence = evidence or [[] for _ in questions]
        msgs = [prompts.open_messages(q, list(ev)[: self.max_passages], self.max_passage_chars)
                for q, ev in zip(questions, evidence)]
        metas = [{"task": "answer_open", "question_id": q.id, "passage_ids": [p.id for p in ev]}
                 for q, ev in zip(questions, evidence)]
        out = []
        for q, m, gen in zip(questions, msgs, self._ask(msgs, metas)):
            answer, problem = (None, f"generation failed: {gen.error}") if gen.error else parse_open_answer(gen.text)
            out.append(ReaderOutput(q.id, answer, False, gen.text, problem, _hash(m)))
        return out

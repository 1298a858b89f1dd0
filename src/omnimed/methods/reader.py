"""The reader: answers multiple-choice and open questions from the question and optional evidence passages.

Parsing is strict about what counts as an answer and loud about what does not: a missing or malformed answer, or
a backend error, is a wrong answer with a ``problem`` saying why, never a dropped example. Every request carries
``meta`` (task, question id, ids of the passages shown) so the world's oracle backend can answer it exactly.

What the answer tag may hold for a multiple-choice question (case-insensitive; the *last* tag wins):
``B``, ``(B)``, ``[B]``, ``B.``, ``B) text``, ``B. text``, ``Option B``, ``Answer: B``, or the full text of an
option. With a letter and a text the letter decides (the text is not checked against it). A closing tag that is missing at the very end (a stop string or the token limit ate it) is tolerated.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.generation.types import Generation, Messages, Request, SamplingParams
from omnimed.methods import prompts

_CLOSED = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)
_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+|correct\s+|best\s+)?(?:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*",
                     re.IGNORECASE)
_BARE = re.compile(r"^[(\[]?\s*([A-Za-z])\s*[)\]]?\s*[.:]?$")
_LETTER_TEXT = re.compile(r"^[(\[]?\s*([A-Za-z])\s*(?:[)\]]\s*[.:\-]?|[.:\-])\s*(\S.*)$", re.DOTALL)
_SEPARATORS = re.compile(r"\s*(?:,|;|/|&|\band\b)\s*", re.IGNORECASE)
_WRAPPERS = " \t\n\"'`*"


@dataclass
class ReaderOutput:
    """One answered question. ``prediction``: the option letter (``"A,C"`` for a multi-answer question) or the
    open answer's text; None when no usable answer came back, in which case ``problem`` says why and ``correct``
    is False. ``passage_ids``: the evidence actually shown, after ``max_passages``. ``error``: the backend's error
    when the call itself failed (connection, timeout, server), which an evaluation counts apart from unparsable
    answers."""

    question_id: str
    prediction: str | None
    correct: bool
    raw: str
    problem: str | None = None
    prompt_hash: str = ""
    passage_ids: list[str] = field(default_factory=list)
    error: str | None = None


# ------------------------------------------------------------------------------------------------ parsing
def answer_span(text: str) -> tuple[str | None, str | None]:
    """The content of the last ``<answer>`` tag, or (None, problem). An opening tag with no closing tag after it
    counts when nothing closed follows it (the stop string or the token limit removed ``</answer>``)."""
    if not text or not text.strip():
        return None, "empty output"
    closed = list(_CLOSED.finditer(text))
    tail_from = closed[-1].end() if closed else 0
    opened = list(_OPEN.finditer(text, tail_from))
    if opened:  # an unclosed tag after the last closed one is the latest answer
        inner = text[opened[-1].end():].strip()
        return (inner, None) if inner else (None, "empty <answer> tag")
    if not closed:
        return None, "no <answer> tag"
    inner = closed[-1].group(1).strip()
    return (inner, None) if inner else (None, "empty <answer> tag")


def _norm(text: str) -> str:
    """Casefolded, whitespace collapsed, wrapping quotes / emphasis and a trailing period removed."""
    return " ".join(text.strip(_WRAPPERS).rstrip(".").strip(_WRAPPERS).casefold().split())


def _as_options(options: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    return dict(options) if isinstance(options, Mapping) else {letter: "" for letter in options}


def _read_one(inner: str, options: dict[str, str]) -> tuple[str | None, str | None]:
    """One option letter from a tag's content, or (None, problem)."""
    wanted = _norm(inner)
    by_text = [k for k, v in options.items() if v.strip() and _norm(v) == wanted]
    if len(by_text) == 1:
        return by_text[0], None
    if len(by_text) > 1:
        return None, f"answer {inner[:40]!r} matches the text of several options ({', '.join(by_text)})"
    cleaned = inner.strip(_WRAPPERS)
    cleaned = _PREFIX.sub("", cleaned, count=1).strip(_WRAPPERS) or cleaned
    m = _BARE.match(cleaned) or _LETTER_TEXT.match(cleaned)
    if m:
        letter = m.group(1).upper()
        if letter in options:
            return letter, None
        return None, f"answer {letter!r} is not an option ({', '.join(options)})"
    return None, f"answer {inner[:40]!r} names no option"


def _read_many(inner: str, options: dict[str, str]) -> list[str] | None:
    """Several letters (``A, C``, ``A and C``, ``(A)/(C)``, ``AC``), sorted, or None when any piece is not one."""
    cleaned = _PREFIX.sub("", inner.strip(_WRAPPERS), count=1).strip(_WRAPPERS)
    if re.fullmatch(r"[A-Z]{2,}", cleaned) and all(c in options for c in cleaned) and len(set(cleaned)) == len(
            cleaned):
        return sorted(cleaned)
    pieces = [p for p in _SEPARATORS.split(cleaned) if p.strip()]
    letters = []
    for piece in pieces:
        letter, _ = _read_one(piece, options)
        if letter is None:
            return None
        letters.append(letter)
    return sorted(set(letters)) or None


def parse_mcq_answer(text: str, options: Mapping[str, str] | Sequence[str]) -> tuple[str | None, str | None]:
    """(letter, None) or (None, problem) for a single-answer question. ``options``: the question's ``{letter:
    text}`` (lets the option's text stand for its letter) or just its letters. Problems read like ``no <answer>
    tag``, ``empty <answer> tag``, ``answer 'E' is not an option (A, B, C, D)``, ``answer 'A, C' names several
    options (A, C); one was asked for``."""
    opts = _as_options(options)
    inner, problem = answer_span(text)
    if inner is None:
        return None, problem
    letter, problem = _read_one(inner, opts)
    if letter is not None:
        return letter, None
    several = _read_many(inner, opts)
    if several and len(several) > 1:
        return None, f"answer {inner[:40]!r} names several options ({', '.join(several)}); one was asked for"
    return None, problem


def parse_mcq_answers(text: str, options: Mapping[str, str] | Sequence[str]) -> tuple[list[str] | None, str | None]:
    """(sorted letters, None) or (None, problem) for a question with possibly several correct options."""
    opts = _as_options(options)
    inner, problem = answer_span(text)
    if inner is None:
        return None, problem
    several = _read_many(inner, opts)
    if several:
        return several, None
    letter, problem = _read_one(inner, opts)
    return ([letter], None) if letter is not None else (None, problem)


def parse_open_answer(text: str) -> tuple[str | None, str | None]:
    """(answer text, None) or (None, problem): the last ``<answer>`` tag's content, whitespace-trimmed."""
    return answer_span(text)


# ------------------------------------------------------------------------------------------------- reader
def prompt_hash(messages: Messages | str) -> str:
    """Short, stable fingerprint of a rendered prompt, stored with each output to tie it to its wording."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]


def _problem(gen: Generation | None, problem: str | None) -> str | None:
    if problem and gen is not None and gen.finish_reason == "length":
        return f"{problem} (output cut at max_new_tokens)"
    return problem


class Reader:
    """Answer questions with ``backend`` (anything meeting :class:`omnimed.generation.types.Backend`).

    ``params``: decoding settings (only the first of ``n`` generations is read); ``max_passages`` /
    ``max_passage_chars`` bound the evidence put in the prompt. ``answer_mode``: ``generate`` (reason, then
    ``<answer>X</answer>``, parsed) or ``logprob`` (the reply is started with ``<answer>`` and the option letter
    with the highest next-token log-probability is the answer, ties to the earlier letter: how small models such
    as SmolLM2-135M are scored, since they rarely finish the answer format on their own; an open question's reply
    is started with ``<answer>`` and generated).

    A multiple-choice question with several correct letters is right only when exactly those letters are given;
    in ``logprob`` mode, which picks one letter, such a question is counted wrong with a problem saying so.
    Open answers are parsed, not scored: their ``correct`` stays False until a long-form metric judges them.
    """

    def __init__(self, backend, *, params: SamplingParams | None = None, max_passages: int = 10,
                 max_passage_chars: int | None = 1200, answer_mode: str = "generate") -> None:
        if answer_mode not in ("generate", "logprob"):
            raise ValueError(f"answer_mode={answer_mode!r}; expected generate or logprob")
        if max_passages < 0:
            raise ValueError(f"max_passages={max_passages}; expected 0 or more")
        self.backend = backend
        self.params = params or SamplingParams(max_new_tokens=512)
        self.max_passages = max_passages
        self.max_passage_chars = max_passage_chars
        self.answer_mode = answer_mode

    # ----------------------------------------------------------------------------------------- requests
    def _shown(self, questions: Sequence, evidence: Sequence[Sequence[Passage]] | None) -> list[list[Passage]]:
        if evidence is None:
            return [[] for _ in questions]
        if len(evidence) != len(questions):
            raise ValueError(f"evidence has {len(evidence)} passage lists for {len(questions)} questions")
        return [list(ev)[: self.max_passages] for ev in evidence]

    def mcq_requests(self, questions: Sequence[MultipleChoiceQuestion],
                     evidence: Sequence[Sequence[Passage]] | None = None) -> list[Request]:
        """The requests :meth:`answer_mcq` sends (also for building training prompts with the same wording)."""
        return [Request(prompts.mcq_messages(q, ev, self.max_passage_chars),
                        {"task": "answer_mcq", "question_id": q.id, "passage_ids": [p.id for p in ev]})
                for q, ev in zip(questions, self._shown(questions, evidence))]

    def open_requests(self, questions: Sequence[OpenQuestion],
                      evidence: Sequence[Sequence[Passage]] | None = None) -> list[Request]:
        """The requests :meth:`answer_open` sends."""
        return [Request(prompts.open_messages(q, ev, self.max_passage_chars),
                        {"task": "answer_open", "question_id": q.id, "passage_ids": [p.id for p in ev]})
                for q, ev in zip(questions, self._shown(questions, evidence))]

    def _generate(self, requests: list[Request], params: SamplingParams | None = None) -> list[Generation | None]:
        if not requests:
            return []
        gens = self.backend.generate(requests, params or self.params)
        if len(gens) != len(requests):
            raise RuntimeError(f"backend {getattr(self.backend, 'name', self.backend)!r} returned "
                               f"{len(gens)} results for {len(requests)} requests")
        return [g[0] if g else None for g in gens]

    # ------------------------------------------------------------------------------------------ answers
    def answer_mcq(self, questions: Sequence[MultipleChoiceQuestion],
                   evidence: Sequence[Sequence[Passage]] | None = None) -> list[ReaderOutput]:
        """One output per question, in order; ``evidence[i]`` (optional) is shown with question ``i``."""
        requests = self.mcq_requests(questions, evidence)
        if self.answer_mode == "logprob":
            return self._mcq_by_logprob(questions, requests)
        out = []
        for q, req, gen in zip(questions, requests, self._generate(requests)):
            raw = gen.text if gen is not None else ""
            if gen is None:
                letters, problem = None, "backend returned no generation"
            elif gen.error:
                letters, problem = None, f"generation failed: {gen.error}"
            elif len(q.answer) > 1:
                letters, problem = parse_mcq_answers(gen.text, q.options)
            else:
                letter, problem = parse_mcq_answer(gen.text, q.options)
                letters = [letter] if letter is not None else None
            prediction = ",".join(letters) if letters else None
            correct = letters is not None and sorted(letters) == sorted(q.answer)
            out.append(ReaderOutput(q.id, prediction, correct, raw, _problem(gen, problem), prompt_hash(req.prompt),
                                    list(req.meta["passage_ids"]), gen.error if gen is not None else None))
        return out

    def _mcq_by_logprob(self, questions: Sequence[MultipleChoiceQuestion],
                        requests: list[Request]) -> list[ReaderOutput]:
        # one backend call per distinct letter set (usually one for a whole dataset)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, q in enumerate(questions):
            groups.setdefault(tuple(q.options), []).append(i)
        scores: list[dict[str, float]] = [{} for _ in questions]
        for letters, idx in groups.items():
            primed = [Request(requests[i].prompt, {**requests[i].meta, "assistant_prefix": "<answer>"}) for i in idx]
            for i, lps in zip(idx, self.backend.next_token_logprobs(primed, list(letters))):
                scores[i] = lps
        out = []
        for q, req, lps in zip(questions, requests, scores):
            best = max(q.options, key=lambda k: lps.get(k, float("-inf")))
            problem = None
            if len(q.answer) > 1:
                problem = f"logprob mode picks one letter; the question has {len(q.answer)} correct options"
            out.append(ReaderOutput(q.id, best, problem is None and best in q.answer, json.dumps(lps), problem,
                                    prompt_hash(req.prompt), list(req.meta["passage_ids"])))
        return out

    def answer_open(self, questions: Sequence[OpenQuestion],
                    evidence: Sequence[Sequence[Passage]] | None = None) -> list[ReaderOutput]:
        """One output per open question: the parsed answer text, ``correct`` False (not scored here). In
        ``logprob`` mode, which has no options to score here, the reply is started with ``<answer>`` and the model
        writes the answer itself up to ``</answer>``: a small model that never opens the tag by itself (SmolLM2-135M
        writes on to the token limit) still gives an answer to judge."""
        requests = self.open_requests(questions, evidence)
        prefilled = self.answer_mode == "logprob"
        params = None
        if prefilled:
            requests = [Request(r.prompt, {**r.meta, "assistant_prefix": "<answer>"}) for r in requests]
            params = replace(self.params, stop=(*self.params.stop, "</answer>"))
        out = []
        for q, req, gen in zip(questions, requests, self._generate(requests, params)):
            if gen is None:
                answer, problem = None, "backend returned no generation"
            elif gen.error:
                answer, problem = None, f"generation failed: {gen.error}"
            else:
                started = prefilled and not _OPEN.search(gen.text)  # the tag is the prompt's, not in the text
                answer, problem = parse_open_answer("<answer>" + gen.text if started else gen.text)
            out.append(ReaderOutput(q.id, answer, False, gen.text if gen is not None else "", _problem(gen, problem),
                                    prompt_hash(req.prompt), list(req.meta["passage_ids"]),
                                    gen.error if gen is not None else None))
        return out

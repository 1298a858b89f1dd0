"""LUQ, long-text uncertainty (Zhang et al., 2024), as Omni-RAG's table 10 measures the reader: several answers
sampled for the same prompt; each sentence of each answer is checked against every other answer by an NLI judge;
an answer's consistency is the mean over its sentences and the other answers of
P(entail) / (P(entail) + P(contradict)); the question's uncertainty is 1 minus the mean consistency of its answers.

The NLI judge is either a sequence-classification NLI model (a hub id or a folder, its labels read from the model
config: ``entailment`` / ``contradiction``), or, as LUQ's LLM variant, a generation backend asked whether the
premise entails the hypothesis, read from its next-token probabilities of ``Yes`` and ``No``, or, for closed-form
answers (an option letter), :class:`ExactNLI`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

from omnimed.generation.types import Request
from omnimed.methods.selfbiorag.sentences import split_sentences

#: the NLI prompt of the LLM variant (our words)
NLI_PROMPT = ("Premise: {premise}\n\nHypothesis: {hypothesis}\n\nDoes the premise entail the hypothesis? "
              "Answer Yes or No.")
_OPEN = re.compile(r"<\s*[A-Za-z_]+\s*>")
_CLOSE = re.compile(r"\s*<\s*/\s*[A-Za-z_]+\s*>")


class NLIJudge(Protocol):
    def entail_contradict(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
        """(P(entail), P(contradict)) of each (premise, hypothesis) pair."""
        ...


class BackendNLI:
    """LUQ's LLM variant: a generation backend's next-token probabilities of ``Yes`` (entails) and ``No``."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def entail_contradict(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
        requests = [Request([{"role": "user", "content": NLI_PROMPT.format(premise=p, hypothesis=h)}],
                            {"task": "nli"}) for p, h in pairs]
        out = []
        for lp in self.backend.next_token_logprobs(requests, ["Yes", "No"]):
            yes, no = math.exp(lp["Yes"]), math.exp(lp["No"])
            out.append((yes / (yes + no), no / (yes + no)) if yes + no > 0 else (0.5, 0.5))
        return out


class ClassifierNLI:
    """A sequence-classification NLI model (``transformers``), e.g. an MNLI-tuned DeBERTa."""

    def __init__(self, name_or_path: str, batch_size: int = 16, device: str = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            self.model = AutoModelForSequenceClassification.from_pretrained(name_or_path, use_safetensors=True)
        except OSError as exc:
            raise OSError(f"task.luq_nli={name_or_path}: cannot load an NLI model from it ({exc}); a hub id needs "
                          "the hub to be reachable, or give a local folder, or task.luq_nli=null to ask the run's "
                          "backend") from exc
        labels = {v.lower(): int(k) for k, v in self.model.config.id2label.items()}
        found = {want: next((i for name, i in labels.items() if name.startswith(want)), None)
                 for want in ("entail", "contradict")}
        if None in found.values():
            raise ValueError(f"task.luq_nli={name_or_path}: its labels {sorted(labels)} name no entailment and "
                             "contradiction classes")
        self.entail, self.contradict = found["entail"], found["contradict"]
        self.model.eval().to(device)
        self.batch_size, self.device = batch_size, device

    def entail_contradict(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
        import torch

        out: list[tuple[float, float]] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            enc = self.tokenizer([p for p, _ in chunk], [h for _, h in chunk], truncation=True, padding=True,
                                 return_tensors="pt").to(self.device)
            with torch.no_grad():
                probs = torch.softmax(self.model(**enc).logits.float(), dim=-1)
            out += [(float(row[self.entail]), float(row[self.contradict])) for row in probs]
        return out


class ExactNLI:
    """The judge of closed-form answers (``task.luq_nli=exact``): a hypothesis sentence is entailed when it reads
    the same as a sentence of the premise (case, punctuation and spacing aside) and contradicted otherwise, since
    two different options of one question exclude each other. Free text would need a real NLI judge: a paraphrase
    would count as a contradiction here."""

    def entail_contradict(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
        return [(1.0, 0.0) if _plain(h) in {_plain(s) for s in split_sentences(p)} else (0.0, 1.0) for p, h in pairs]


def _plain(sentence: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", sentence.lower()).split())


def nli_judge(name_or_path: str | None, backend: Any) -> NLIJudge:
    """``task.luq_nli``: null asks the run's backend (:class:`BackendNLI`), ``exact`` compares closed-form answers
    (:class:`ExactNLI`), anything else names an NLI classifier."""
    if name_or_path == "exact":
        return ExactNLI()
    return BackendNLI(backend) if name_or_path is None else ClassifierNLI(name_or_path)


def option_samples(option_logprobs: Sequence[dict[str, float] | None], n: int, temperature: float,
                   seed: int) -> list[list[str]]:
    """``n`` answers (``<answer>X</answer>``) per question drawn from the reader's log-probabilities of the option
    letters at ``temperature`` (p proportional to exp(log p / T)): the letter that sampling after ``<answer>``
    draws, restricted to the options, for a reader whose answer is that letter alone, without ``n`` more prompts'
    worth of computation (``task.luq_sampler=options``). A question without scores gets no samples."""
    import numpy as np

    if temperature <= 0:
        raise ValueError(f"task.luq_temperature={temperature}: sampling the options needs a temperature above 0")
    rng = np.random.default_rng(seed)
    out: list[list[str]] = []
    for scores in option_logprobs:
        if not scores:
            out.append([])
            continue
        letters = list(scores)
        logits = np.array([scores[k] for k in letters], dtype=float) / temperature
        p = np.exp(logits - logits.max())
        out.append([f"<answer>{letters[i]}</answer>" for i in rng.choice(len(letters), size=n, p=p / p.sum())])
    return out


def answer_text(raw: str) -> str:
    """An answer as the NLI judge reads it: tag markup removed, a closing tag ending its sentence (``<answer>B
    </answer>`` is the sentence ``B.``), whitespace collapsed."""
    text = _OPEN.sub(" ", _CLOSE.sub(". ", raw))
    return " ".join(re.sub(r"([.!?])\s*\.", r"\1", text).split())


def luq(samples: Sequence[Sequence[str]], nli: NLIJudge) -> list[float | None]:
    """Each question's LUQ uncertainty (in [0, 1], lower = more consistent answers) from its sampled answers; None
    for a question with fewer than two non-empty answers, which leaves nothing to compare."""
    texts = [[t for t in map(answer_text, answers) if t] for answers in samples]
    pairs: list[tuple[str, str]] = []
    index: list[tuple[int, int, int]] = []  # (question, answer, sentence) of each pair, in order
    for q, answers in enumerate(texts):
        if len(answers) < 2:
            continue
        for i, answer in enumerate(answers):
            for s, sentence in enumerate(split_sentences(answer)):
                for j, other in enumerate(answers):
                    if j != i:
                        pairs.append((other, sentence))
                        index.append((q, i, s))
    scores: dict[tuple[int, int, int], list[float]] = {}
    for key, (entail, contradict) in zip(index, nli.entail_contradict(pairs) if pairs else []):
        scores.setdefault(key, []).append(entail / (entail + contradict) if entail + contradict > 0 else 0.5)
    consistency: dict[int, dict[int, list[float]]] = {}
    for (q, i, _), values in scores.items():
        consistency.setdefault(q, {}).setdefault(i, []).append(sum(values) / len(values))
    return [1.0 - sum(sum(v) / len(v) for v in consistency[q].values()) / len(consistency[q])
            if q in consistency else None for q in range(len(samples))]

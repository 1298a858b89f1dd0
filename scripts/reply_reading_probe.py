"""Does a model read evidence where Self-BioRAG's generator reads it? Accuracy on test questions of the ``table``
world with each question's gold passage shown in the reader's own prompt, inside the reply as the generator sees
it (``<paragraph>GOLD</paragraph>The answer is``), and with no passage in the reply; the option letter is read from
the next-token distribution, as ``answer_mode=logprob`` reads it.

    .venv/bin/python scripts/reply_reading_probe.py MODEL [--n 60] [--tokens] [--shots K]

``MODEL``: an ``omnimed-train`` export (``checkpoints/reader/reader-miniature/hf``). ``--tokens`` writes the
reflective tokens a trained generator writes before and after the evidence (``[Retrieval]``, ``[Relevant]``;
``[No Retrieval]`` without). Questions: treatment and mechanism questions with one gold passage, shuffled with
seed 0; ``--shots K`` puts K solved training questions of the same kinds before each question in the reply
layout, chosen as the pipeline chooses them (``pipeline.shots``; the tables ask 3-shot). The README's "The
miniature reader" and "Self-BioRAG in miniature" quote its runs.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from omnimed.generation.hf import HFBackend
from omnimed.generation.types import Request
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.knowledge.corpus import world_of
from omnimed.methods.reader import Reader
from omnimed.methods.selfbiorag import tokens as T
from omnimed.methods.selfbiorag.inference import SelfBioRAGConfig, pick_demonstrations, reply_reading

ANSWER_PREFIX = SelfBioRAGConfig.answer_prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--tokens", action="store_true")
    parser.add_argument("--shots", type=int, default=0)
    args = parser.parse_args()
    world = world_of(KnowledgeConfig(name="world_table", world_size="table"))
    passages = {p.id: p for p in world.passages}
    kinds = ("treatment", "mechanism")
    questions = [q for q in world.questions if q.split == "test" and q.metadata.get("kind") in kinds
                 and len(q.gold_passages) == 1 and len(q.answer) == 1]
    random.Random(0).shuffle(questions)
    questions = questions[: args.n]
    gold = [passages[q.gold_passages[0]] for q in questions]
    shown = pick_demonstrations(questions, [q for q in world.questions if q.split == "train"
                                            and q.metadata.get("kind") in kinds], args.shots)
    backend = HFBackend(args.model, batch_size=4)

    def report(label: str, letters: list[str | None]) -> None:
        right = sum(x == q.answer[0] for x, q in zip(letters, questions))
        print(f"{label:<26} {100 * right / len(questions):5.1f}% of {len(questions)}  answers {dict(Counter(letters))}")

    report("own prompt, gold", [o.prediction for o in Reader(backend, answer_mode="logprob").answer_mcq(
        questions, [[p] for p in gold])])
    for label, evidence in (("reply, gold", gold), ("reply, no passage", [None] * len(questions))):
        requests = []
        for q, passage in zip(questions, evidence):
            prompt, reply = reply_reading(q, passage, shown[q.id])
            prefix = reply[: reply.rindex(ANSWER_PREFIX) + len(ANSWER_PREFIX)]
            if args.tokens:
                prefix = (T.RETRIEVE + prefix.replace(T.PARAGRAPH_CLOSE, T.PARAGRAPH_CLOSE + T.RELEVANT)
                          if passage else T.NO_RETRIEVE + prefix)
            requests.append(Request(prompt, {"task": "answer_mcq", "assistant_prefix": prefix}))
        logprobs = backend.next_token_logprobs(requests, [f" {x}" for x in "ABCDE"])
        report(label, [max(q.options, key=lambda x: lp.get(f" {x}", float("-inf")))
                       for q, lp in zip(questions, logprobs)])


if __name__ == "__main__":
    main()

"""Stage ``selfbiorag_generator_data``: the trained critic annotates instruction examples with reflective tokens,
giving the generator's training data (self-biorag.txt section 3.4; the paper kept 84k of 120k examples).

For each example (instruction x, output y):

1. the critic predicts RET on x;
2. when it says ``[Retrieval]``, the knowledge base returns the top ``top_k`` passages for x and the critic judges
   REL (x, e) and SUP (x, e, y) for each; the passage it rates best (relevant before irrelevant, then fully before
   partially supported, then retrieval rank) is the one quoted;
3. the critic predicts USE on (x, y);
4. the output is rewritten in Self-RAG's layout (:func:`~omnimed.methods.selfbiorag.tokens.format_output`).

The critic writes its tokens freely (greedy, a few tokens); an example where any prediction is not one of the
defined tokens of its type is dropped, and the drops are counted by type, as the paper filters mispredictions
such as ``[Continue Generation]``. An example whose critic calls failed (connection, timeout, server error) is
not dropped: nothing is recorded for it and the next run asks again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import InstructionExample, Passage, ReflectiveLabels
from omnimed.generation.types import Request, SamplingParams
from omnimed.methods.selfbiorag import prompts
from omnimed.methods.selfbiorag.instructions import in_subset, load_instructions, stage_inputs
from omnimed.methods.selfbiorag.tokens import (
    CONTRACT_VERSION,
    RELEVANT,
    RETRIEVE,
    SUPPORT_CREDIT,
    format_output,
    read_choice,
)
from omnimed.models.layout import request_prompt, user_text

STAGE = "selfbiorag_generator_data"


@dataclass
class GeneratorDataConfig:
    """``instructions``: ``world`` or a records path; ``subset``: all | domain | general; ``top_k``: passages the
    critic judges for an example it sends to retrieval; ``sources`` / ``retriever``: where and how they are
    searched (None: every text source, the knowledge base's default method)."""

    name: str = STAGE
    instructions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train"])
    subset: str = "all"
    max_examples: Optional[int] = None
    top_k: int = 3
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    critic_max_new_tokens: int = 4
    batch_size: int = 32
    out: Optional[str] = None


def critic_request(kind: str, ex: InstructionExample, output: str | None = None,
                   passage: Passage | None = None, prompt_layout: str = "chat") -> Request:
    """The critic's question about one example, in the critic model's ``prompt_layout``, with the ids an oracle
    critic answers from."""
    task = user_text(ex.instruction, ex.input)
    evidence = prompts.evidence_text(passage) if passage is not None else None
    meta: dict[str, Any] = {"task": kind, "question_id": ex.id}
    if passage is not None:
        meta["passage_id"] = prompts.passage_ref(passage)
    if output is not None:
        meta["answer"] = output
    content = prompts.critic_instruction(kind, task, output, evidence)
    return Request(request_prompt(content, "", prompt_layout), meta)


def _best(judged: list[tuple[Passage, str, str | None]]) -> tuple[Passage, str, str | None]:
    """The passage to quote: relevant first, then the strongest support, then the retriever's order."""
    return max(enumerate(judged), key=lambda item: (item[1][1] == RELEVANT,
                                                     SUPPORT_CREDIT.get(item[1][2] or "", -1.0),
                                                     -item[0]))[1]


def build_generator_data(cfg: GeneratorDataConfig, *, critic, kb, knowledge=None, root: str = ".",
                         progress: bool = True, log=print, max_failed: float = MAX_FAILED_SHARE,
                         prompt_layout: str = "chat") -> StageResult:
    """Run the stage (or reuse its finished output); ``critic``: a generation backend serving the critic LM. An
    example whose critic calls failed is left for the next run; more than ``max_failed`` of them fail the stage."""
    stage = open_stage(STAGE, cfg, root=root, **stage_inputs(cfg.instructions, critic, kb))
    if stage.finished():
        counts = stage.manifest()["generator_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['kept']} of {counts['examples']} examples kept); nothing to do")
        return StageResult(stage.path, counts, True)

    pool = [e for e in load_instructions(cfg.instructions, knowledge=knowledge, splits=tuple(cfg.splits))
            if in_subset(e, cfg.subset)]
    if cfg.max_examples:
        pool = pool[: cfg.max_examples]
    done = stage.start()
    todo = [ex for ex in pool if ex.id not in done]
    log(f"{STAGE}: {len(pool)} instruction examples ({cfg.subset}); {len(done)} done earlier, {len(todo)} to "
        f"annotate with critic {critic.model_id} -> {stage.path}")

    params = SamplingParams(max_new_tokens=cfg.critic_max_new_tokens)
    ask_critic = partial(critic_request, prompt_layout=prompt_layout)  # in the critic model's layout

    def ask(requests: list[Request], kinds: list[str]) -> list[tuple[str | None, str | None]]:
        """(token or None, error or None) per request."""
        replies = critic.generate(requests, params) if requests else []
        return [(None, r[0].error) if r[0].error is not None else (read_choice(r[0].text, k), None)
                for r, k in zip(replies, kinds)]

    def annotate(batch: list[InstructionExample]) -> list[dict[str, Any] | Failed]:
        first = ask([ask_critic("retrieval", ex) for ex in batch]
                    + [ask_critic("utility", ex, ex.output) for ex in batch],
                    ["retrieval"] * len(batch) + ["utility"] * len(batch))
        errors: dict[int, str] = {}
        for i, (_, err) in enumerate(first):
            if err is not None:
                errors.setdefault(i % len(batch), err)
        ret = [tok for tok, _ in first[: len(batch)]]
        use = [tok for tok, _ in first[len(batch):]]
        retrieving = [i for i, r in enumerate(ret) if r == RETRIEVE]
        evidence = (kb.search_sources([user_text(batch[i].instruction, batch[i].input)
                                       for i in retrieving], cfg.top_k, sources=cfg.sources, method=cfg.retriever)
                    if retrieving else [])
        requests, kinds, owners = [], [], []
        for i, passages in zip(retrieving, evidence):
            for p in passages:
                requests += [ask_critic("relevance", batch[i], passage=p),
                             ask_critic("support", batch[i], batch[i].output, p)]
                kinds += ["relevance", "support"]
                owners += [i, i]
        answers = ask(requests, kinds)
        for i, (_, err) in zip(owners, answers):
            if err is not None:
                errors.setdefault(i, err)
        tokens = iter(tok for tok, _ in answers)
        judged: dict[int, list[tuple[Passage, str | None, str | None]]] = {}
        for i, passages in zip(retrieving, evidence):
            judged[i] = [(p, next(tokens), next(tokens)) for p in passages]

        results: list[dict[str, Any] | Failed] = []
        for i, ex in enumerate(batch):
            if i in errors:
                results.append(Failed(ex.id, errors[i]))
                continue
            bad = [kind for kind, tok in (("retrieval", ret[i]), ("utility", use[i])) if tok is None]
            bad += sorted({kind for _, rel, sup in judged.get(i, []) for kind, tok in
                           (("relevance", rel), ("support", sup)) if tok is None})
            if i in judged and not judged[i]:
                bad.append("no evidence retrieved")
            if bad:
                results.append({"id": ex.id, "dropped": bad})
                continue
            labels = ReflectiveLabels(retrieval=ret[i], utility=use[i])
            if i in judged:
                passage, rel, sup = _best(judged[i])  # type: ignore[arg-type]
                labels.relevance, labels.support = rel, sup if rel == RELEVANT else None
                output = format_output(ex.output, retrieval=RETRIEVE, utility=use[i],
                                       evidence=prompts.evidence_text(passage), relevance=rel, support=sup)
                meta_extra = {"evidence_id": passage.id}
            else:
                output = format_output(ex.output, retrieval=ret[i], utility=use[i])
                meta_extra = {}
            record = InstructionExample(
                id=ex.id, instruction=ex.instruction, input=ex.input, output=output, labels=labels,
                dataset="selfbiorag-generator",
                metadata={"split": ex.metadata.get("split"), "source_dataset": ex.dataset, **meta_extra},
            )
            results.append({"id": ex.id, "record": record.to_dict()})
        return results

    failed = stage.process(todo, annotate, total=len(pool), backend=describe_backend(critic), max_failed=max_failed,
                           batch_size=cfg.batch_size, progress=progress, label=f"{STAGE}: critic annotations")
    done = stage.start()
    answered = [ex for ex in pool if ex.id in done]
    records = [InstructionExample.from_dict(done[ex.id]["record"]) for ex in answered if "record" in done[ex.id]]
    dropped: dict[str, int] = {}
    for ex in answered:
        for reason in done[ex.id].get("dropped", []):
            dropped[reason] = dropped.get(reason, 0) + 1
    counts = {"kept": len(records), "dropped": len(answered) - len(records), "examples": len(pool),
              "retrieval": sum(r.labels.retrieval == RETRIEVE for r in records),
              **({"failed": len(failed)} if failed else {}),
              **{f"dropped/{k}": v for k, v in sorted(dropped.items())}}
    stage.finish(records, failed=failed, selfbiorag={"contract": CONTRACT_VERSION, "prompts": prompts.PROMPT_VERSION},
                 generator_counts=counts)
    log(f"{STAGE}: kept {counts['kept']} of {counts['examples']} examples ({counts['dropped']} dropped: "
        + (", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none")
        + f"; {counts['retrieval']} with evidence"
        + (f"; {len(failed)} whose critic calls failed are asked again by the next run" if failed else "")
        + f") in {stage.path}")
    return StageResult(stage.path, counts, False)

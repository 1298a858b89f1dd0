"""Stage ``selfbiorag_critic_data``: a teacher labels sampled instruction examples with the four reflective-token
types, giving the critic LM's training and dev data (self-biorag.txt section 3.3: 5k of 120k examples, GPT-4).

For each sampled example (instruction x, output y) the teacher rates

- RET on x; USE on (x, y);
- REL on (x, e) and SUP on (x, e, y) for each of the ``evidence_k`` passages the knowledge base returns for x.

A fraction of the examples (``mismatched_fraction``) is judged with the output of another, randomly chosen
example: real instruction outputs vary in quality, the world's do not, and without such outputs a critic would
never see a useless or unsupported response. Each judgement becomes one critic example: the critic's instruction
(:func:`~omnimed.methods.selfbiorag.prompts.critic_instruction`) and the teacher's token as output. All judgements
of one source example land in the same split (train or dev), so dev measures examples the critic never saw.

A teacher reply without a valid token of the asked type is dropped and counted by type, never guessed. An example
whose teacher calls failed (connection, timeout, server error) is not dropped: nothing is recorded for it and the
next run asks again; when such examples pass ``max_failed_share`` the stage fails without a manifest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import InstructionExample, Passage
from omnimed.generation.types import Request, SamplingParams
from omnimed.methods.selfbiorag import prompts
from omnimed.methods.selfbiorag.instructions import in_subset, load_instructions, split_of, stage_inputs
from omnimed.methods.selfbiorag.tokens import CONTRACT_VERSION, CRITIC_CHOICES
from omnimed.models.layout import user_text

STAGE = "selfbiorag_critic_data"


@dataclass
class CriticDataConfig:
    """``instructions``: ``world`` or a records path; ``subset``: all | domain | general (see
    :func:`~omnimed.methods.selfbiorag.instructions.in_subset`); ``n_examples``: how many examples are sampled
    (the paper: 5,000); ``evidence_k``: passages judged per example for REL and SUP; ``out``: a fixed output
    folder (default ``builds/selfbiorag_critic_data/<settings key>``)."""

    name: str = STAGE
    instructions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train"])
    subset: str = "all"
    n_examples: int = 5000
    evidence_k: int = 2
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    mismatched_fraction: float = 0.25
    dev_fraction: float = 0.2
    seed: int = 0
    batch_size: int = 64
    teacher_max_new_tokens: int = 256
    out: Optional[str] = None


def last_choice(text: str, kind: str) -> str | None:
    """The teacher's rating: the last token of the asked type in its reply (it reasons first, rates last)."""
    best, where = None, -1
    for token in CRITIC_CHOICES[kind]:
        pos = text.rfind(token)
        if pos > where:
            best, where = token, pos
    return best


def _judgements(ex: InstructionExample, output: str, evidence: list[Passage]) -> list[dict[str, Any]]:
    """The (kind, output, passage) triples the teacher rates for one example."""
    task = user_text(ex.instruction, ex.input)
    items = [{"kind": "retrieval", "task": task, "output": None, "passage": None},
             {"kind": "utility", "task": task, "output": output, "passage": None}]
    for p in evidence:
        items.append({"kind": "relevance", "task": task, "output": None, "passage": p})
        items.append({"kind": "support", "task": task, "output": output, "passage": p})
    return items


def _teacher_request(ex: InstructionExample, item: dict[str, Any]) -> Request:
    p: Passage | None = item["passage"]
    evidence = prompts.evidence_text(p) if p is not None else None
    meta: dict[str, Any] = {"task": item["kind"], "question_id": ex.id}
    if p is not None:
        meta["passage_id"] = prompts.passage_ref(p)
    if item["output"] is not None:
        meta["answer"] = item["output"]
    return Request(prompts.teacher_messages(item["kind"], item["task"], item["output"], evidence), meta)


def build_critic_data(cfg: CriticDataConfig, *, teacher, kb, knowledge=None, root: str = ".",
                      progress: bool = True, log=print, max_failed: float = MAX_FAILED_SHARE) -> StageResult:
    """Run the stage (or reuse its finished output); ``teacher``: a generation backend; ``kb``: a knowledge base
    for the evidence (None with ``evidence_k=0``). An example whose teacher calls failed is left for the next run;
    more than ``max_failed`` of them fail the stage (:class:`~omnimed.data.artifacts.RunFailed`)."""
    stage = open_stage(STAGE, cfg, root=root, **stage_inputs(cfg.instructions, teacher, kb))
    if stage.finished():
        counts = stage.manifest()["critic_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['train']} train / {counts['dev']} dev critic examples); nothing to do")
        return StageResult(stage.path, counts, True)
    if cfg.evidence_k and kb is None:
        raise ValueError(f"{STAGE}: evidence_k={cfg.evidence_k} needs a knowledge base")

    pool = [e for e in load_instructions(cfg.instructions, knowledge=knowledge, splits=tuple(cfg.splits))
            if in_subset(e, cfg.subset)]
    rng = random.Random(cfg.seed)
    sample = rng.sample(pool, min(cfg.n_examples, len(pool)))
    swap = {ex.id: rng.random() < cfg.mismatched_fraction for ex in sample}
    # a mismatched example borrows the output of a random other example (three draws, so one hit is near certain;
    # drawn for every example, used only where swap says so, so the sample does not depend on the fraction)
    donors = {ex.id: rng.choice([d for d in (rng.choice(pool) for _ in range(3)) if d.id != ex.id] or pool).output
              for ex in sample}
    done = stage.start()
    todo = [ex for ex in sample if ex.id not in done]
    log(f"{STAGE}: {len(sample)} examples sampled from {len(pool)} ({cfg.subset}); {len(done)} done earlier, "
        f"{len(todo)} to label -> {stage.path}")

    params = SamplingParams(max_new_tokens=cfg.teacher_max_new_tokens)

    def label(batch: list[InstructionExample]) -> list[dict[str, Any] | Failed]:
        evidence = (kb.search_sources([user_text(e.instruction, e.input) for e in batch],
                                      cfg.evidence_k, sources=cfg.sources, method=cfg.retriever)
                    if cfg.evidence_k else [[] for _ in batch])
        plans = []
        for ex, ev in zip(batch, evidence):
            output = donors[ex.id] if swap[ex.id] else ex.output
            plans.append((ex, _judgements(ex, output, ev)))
        requests = [_teacher_request(ex, item) for ex, items in plans for item in items]
        replies = iter(teacher.generate(requests, params))
        results: list[dict[str, Any] | Failed] = []
        for ex, items in plans:
            got = [next(replies)[0] for _ in items]
            error = next((r.error for r in got if r.error is not None), None)
            if error is not None:
                results.append(Failed(ex.id, error))
                continue
            split = split_of(ex.id, cfg.dev_fraction, cfg.seed)
            made, dropped = [], {}
            for j, (item, reply) in enumerate(zip(items, got)):
                token = last_choice(reply.text, item["kind"])
                if token is None:  # the paper's "dropped": an answer without a valid token of the asked type
                    dropped[item["kind"]] = dropped.get(item["kind"], 0) + 1
                    continue
                p = item["passage"]
                made.append(InstructionExample(
                    id=f"{ex.id}:{item['kind']}:{j}",
                    instruction=prompts.critic_instruction(item["kind"], item["task"], item["output"],
                                                           prompts.evidence_text(p) if p is not None else None),
                    output=token,
                    dataset="selfbiorag-critic",
                    metadata={"type": item["kind"], "split": split, "source_id": ex.id,
                              "passage_id": p.id if p is not None else None, "mismatched": swap[ex.id]},
                ).to_dict())
            results.append({"id": ex.id, "examples": made, "dropped": dropped})
        return results

    failed = stage.process(todo, label, total=len(sample), backend=describe_backend(teacher), max_failed=max_failed,
                           batch_size=cfg.batch_size, progress=progress, label=f"{STAGE}: teacher labels")
    done = stage.start()
    answered = [ex for ex in sample if ex.id in done]
    records = [InstructionExample.from_dict(d) for ex in answered for d in done[ex.id]["examples"]]
    dropped: dict[str, int] = {}
    for ex in answered:
        for kind, n in done[ex.id]["dropped"].items():
            dropped[kind] = dropped.get(kind, 0) + n
    counts = _counts(records, dropped, len(failed))
    stage.finish(records, failed=failed, selfbiorag={"contract": CONTRACT_VERSION, "prompts": prompts.PROMPT_VERSION},
                 critic_counts=counts)
    log(f"{STAGE}: {counts['train']} train / {counts['dev']} dev critic examples in {stage.path} "
        f"({counts['dropped']} teacher replies without a valid token dropped"
        + (f"; {len(failed)} examples whose teacher calls failed are asked again by the next run" if failed else "")
        + ")")
    return StageResult(stage.path, counts, False)


def _counts(records: list[InstructionExample], dropped: dict[str, int], failed: int) -> dict[str, int]:
    """Examples per split and per (type, token); replies dropped in all and per type; examples whose calls
    failed."""
    counts: dict[str, int] = {"train": 0, "dev": 0, "dropped": sum(dropped.values()),
                              **{f"dropped/{kind}": n for kind, n in sorted(dropped.items())}}
    if failed:
        counts["failed"] = failed
    for r in records:
        counts[r.metadata["split"]] += 1
        key = f"{r.metadata['type']}/{r.output}"
        counts[key] = counts.get(key, 0) + 1
    return counts

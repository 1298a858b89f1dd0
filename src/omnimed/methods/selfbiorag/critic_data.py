"""Stage ``selfbiorag_critic_data``: a teacher labels sampled instruction examples with the four reflective-token
types, giving the critic LM's training and dev data (self-biorag.txt section 3.3: 5k of 120k examples, GPT-4).

For each sampled example (instruction x, output y) the teacher rates

- RET on x (two-way: does the task need knowledge at all); USE on (x, y);
- REL on (x, e) and SUP on (x, e, y) for each of the ``evidence_k`` passages the knowledge base returns for x;
- with ``retrieval_task: three_way`` (the paper's and the reference's, the default) also the three-way RET of each
  sentence of y, given x, the top passage and the sentences before it: retrieve, no retrieval, or continue to use
  the evidence. ``instruction_only`` keeps our earlier two-way-only data (a critic that never says continue, for
  generator data of one segment per example).

The teacher sees worked examples before each triple (``teacher_few_shot``, the paper's few-shot prompts). Teachers
call most passages relevant; the reference keeps about 70% of the ``[Relevant]`` ratings (``relevant_keep``), a
deterministic draw per judgement whose drops the manifest counts (``balanced_out/relevance``).

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
from omnimed.methods.selfbiorag.instructions import draw, in_subset, load_instructions, split_of, stage_inputs
from omnimed.methods.selfbiorag.sentences import split_sentences
from omnimed.methods.selfbiorag.tokens import CONTRACT_VERSION, CRITIC_CHOICES, RELEVANT
from omnimed.models.layout import user_text

STAGE = "selfbiorag_critic_data"


@dataclass
class CriticDataConfig:
    """``instructions``: ``world`` or a records path; ``subset``: all | domain | general (see
    :func:`~omnimed.methods.selfbiorag.instructions.in_subset`); ``n_examples``: how many examples are sampled
    (the paper: 5,000); ``evidence_k``: passages judged per example for REL and SUP; ``retrieval_task``:
    three_way | instruction_only; ``relevant_keep``: share of ``[Relevant]`` ratings kept (1.0 keeps all);
    ``teacher_few_shot``: worked examples in the teacher prompt; ``out``: a fixed output folder (default
    ``builds/selfbiorag_critic_data/<settings key>``)."""

    name: str = STAGE
    instructions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train"])
    subset: str = "all"
    n_examples: int = 5000
    evidence_k: int = 2
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    retrieval_task: str = "three_way"
    relevant_keep: float = 0.7
    teacher_few_shot: bool = True
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


def _judgements(ex: InstructionExample, output: str, evidence: list[Passage], three_way: bool) -> list[dict[str, Any]]:
    """The judgements the teacher makes for one example: kind, task, output, passage and preceding sentences."""
    task = user_text(ex.instruction, ex.input)
    items = [{"kind": "retrieval", "task": task, "output": None, "passage": None},
             {"kind": "utility", "task": task, "output": output, "passage": None}]
    for p in evidence:
        items.append({"kind": "relevance", "task": task, "output": None, "passage": p})
        items.append({"kind": "support", "task": task, "output": output, "passage": p})
    if three_way and evidence:
        sentences = split_sentences(output)
        items += [{"kind": "retrieval_three_way", "task": task, "output": sentence, "passage": evidence[0],
                   "preceding": " ".join(sentences[:i]) or None} for i, sentence in enumerate(sentences)]
    return items


def _teacher_request(ex: InstructionExample, item: dict[str, Any], few_shot: bool) -> Request:
    p: Passage | None = item["passage"]
    evidence = prompts.evidence_text(p) if p is not None else None
    meta: dict[str, Any] = {"task": item["kind"], "question_id": ex.id}
    if p is not None:
        meta["passage_id"] = prompts.passage_ref(p)
    if item["output"] is not None:
        meta["answer"] = item["output"]
    return Request(prompts.teacher_messages(item["kind"], item["task"], item["output"], evidence,
                                            item.get("preceding"), few_shot=few_shot), meta)


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
    if cfg.retrieval_task not in ("three_way", "instruction_only"):
        raise ValueError(f"{STAGE}: retrieval_task={cfg.retrieval_task!r}; expected three_way or instruction_only")
    if not 0.0 <= cfg.relevant_keep <= 1.0:
        raise ValueError(f"{STAGE}: relevant_keep={cfg.relevant_keep}; expected a share in [0, 1]")

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
            plans.append((ex, _judgements(ex, output, ev, cfg.retrieval_task == "three_way")))
        requests = [_teacher_request(ex, item, cfg.teacher_few_shot) for ex, items in plans for item in items]
        replies = iter(teacher.generate(requests, params))
        results: list[dict[str, Any] | Failed] = []
        for ex, items in plans:
            got = [next(replies)[0] for _ in items]
            error = next((r.error for r in got if r.error is not None), None)
            if error is not None:
                results.append(Failed(ex.id, error))
                continue
            split = split_of(ex.id, cfg.dev_fraction, cfg.seed)
            made, dropped, balanced = [], {}, 0
            for j, (item, reply) in enumerate(zip(items, got)):
                kind = item["kind"]
                token = last_choice(reply.text, kind)
                if token is None:  # the paper's "dropped": an answer without a valid token of the asked type
                    dropped[kind] = dropped.get(kind, 0) + 1
                    continue
                record_id = f"{ex.id}:{kind}:{j}"
                if token == RELEVANT and draw(f"{cfg.seed}:{record_id}") >= cfg.relevant_keep:
                    balanced += 1
                    continue
                p = item["passage"]
                made.append(InstructionExample(
                    id=record_id,
                    instruction=prompts.critic_instruction(kind, item["task"], item["output"],
                                                           prompts.evidence_text(p) if p is not None else None,
                                                           item.get("preceding")),
                    output=token,
                    dataset="selfbiorag-critic",
                    # the three-way RET is a retrieval label (Table 9's column) with its own question and choices
                    metadata={"type": "retrieval" if kind == "retrieval_three_way" else kind, "judgement": kind,
                              "choices": list(CRITIC_CHOICES[kind]), "split": split, "source_id": ex.id,
                              "passage_id": p.id if p is not None else None, "mismatched": swap[ex.id]},
                ).to_dict())
            results.append({"id": ex.id, "examples": made, "dropped": dropped, "balanced": balanced})
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
    balanced = sum(done[ex.id].get("balanced", 0) for ex in answered)
    if balanced:
        counts["balanced_out/relevance"] = balanced
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
        key = f"{r.metadata.get('judgement', r.metadata['type'])}/{r.output}"
        counts[key] = counts.get(key, 0) + 1
    return counts

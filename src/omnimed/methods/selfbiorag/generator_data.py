"""Stage ``selfbiorag_generator_data``: the trained critic annotates instruction examples with reflective tokens,
giving the generator's training data (self-biorag.txt section 3.4; the paper kept 84k of 120k examples).

For each example (instruction x, output y), with ``segmentation: sentence`` (the paper's and the reference's):

1. the critic predicts RET on x and USE on (x, y);
2. ``[No Retrieval]``: y stays one segment; such examples are kept with probability ``no_retrieval_keep`` (the
   reference keeps 40%), a deterministic draw per example id;
3. ``[Retrieval]``: y is split into sentences. The first is retrieved for; each later one gets the critic's
   three-way RET (given x, the sentences before it and the evidence quoted last): ``[Continue to Use Evidence]``
   and ``[No Retrieval]`` prefix the sentence, ``[Retrieval]`` retrieves again. Retrieving returns ``top_k``
   passages for a query of x and the sentence being written (``query: instruction_sentence``, the reference's: at
   data creation the output is known, so the evidence searched for is the evidence for it; ``query: instruction``,
   our earlier choice, searches with x and the sentences before only, as inference must), the critic judges
   REL (x, e) and SUP (x, e, sentence) for each, and the passage it rates best (relevant before irrelevant, then
   fully before partially supported, then retrieval rank) is quoted; the reference picks among the best at random,
   we keep the deterministic order;
4. the target is written sentence by sentence, USE at the end
   (:func:`~omnimed.methods.selfbiorag.tokens.format_sentences`).

``segmentation: example`` keeps our earlier layout (y as one segment, SUP on the whole output, no
``[Continue to Use Evidence]``), which matches a critic trained with ``retrieval_task: instruction_only``.

The critic writes its tokens freely (greedy, a few tokens). A prediction that is not one of the defined tokens of
its type (the paper filters mispredictions such as ``[Continue Generation]``) costs, with ``invalid: passage``
(the reference's), only that passage: a sentence left with no validly judged passage, an invalid RET or USE drop
the example; ``invalid: example`` drops the example for any invalid token, as our earlier stage did. Drops are
counted by reason. An example whose critic calls failed (connection, timeout, server error) is not dropped:
nothing is recorded for it and the next run asks again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

from omnimed.data.artifacts import MAX_FAILED_SHARE, Failed, StageResult, describe_backend, open_stage
from omnimed.data.records import InstructionExample, Passage, ReflectiveLabels
from omnimed.generation.types import Request, SamplingParams
from omnimed.methods.selfbiorag import prompts
from omnimed.methods.selfbiorag.instructions import draw, in_subset, load_instructions, stage_inputs
from omnimed.methods.selfbiorag.sentences import split_sentences
from omnimed.methods.selfbiorag.tokens import (
    CONTINUE,
    CONTRACT_VERSION,
    NO_RETRIEVE,
    RELEVANT,
    RETRIEVE,
    SUPPORT_CREDIT,
    Sentence,
    format_sentences,
    read_choice,
)
from omnimed.models.layout import request_prompt, user_text

STAGE = "selfbiorag_generator_data"
#: ``query`` values: the instruction with the sentence being written (the reference's), or with the ones before it
QUERIES = ("instruction_sentence", "instruction")


@dataclass
class GeneratorDataConfig:
    """``instructions``: ``world`` or a records path; ``subset``: all | domain | general; ``top_k``: passages the
    critic judges for an example it sends to retrieval; ``sources`` / ``retriever``: where and how they are
    searched (None: every text source, the knowledge base's default method); ``segmentation``: sentence |
    example; ``query``: instruction_sentence | instruction (what retrieval searches with); ``no_retrieval_keep``:
    share of ``[No Retrieval]`` examples kept; ``invalid``: passage | example (what an invalid critic token costs)."""

    name: str = STAGE
    instructions: str = "world"
    splits: list[str] = field(default_factory=lambda: ["train"])
    subset: str = "all"
    max_examples: Optional[int] = None
    top_k: int = 3
    sources: Optional[list[str]] = None
    retriever: Optional[str] = None
    segmentation: str = "sentence"
    query: str = "instruction_sentence"
    no_retrieval_keep: float = 0.4
    invalid: str = "passage"
    critic_max_new_tokens: int = 4
    batch_size: int = 32
    out: Optional[str] = None


def critic_request(kind: str, ex: InstructionExample, output: str | None = None,
                   passage: Passage | None = None, prompt_layout: str = "chat",
                   preceding: str | None = None) -> Request:
    """The critic's question about one example (``output``: the response or the sentence judged; ``preceding``:
    the sentences before it), in the critic model's ``prompt_layout``, with the ids an oracle critic answers
    from."""
    task = user_text(ex.instruction, ex.input)
    evidence = prompts.evidence_text(passage) if passage is not None else None
    meta: dict[str, Any] = {"task": kind, "question_id": ex.id}
    if passage is not None:
        meta["passage_id"] = prompts.passage_ref(passage)
    if output is not None:
        meta["answer"] = output
    content = prompts.critic_instruction(kind, task, output, evidence, preceding)
    return Request(request_prompt(content, "", prompt_layout), meta)


def search_query(ex: InstructionExample, preceding: str | None, sentence: str | None) -> str:
    """What the stage searches the knowledge base with for one sentence: the instruction and its input, then the
    sentence being written (``query: instruction_sentence``) or else the sentences before it."""
    return " ".join(filter(None, [user_text(ex.instruction, ex.input), sentence or preceding]))


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

    if cfg.segmentation not in ("sentence", "example"):
        raise ValueError(f"{STAGE}: segmentation={cfg.segmentation!r}; expected sentence or example")
    if cfg.invalid not in ("passage", "example"):
        raise ValueError(f"{STAGE}: invalid={cfg.invalid!r}; expected passage or example")
    if cfg.query not in QUERIES:
        raise ValueError(f"{STAGE}: query={cfg.query!r}; expected one of {', '.join(QUERIES)}")
    if not 0.0 <= cfg.no_retrieval_keep <= 1.0:
        raise ValueError(f"{STAGE}: no_retrieval_keep={cfg.no_retrieval_keep}; expected a share in [0, 1]")
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
    per_sentence = cfg.segmentation == "sentence"
    with_sentence = cfg.query == "instruction_sentence"  # the sentence being written joins the search

    def annotate(batch: list[InstructionExample]) -> list[dict[str, Any] | Failed]:
        errors: dict[int, str] = {}
        bad: dict[int, list[str]] = {i: [] for i in range(len(batch))}

        def asked(requests: list[Request], kinds: list[str], owners: list[int]) -> list[str | None]:
            """The critic's token per request (None: not one of its judgement's tokens, or the call failed, in
            which case the owning example's first error is recorded)."""
            replies = critic.generate(requests, params) if requests else []
            for i, r in zip(owners, replies):
                if r[0].error is not None:
                    errors.setdefault(i, r[0].error)
            return [None if r[0].error is not None else read_choice(r[0].text, k) for r, k in zip(replies, kinds)]

        n = len(batch)
        first = asked([ask_critic("retrieval", ex) for ex in batch]
                      + [ask_critic("utility", ex, ex.output) for ex in batch],
                      ["retrieval"] * n + ["utility"] * n, [*range(n), *range(n)])
        ret, use = first[:n], first[n:]
        for i in range(n):
            bad[i] += [kind for kind, tok in (("retrieval", ret[i]), ("utility", use[i])) if tok is None]
        # the text segments of each example that retrieves, and what it has written so far
        texts = {i: split_sentences(ex.output) if per_sentence else [ex.output]
                 for i, ex in enumerate(batch) if ret[i] == RETRIEVE and not bad[i]}
        written: dict[int, list[Sentence]] = {i: [] for i in texts}
        quoted: dict[int, list[Passage]] = {}  # in order; a later sentence may continue to use the last one
        for k in range(max((len(t) for t in texts.values()), default=0)):
            active = [i for i in texts if k < len(texts[i]) and not bad[i] and i not in errors]
            preceding = {i: " ".join(texts[i][:k]) or None for i in active}
            decision = {i: RETRIEVE for i in active}
            later = [i for i in active if k > 0]
            for i, tok in zip(later, asked(
                    [ask_critic("retrieval_three_way", batch[i], texts[i][k], quoted[i][-1], preceding=preceding[i])
                     for i in later], ["retrieval_three_way"] * len(later), later)):
                if tok is None:
                    bad[i].append("retrieval_three_way")
                decision[i] = tok
            fetch = [i for i in active if decision[i] == RETRIEVE and i not in errors]
            evidence = (kb.search_sources([search_query(batch[i], preceding[i], texts[i][k] if with_sentence else None)
                                           for i in fetch],
                                          cfg.top_k, sources=cfg.sources, method=cfg.retriever) if fetch else [])
            requests, kinds, owners = [], [], []
            for i, passages in zip(fetch, evidence):
                for p in passages:
                    requests += [ask_critic("relevance", batch[i], passage=p),
                                 ask_critic("support", batch[i], texts[i][k], p, preceding=preceding[i])]
                    kinds += ["relevance", "support"]
                    owners += [i, i]
            tokens = iter(asked(requests, kinds, owners))
            for i, passages in zip(fetch, evidence):
                judged = [(p, next(tokens), next(tokens)) for p in passages]
                valid = [(p, rel, sup) for p, rel, sup in judged if rel is not None and sup is not None]
                if len(valid) < len(judged) and cfg.invalid == "example":
                    bad[i] += sorted({kind for _, rel, sup in judged for kind, tok in
                                      (("relevance", rel), ("support", sup)) if tok is None})
                    continue
                if not valid:
                    bad[i].append("no validly judged evidence" if judged else "no evidence retrieved")
                    continue
                passage, rel, sup = _best(valid)
                quoted.setdefault(i, []).append(passage)
                written[i].append(Sentence(texts[i][k], RETRIEVE, prompts.evidence_text(passage), rel, sup))
            for i in active:
                if decision[i] in (CONTINUE, NO_RETRIEVE):
                    written[i].append(Sentence(texts[i][k], decision[i]))

        results: list[dict[str, Any] | Failed] = []
        for i, ex in enumerate(batch):
            if i in errors:
                results.append(Failed(ex.id, errors[i]))
            elif bad[i]:
                results.append({"id": ex.id, "dropped": sorted(set(bad[i]))})
            elif i not in texts and draw(f"no_retrieval:{ex.id}") >= cfg.no_retrieval_keep:
                results.append({"id": ex.id, "balanced_out": True})
            else:
                sentences = written.get(i) or [Sentence(ex.output, ret[i])]
                top = sentences[0]
                labels = ReflectiveLabels(retrieval=ret[i], utility=use[i], relevance=top.relevance,
                                          support=top.support if top.relevance == RELEVANT else None)
                record = InstructionExample(
                    id=ex.id, instruction=ex.instruction, input=ex.input, output=format_sentences(sentences, use[i]),
                    labels=labels, dataset="selfbiorag-generator",
                    metadata={"split": ex.metadata.get("split"), "source_dataset": ex.dataset,
                              "sentences": len(sentences), "evidence_ids": [q.id for q in quoted.get(i, [])]},
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
    balanced = sum(bool(done[ex.id].get("balanced_out")) for ex in answered)
    counts = {"kept": len(records), "dropped": len(answered) - len(records) - balanced, "examples": len(pool),
              "retrieval": sum(r.labels.retrieval == RETRIEVE for r in records),
              "continue": sum(CONTINUE in r.output for r in records),
              **({"balanced_out/no_retrieval": balanced} if balanced else {}),
              **({"failed": len(failed)} if failed else {}),
              **{f"dropped/{k}": v for k, v in sorted(dropped.items())}}
    stage.finish(records, failed=failed, selfbiorag={"contract": CONTRACT_VERSION, "prompts": prompts.PROMPT_VERSION},
                 generator_counts=counts)
    log(f"{STAGE}: kept {counts['kept']} of {counts['examples']} examples ({counts['dropped']} dropped: "
        + (", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none")
        + f"; {balanced} [No Retrieval] examples left out by no_retrieval_keep={cfg.no_retrieval_keep}"
        + f"; {counts['retrieval']} with evidence, {counts['continue']} with [Continue to Use Evidence]"
        + (f"; {len(failed)} whose critic calls failed are asked again by the next run" if failed else "")
        + f") in {stage.path}")
    return StageResult(stage.path, counts, False)

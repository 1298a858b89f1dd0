"""Stage ``omnirag_pairs`` (Omni-RAG 4.2.3): plans from judged queries, as the planner's training data.

For each question the positive plan P+ takes up to 3 positive queries per source (drawn with ``seed`` where there
are more; a source without any is left empty, i.e. unused); the negative plan P- is built the same way from the
negative queries. ``negatives=matched`` instead gives the DPO pair's P- the sources P+ uses, as many queries in
each as P+ has there: under the paper's rule a P- of mostly-negative exploration is far longer than P+, and DPO's
summed log-probabilities then reward writing fewer queries (in miniature the SPO planner learnt the empty plan).
A question without any positive query is dropped (no source can help it); DPO keeps only the
questions with both plans. Three record sets, each with its manifest:

- ``sft/``: the planner's prompt (Prompt E.7) -> P+ (TRL's conversational prompt / completion);
- ``dpo/``: prompt, chosen P+, rejected P- (TRL's conversational preference format);
- ``sft_neg/``: prompt -> P- (Table 10's "SFT (P-)" planner).

Counts and drop reasons are in the stage's manifest. It calls no backend: a rerun rebuilds nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from omnimed.data.artifacts import StageResult, open_stage
from omnimed.data.records import (
    MAX_QUERIES_PER_SOURCE,
    SOURCE_KINDS,
    Message,
    PreferencePair,
    PromptCompletion,
    SourceQuery,
)
from omnimed.knowledge.plan import format_queries
from omnimed.methods.omnirag import prompts
from omnimed.methods.omnirag.explore import check_sources
from omnimed.methods.omnirag.judge import finished_folder, questions_by_id

STAGE = "omnirag_pairs"
#: the record sets the stage writes, each in its own sub-folder
SETS = ("sft", "dpo", "sft_neg")
#: how the DPO pair's negative plan is drawn: the paper's rule, or matched to the positive plan's sources and counts
NEGATIVES = ("all", "matched")


@dataclass
class PairsConfig:
    """``judge``: the ``omnirag_judge`` output folder; ``questions``: where its questions come from; ``sources``:
    the sources the planner is taught and prompted with (``spo_ood`` leaves one out); ``per_source``: queries per
    source in a plan (the paper: up to 3); ``negatives``: the DPO pair's P-, ``all`` (the paper: up to
    ``per_source`` negatives in every source) or ``matched`` (P+'s sources and query counts; ``sft_neg`` keeps
    the full P-); ``dev_fraction``: questions whose records go to the dev split."""

    name: str = STAGE
    judge: Optional[str] = None
    questions: str = "world"
    sources: list[str] = field(default_factory=lambda: list(SOURCE_KINDS))
    per_source: int = MAX_QUERIES_PER_SOURCE
    negatives: str = "all"
    dev_fraction: float = 0.05
    seed: int = 0
    out: Optional[str] = None


def plan_of(queries: list[SourceQuery], judgement: str, sources: list[str], per_source: int,
            rng: random.Random) -> dict[str, list[str]]:
    """Up to ``per_source`` queries of ``judgement`` per source (a seeded draw where there are more; duplicates
    collapsed); a source without any gets an empty list."""
    plan: dict[str, list[str]] = {}
    for source in sources:
        found = list(dict.fromkeys(q.query for q in queries if q.source == source and q.judgement == judgement))
        plan[source] = rng.sample(found, per_source) if len(found) > per_source else found
    return plan


def _assistant(text: str) -> list[Message]:
    return [Message(role="assistant", content=text)]


def build_pairs(cfg: PairsConfig, *, knowledge: Any, root: str = ".", log=print) -> StageResult:
    """Run the stage (or reuse its finished output)."""
    from omnimed.data.io import load_record_set, read_json, save_record_set

    folder = finished_folder(cfg.judge, "stage.judge", "omnirag_judge")
    check_sources(cfg.sources, "stage.sources")
    if not 1 <= cfg.per_source <= MAX_QUERIES_PER_SOURCE:
        raise ValueError(f"stage.per_source={cfg.per_source}: expected 1 to {MAX_QUERIES_PER_SOURCE} (the plan format's limit)")
    if cfg.negatives not in NEGATIVES:
        raise ValueError(f"stage.negatives={cfg.negatives!r}: expected one of {', '.join(NEGATIVES)}")
    stage = open_stage(STAGE, cfg, root=root, judged=read_json(folder / "manifest.json")["fingerprint"],
                       prompts=prompts.PROMPT_VERSION, knowledge=knowledge.name)
    if stage.finished():
        counts = stage.manifest()["pairs_counts"]
        log(f"{STAGE}: already built in {stage.path} ({counts['sft']} SFT / {counts['dpo']} DPO examples); nothing to do")
        return StageResult(stage.path, counts, True)
    stage.start()
    judged = load_record_set(folder, SourceQuery)
    questions = questions_by_id(cfg.questions, knowledge)
    by_question: dict[str, list[SourceQuery]] = {}
    for r in judged:
        if r.source in cfg.sources:
            by_question.setdefault(r.question_id, []).append(r)
    made: dict[str, list[Any]] = {name: [] for name in SETS}
    drops: Counter[str] = Counter()
    for qid in sorted(by_question):
        q, queries = questions[qid], by_question[qid]
        rng = random.Random(f"{cfg.seed}:{qid}")
        pos = plan_of(queries, "positive", cfg.sources, cfg.per_source, rng)
        neg = plan_of(queries, "negative", cfg.sources, cfg.per_source, rng)
        has_pos, has_neg = any(pos.values()), any(neg.values())
        split = "dev" if rng.random() < cfg.dev_fraction else "train"
        meta = {"question_id": qid, "split": split, "kind": q.metadata.get("kind", ""),
                "positive_sources": [s for s in cfg.sources if pos[s]]}
        prompt = [Message(**m) for m in prompts.planning_messages(q, cfg.sources)]
        chosen = _assistant(format_queries(pos, all_sources=True))
        rejected = _assistant(format_queries(neg, all_sources=True))
        paired, has_paired = rejected, has_neg
        if cfg.negatives == "matched":
            shaped = {s: qs[:len(pos[s])] for s, qs in neg.items()}
            paired, has_paired = _assistant(format_queries(shaped, all_sources=True)), any(shaped.values())
        if not has_pos:
            drops["no positive query in any source"] += 1
        else:
            made["sft"].append(PromptCompletion(id=f"plan-{qid}", prompt=prompt, completion=chosen, metadata=meta))
        if has_neg:
            made["sft_neg"].append(PromptCompletion(id=f"plan-neg-{qid}", prompt=prompt, completion=rejected,
                                                    metadata=meta))
        if has_pos and not has_paired:
            where = "any source" if cfg.negatives == "all" else "the positive plan's sources"
            drops[f"dpo: no negative query in {where}"] += 1
        if has_pos and has_paired:
            made["dpo"].append(PreferencePair(id=f"pair-{qid}", prompt=prompt, chosen=chosen, rejected=paired,
                                              metadata=meta))
    for name in SETS:
        save_record_set(stage.path / name, made[name], extra={"stage": {"name": STAGE, "key": stage.key, "set": name}})
    counts: dict[str, Any] = {
        "questions": len(by_question), **{name: len(made[name]) for name in SETS},
        "dropped": dict(drops),
        "mean_positive_sources": round(sum(len(r.metadata["positive_sources"]) for r in made["sft"])
                                       / max(1, len(made["sft"])), 3),
        **{f"positive_plans_using/{s}": sum(s in r.metadata["positive_sources"] for r in made["sft"])
           for s in cfg.sources},
    }
    stage.finish([], pairs_counts=counts, sets={name: f"{name}/" for name in SETS})
    log(f"{STAGE}: {counts['sft']} SFT, {counts['dpo']} DPO, {counts['sft_neg']} SFT(P-) examples in {stage.path} "
        f"(dropped: {dict(drops) or 'none'})")
    return StageResult(stage.path, counts, False)

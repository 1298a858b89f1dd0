"""``omnimed-evaluate task=world_calibration``: is the synthetic world as hard as a benchmark should be?

The world is useful only while retrieval matters and is not trivial, and while the reader needs the evidence. This
report measures that on the world of the ``knowledge`` config (the knowledge base's own world, so the questions,
the passages and the oracle always agree) and sets each number beside its target (:data:`TARGETS`, set for world
size ``small``):

1. retrieval HIT@k per question kind for BM25, dense and hybrid: a question is a hit when the top k of any of its
   gold sources (each searched apart, as :func:`~omnimed.evaluation.retrieval.world_queries` words them) holds a
   gold passage;
2. gold-source vs wrong-source hits: in a source that holds none of a question's gold, a "hit" is a top-k passage
   that *leaks* the answer (its ``entities`` name both the question's subject and its answer entity);
3. the shared reader (the closed-book / RAG baselines) with the gold passages, with the RAG pipeline's retrieved
   passages and with none, against chance;
4. recency: how often a superseded guideline outranks the current one for a treatment question.

Rates are fractions in metrics.json (targets are printed in percent); ``targets/<name>`` is 1.0 (pass) or 0.0
(fail). A failed target is reported, not raised: the command exits 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from omnimed.data.records import MultipleChoiceQuestion
from omnimed.evaluation.retrieval import METHODS, RetrievalQuery, run_method, world_queries
from omnimed.knowledge.types import Hit


@dataclass
class CalibrationTaskConfig:
    """``split``/``max_questions``/``kinds``: which world MCQs (``kinds``: ``metadata["kind"]`` values, spaces
    or ``_``; None: all); ``methods``: compared retrievers at depth ``k``; ``source_method``: the retriever of
    parts 2 and 4 (recency looks at the top ``recency_k`` guideline passages); ``reader``: false skips part 3."""

    name: str = "world_calibration"
    split: Optional[str] = "test"
    max_questions: Optional[int] = None
    kinds: Optional[list[str]] = None
    methods: list[str] = field(default_factory=lambda: ["bm25", "dense", "hybrid"])
    k: int = 3
    source_method: str = "hybrid"
    recency_k: int = 10
    reader: bool = True


@dataclass
class CalibrationResult:
    metrics: dict[str, float]
    targets: list[tuple[str, str, str, bool]]  # (name, target, measured, passed)
    output_dir: Path
    logger_dir: str | None = None


def kind_of(q: MultipleChoiceQuestion) -> str:
    return str(q.metadata.get("kind", "unknown"))


def means(values: Mapping[str, float], kinds: Mapping[str, str], name: str, metric: str) -> dict[str, float]:
    """``<name>/<metric>`` over every question id of ``values`` and ``<name>/<kind>/<metric>`` per kind (spaces in
    a kind become ``_``)."""
    if not values:
        return {}
    out = {f"{name}/{metric}": sum(values.values()) / len(values)}
    for kind in sorted({kinds[q] for q in values}):
        mine = [v for q, v in values.items() if kinds[q] == kind]
        out[f"{name}/{kind.replace(' ', '_')}/{metric}"] = sum(mine) / len(mine)
    return out


def counts(ids: Sequence[str] | Mapping[str, Any], kinds: Mapping[str, str], name: str) -> dict[str, float]:
    """``<name>/questions`` and ``<name>/<kind>/questions``: how many question ids a part measured."""
    out = {f"{name}/questions": float(len(ids))}
    for q in ids:
        key = f"{name}/{kinds[q].replace(' ', '_')}/questions"
        out[key] = out.get(key, 0.0) + 1
    return out


def question_hits(queries: Sequence[RetrievalQuery], hits: Mapping[str, Sequence[Hit]], k: int) -> dict[str, bool]:
    """Question id -> whether the top ``k`` of any of its queries (ids ``<question>@<source>``) holds a gold
    passage (a chunk counts for the passage it was cut from)."""
    out: dict[str, bool] = {}
    for q in queries:
        qid = q.id.rsplit("@", 1)[0]
        out[qid] = out.get(qid, False) or any(h.doc_id in q.gold for h in list(hits.get(q.id, []))[:k])
    return out


def gold_sources(q: MultipleChoiceQuestion) -> set[str]:
    return set(q.gold_sources) | {pid.split(":", 1)[0] for pid in q.gold_passages}


def wrong_source_queries(questions: Sequence[MultipleChoiceQuestion], sources: Sequence[str],
                         entity_names: Mapping[str, str]) -> list[RetrievalQuery]:
    """One query per (question, source of ``sources`` holding none of its gold), worded exactly as
    :func:`world_queries` words a gold-source query there (the graph's with the subject's name); no gold set."""
    stand_ins = [q.model_copy(update={"gold_passages": [f"{s}:" for s in sources if s not in gold_sources(q)]})
                 for q in questions]
    return [replace(rq, gold=set()) for rq in world_queries(stand_ins, sources, entity_names=entity_names)]


def leaks(hits: Sequence[Hit], subject: str, answer: str, entities: Mapping[str, Sequence[str]], k: int) -> bool:
    """Whether a top-``k`` hit names both ``subject`` and ``answer`` among its passage's ``entities`` (looked up by
    the passage it was cut from, else the hit's own metadata)."""
    for h in list(hits)[:k]:
        names = entities.get(h.doc_id) or h.passage.metadata.get("entities") or []
        if subject in names and answer in names:
            return True
    return False


def source_rates(gold: Mapping[str, bool], wrong: Mapping[str, Mapping[str, bool]], k: int) -> dict[str, float]:
    """``gold``: question -> hit in its gold sources; ``wrong``: question -> {wrong source: leaked}. The share of
    questions with a gold hit, the mean leak over (question, wrong source) pairs (overall and per wrong source) and
    the share of questions that leak in any wrong source."""
    pairs = [(source, v) for per in wrong.values() for source, v in per.items()]
    asked = [per for per in wrong.values() if per]
    out = {
        f"source/gold_hit@{k}": sum(gold.values()) / len(gold) if gold else 0.0,
        f"source/wrong_hit@{k}": sum(v for _, v in pairs) / len(pairs) if pairs else 0.0,
        f"source/any_wrong_hit@{k}": sum(any(p.values()) for p in asked) / len(asked) if asked else 0.0,
        "source/questions": float(len(gold)), "source/wrong_pairs": float(len(pairs)),
    }
    for source in sorted({s for s, _ in pairs}):
        mine = [v for s, v in pairs if s == source]
        out[f"source/{source}/wrong_hit@{k}"] = sum(mine) / len(mine)
    return out


def _about(meta: Mapping[str, Any]) -> list[str]:
    about = meta.get("about") or []
    return [about] if isinstance(about, str) else list(about)


def outdated_first(hits: Sequence[Hit], disease: str, meta: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the first guideline hit about ``disease`` with a status of current or superseded is superseded
    (a superseded one above every current one, or present with no current one); ``meta``: passage id -> metadata."""
    for h in hits:
        m = meta.get(h.doc_id, h.passage.metadata)
        if disease in _about(m) and m.get("status") in ("current", "superseded"):
            return m["status"] == "superseded"
    return False


# ------------------------------------------------------------------------------------------------- targets
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _bm25(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    v = m.get(f"bm25/hit@{k}")
    return None if v is None else (_pct(v), 0.35 <= v <= 0.70)


def _gap(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    """The largest gap in a kind's HIT@k between BM25 and any other method measured."""
    bm25 = {key[5:]: v for key, v in m.items()
            if key.startswith("bm25/") and key.endswith(f"/hit@{k}") and key.count("/") == 2}
    gaps = [abs(v - bm25[rest]) for key, v in m.items() for method, _, rest in [key.partition("/")]
            if method in METHODS and method != "bm25" and rest in bm25]
    return None if not gaps else (f"max {100 * max(gaps):.1f} pts", max(gaps) >= 0.05)


def _wrong(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    v = m.get(f"source/wrong_hit@{k}")
    return None if v is None else (_pct(v), v < 0.20)


def _gold(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    v = m.get("reader/gold/accuracy")
    return None if v is None else (_pct(v), v >= 0.80)


def _none(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    v, chance = m.get("reader/none/knowledge_accuracy"), m.get("reader/knowledge_chance")
    return None if v is None or chance is None else (f"{_pct(v)} (chance {_pct(chance)})", v <= chance + 0.10)


def _between(m: Mapping[str, float], k: int) -> tuple[str, bool] | None:
    got = [m.get(f"reader/{c}/accuracy") for c in ("none", "retrieved", "gold")]
    if None in got:
        return None
    none, retrieved, gold = got
    return f"{_pct(none)} <= {_pct(retrieved)} <= {_pct(gold)}", none <= retrieved <= gold


#: name -> (what it asks, check(metrics, k) -> (measured, passed), None when not measured in this run)
TARGETS: dict[str, tuple[str, Callable[[Mapping[str, float], int], tuple[str, bool] | None]]] = {
    "bm25_hit": ("BM25 HIT@k overall in 35-70%", _bm25),
    "method_gap": ("another method differs from BM25 by >= 5 pts on some kind", _gap),
    "wrong_source": ("wrong-source (leaking) hit rate < 20%", _wrong),
    "reader_gold": ("reader with gold evidence >= 80%", _gold),
    "reader_none": ("closed book <= chance + 10 pts on knowledge questions", _none),
    "reader_retrieved": ("none <= retrieved <= gold evidence", _between),
}


def check_targets(metrics: Mapping[str, float], k: int) -> list[tuple[str, str, str, bool]]:
    """(name, target, measured, passed) for every target this run measured."""
    out = []
    for name, (what, check) in TARGETS.items():
        got = check(metrics, k)
        if got is not None:
            out.append((name, what, *got))
    return out


# ------------------------------------------------------------------------------------------------- parts
def _reader(cfg: Any, questions: list[MultipleChoiceQuestion], kb: Any, passages: Mapping[str, Any],
            kinds: Mapping[str, str], output_dir: Path, rows: list[dict]) -> dict[str, float]:
    """Part 3: the closed-book and RAG baselines' reader with gold, retrieved and no evidence."""
    from omnimed.data.artifacts import describe_backend
    from omnimed.evaluation.runner import gate_failures
    from omnimed.methods.backends import run_backend
    from omnimed.methods.baselines.closed_book import ClosedBook, PipelineConfig
    from omnimed.methods.baselines.rag import RAG

    if not isinstance(cfg.pipeline, PipelineConfig):
        raise ValueError(f"task=world_calibration reads with the baselines' reader; pipeline={cfg.pipeline.name} "
                         "has another config (pick the closed-book or RAG pipeline, or task.reader=false)")
    closed, rag = ClosedBook(cfg.pipeline), RAG(cfg.pipeline)
    backend_cfg, model = closed.serve(cfg.backend, cfg.model)
    backend = run_backend(backend_cfg, model=model, knowledge=cfg.knowledge, cache_root=cfg.paths.cache)
    gold = [[passages[p] for p in q.gold_passages if p in passages] for q in questions]  # self-contained: []
    runs = {"gold": lambda: closed.answer(questions, backend, None, seed=cfg.seed, evidence=gold),
            "retrieved": lambda: rag.answer(questions, backend, kb, seed=cfg.seed),
            "none": lambda: closed.answer(questions, backend, None, seed=cfg.seed)}
    knowledge = {q.id for q in questions if q.gold_passages}
    metrics = counts([q.id for q in questions], kinds, "reader")
    errors = []
    for condition, answer in runs.items():
        answers = answer()
        correct = {q.id: float(a.correct) for q, a in zip(questions, answers)}
        metrics.update(means(correct, kinds, f"reader/{condition}", "accuracy"))
        if knowledge:
            metrics[f"reader/{condition}/knowledge_accuracy"] = sum(correct[q] for q in knowledge) / len(knowledge)
        for q, a in zip(questions, answers):
            errors += [a.error] if a.error else []
            rows.append({"part": "reader", "condition": condition, "question_id": q.id, "kind": kinds[q.id],
                         "gold": q.answer, "prediction": a.prediction, "correct": a.correct, "problem": a.problem,
                         "evidence": a.evidence, "error": a.error})
    gate_failures(output_dir, rows, errors, what="task=world_calibration's reader", backend=describe_backend(backend),
                  max_share=cfg.max_failed_share, unit="answers")
    chance = {q.id: 1.0 / len(q.options) for q in questions}
    metrics["reader/chance"] = sum(chance.values()) / len(chance)
    if knowledge:
        metrics["reader/knowledge_chance"] = sum(chance[q] for q in knowledge) / len(knowledge)
    return metrics


def run_calibration(cfg: Any, output_dir: Any) -> CalibrationResult:
    """Measure the four parts on the knowledge base's world, check the targets, write ``metrics.json`` and
    ``predictions.jsonl`` (every search's top ids and every answer, tagged by ``part``) and log them."""
    from omnimed.evaluation.runner import finish_run
    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.corpus import world_of

    task, kcfg, k = cfg.task, cfg.knowledge, cfg.task.k
    output_dir = Path(output_dir)
    unknown = [m for m in [*task.methods, task.source_method] if m not in METHODS]
    if unknown:
        raise ValueError(f"task.methods / task.source_method: unknown {unknown}; expected some of {', '.join(METHODS)}")
    if kcfg.corpus != "world":
        raise ValueError(f"task=world_calibration needs a world knowledge base; knowledge={kcfg.name}")
    if any(m.endswith("+rerank") for m in [*task.methods, task.source_method]):
        kcfg.rerank.enabled = True
    kb = build_knowledge_base(kcfg, Path(cfg.paths.root), progress=True)
    world = world_of(kcfg)
    questions = [q for q in world.questions if (task.split is None or q.split == task.split)
                 and (not task.kinds or {kind_of(q), kind_of(q).replace(" ", "_")} & set(task.kinds))]
    questions = questions[: task.max_questions or None]
    if not questions:
        raise ValueError(f"task.split={task.split} task.kinds={task.kinds}: no world question")
    kinds = {q.id: kind_of(q) for q in questions}
    names = {e.id: e.name for e in world.model.entities.values()}
    passages = {p.id: p for p in world.passages}
    meta = {pid: p.metadata for pid, p in passages.items()}
    rows: list[dict] = []
    metrics: dict[str, float] = {}

    # 1. HIT@k per kind and method (questions with gold passages in the base's sources)
    queries = world_queries([q for q in questions if q.gold_passages], kb.sources, entity_names=names)
    hits = {m: run_method(kb, queries, m, k) for m in dict.fromkeys([*task.methods, task.source_method])}
    per_method = {m: question_hits(queries, h, k) for m, h in hits.items()}
    for m in task.methods:
        metrics.update(means({q: float(v) for q, v in per_method[m].items()}, kinds, m, f"hit@{k}"))
        rows += [{"part": "retrieval", "method": m, "query_id": q.id, "gold": sorted(q.gold),
                  "top": [h.doc_id for h in hits[m][q.id][:k]]} for q in queries if q.id in hits[m]]
    metrics.update(counts(per_method[task.source_method], kinds, "retrieval"))

    # 2. gold vs wrong sources (with the source method)
    asked = {q.id: q for q in questions if q.gold_passages and q.id in per_method[task.source_method]}
    wrong_q = wrong_source_queries(list(asked.values()), kb.sources, names)
    wrong_hits = run_method(kb, wrong_q, task.source_method, k)
    entities = {pid: m.get("entities", []) for pid, m in meta.items()}
    wrong: dict[str, dict[str, bool]] = {qid: {} for qid in asked}
    for rq in wrong_q:
        q = asked[rq.id.rsplit("@", 1)[0]]
        subject, answer = q.metadata.get("subject"), q.metadata.get("answer_entity")
        if subject and answer:
            wrong[q.id][rq.source] = leaks(wrong_hits.get(rq.id, []), subject, answer, entities, k)
            rows.append({"part": "wrong_source", "query_id": rq.id, "leak": wrong[q.id][rq.source],
                         "top": [h.doc_id for h in wrong_hits.get(rq.id, [])[:k]]})
    metrics.update(source_rates({qid: per_method[task.source_method][qid] for qid in asked}, wrong, k))

    # 4. recency: treatment questions whose disease has a superseded guideline recommendation
    superseded = {d for m in meta.values() if m.get("status") == "superseded" for d in _about(m)}
    treat = [q for q in questions if kinds[q.id] == "treatment" and q.metadata.get("subject") in superseded]
    if treat and "guideline" in kb.sources:
        rq = [RetrievalQuery(f"{q.id}@guideline", "guideline", q.question) for q in treat]
        found = run_method(kb, rq, task.source_method, task.recency_k)
        first = [outdated_first(found[r.id], q.metadata["subject"], meta) for q, r in zip(treat, rq)]
        metrics["recency/outdated_above_current"] = sum(first) / len(first)
        metrics["recency/questions"] = float(len(first))

    if task.reader:  # 3.
        metrics.update(_reader(cfg, questions, kb, passages, kinds, output_dir, rows))
    targets = check_targets(metrics, k)
    metrics.update({f"targets/{name}": float(ok) for name, _, _, ok in targets})
    logger_dir = finish_run(cfg, output_dir, rows=rows, metrics=metrics, run_name=f"world_calibration-{kcfg.name}",
                            job_type="evaluate-calibration", lineage={"knowledge_dir": str(kb.directory),
                                                                      "questions": len(questions)})
    return CalibrationResult(metrics, targets, output_dir, logger_dir)


def report(result: CalibrationResult, cfg: Any, console: Any) -> float | None:
    """Print the per-kind numbers and each target with its measurement and verdict; returns the share of targets
    met (a failed target does not fail the command)."""
    from rich.table import Table

    m, k = result.metrics, cfg.task.k
    kinds = sorted({key.split("/")[1] for key in m if key.count("/") == 2 and key.endswith("/questions")
                    and key.startswith(("retrieval/", "reader/"))})
    cols = {**{x: f"{x}/{{}}hit@{k}" for x in cfg.task.methods},
            **{c[:4]: f"reader/{c}/{{}}accuracy" for c in ("gold", "retrieved", "none") if cfg.task.reader}}
    table = Table(title=f"world calibration on {cfg.knowledge.name} (split {cfg.task.split}): retrieval HIT@{k} "
                        "and reader accuracy with gold / retrieved / no evidence, %")
    table.add_column("kind")
    table.add_column("n", justify="right")
    for col in cols:
        table.add_column(col, justify="right")
    for kind in [*kinds, None]:
        part = f"{kind}/" if kind else ""
        n = max(m.get(f"retrieval/{part}questions", 0), m.get(f"reader/{part}questions", 0))
        table.add_row(kind.replace("_", " ") if kind else "all", f"{n:.0f}",
                      *[f"{100 * m[c.format(part)]:.1f}" if c.format(part) in m else "-" for c in cols.values()])
    console.print(table)
    checks = Table(title="targets (world size small)")
    for col in ("target", "measured", "verdict"):
        checks.add_column(col)
    for _, what, measured, ok in result.targets:
        checks.add_row(what, measured, "[green]pass[/]" if ok else "[red]FAIL[/]")
    console.print(checks)
    console.print(f"source: gold hit {_pct(m.get(f'source/gold_hit@{k}', 0))}, any-wrong-source leak "
                  f"{_pct(m.get(f'source/any_wrong_hit@{k}', 0))}; recency: outdated above current "
                  + (f"{_pct(m['recency/outdated_above_current'])} of {m['recency/questions']:.0f}"
                     if "recency/questions" in m else "not measured"))
    failed = [name for name, _, _, ok in result.targets if not ok]
    console.print(f"targets failed: {', '.join(failed)}" if failed else f"all {len(result.targets)} targets met",
                  soft_wrap=True)
    console.print(f"metrics.json and predictions.jsonl in {result.output_dir}"
                  + (f"; logger files in {result.logger_dir}" if result.logger_dir else ""))
    return sum(ok for *_, ok in result.targets) / len(result.targets) if result.targets else None

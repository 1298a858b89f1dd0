"""Omni-RAG's Source Planning Optimisation on the tiny world: exploration replies parsed as far as they are valid,
the judge's verdicts backed by what each query retrieves, positive / negative plans with the paper's rules, and the
planner + reader pipeline through ``omnimed-evaluate`` with its plan statistics, malformed plans counted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.data.io import load_record_set
from omnimed.data.records import PreferencePair, PromptCompletion, SourceQuery
from omnimed.generation.oracle import OracleBackend
from omnimed.generation.types import Generation
from omnimed.knowledge.plan import parse_exploration, parse_plan

BIN = Path(sys.executable).parent


def test_an_exploration_reply_is_read_as_far_as_it_is_valid_and_what_was_dropped_is_named():
    reply = ("<book>a ; b ; c ; d ; e ; f ; g</book><guideline>x ; y</guideline><think>hmm</think>"
             "<research>r1 ; r2 ; r3 ; r4 ; r5 ; r6<wiki>w</wiki>")
    queries, problems = parse_exploration(reply, 6)
    assert queries["book"] == ["a", "b", "c", "d", "e", "f"]  # the 7th is dropped, not the whole tag
    assert queries["guideline"] == ["x", "y"] and queries["wiki"] == ["w"]
    assert len(queries["research"]) == 6  # unclosed: kept up to the next tag
    text = " | ".join(problems)
    for expected in ("more than 6 queries for book", "unknown tag <think>", "unclosed <research>",
                     "2 queries for guideline (expected 6)", "1 queries for wiki (expected 6)", "missing tags"):
        assert expected in text
    assert parse_exploration(None, 6) == ({}, ["expected text, got NoneType"])


@pytest.fixture(scope="module")
def built(tmp_path_factory, world_tiny, kb_tiny):
    """The three stages on the tiny world with the oracle as expert and judge."""
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.omnirag.explore import ExploreConfig, build_exploration
    from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements
    from omnimed.methods.omnirag.pairs import PairsConfig, build_pairs

    root = tmp_path_factory.mktemp("omnirag")
    knowledge = KnowledgeConfig(name="world_tiny", world_size="tiny")
    oracle = OracleBackend(world_tiny)
    quiet = lambda *a, **k: None  # noqa: E731
    explore = build_exploration(ExploreConfig(n_questions=16, out=str(root / "explore")), expert=oracle,
                                knowledge=knowledge, progress=False, log=quiet)
    judge = build_judgements(JudgeConfig(explore=str(explore.path), out=str(root / "judge")), judge=oracle,
                             kb=kb_tiny, knowledge=knowledge, progress=False, log=quiet)
    pairs = build_pairs(PairsConfig(judge=str(judge.path), out=str(root / "pairs")), knowledge=knowledge, log=quiet)
    return {"explore": explore, "judge": judge, "pairs": pairs, "knowledge": knowledge, "oracle": oracle}


def test_the_expert_writes_n_queries_per_source_and_the_manifest_holds_their_diversity(built):
    explored = load_record_set(built["explore"].path, SourceQuery)
    counts = built["explore"].counts
    assert counts["questions"] == 16 and counts["queries"] == len(explored) == 16 * 5 * 6
    assert counts["replies_with_problems"] == 0
    for source in ("book", "guideline", "research", "wiki", "graph"):
        assert 0 < counts[f"query_diversity/{source}"] < 1  # Eq. 5: a mean cosine distance
    graph = [r.query for r in explored if r.source == "graph"]
    assert all(" , " in q for q in graph)  # term , question


def test_a_query_is_positive_exactly_when_its_documents_state_a_gold_fact(built, world_tiny):
    judged = load_record_set(built["judge"].path, SourceQuery)
    oracle = world_tiny.oracle
    assert {r.judgement for r in judged} == {"positive", "negative"}
    assert sum(bool(r.passage_ids) for r in judged) > len(judged) / 2
    for r in judged:
        assert len(r.passage_ids) <= 5  # at most stage.k documents (BM25 returns only those sharing a term)
        gold_facts = set(oracle.facts_of(r.question_id)["facts"])
        stated = {f for pid in r.passage_ids for p in oracle.passages_stating(gold_facts) if p.id == pid
                  for f in p.metadata["facts"]}
        assert (r.judgement == "positive") == bool(stated & gold_facts)


def test_plans_follow_the_papers_rules_and_are_trl_conversational(built):
    from trl.data_utils import is_conversational

    from omnimed.knowledge.plan import parse_plan

    judged = load_record_set(built["judge"].path, SourceQuery)
    path = built["pairs"].path
    sft, dpo = load_record_set(path / "sft", PromptCompletion), load_record_set(path / "dpo", PreferencePair)
    counts = built["pairs"].counts
    assert counts["sft"] == len(sft) > 0 and counts["dpo"] == len(dpo) > 0
    assert counts["questions"] == counts["sft"] + counts["dropped"].get("no positive query in any source", 0)
    for pair in dpo:
        qid = pair.metadata["question_id"]
        chosen = parse_plan(pair.chosen[0].content)
        rejected = parse_plan(pair.rejected[0].content)
        assert chosen.ok and rejected.ok  # every source tag, empty where no query of its kind exists
        for plan, verdict in ((chosen.plan, "positive"), (rejected.plan, "negative")):
            for source, queries in plan.queries.items():
                assert len(queries) <= 3
                mine = {r.query for r in judged
                        if r.question_id == qid and r.source == source and r.judgement == verdict}
                assert set(queries) <= mine and (queries or not mine)
        assert is_conversational({"prompt": [m.model_dump() for m in pair.prompt]})
    assert {r.metadata["question_id"] for r in dpo} <= {r.metadata["question_id"] for r in sft}


def test_matched_negatives_mirror_the_positive_plans_shape_and_a_bad_choice_is_named(built, tmp_path):
    """stage.negatives=matched: the DPO pair's P- writes negatives only where P+ writes positives, no more of them,
    so DPO cannot win by writing fewer queries; sft_neg keeps the paper's full P-."""
    from omnimed.methods.omnirag.pairs import PairsConfig, build_pairs

    quiet = lambda *a, **k: None  # noqa: E731
    matched = build_pairs(PairsConfig(judge=str(built["judge"].path), out=str(tmp_path / "matched"),
                                      negatives="matched"), knowledge=built["knowledge"], log=quiet)
    pairs = load_record_set(matched.path / "dpo", PreferencePair)
    assert pairs
    for pair in pairs:
        chosen = parse_plan(pair.chosen[0].content).plan.queries
        rejected = parse_plan(pair.rejected[0].content).plan.queries
        assert any(rejected.values())
        for source, queries in rejected.items():
            assert len(queries) <= len(chosen.get(source, []))
    paper = load_record_set(built["pairs"].path / "sft_neg", PromptCompletion)
    assert load_record_set(matched.path / "sft_neg", PromptCompletion) == paper
    with pytest.raises(ValueError, match="stage.negatives='shorter'"):
        build_pairs(PairsConfig(judge=str(built["judge"].path), out=str(tmp_path / "bad"), negatives="shorter"),
                    knowledge=built["knowledge"], log=quiet)


def test_a_rerun_of_each_stage_does_nothing(built, kb_tiny):
    from omnimed.methods.omnirag.explore import ExploreConfig, build_exploration
    from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements
    from omnimed.methods.omnirag.pairs import PairsConfig, build_pairs

    class NoCalls:
        name, model_id = "oracle", built["oracle"].model_id

        def generate(self, requests, params):
            raise AssertionError("a finished stage asked its backend")

    quiet = lambda *a, **k: None  # noqa: E731
    k = built["knowledge"]
    assert build_exploration(ExploreConfig(n_questions=16, out=str(built["explore"].path)), expert=NoCalls(),
                             knowledge=k, progress=False, log=quiet).reused
    assert build_judgements(JudgeConfig(explore=str(built["explore"].path), out=str(built["judge"].path)),
                            judge=NoCalls(), kb=kb_tiny, knowledge=k, progress=False, log=quiet).reused
    assert build_pairs(PairsConfig(judge=str(built["judge"].path), out=str(built["pairs"].path)), knowledge=k,
                       log=quiet).reused


def test_judging_without_an_exploration_says_which_stage_to_run(tmp_path, kb_tiny, world_tiny):
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements

    with pytest.raises(FileNotFoundError, match=r"stage.explore=.*omnimed-build stage=omnirag_explore"):
        build_judgements(JudgeConfig(explore=str(tmp_path / "nothing")), judge=OracleBackend(world_tiny), kb=kb_tiny,
                         knowledge=KnowledgeConfig(name="world_tiny", world_size="tiny"))


def _evaluate(tmp_path: Path, *overrides: str) -> dict:
    out = tmp_path / "run"
    res = subprocess.run([str(BIN / "omnimed-evaluate"), "task=qa", "pipeline=omnirag", "knowledge=world_tiny",
                          "task.dataset=world_mcq", "logger=none", f"paths.root={tmp_path}",
                          f"paths.cache={tmp_path}/cache", f"hydra.run.dir={out}", *overrides],
                         cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return {"metrics": json.loads((out / "metrics.json").read_text()),
            "rows": [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]}


def test_the_oracle_planner_retrieves_every_gold_passage_through_omnimed_evaluate(tmp_path):
    run = _evaluate(tmp_path, "backend=oracle")
    m = run["metrics"]
    assert m["accuracy"] == 1.0 and m["plan/gold_recall"] == 1.0 and m["plan/malformed"] == 0.0
    assert m["plan/queries"] > 0 and any(k.startswith("words_per_query/") for k in m)
    for row in run["rows"]:
        assert parse_plan(row["plan"]).ok and 0 < len(row["evidence"]) <= 5  # pipeline.top_k


def test_a_plan_only_run_keeps_the_plan_statistics_and_reports_no_accuracy(tmp_path):
    """pipeline.read=false (tables 12 and 13): the plans and what they retrieve, without the reader; the run states
    no accuracy (no question was answered, so none is right, wrong or missing)."""
    run = _evaluate(tmp_path, "backend=oracle", "pipeline.read=false")
    m = run["metrics"]
    assert not [k for k in m if k.startswith(("accuracy", "missing_answers"))]
    assert m["n"] > 0 and m["plan/gold_recall"] == 1.0 and any(k.startswith("words_per_query/") for k in m)
    for row in run["rows"]:
        assert row["prediction"] is None and row["error"] is None and 0 < len(row["evidence"]) <= 5


class ScriptedPlanner:
    """A planner whose replies are fixed texts, in turn."""

    name, model_id = "scripted", "scripted-planner"

    def __init__(self, texts):
        self.texts = texts

    def generate(self, requests, params):
        return [[Generation(self.texts[i % len(self.texts)], "stop")] for i in range(len(requests))]


def test_a_malformed_plan_is_counted_and_answered_never_a_crash(world_tiny, kb_tiny, monkeypatch):
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    method = OmniRAG(OmniRAGConfig(drop_sources=["graph"]))
    texts = ["<book>Groshulide mechanism of action ; a ; b ; c</book><wiki>unclosed",
             "no tags at all", "<book></book><guideline></guideline><research></research><wiki></wiki><graph></graph>"]
    monkeypatch.setattr(method, "serve_planner", lambda kb: ScriptedPlanner(texts))
    questions = [q for q in world_tiny.questions if q.split == "test"][:3]
    answers = method.answer(questions, OracleBackend(world_tiny), kb_tiny, seed=0)
    assert [a.question_id for a in answers] == [q.id for q in questions]
    first, second, third = (a.extras for a in answers)
    assert first["plan_queries"]["book"] == ["Groshulide mechanism of action", "a", "b"]
    assert any("more than 3 queries for book" in p for p in first["plan_problems"])
    assert any("unclosed <wiki>" in p for p in first["plan_problems"])
    assert second["plan_queries"] == {} and "no source tags found" in second["plan_problems"]
    assert third["plan_problems"] == [] and answers[2].evidence == []  # every source left empty: nothing read
    assert [x["plan_text"] for x in (first, second, third)] == texts  # the reply itself, for a later parser
    metrics = method.metrics(answers)
    assert metrics["plan/malformed"] == pytest.approx(2 / 3)


class NoReader:
    """A reader backend that fails the test if it is asked anything."""

    name, model_id = "no-reader", "no-reader"

    def __getattr__(self, call):
        raise AssertionError(f"the reader was called ({call}) in a plan-only run")


def test_a_plan_only_run_never_calls_the_reader(world_tiny, kb_tiny, monkeypatch):
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    method = OmniRAG(OmniRAGConfig(read=False))
    monkeypatch.setattr(method, "serve_planner", lambda kb: OracleBackend(world_tiny))
    questions = [q for q in world_tiny.questions if q.split == "test"][:3]
    answers = method.answer(questions, NoReader(), kb_tiny, seed=0)
    assert not method.reads() and [a.prediction for a in answers] == [None] * 3
    assert all(a.evidence for a in answers)  # what would have been read
    assert method.metrics(answers)["plan/gold_recall"] == 1.0


def test_per_source_plan_statistics_that_no_plan_defines_are_reported_with_why():
    """words_per_query/<source> needs one query sent there, query_diversity/<source> a plan with two: where no plan
    has them the metric is absent and undefined_metrics says why (a table shows it instead of a failure)."""
    from omnimed.methods.answer import Answer
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    def answer(queries):
        return Answer("q", None, False, extras={"plan_queries": queries, "plan_problems": [],
                                                "gold_recall": None, "gold_shown": None})

    answers = [answer({"guideline": ["a b", "c d e"], "wiki": ["f"]}), answer({"wiki": ["g h"]})]
    method = OmniRAG(OmniRAGConfig(read=False))
    m, undefined = method.metrics(answers), method.undefined_metrics(answers)
    assert m["words_per_query/wiki"] == 1.5 and "words_per_query/graph" not in m and "query_diversity/wiki" not in m
    assert undefined["words_per_query/graph"] == "none of the 2 plans sent a query to graph"
    assert undefined["query_diversity/wiki"] == "none of the 2 plans sent two queries to wiki"
    assert not set(undefined) & set(m)  # a reason only where the value is absent


def test_gold_recall_is_also_given_by_how_the_question_names_its_subject():
    """A world question names its subject by its passages' name or by an alias only the graph links to it; the
    plan metrics split gold recall that way, since a planner can copy a name but cannot know an unseen alias."""
    from omnimed.methods.answer import Answer
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    def answer(named_by, recall):
        return Answer("q", "A", True, extras={"plan_queries": {"guideline": ["x"]}, "plan_problems": [],
                                              "gold_recall": recall, "gold_shown": recall, "named_by": named_by})

    m = OmniRAG(OmniRAGConfig()).metrics([answer("alias", 0.0), answer("alias", 0.5), answer("name", 1.0),
                                          answer(None, 1.0)])
    assert m["plan/gold_recall"] == pytest.approx(2.5 / 4)
    assert m["plan/gold_recall/named_by_alias"] == pytest.approx(0.25)
    assert m["plan/gold_shown/named_by_name"] == 1.0
    assert not any("named_by_None" in k for k in m)


def test_the_baselines_signals_judge_the_same_documents_and_are_scored_against_the_oracle(built, tmp_path, kb_tiny):
    """The oracle judge agrees with itself; Trainable Planning's signal, with a reader that knows every answer
    anyway (the oracle), finds no query that helps: the paper's 'intrinsic knowledge overshadows retrieval'."""
    from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements

    counts = built["judge"].counts
    assert counts["agreement/accuracy"] == counts["agreement/f1"] == 1.0
    assert counts["agreement/oracle_positive"] == counts["positive"] > 0
    quiet = lambda *a, **k: None  # noqa: E731
    downstream = build_judgements(JudgeConfig(explore=str(built["explore"].path), signal="downstream",
                                              out=str(tmp_path / "downstream")), judge=built["oracle"], kb=kb_tiny,
                                  knowledge=built["knowledge"], progress=False, log=quiet).counts
    assert downstream["positive"] == 0 and downstream["agreement/recall"] == 0.0
    assert downstream["agreement/accuracy"] == pytest.approx(counts["negative"] / counts["queries"], abs=1e-4)


class _ForgetfulReader:
    """A reader that answers the questions of ``wrong_alone`` wrongly without documents and defers to the oracle
    (who knows every answer) otherwise; it records which questions it was shown documents for."""

    name = model_id = "forgetful"

    def __init__(self, oracle, wrong_alone):
        self.oracle, self.wrong_alone, self.read_with_docs = oracle, wrong_alone, set()

    def generate(self, requests, params):
        out = []
        for r in requests:
            if r.meta["passage_ids"]:
                self.read_with_docs.add(r.meta["question_id"])
            if not r.meta["passage_ids"] and r.meta["question_id"] in self.wrong_alone:
                out.append([Generation(text="no idea")])
            else:
                out.extend(self.oracle.generate([r], params))
        return out


def test_trainable_planning_reads_documents_only_for_questions_the_reader_gets_wrong_alone(built, tmp_path, kb_tiny):
    """A query is positive exactly when its documents turn the reader's wrong answer right; a question answered
    right without documents has no positive query, and its queries' documents are never read (the stage's cost
    is the reader's calls)."""
    from omnimed.methods.omnirag.judge import JudgeConfig, build_judgements

    explored = load_record_set(built["explore"].path, SourceQuery)
    qids = sorted({r.question_id for r in explored})
    reader = _ForgetfulReader(built["oracle"], set(qids[::2]))
    result = build_judgements(JudgeConfig(explore=str(built["explore"].path), signal="downstream",
                                          out=str(tmp_path / "downstream")), judge=reader, kb=kb_tiny,
                              knowledge=built["knowledge"], progress=False, log=lambda *a, **k: None)
    judged = load_record_set(result.path, SourceQuery)
    assert reader.read_with_docs and reader.read_with_docs <= reader.wrong_alone
    for r in judged:
        assert (r.judgement == "positive") == (r.question_id in reader.wrong_alone and bool(r.passage_ids))
    assert result.counts["positive"] > 0


class _OverlapReranker:
    """A reranker without a model: the share of the question's words a text holds."""

    def rerank(self, query, texts, top_k):
        words = set(query.lower().split())
        scores = [len(words & set(t.lower().split())) / len(words) for t in texts]
        return sorted(enumerate(scores), key=lambda x: -x[1])[:top_k]


def test_rafe_chooses_its_threshold_on_the_dev_queries_and_labels_every_query_by_it(built, tmp_path, kb_tiny,
                                                                                     monkeypatch):
    """RaFe's signal without a reranking knowledge base: the reranker knowledge.rerank names is built for it,
    the threshold is the F1-best against the oracle on the first questions' queries, and each query is positive
    exactly when its best score reaches that threshold."""
    from omnimed.knowledge import build
    from omnimed.methods.omnirag.judge import JudgeConfig, best_rerank_scores, build_judgements, questions_by_id

    monkeypatch.setattr(build, "build_reranker", lambda knowledge, encoder: _OverlapReranker())
    quiet = lambda *a, **k: None  # noqa: E731
    searched: list[str] = []  # every query the stage retrieves for
    search_batch = kb_tiny.search_batch

    def counted(source, queries, *args, **kwargs):
        searched.extend(queries)
        return search_batch(source, queries, *args, **kwargs)

    monkeypatch.setattr(kb_tiny, "search_batch", counted)
    cfg = JudgeConfig(explore=str(built["explore"].path), signal="rerank", rerank_threshold=None,
                      threshold_dev_questions=6, out=str(tmp_path / "rafe"))
    result = build_judgements(cfg, judge=built["oracle"], kb=kb_tiny, knowledge=built["knowledge"], progress=False,
                              log=quiet)
    monkeypatch.setattr(kb_tiny, "search_batch", search_batch)
    counts = result.counts
    explored = load_record_set(built["explore"].path, SourceQuery)
    assert len(searched) == len(explored)  # the threshold's development queries are not retrieved a second time
    assert counts["rerank_threshold_dev/questions"] == 6 and counts["rerank_threshold_dev/queries"] == 6 * 5 * 6
    threshold = counts["rerank_threshold"]
    judged = load_record_set(result.path, SourceQuery)
    questions = questions_by_id("world", built["knowledge"])
    docs = {r.id: kb_tiny.search_batch(r.source, [r.query], 5)[0] for r in judged}
    scores = best_rerank_scores(_OverlapReranker(), judged, docs, questions)
    assert {r.judgement for r in judged} == {"positive", "negative"}
    assert all((r.judgement == "positive") == (scores[r.id] >= threshold - 1e-6) for r in judged)
    assert 0 < counts["agreement/f1"] <= 1  # scored against the oracle like every signal
    given = build_judgements(JudgeConfig(explore=str(built["explore"].path), signal="rerank", rerank_threshold=2.3,
                                         out=str(tmp_path / "given")), judge=built["oracle"], kb=kb_tiny,
                             knowledge=built["knowledge"], progress=False, log=quiet).counts
    assert given["positive"] == 0 and given["rerank_threshold"] == 2.3  # an overlap share never reaches 2.3
    real = dataclasses.replace(built["knowledge"], corpus="realdata", name="realdata")
    with pytest.raises(ValueError, match="stage.rerank_threshold=null .* knowledge=realdata is not a world"):
        build_judgements(dataclasses.replace(cfg, out=str(tmp_path / "real")), judge=built["oracle"], kb=kb_tiny,
                         knowledge=real, progress=False, log=quiet)


def test_the_threshold_is_the_one_whose_labels_agree_best_with_the_truth_by_f1():
    from sklearn.metrics import f1_score

    from omnimed.methods.omnirag.judge import choose_threshold

    scores = [0.1, 0.4, 0.35, 0.8, 0.7, 0.2, 0.9, float("-inf"), 0.5, 0.45]
    truth = [False, True, False, True, False, False, True, False, True, False]
    chosen = choose_threshold(scores, truth)
    best = max(f1_score(truth, [s >= t for s in scores]) for t in scores if t > float("-inf"))
    assert f1_score(truth, [s >= chosen for s in scores]) == pytest.approx(best)
    with pytest.raises(ValueError, match="no positive query"):
        choose_threshold([0.2, 0.3], [False, False])


def test_a_trained_planner_beside_the_oracle_reader_is_served_from_its_export_and_cached(kb_tiny, monkeypatch):
    """planner_backend=hf with backend=oracle: the planner runs on hf from pipeline.checkpoints, and its calls are
    memoised (the oracle reader caches nothing, which must not switch off the planner's cache)."""
    from omnimed.generation.factory import BackendConfig
    from omnimed.methods import backends
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    served = []
    monkeypatch.setattr(backends, "run_backend", lambda cfg, **kw: served.append((cfg, kw["cache_root"])) or "planner")
    method = OmniRAG(OmniRAGConfig(planner="sft", planner_backend="hf", checkpoints={"sft": "/exports/sft/hf"}))
    method.serve(BackendConfig(name="oracle", cache=False, cache_dir="/c"), model=None)
    assert method.serve_planner(kb_tiny) == "planner"
    cfg, root = served[0]
    assert (cfg.name, cfg.model, cfg.cache, cfg.cache_dir) == ("hf", "/exports/sft/hf", True, "/c")
    assert cfg.batch_size == 32  # pipeline.planner_batch_size, whatever the reader's batch
    # without a backend cache folder the planner caches where the run does (paths.cache), not in the home folder
    method.serve(BackendConfig(name="hf", cache_dir=None), model=None)
    method.cache_root = "/runs/cache"
    method.serve_planner(kb_tiny)
    assert served[1][1] == "/runs/cache"
    # a planner of the user's own is one more key of pipeline.checkpoints; a name that is none of them says so
    mine = OmniRAG(OmniRAGConfig(planner="mine", checkpoints={"sft": "/exports/sft/hf", "mine": "/exports/mine/hf"}))
    mine.serve(BackendConfig(name="hf"), model=None)
    mine.serve_planner(kb_tiny)
    assert served[2][0].model == "/exports/mine/hf"
    mine.cfg.planner_batch_size = None  # null: the backend's own batch size
    mine.serve(BackendConfig(name="hf", batch_size=4), model=None)
    mine.serve_planner(kb_tiny)
    assert served[3][0].batch_size == 4
    typo = OmniRAG(OmniRAGConfig(planner="spoo", checkpoints={"sft": "/exports/sft/hf"}))
    typo.serve(BackendConfig(name="hf"), model=None)
    with pytest.raises(ValueError, match=r"pipeline.planner='spoo': expected frozen or a key of pipeline.checkpoints "
                                         r"\(sft\); .*\+pipeline.checkpoints.spoo="):
        typo.serve_planner(kb_tiny)


def test_one_available_source_leaves_the_plans_other_queries_unsearched_and_picks_its_ood_planner(
        world_tiny, kb_tiny, monkeypatch):
    """Table 8: pipeline.sources=[one] is the only source searched, whatever the plan asks, and the only one whose
    tag a plan can miss; the OOD planner's export is the one trained without that source ({source} in its path)."""
    from omnimed.generation.factory import BackendConfig
    from omnimed.methods import backends
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    method = OmniRAG(OmniRAGConfig(sources=["book"]))
    monkeypatch.setattr(method, "serve_planner", lambda kb: ScriptedPlanner(
        ["<book>mechanism of action</book><wiki>signs and symptoms</wiki>"]))
    (answer,) = method.answer([q for q in world_tiny.questions if q.split == "test"][:1], OracleBackend(world_tiny),
                              kb_tiny, seed=0)
    assert answer.evidence and all(pid.startswith("book:") for pid in answer.evidence)
    assert "queries for wiki not searched: pipeline.sources=['book']" in answer.extras["plan_problems"]
    assert not [p for p in answer.extras["plan_problems"] if p.startswith("missing tags")]  # only book was offered

    served = []
    monkeypatch.setattr(backends, "run_backend", lambda cfg, **kw: served.append(cfg) or "planner")
    for sources in (["research"], None):
        ood = OmniRAG(OmniRAGConfig(planner="spo_ood", planner_backend="hf", sources=sources,
                                    checkpoints={"spo_ood": "/exports/spo-ood-{source}/hf"}))
        ood.serve(BackendConfig(name="oracle", cache_dir="/c"), model=None)
        if sources:
            ood.serve_planner(kb_tiny)
        else:
            with pytest.raises(ValueError, match=r"\{source\} is the one source available at test time"):
                ood.serve_planner(kb_tiny)
    assert [cfg.model for cfg in served] == ["/exports/spo-ood-research/hf"]


def test_open_first_source_starts_the_planners_reply_with_the_offered_tag_and_the_plan_reads_it(
        world_tiny, kb_tiny, monkeypatch):
    """Table 8 at miniature: a planner that writes no tag when offered one source is started at ``<book>`` and
    stopped at ``</book>`` (nothing after it is searched); the queries it writes are parsed and searched in book,
    and the stored reply holds the tags it was given, so the plan reads as well-formed."""
    from omnimed.methods.omnirag.method import OmniRAG, OmniRAGConfig

    class Recording(ScriptedPlanner):
        def generate(self, requests, params):
            self.prefixes, self.stop = [r.meta.get("assistant_prefix") for r in requests], params.stop
            return super().generate(requests, params)

    questions = [q for q in world_tiny.questions if q.split == "test"][:2]
    for opened, expected in ((True, {"book": ["mechanism of action", "pathway"]}), (False, {})):
        planner = Recording(["mechanism of action ; pathway"])  # what a backend returns once cut at the stop
        method = OmniRAG(OmniRAGConfig(sources=["book"], open_first_source=opened))
        monkeypatch.setattr(method, "serve_planner", lambda kb: planner)
        answers = method.answer(questions, OracleBackend(world_tiny), kb_tiny, seed=0)
        assert planner.prefixes == (["<book>"] * 2 if opened else [None] * 2)
        assert planner.stop == (("</book>",) if opened else ())
        assert all({s: qs for s, qs in a.extras["plan_queries"].items() if qs} == expected for a in answers)
        assert all((a.extras["plan_text"] == "<book>mechanism of action ; pathway</book>") == opened for a in answers)
        assert all(bool(a.evidence) == opened for a in answers)
    opened_answers = OmniRAG(OmniRAGConfig(sources=["book"], open_first_source=True))
    monkeypatch.setattr(opened_answers, "serve_planner", lambda kb: Recording(["mechanism of action"]))
    (one,) = opened_answers.answer(questions[:1], OracleBackend(world_tiny), kb_tiny, seed=0)
    assert one.extras["plan_problems"] == []  # offered book only: no other tag is missing, and book is closed


def test_a_bi_encoder_reranks_from_cached_vectors_with_the_scores_its_rerank_call_gives(built, kb_tiny):
    """RaFe's scores with MiniLM: questions encoded once, documents through the knowledge base's embedding path,
    the same best cosine per query as the reranker's own (slow) call per query."""
    from omnimed.knowledge.encoders import TextEncoder
    from omnimed.knowledge.rerank import BiEncoderReranker
    from omnimed.methods.omnirag.judge import best_rerank_scores, questions_by_id
    from omnimed.models.config import named_model_config

    reranker = BiEncoderReranker(TextEncoder(named_model_config("minilm-l6")))
    judged = load_record_set(built["judge"].path, SourceQuery)[:60]
    docs = {r.id: kb_tiny.search_batch(r.source, [r.query], 5)[0] for r in judged}
    questions = questions_by_id("world", built["knowledge"])
    fast = best_rerank_scores(reranker, judged, docs, questions, kb_tiny)
    slow = best_rerank_scores(reranker, judged, docs, questions)
    assert any(docs[r.id] for r in judged) and set(fast) == set(slow)
    assert all(fast[k] == pytest.approx(slow[k], abs=1e-5) for k in slow)

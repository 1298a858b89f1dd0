"""Omni-RAG's table 4 query baselines on the tiny world: Query2Doc's pseudo-documents as queries, Reflexion's
plan -> review -> revise loop and SeRTS's tree search over reviewed plans, against the oracle (an upper bound that
must find the gold passages) and against a scripted LM whose reviews steer the loops."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.generation.oracle import OracleBackend
from omnimed.generation.types import Generation
from omnimed.knowledge.plan import parse_plan
from omnimed.methods.baselines.query2doc import (
    OriginalQuestion,
    OriginalQuestionConfig,
    Query2Doc,
    Query2DocConfig,
)
from omnimed.methods.baselines.reflexion import Reflexion, ReflexionConfig, Reviewed
from omnimed.methods.baselines.serts import Node, SeRTS, SeRTSConfig, backpropagate, select
from omnimed.methods.omnirag.prompts import read_feedback, read_graph_terms

BIN = Path(sys.executable).parent


def _questions(world, n=3):
    return [q for q in world.questions if q.split == "test"][:n]


class ScriptedLM:
    """Plans ``<book>plan N</book>`` (N counts the plans written) and reviews each plan with ``scores[N]``
    (a missing N: an unreadable review). Records every prompt it was sent, by task."""

    name, model_id = "scripted", "scripted-lm"

    def __init__(self, scores, fail_plan_at=None):
        self.scores, self.fail_plan_at = scores, fail_plan_at
        self.written = 0
        self.prompts: dict[str, list[str]] = {"omnirag_plan": [], "omnirag_feedback": []}

    def generate(self, requests, params):
        out = []
        for r in requests:
            task, text = r.meta["task"], r.prompt[-1]["content"]
            self.prompts[task].append(text)
            if task == "omnirag_plan":
                gens = []
                for _ in range(params.n):
                    self.written += 1
                    if self.written == self.fail_plan_at:
                        gens.append(Generation("", "error", error="connection reset"))
                    else:
                        gens.append(Generation(f"<book>plan {self.written}</book>"))
                out.append(gens)
            else:
                n = int(re.search(r"query: plan (\d+)", text).group(1))
                score = self.scores.get(n)
                reply = (f"<suggestion>try harder than plan {n}</suggestion><score>{score}</score>"
                         if score is not None else "I cannot tell.")
                out.append([Generation(reply)])
        return out


def _run(method, lm, world, kb, n=1):
    method.serve_planner = lambda kb: lm
    return method.answer(_questions(world, n), OracleBackend(world), kb, seed=0)


def test_e9_replies_are_read_and_what_is_unreadable_scores_zero():
    ok = read_feedback("Thinking... <suggestion>use the guideline</suggestion>\n<score> 4 </score>")
    assert (ok.score, ok.suggestion, ok.problems) == (4, "use the guideline", [])
    assert read_feedback("<suggestion>x</suggestion><score>7</score>").score == 0
    assert "no <score> tag" in read_feedback("<suggestion>x</suggestion>").problems[0]
    assert read_feedback("<score>five</score>").problems == ["no <suggestion> tag",
                                                             "score 'five' is not an integer 0-5 (scored 0)"]
    assert read_graph_terms("<term>asthma , salbutamol ; beta agonist , x , y</term>") == [
        "asthma", "salbutamol", "beta agonist"]  # fewer than 4 (E.5)
    assert read_graph_terms("asthma") == []


def test_reflexion_revises_with_every_review_so_far_and_reads_the_best_scored_plan(world_tiny, kb_tiny):
    lm = ScriptedLM({1: 1, 2: 3, 3: 2})
    (answer,) = _run(Reflexion(ReflexionConfig(max_iterations=3)), lm, world_tiny, kb_tiny)
    assert answer.extras["loop_scores"] == [1, 3, 2] and answer.extras["loop_chosen"] == 1
    assert answer.extras["plan_queries"] == {"book": ["plan 2"]}
    first, _, third = lm.prompts["omnirag_plan"]
    assert "# Feedback" not in first  # E.7 before any review
    assert "try harder than plan 1" in third and "try harder than plan 2" in third and "Score: 3 of 5" in third


def test_reflexion_stops_at_the_maximum_score_and_counts_unreadable_reviews(world_tiny, kb_tiny):
    lm = ScriptedLM({2: 5, 3: 1})  # plan 1's review is unreadable: scored 0, the loop goes on
    method = Reflexion(ReflexionConfig(max_iterations=8))
    (answer,) = _run(method, lm, world_tiny, kb_tiny)
    assert answer.extras["loop_scores"] == [0, 5] and len(lm.prompts["omnirag_plan"]) == 2
    metrics = method.metrics([answer])
    assert metrics["loop/plans"] == 2 and metrics["loop/reached_max"] == 1.0
    assert metrics["loop/unreadable_reviews"] == 1.0 and metrics["loop/chosen_score"] == 5


def test_a_failed_planner_call_is_an_error_never_an_answer(world_tiny, kb_tiny):
    (answer,) = _run(Reflexion(ReflexionConfig(max_iterations=4)), ScriptedLM({1: 2}, fail_plan_at=2),
                     world_tiny, kb_tiny)
    assert answer.error == "connection reset" and answer.extras["loop_scores"] == [2, None]
    assert answer.extras["plan_queries"] == {"book": ["plan 1"]}  # the reviewed plan, but the question failed


def test_uct_selection_descends_to_the_most_promising_unexpanded_plan():
    root = Node(Reviewed(parse_plan("")))
    backpropagate(root, 0.2)
    good, bad = Node(Reviewed(parse_plan("")), parent=root), Node(Reviewed(parse_plan("")), parent=root)
    root.children = [bad, good]
    backpropagate(bad, 0.0)
    backpropagate(good, 0.8)
    assert select(root, exploration=0.0) is good
    grandchild = Node(Reviewed(parse_plan("")), parent=good)
    good.children = [grandchild]
    backpropagate(grandchild, 0.8)
    assert select(root, exploration=0.0) is grandchild and root.visits == 4
    assert select(root, exploration=100.0) is bad  # explore: the less visited branch


def test_serts_expands_sibling_plans_within_its_iteration_budget(world_tiny, kb_tiny):
    lm = ScriptedLM({1: 1, 2: 2, 3: 4, 4: 1, 5: 3, 6: 2, 7: 1})
    method = SeRTS(SeRTSConfig(max_iterations=4, children=2))
    (answer,) = _run(method, lm, world_tiny, kb_tiny)
    scores = answer.extras["loop_scores"]
    assert len(scores) == 1 + 3 * 2 == lm.written  # the root, then 2 children per iteration
    assert answer.extras["loop_chosen"] == 2 and answer.extras["plan_queries"] == {"book": ["plan 3"]}
    assert answer.extras["tree_depth"] >= 2  # it went down the branch that scored 4
    # one request per expansion; the second expands plan 3 (scored 4) with the reviews along its path, not its
    # sibling plan 2's
    _, expand_root, expand_best, _ = lm.prompts["omnirag_plan"]
    assert "try harder than plan 1" in expand_root
    assert "try harder than plan 3" in expand_best and "try harder than plan 2" not in expand_best
    stopped = SeRTS(SeRTSConfig(max_iterations=8, children=3))
    (early,) = _run(stopped, ScriptedLM({1: 1, 2: 5, 3: 1, 4: 1}), world_tiny, kb_tiny)
    assert early.extras["loop_scores"] == [1, 5, 1, 1]  # the iteration that found a 5 was the last


def test_query2doc_and_original_question_query_each_text_source_once_and_the_graph_with_its_terms(world_tiny, kb_tiny):
    method = Query2Doc(Query2DocConfig(question_repeats=1))  # conf/pipeline/query2doc.yaml's value
    answers = _run(method, OracleBackend(world_tiny), world_tiny, kb_tiny, n=3)
    query2doc_graph = []
    for a in answers:
        query2doc_graph.append(a.extras["plan_queries"]["graph"])
        assert a.correct and a.extras["plan_problems"] == []
        assert all(len(qs) == 1 for s, qs in a.extras["plan_queries"].items() if s != "graph")
        assert all(" , " in q for q in a.extras["plan_queries"].get("graph", []))
    metrics = method.metrics(answers)
    assert metrics["plan/gold_recall"] == 1.0  # the oracle's pseudo-documents are the gold passages' texts
    for q, a in zip(_questions(world_tiny), answers):  # Query2Doc expands the question: it leads every text query
        assert all(qs[0].startswith(" ".join(q.question.split()) + " ") for s, qs in a.extras["plan_queries"].items()
                   if s != "graph")
    alone = _run(Query2Doc(Query2DocConfig(question_repeats=0)), OracleBackend(world_tiny), world_tiny, kb_tiny, n=3)
    twice = _run(Query2Doc(Query2DocConfig(question_repeats=2)), OracleBackend(world_tiny), world_tiny, kb_tiny, n=3)
    for q, a, b, c in zip(_questions(world_tiny), alone, twice, answers):
        question = " ".join(q.question.split())
        assert a.extras["plan_queries"]["book"][0] == c.extras["plan_queries"]["book"][0].removeprefix(question + " ")
        assert b.extras["plan_queries"]["book"][0] == f"{question} {c.extras['plan_queries']['book'][0]}"
    with pytest.raises(ValueError, match=r"pipeline.question_repeats=-1: expected 0"):
        Query2DocConfig(question_repeats=-1)
    original = OriginalQuestion(OriginalQuestionConfig())
    asked = _run(original, OracleBackend(world_tiny), world_tiny, kb_tiny, n=3)
    for q, a in zip(_questions(world_tiny), asked):
        assert a.extras["plan_queries"]["book"] == [" ".join(q.question.split())]
        assert a.extras["plan_queries"]["graph"] == query2doc_graph.pop(0)  # the same E.5 terms
    assert original.metrics(asked)["words_per_query/book"] > 0


@pytest.mark.parametrize("pipeline", ["query2doc", "serts"])  # the others: in-process above, composed by test_reproduce
def test_each_baseline_runs_through_omnimed_evaluate_with_the_oracle(pipeline, tmp_path):
    out = tmp_path / "run"
    res = subprocess.run([str(BIN / "omnimed-evaluate"), "task=qa", f"pipeline={pipeline}", "knowledge=world_tiny",
                          "task.dataset=world_mcq", "task.limit=4", "backend=oracle", "logger=none",
                          f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"hydra.run.dir={out}"],
                         cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["accuracy"] == 1.0 and metrics["plan/gold_recall"] == 1.0
    if pipeline in ("reflexion", "serts"):
        assert metrics["loop/plans"] == 1.0 and metrics["loop/reached_max"] == 1.0  # the oracle's first plan

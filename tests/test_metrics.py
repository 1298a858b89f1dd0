"""Metrics with their uncertainty: accuracy's standard error and bootstrap interval, seed statistics, per-class
accuracy of reflective tokens, sentence splitting, the statement judge and PolyRAG's statement ratios."""

from __future__ import annotations

import logging
import math
import warnings

import pytest

from omnimed.evaluation import metrics
from omnimed.evaluation.metrics import (
    AccuracyResult,
    accuracy,
    judge_statements,
    mean_std,
    parse_judge_label,
    per_class_accuracy,
    split_statements,
    statement_ratios,
)
from omnimed.generation.types import Generation


def test_accuracy_standard_error_on_a_known_case():
    acc = accuracy([True] * 50 + [False] * 50, n_resamples=500)
    assert isinstance(acc, AccuracyResult)
    assert acc.value == 0.5 and acc.n == 100 and acc.missing == 0
    assert acc.stderr == pytest.approx(0.05)  # sqrt(0.5 * 0.5 / 100)
    assert acc.as_dict()["accuracy_stderr"] == pytest.approx(0.05) and acc.as_dict()["accuracy"] == 0.5


def test_bootstrap_interval_contains_the_point_narrows_with_n_and_is_reproducible():
    small = accuracy([True] * 6 + [False] * 4, n_resamples=500)
    large = accuracy([True] * 60 + [False] * 40, n_resamples=500)
    for acc in (small, large):
        assert 0.0 <= acc.ci_low <= acc.value <= acc.ci_high <= 1.0
    assert large.ci_high - large.ci_low < small.ci_high - small.ci_low
    # about +-1.96 standard errors for a large sample
    assert large.ci_high - large.ci_low == pytest.approx(2 * 1.96 * large.stderr, abs=0.04)
    assert accuracy([True] * 60 + [False] * 40, n_resamples=500) == large  # fixed seed
    assert accuracy([True] * 60 + [False] * 40, n_resamples=500, seed=1).ci_low == pytest.approx(large.ci_low,
                                                                                                abs=0.03)


def test_accuracy_degenerate_missing_and_empty():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scipy degenerate-sample warning
        assert accuracy([True] * 7) == AccuracyResult(1.0, 7, 0.0, 1.0, 1.0, 0)
        assert accuracy([False] * 3) == AccuracyResult(0.0, 3, 0.0, 0.0, 0.0, 0)
        assert accuracy([True]).ci_low == 1.0
    acc = accuracy([True, None, False, None], n_resamples=200)
    assert acc.value == 0.25 and acc.missing == 2 and acc.n == 4
    with pytest.raises(ValueError, match="zero examples"):
        accuracy([])


def test_mean_std_over_seeds():
    assert mean_std([0.5, 0.7]) == pytest.approx((0.6, math.sqrt(0.02), 2))  # ddof=1
    assert mean_std([0.42]) == (0.42, 0.0, 1)
    mean, std, n = mean_std([1.0, 2.0, 3.0, 4.0])
    assert (mean, n) == (2.5, 4) and std == pytest.approx(1.2909944)
    with pytest.raises(ValueError):
        mean_std([])


def test_per_class_accuracy_on_a_hand_case():
    classes = ["[Fully supported]", "[Partially supported]", "[No support / Contradictory]"]
    gold = ["[Fully supported]", "[Fully supported]", "[Fully supported]", "[Partially supported]",
            "[No support / Contradictory]"]
    pred = ["[Fully supported]", "[Partially supported]", None, "[Partially supported]", "[Fully supported]"]
    pc = per_class_accuracy(gold, pred, classes)
    assert pc["overall"] == pytest.approx(2 / 5) and pc["n"] == 5 and pc["missing"] == 1
    assert pc["per_class"]["[Fully supported]"] == {"accuracy": pytest.approx(1 / 3), "n": 3}
    assert pc["per_class"]["[Partially supported]"] == {"accuracy": 1.0, "n": 1}
    assert pc["per_class"]["[No support / Contradictory]"] == {"accuracy": 0.0, "n": 1}
    assert pc["macro"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert pc["confusion"]["[Fully supported]"] == {"[Fully supported]": 1, "[Partially supported]": 1, "<none>": 1}
    assert pc["confusion"]["[No support / Contradictory]"] == {"[Fully supported]": 1}
    empty = per_class_accuracy(["[Relevant]"], ["[Relevant]"], ["[Relevant]", "[Irrelevant]"])
    assert empty["per_class"]["[Irrelevant]"] == {"accuracy": None, "n": 0} and empty["macro"] == 1.0
    with pytest.raises(ValueError, match="not among the classes"):
        per_class_accuracy(["[Relevant ]"], ["[Relevant]"], ["[Relevant]", "[Irrelevant]"])
    with pytest.raises(ValueError, match="2 gold labels but 1 predictions"):
        per_class_accuracy(["[Relevant]"] * 2, [None], ["[Relevant]"])


def test_split_statements_rule():
    assert split_statements("Take 2.5 mg daily. Avoid e.g. alcohol. Stop if rash.") == \
        ["Take 2.5 mg daily.", "Avoid e.g. alcohol.", "Stop if rash."]
    text = "Causes:\n- Viral infection, i.e. Influenza. Rest helps!\n2) See Fig. 3 for doses? Yes.\n\n..."
    assert split_statements(text) == ["Causes:", "Viral infection, i.e. Influenza.", "Rest helps!",
                                      "See Fig. 3 for doses?", "Yes."]
    assert split_statements("  ") == []


def test_statement_ratios():
    r = statement_ratios(["correct", "incorrect", "correct", "not_mentioned", "unparsed"])
    assert r == {"correct": 0.4, "incorrect": 0.2, "not_mentioned": 0.2, "unparsed": 0.2, "n": 5}
    assert statement_ratios(["correct"] * 3)["correct"] == 1.0
    assert math.isnan(statement_ratios([])["correct"]) and statement_ratios([])["n"] == 0


@pytest.mark.parametrize("reply,label", [
    ("The reference says so. <label>correct</label>", "correct"),
    ("<label> Not Mentioned </label>", "not_mentioned"),
    ("<label>not-mentioned</label>", "not_mentioned"),
    ("<label>correct</label> no wait <label>incorrect</label>", "incorrect"),
    ("incorrect", "incorrect"),
    ("<label>partly</label>", None),
    ("It is probably right.", None),
    ("", None),
])
def test_parse_judge_label(reply, label):
    assert parse_judge_label(reply) == label


class Judge:
    name, model_id = "judge", "j"

    def __init__(self, replies):
        self.replies, self.requests = replies, []

    def generate(self, requests, params):
        self.requests.extend(requests)
        return [[r if isinstance(r, Generation) else Generation(text=r)] for r in self.replies]


def test_judge_statements_with_a_fake_backend(caplog):
    judge = Judge(["<label>correct</label>", "<label>not mentioned</label>", "I cannot tell",
                   Generation(text="", error="rate limited"), "<label>incorrect</label>"])
    statements = split_statements("Aspirin helps. It cures cancer. Sky is blue. Take it daily. Never with food.")
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        labels = judge_statements(judge, "Aspirin helps; take it with food.", statements, question="Aspirin?",
                                  question_id="q7")
    # an unreadable reply is "unparsed"; a failed call carries its error (an evaluation counts it as a failure)
    assert labels == ["correct", "not_mentioned", "unparsed", "failed: rate limited", "incorrect"]
    assert "2 of 5 replies unreadable" in caplog.text
    first = judge.requests[0]
    assert first.meta == {"task": "judge_statement", "question_id": "q7", "statement_index": 0,
                          "statement": statements[0]}
    assert "Aspirin helps; take it with food." in first.prompt[-1]["content"]
    assert "Aspirin helps." in first.prompt[-1]["content"] and "Aspirin?" in first.prompt[-1]["content"]
    r = statement_ratios(labels)
    assert (r["correct"], r["incorrect"], r["not_mentioned"], r["unparsed"]) == (0.2, 0.2, 0.2, 0.4)
    assert judge_statements(Judge([]), "ref", []) == []


def test_ir_metrics_is_the_retrieval_modules_own():
    from omnimed.evaluation.retrieval import ir_metrics

    assert metrics.ir_metrics is ir_metrics

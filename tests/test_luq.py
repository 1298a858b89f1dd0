"""LUQ (Omni-RAG table 10): answers that agree are certain, answers that contradict each other are not, a question
with one answer has no score; the NLI judge is a classifier read by its label names, a backend asked yes / no, or
exact for option letters; ``omnimed-evaluate task.luq_samples=N`` samples N answers per question (generated, or drawn
from the option letters' log-probabilities) and writes ``luq`` beside accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.evaluation.luq import BackendNLI, ClassifierNLI, ExactNLI, answer_text, luq, option_samples

BIN = Path(sys.executable).parent


class SameTextNLI:
    """Entails exactly when the hypothesis is a sentence of the premise; contradicts otherwise."""

    def __init__(self):
        self.pairs = []

    def entail_contradict(self, pairs):
        self.pairs += pairs
        return [(0.9, 0.1) if h in p else (0.1, 0.9) for p, h in pairs]


def test_agreeing_answers_are_certain_and_disagreeing_ones_are_not():
    nli = SameTextNLI()
    same = ["<answer>Option B is right</answer> The drug blocks the channel."] * 3
    split = ["The answer is B.", "The answer is B.", "The answer is C."]
    scores = luq([same, split, ["only one"], []], nli)
    assert scores[0] == pytest.approx(0.1)  # 1 - 0.9: every sentence entailed by every other answer
    # answers 1 and 2: entailed by one other, contradicted by the third -> 0.5; answer 3: contradicted by both
    assert scores[1] == pytest.approx(1 - (0.5 + 0.5 + 0.1) / 3)
    assert scores[2] is None and scores[3] is None  # nothing to compare
    # the tagged answer is a sentence of its own
    assert ("Option B is right. The drug blocks the channel.", "Option B is right.") in nli.pairs
    assert answer_text("Because X. <answer> A </answer>\n") == "Because X. A."


def test_closed_form_answers_entail_when_they_name_the_same_option_and_contradict_otherwise():
    nli = ExactNLI()
    assert nli.entail_contradict([("B.", "b"), ("B.", "C."), ("Because the drug blocks it. B.", "B."), ("B, final.", "B")]) == [
        (1.0, 0.0), (0.0, 1.0), (1.0, 0.0), (0.0, 1.0)]
    answers = [[f"<answer>{x}</answer>" for x in "BBBB"], [f"<answer>{x}</answer>" for x in "BBCC"]]
    assert luq(answers, nli) == pytest.approx([0.0, 1 - 1 / 3])  # each answer agrees with 1 of the 3 others


def test_option_samples_follow_the_letters_probabilities_at_the_temperature():
    import math

    scores = [{"A": math.log(0.7), "B": math.log(0.2), "C": math.log(0.1)}, None, {"A": 0.0, "B": -50.0}]
    drawn = option_samples(scores, 3000, 0.5, seed=3)
    assert drawn[1] == [] and set(drawn[2]) == {"<answer>A</answer>"}  # no scores: no samples; a sure reader
    p = {k: math.exp(v / 0.5) for k, v in scores[0].items()}  # sharpened: 0.49 / 0.04 / 0.01 before normalising
    for letter in "ABC":
        assert drawn[0].count(f"<answer>{letter}</answer>") / 3000 == pytest.approx(p[letter] / sum(p.values()),
                                                                                     abs=0.03)
    assert option_samples(scores, 5, 0.5, seed=3) == option_samples(scores, 5, 0.5, seed=3)  # seeded
    with pytest.raises(ValueError, match="task.luq_temperature=0"):
        option_samples(scores, 5, 0.0, seed=3)


class LogprobBackend:
    def __init__(self, yes, no):
        self.yes, self.no, self.requests = yes, no, []

    def next_token_logprobs(self, requests, tokens):
        self.requests += requests
        assert tokens == ["Yes", "No"]
        return [{"Yes": self.yes, "No": self.no} for _ in requests]


def test_the_backend_judge_reads_entailment_from_yes_against_no():
    import math

    backend = LogprobBackend(math.log(0.3), math.log(0.1))
    (probs,) = BackendNLI(backend).entail_contradict([("premise text", "hypothesis text")])
    assert probs == pytest.approx((0.75, 0.25))
    prompt = backend.requests[0].prompt[0]["content"]
    assert "Premise: premise text" in prompt and "Hypothesis: hypothesis text" in prompt


def test_a_classifier_judge_finds_its_classes_by_label_name(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from omnimed.models.tiny import tiny_model_path

    base = tiny_model_path("tiny-llama")
    labels = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=3, id2label=labels,
                                                               label2id={v: k for k, v in labels.items()})
    model.config.pad_token_id = model.config.pad_token_id or 0
    model.save_pretrained(tmp_path / "nli")
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "nli")
    nli = ClassifierNLI(str(tmp_path / "nli"), batch_size=2)
    assert (nli.entail, nli.contradict) == (2, 0)
    probs = nli.entail_contradict([("a premise", "a hypothesis"), ("another premise", "x"), ("p", "h")])
    assert len(probs) == 3 and all(0 < e < 1 and 0 < c < 1 and e + c < 1 for e, c in probs)  # neutral takes some
    model.config.id2label = {0: "yes", 1: "maybe", 2: "no"}
    model.save_pretrained(tmp_path / "odd")
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "odd")
    with pytest.raises(ValueError, match="name no entailment and contradiction classes"):
        ClassifierNLI(str(tmp_path / "odd"))
    with pytest.raises(OSError, match="task.luq_nli=.*hub to be reachable"):
        ClassifierNLI(str(tmp_path / "absent"))


def test_omnimed_evaluate_samples_answers_and_writes_luq_beside_accuracy(tmp_path):
    """SmolLM2 reads two questions, samples 2 answers each and judges them itself (LUQ's LLM variant)."""
    out = tmp_path / "run"
    res = subprocess.run([str(BIN / "omnimed-evaluate"), "task=qa", "pipeline=closed_book", "backend=hf",
                          "model=smollm2-135m", "knowledge=world_tiny", "task.dataset=world_mcq", "task.limit=2",
                          "pipeline.answer_mode=logprob", "pipeline.max_new_tokens=24", "task.luq_samples=2",
                          "logger=none", f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache",
                          f"hydra.run.dir={out}"], cwd=tmp_path, text=True, capture_output=True, timeout=900,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["luq"] <= 1.0 and metrics["luq/n"] == 2 and "accuracy" in metrics
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    # the greedy answer is read from log-probabilities; the samples are generated text
    assert all(len(r["luq_samples"]) == 2 and all(t.strip() for t in r["luq_samples"]) for r in rows)
    assert all(0.0 <= r["luq"] <= 1.0 for r in rows)


def test_luq_from_the_option_log_probabilities_over_the_first_questions(tmp_path):
    """``task.luq_sampler=options``: no answer is generated again; the samples are drawn from the greedy pass's
    letter log-probabilities, judged exactly, for the first ``task.luq_limit`` questions only."""
    def evaluate(name, *extra):
        return subprocess.run([str(BIN / "omnimed-evaluate"), "task=qa", "pipeline=closed_book", "backend=hf",
                               "model=tiny-llama", "knowledge=world_tiny", "task.dataset=world_mcq", "task.limit=3",
                               "task.luq_samples=5", "task.luq_sampler=options", "task.luq_nli=exact",
                               "task.luq_limit=2", "logger=none", f"paths.root={tmp_path}",
                               f"paths.cache={tmp_path}/cache", f"hydra.run.dir={tmp_path / name}", *extra],
                              cwd=tmp_path, text=True, capture_output=True, timeout=900, check=False)

    res = evaluate("run", "pipeline.answer_mode=logprob")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert metrics["luq/n"] == 2 and metrics["n"] == 3 and "luq" not in rows[2]
    for row in rows[:2]:
        letters = [t.removeprefix("<answer>").removesuffix("</answer>") for t in row["luq_samples"]]
        assert len(letters) == 5 and set(letters) <= set(json.loads(row["output"]))
        agree = [(sum(x == y for y in letters) - 1) / 4 for x in letters]
        assert row["luq"] == pytest.approx(1 - sum(agree) / 5)
    assert metrics["luq"] == pytest.approx((rows[0]["luq"] + rows[1]["luq"]) / 2)
    bad = evaluate("bad", "pipeline.answer_mode=generate", "pipeline.max_new_tokens=4")
    assert bad.returncode != 0 and "task.luq_sampler=options" in bad.stderr and "answer_mode=logprob" in bad.stderr

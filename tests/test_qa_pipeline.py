"""Generation backends, the reader, the metrics and `omnimed-evaluate task=qa`, on the tiny model, the real
SmolLM2 and the world's oracle: deterministic batched decoding, exact scores, the call cache (no repeated calls,
resumes after an interruption), answer parsing that reports what it cannot read, intervals that behave."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnimed.data.world import build_world
from omnimed.evaluation.metrics import (
    accuracy,
    mean_std,
    per_class_accuracy,
    split_statements,
    statement_ratios,
)
from omnimed.generation.cache import CachedBackend
from omnimed.generation.hf import HFBackend
from omnimed.generation.oracle import OracleBackend
from omnimed.generation.types import Generation, Request, SamplingParams
from omnimed.models.config import ModelConfig
from omnimed.methods.reader import Reader, parse_mcq_answer

BIN = Path(sys.executable).parent
TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")


@pytest.fixture(scope="module")
def tiny():
    return HFBackend(TINY, batch_size=3)


def test_hf_greedy_is_deterministic_and_batch_invariant(tiny):
    reqs = [Request("the patient"), Request("a drug that"), Request([{"role": "user", "content": "hello"}])]
    params = SamplingParams(max_new_tokens=5)
    batched = [g[0].text for g in tiny.generate(reqs, params)]
    alone = [tiny.generate([r], params)[0][0].text for r in reqs]
    assert batched == alone and batched == [g[0].text for g in tiny.generate(reqs, params)]


def test_hf_score_and_next_token_logprobs_equal_a_hand_computation(tiny):
    tok, model = tiny.tokenizer, tiny.model
    prompt, cont = "the patient", " has fever"
    p = tok(prompt)["input_ids"]
    c = tok(cont, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([p + c])).logits[0].float(), -1)
    expected = sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(c))
    assert tiny.score([Request(prompt)], [cont])[0] == pytest.approx(expected, abs=1e-5)
    token = tok.convert_ids_to_tokens(c[0])
    (lps,) = tiny.next_token_logprobs([Request(prompt)], [token])
    assert lps[token] == pytest.approx(float(logp[len(p) - 1, c[0]]), abs=1e-5)


class _Counting:
    """A backend that counts calls and can fail once, mid-way through a stage."""

    name, model_id = "counting", "m"

    def __init__(self, fail_after: int | None = None):
        self.calls, self.fail_after = 0, fail_after

    def generate(self, requests, params):
        self.calls += len(requests)
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt
        return [[Generation(text=f"echo {r.prompt}")] for r in requests]


def test_cache_serves_repeats_and_resumes_an_interrupted_stage(tmp_path):
    reqs = [Request(f"q{i}") for i in range(10)]
    first = CachedBackend(_Counting(fail_after=4), tmp_path, batch_size=4)
    with pytest.raises(KeyboardInterrupt):
        first.generate(reqs, SamplingParams())
    again = CachedBackend(_Counting(), tmp_path, batch_size=4)
    out = again.generate(reqs, SamplingParams())
    assert again.backend.calls == 6 and again.hits == 4  # the finished batch was kept
    assert [g[0].text for g in out] == [f"echo q{i}" for i in range(10)]
    third = CachedBackend(_Counting(), tmp_path)
    third.generate(reqs, SamplingParams())
    assert third.backend.calls == 0 and third.hits == 10
    third.generate(reqs, SamplingParams(max_new_tokens=7))  # other sampling parameters are other calls
    assert third.backend.calls == 10


@pytest.mark.parametrize("text,expected", [
    ("so <answer>B</answer>", ("B", None)),
    ("<answer> (c) </answer>", ("C", None)),
    ("<answer>A. Aspirin</answer> then <answer>D</answer>", ("D", None)),
    ("<answer>warfarin</answer>", ("B", None)),
    ("the answer is B", (None, "no <answer> tag")),
    ("<answer>E</answer>", (None, "answer 'E' is not an option (A, B, C, D)")),
    ("<answer></answer>", (None, "empty <answer> tag")),
])
def test_mcq_answer_parsing(text, expected):
    options = {"A": "aspirin", "B": "Warfarin", "C": "heparin", "D": "insulin"}
    assert parse_mcq_answer(text, options) == expected


def test_reader_counts_malformed_answers_wrong_and_reports_them():
    world = build_world(0, "tiny")
    qs = world.questions[:3]

    class Canned:
        name, model_id = "canned", "c"

        def generate(self, requests, params):
            gold = [f"<answer>{qs[0].answer[0]}</answer>", "I am not sure.", ""]
            return [[Generation(text=t, error=None if t else "HTTP 500")] for t in gold]

    outs = Reader(Canned()).answer_mcq(qs, [[world.passages[0]]] * 3)
    assert [o.correct for o in outs] == [True, False, False]
    assert outs[1].problem == "no <answer> tag" and outs[2].problem.startswith("generation failed: HTTP 500")


def test_oracle_answers_world_questions_and_logprob_mode_picks_its_letter():
    world = build_world(0, "tiny")
    oracle = OracleBackend(world)
    outs = Reader(oracle).answer_mcq(world.questions)
    assert all(o.correct for o in outs)
    outs = Reader(oracle, answer_mode="logprob").answer_mcq(world.questions)
    assert all(o.correct for o in outs)


def test_accuracy_interval_and_seed_statistics():
    acc = accuracy([True] * 50 + [False] * 50)
    assert acc.value == 0.5 and acc.stderr == pytest.approx(0.05)
    assert acc.ci_low < 0.5 < acc.ci_high and acc.ci_high - acc.ci_low == pytest.approx(0.2, abs=0.05)
    wide = accuracy([True] * 5 + [False] * 5)
    assert wide.ci_high - wide.ci_low > acc.ci_high - acc.ci_low
    assert accuracy([True] * 7).ci_low == 1.0
    assert mean_std([0.5, 0.7]) == pytest.approx((0.6, math.sqrt(0.02), 2))
    pc = per_class_accuracy(["[Relevant]", "[Relevant]", "[Irrelevant]"], ["[Relevant]", None, "[Relevant]"],
                            ["[Relevant]", "[Irrelevant]"])
    assert pc["per_class"]["[Relevant]"]["accuracy"] == 0.5 and pc["per_class"]["[Irrelevant]"]["accuracy"] == 0.0
    assert pc["confusion"]["[Relevant]"] == {"[Relevant]": 1, "<none>": 1}
    assert split_statements("Take 2.5 mg daily. Avoid e.g. alcohol. Stop if rash.") == \
        ["Take 2.5 mg daily.", "Avoid e.g. alcohol.", "Stop if rash."]
    assert statement_ratios(["correct", "incorrect", "correct", "unparsed"])["correct"] == 0.5


def test_evaluate_qa_with_smollm2_writes_every_prediction(tmp_path):
    res = subprocess.run([str(BIN / "omnimed-evaluate"), "task=qa", "knowledge=world_tiny", "task.split=null",
                          "task.limit=6", "pipeline.answer_mode=logprob", f"paths.root={tmp_path}",
                          f"paths.cache={tmp_path}/cache", f"hydra.run.dir={tmp_path}/qa"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "qa" / "metrics.json").read_text())
    assert metrics["n"] == 6 and 0.0 <= metrics["accuracy_ci_low"] <= metrics["accuracy"] <= metrics["accuracy_ci_high"]
    rows = [json.loads(line) for line in (tmp_path / "qa" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["prediction"] in "ABCD" for r in rows)
    assert sum(r["correct"] for r in rows) / 6 == pytest.approx(metrics["accuracy"])
    (run_file,) = (tmp_path / "qa" / "wandb").glob("offline-run-*/run-*.wandb")
    summary = json.loads(subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--summary", "--json", str(run_file)],
                                        capture_output=True, text=True, check=True).stdout)
    assert summary["summary"]["accuracy"] == pytest.approx(metrics["accuracy"])
    # the predictions and metrics are the run's output artifact (the packaged reader is no trained input)
    history = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(run_file)],
                             capture_output=True, text=True, check=True).stdout
    artifacts = [json.loads(line)["artifact"] for line in history.splitlines() if '"type":"artifact"' in line]
    (evaluation,) = [a for a in artifacts if a["type"] in ("evaluation", "model")]  # beside W&B's tables
    assert evaluation["type"] == "evaluation" and evaluation["aliases"] == ["latest"]
    assert {"predictions.jsonl", "metrics.json"} <= {e["path"] for e in evaluation["manifest"]["contents"]}
    assert json.loads(evaluation["metadata"])["metrics"]["accuracy"] == pytest.approx(metrics["accuracy"])


def test_several_seeds_pool_the_interval_over_questions_and_count_missing_answers_per_seed(tmp_path, monkeypatch):
    """Two seeds of a fake reader backend that answers differently per seed: the interval is that of the mean over
    seeds (questions resampled, each with its mean correctness over the seeds), not the last seed's, and missing
    answers are per seed like ``n``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from omnimed.conf import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.evaluation.datasets import DatasetRequest, load_eval_dataset
    from omnimed.evaluation.qa import run_qa_evaluation, seed_summary
    from omnimed.generation import factory

    register_evaluate_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("evaluate", overrides=[
            "task=qa", "knowledge=world_tiny", "task.split=null", "task.limit=10", "task.seeds=[0,1]",
            "pipeline=closed_book", "pipeline.answer_mode=generate", "pipeline.temperature=0.7", "logger=none",
            f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"paths.output_dir={tmp_path}/run"])
    questions = load_eval_dataset(DatasetRequest("world_mcq", split=None, limit=10, world_size="tiny"))
    assert len(questions) == 10
    index = {q.id: i for i, q in enumerate(questions)}

    class BySeed:
        """seed 0: questions 0-7 right, 8-9 wrong; seed 1: 0-3 right, 4-5 no answer, 6-9 wrong."""

        name, model_id = "by-seed", "fake"

        def generate(self, requests, params):
            out = []
            for r in requests:
                q = questions[index[r.meta["question_id"]]]
                i = index[q.id]
                right = q.answer[0]
                wrong = next(k for k in q.options if k not in q.answer)
                if params.seed == 0:
                    text = f"<answer>{right if i < 8 else wrong}</answer>"
                else:
                    text = f"<answer>{right}</answer>" if i < 4 else ("not sure" if i < 6 else f"<answer>{wrong}</answer>")
                out.append([Generation(text=text)])
            return out

    monkeypatch.setattr(factory, "build_backend", lambda *a, **k: BySeed())
    result = run_qa_evaluation(OmegaConf.to_object(cfg), tmp_path / "run")
    m = result.metrics
    assert m["seeds"] == 2 and m["n"] == 10
    assert m["accuracy/seed_0"] == pytest.approx(0.8) and m["accuracy/seed_1"] == pytest.approx(0.4)
    assert m["accuracy"] == pytest.approx(0.6) and m["accuracy_std"] == pytest.approx(math.sqrt(0.08))
    # per-question means over the seeds: 1 x4, 0.5 x4, 0 x2 -> population sd sqrt(0.14), SE sqrt(0.14 / 10)
    assert m["accuracy_stderr"] == pytest.approx(math.sqrt(0.014))
    assert m["accuracy_ci_low"] < 0.6 < m["accuracy_ci_high"]  # the last seed alone (0.4) would miss the mean
    assert m["missing_answers/seed_0"] == 0 and m["missing_answers/seed_1"] == 2
    assert m["missing_answers"] == 1.0 and m["missing_answers_total"] == 2
    assert result.problems == {"no <answer> tag": 1.0}
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["accuracy_ci_low"] == m["accuracy_ci_low"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and sum(r["prediction"] is None for r in rows) == 2
    # one seed: exactly the single-run accuracy (binomial SE, the same bootstrap interval)
    outcomes = [True] * 6 + [False] * 3 + [None]
    one, ref = seed_summary({3: outcomes}), accuracy(outcomes, seed=3)
    assert (one["accuracy"], one["accuracy_stderr"], one["accuracy_ci_low"], one["accuracy_ci_high"]) == \
        pytest.approx((ref.value, ref.stderr, ref.ci_low, ref.ci_high))
    assert one["missing_answers"] == 1 and "accuracy/seed_3" not in one


def test_accuracy_is_also_given_by_how_a_world_question_names_its_subject(tmp_path, monkeypatch):
    """A reader that is right exactly on the questions naming their subject as the passages do: the run's metrics
    split accuracy into named_by_name 1.0 and named_by_alias 0.0 (a search that cannot bridge an alias shows up
    there, not only in a lower mean); real datasets, without the field, get no split."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from omnimed.conf import conf_dir
    from omnimed.data.records import MultipleChoiceQuestion
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.evaluation.datasets import DatasetRequest, load_eval_dataset
    from omnimed.evaluation.qa import accuracy_by_naming, run_qa_evaluation
    from omnimed.generation import factory

    register_evaluate_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("evaluate", overrides=[
            "task=qa", "knowledge=world_small", "task.split=test", "task.limit=40", "pipeline=closed_book",
            "pipeline.answer_mode=generate", "logger=none", f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache",
            f"paths.output_dir={tmp_path}/run"])
    questions = {q.id: q for q in load_eval_dataset(DatasetRequest("world_mcq", split="test", limit=40))}
    how = [q.metadata.get("named_by") for q in questions.values()]
    assert {"name", "alias"} <= set(how)

    class RightOnNames:
        name, model_id = "right-on-names", "fake"

        def generate(self, requests, params):
            out = []
            for r in requests:
                q = questions[r.meta["question_id"]]
                wrong = next(k for k in q.options if k not in q.answer)
                letter = q.answer[0] if q.metadata.get("named_by") == "name" else wrong
                out.append([Generation(text=f"<answer>{letter}</answer>")])
            return out

    monkeypatch.setattr(factory, "build_backend", lambda *a, **k: RightOnNames())
    m = run_qa_evaluation(OmegaConf.to_object(cfg), tmp_path / "run").metrics
    assert m["accuracy/named_by_name"] == 1.0 and m["accuracy/named_by_alias"] == 0.0
    assert m["accuracy"] == pytest.approx(how.count("name") / len(how))
    # over seeds: the mean per question; questions without the field add nothing
    def mcq(i, **metadata):
        return MultipleChoiceQuestion(id=f"q{i}", question="?", options={"A": "x", "B": "y"}, answer=["A"],
                                      dataset="d", metadata=metadata)

    assert accuracy_by_naming([mcq(0, named_by="alias"), mcq(1)], {0: [True, True], 1: [False, True]}) == \
        {"accuracy/named_by_alias": 0.5}


# ------------------------------------------------------------------------------------------------ long form
def test_open_answers_are_judged_statement_by_statement_and_averaged_per_answer():
    from omnimed.evaluation.longform import score_answers

    world = build_world(seed=0, size="tiny")
    judge = OracleBackend(world)
    q = world.open_questions[0]
    stranger = next(p.title for p in world.passages
                    if p.source == "graph" and p.title and p.title.lower() not in q.reference_answer.lower()
                    and p.title.split()[0].istitle())
    answers = [q.reference_answer, f"It is treated with {stranger}. The weather was mild that year.", None]
    per_answer, m = score_answers([q, q, q], answers, judge)
    assert set(per_answer[0]["labels"]) == {"correct"}
    assert per_answer[1]["labels"] == ["incorrect", "not_mentioned"]
    assert per_answer[2]["statements"] == [] and m["answers_without_statements"] == 1
    assert m["statement_correct_ratio"] == pytest.approx((1.0 + 0.0) / 2)  # per answer, answers with statements
    assert m["statement_incorrect_ratio"] == pytest.approx(0.25) and m["statement_not_mentioned_ratio"] == 0.25
    n0 = len(per_answer[0]["statements"])
    assert m["statement_correct_count"] == pytest.approx(n0 / 3)  # counts: mean over every answer


def test_statement_shares_carry_a_bootstrap_interval_over_questions():
    from omnimed.evaluation.longform import score_answers, statement_intervals

    world = build_world(seed=0, size="tiny")
    judge = OracleBackend(world)
    qs = world.open_questions[:6]
    right = [q.reference_answer for q in qs]
    wrong = ["The weather was mild that year."] * len(qs)
    mixed = [r if i % 2 else w for i, (r, w) in enumerate(zip(right, wrong))]
    per_answer, m = score_answers(qs, mixed, judge)
    ci = statement_intervals([per_answer], seed=0)
    for key in ("statement_correct_ratio", "statement_not_mentioned_ratio", "statement_correct_count"):
        assert ci[key + "_ci_low"] < m[key] < ci[key + "_ci_high"], key  # half right: the interval has width
    assert ci["statement_incorrect_ratio_ci_low"] == ci["statement_incorrect_ratio_ci_high"] == 0.0  # no spread
    # two seeds, the question as the unit: each question's share is averaged over the seeds first, so two seeds
    # that answer every question right once and wrong once have no spread across questions
    flipped, _ = score_answers(qs, [w if i % 2 else r for i, (r, w) in enumerate(zip(right, wrong))], judge)
    both = statement_intervals([per_answer, flipped], seed=0)
    assert both["statement_correct_ratio_ci_low"] == both["statement_correct_ratio_ci_high"] == 0.5


def test_evaluate_qa_on_open_questions_writes_statement_metrics(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run([str(Path(sys.executable).parent / "omnimed-evaluate"), "task=qa", "task.dataset=world_open",
                          "task.split=null", "backend=oracle", "task.judge.name=oracle", "knowledge=world_tiny",
                          f"paths.root={tmp_path}", f"hydra.run.dir={out}", "logger=csv"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["statement_correct_ratio"] == 1.0 and "accuracy" not in m and m["n"] == 6
    assert m["statement_correct_ratio_ci_low"] == m["statement_correct_ratio_ci_high"] == 1.0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(r["labels"] and set(r["labels"]) == {"correct"} for r in rows)


def test_a_mixed_world_key_takes_its_kinds_in_turn_and_a_bad_part_is_named():
    """`world_mcq_treatment+self_contained`: a column whose paper benchmark mixes questions that need retrieval with
    ones that do not; any first n hold the kinds in equal shares, each in its own order; a part that is not a kind
    is refused before anything runs, naming the kinds."""
    from omnimed.evaluation.datasets import DatasetRequest, dataset_holds, dataset_status, load_eval_dataset

    req = DatasetRequest("world_mcq_treatment+self_contained", limit=6, world_size="small")
    mixed = load_eval_dataset(req)
    assert [q.metadata["kind"] for q in mixed] == ["treatment", "self-contained"] * 3
    alone = load_eval_dataset(DatasetRequest("world_mcq_self_contained", limit=3, world_size="small"))
    assert [q.id for q in mixed[1::2]] == [q.id for q in alone] and all(q.split == "test" for q in mixed)
    assert dataset_status("qa", req.key) == ("known", "")
    assert dataset_holds(req.key) == "world treatment + self-contained MCQs in turn"
    status, why = dataset_status("qa", "world_mcq_treatment+dosage")
    assert status == "unknown" and "dosage" in why and "self_contained" in why
    with pytest.raises(ValueError, match="dosage"):
        load_eval_dataset(DatasetRequest("world_mcq_treatment+dosage", world_size="small"))

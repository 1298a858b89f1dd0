"""The reader and its prompts against small fake backends: answer parsing that reads what models write and says
what it cannot read, malformed or failed outputs counted wrong, evidence numbered with its source in the prompt,
requests that carry the meta an oracle answers from, and the log-probability mode."""

from __future__ import annotations

import pytest

from omnimed.data.records import MultipleChoiceQuestion, OpenQuestion, Passage
from omnimed.generation.types import Generation, SamplingParams
from omnimed.evaluation import judge_prompt
from omnimed.methods import prompts
from omnimed.methods.prompts import PROMPT_VERSION
from omnimed.methods.reader import Reader, parse_mcq_answer, parse_mcq_answers, parse_open_answer

OPTIONS = {"A": "aspirin", "B": "Warfarin", "C": "heparin", "D": "insulin"}


def mcq(qid: str, answer: str | list[str] = "B") -> MultipleChoiceQuestion:
    return MultipleChoiceQuestion(id=qid, question=f"Which drug for {qid}?", options=OPTIONS, answer=answer,
                                  dataset="fake")


def passage(pid: str, source: str = "guideline", title: str = "", text: str = "Some evidence text.") -> Passage:
    return Passage(id=pid, source=source, title=title, text=text)


class Canned:
    """Replies with fixed texts (one per request, in order) and records every request and parameter set."""

    name, model_id = "canned", "c"

    def __init__(self, texts: list[str | Generation]):
        self.texts, self.requests, self.params = texts, [], []

    def generate(self, requests, params):
        self.requests.extend(requests)
        self.params.append(params)
        return [[t if isinstance(t, Generation) else Generation(text=t)] for t in self.texts[: len(requests)]]


class Oracle:
    """Answers from ``meta`` only, as the world's oracle does."""

    name, model_id = "oracle", "o"

    def __init__(self, gold: dict[str, str]):
        self.gold, self.logprob_calls = gold, 0

    def generate(self, requests, params):
        return [[Generation(text=f"Reasoning...\n<answer>{self.gold[r.meta['question_id']]}</answer>")]
                for r in requests]

    def next_token_logprobs(self, requests, tokens):
        self.logprob_calls += 1
        assert all(r.meta["assistant_prefix"] == "<answer>" for r in requests)
        return [{t: (0.0 if t == self.gold[r.meta["question_id"]] else -9.0) for t in tokens} for r in requests]


# ------------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text,expected", [
    ("Step 1 ... so <answer>B</answer>", ("B", None)),
    ("<answer> (C) </answer>", ("C", None)),
    ("<answer>[d]</answer>", ("D", None)),
    ("<answer>b</answer>", ("B", None)),
    ("<answer>B. Warfarin</answer>", ("B", None)),
    ("<answer>C) heparin</answer>", ("C", None)),
    ("<answer>A. aspirin</answer> on reflection <answer>D</answer>", ("D", None)),  # the last tag wins
    ("<answer>warfarin</answer>", ("B", None)),  # the option's text, any case
    ("<answer>Heparin.</answer>", ("C", None)),
    ("<ANSWER>Option A</ANSWER>", ("A", None)),
    ("<answer>**D**</answer>", ("D", None)),
    ("reasoning <answer>B", ("B", None)),  # closing tag removed by a stop string
    ("the answer is B", (None, "no <answer> tag")),
    ("<answer>E</answer>", (None, "answer 'E' is not an option (A, B, C, D)")),
    ("<answer>(e)</answer>", (None, "answer 'E' is not an option (A, B, C, D)")),
    ("<answer></answer>", (None, "empty <answer> tag")),
    ("<answer>   </answer>", (None, "empty <answer> tag")),
    ("", (None, "empty output")),
    ("<answer>A, C</answer>", (None, "answer 'A, C' names several options (A, C); one was asked for")),
    ("<answer>I think it is B</answer>", (None, "answer 'I think it is B' names no option")),
    ("<answer>penicillin</answer>", (None, "answer 'penicillin' names no option")),
])
def test_mcq_answer_parsing(text, expected):
    assert parse_mcq_answer(text, OPTIONS) == expected


def test_parsing_with_letters_only_and_several_answers():
    assert parse_mcq_answer("<answer>(B)</answer>", ["A", "B"]) == ("B", None)
    assert parse_mcq_answer("<answer>warfarin</answer>", "ABCD")[0] is None  # no texts to match against
    assert parse_mcq_answers("<answer>C, A</answer>", OPTIONS) == (["A", "C"], None)
    assert parse_mcq_answers("<answer>A and heparin</answer>", OPTIONS) == (["A", "C"], None)
    assert parse_mcq_answers("<answer>AC</answer>", OPTIONS) == (["A", "C"], None)
    assert parse_mcq_answers("<answer>B</answer>", OPTIONS) == (["B"], None)
    assert parse_mcq_answers("<answer>A, E</answer>", OPTIONS)[0] is None


def test_open_answer_parsing():
    assert parse_open_answer("thinking <answer>\n Rest and fluids. \n</answer>") == ("Rest and fluids.", None)
    assert parse_open_answer("<answer>first</answer><answer>second</answer>") == ("second", None)
    assert parse_open_answer("no tag here") == (None, "no <answer> tag")
    assert parse_open_answer("<answer></answer>") == (None, "empty <answer> tag")


# -------------------------------------------------------------------------------------------------- prompts
def test_prompts_number_the_evidence_with_source_and_title_and_ask_for_the_tag():
    q = mcq("q1")
    ev = [passage("g:1", "guideline", "Anticoagulation", "Warfarin is first line. " * 10),
          passage("w:2", "wiki", "", "Heparin acts fast.")]
    msgs = prompts.mcq_messages(q, ev, max_chars=60)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert "[1] source: guideline | title: Anticoagulation" in user and "[2] source: wiki\nHeparin" in user
    assert user.index("[1]") < user.index("[2]") < user.index("Question:") < user.index("A. aspirin")
    assert " ..." in user and "Warfarin is first line. " * 3 not in user  # cut to max_chars at a word
    assert "<answer>X</answer>" in user and "(A, B, C, D)" in user
    assert "Evidence" not in prompts.mcq_messages(q)[1]["content"]
    assert "A, C</answer>" in prompts.mcq_messages(mcq("q2", ["A", "C"]))[1]["content"]
    open_user = prompts.open_messages(OpenQuestion(id="o", question="Why?", reference_answer="x", dataset="d"),
                                      ev)[1]["content"]
    assert "<answer></answer>" in open_user and "[2] source: wiki" in open_user
    judge = judge_prompt.statement_judge_messages("Ref text.", "A claim.", question="Why?")[1]["content"]
    assert all(s in judge for s in ("Ref text.", "A claim.", "Why?", "<label>not_mentioned</label>"))
    assert PROMPT_VERSION


# --------------------------------------------------------------------------------------------------- reader
def test_reader_end_to_end_counts_malformed_and_failed_outputs_wrong():
    qs = [mcq("q1", "B"), mcq("q2", "A"), mcq("q3", "C"), mcq("q4", "D"), mcq("q5", "A")]
    backend = Canned([
        "Warfarin fits.\n<answer>B</answer>",
        "I am not sure.",
        Generation(text="", error="HTTP 500 after 3 retries", finish_reason="error"),
        Generation(text="Long reasoning that never ends", finish_reason="length"),
        "<answer>B</answer>",
    ])
    ev = [[passage("g:1", "guideline", "Anticoagulants"), passage("r:7", "research", "Trial")]] * 5
    params = SamplingParams(max_new_tokens=64)
    outs = Reader(backend, params=params, max_passages=1).answer_mcq(qs, ev)
    assert [o.question_id for o in outs] == ["q1", "q2", "q3", "q4", "q5"]
    assert [o.correct for o in outs] == [True, False, False, False, False]
    assert [o.prediction for o in outs] == ["B", None, None, None, "B"]
    assert outs[0].problem is None and outs[4].problem is None  # a wrong answer is not a problem
    assert outs[1].problem == "no <answer> tag"
    assert outs[2].problem == "generation failed: HTTP 500 after 3 retries"
    assert outs[3].problem == "no <answer> tag (output cut at max_new_tokens)"
    assert outs[1].raw == "I am not sure." and len(outs[0].prompt_hash) == 12
    assert backend.params == [params]
    # meta for an oracle; only the passages shown (max_passages=1) are named and numbered in the prompt
    assert backend.requests[0].meta == {"task": "answer_mcq", "question_id": "q1", "passage_ids": ["g:1"]}
    user = backend.requests[0].prompt[-1]["content"]
    assert "[1] source: guideline | title: Anticoagulants" in user and "[2]" not in user
    assert outs[0].passage_ids == ["g:1"]


def test_reader_without_evidence_and_with_mismatched_evidence():
    backend = Canned(["<answer>B</answer>"])
    (out,) = Reader(backend).answer_mcq([mcq("q1")])
    assert out.correct and backend.requests[0].meta["passage_ids"] == []
    assert "source:" not in backend.requests[0].prompt[-1]["content"]
    with pytest.raises(ValueError, match="1 passage lists for 2 questions"):
        Reader(backend).answer_mcq([mcq("a"), mcq("b")], [[passage("g:1")]])


def test_multi_answer_questions_need_exactly_the_gold_letters():
    qs = [mcq("m1", ["A", "C"]), mcq("m2", ["A", "C"]), mcq("m3", ["A", "C"])]
    outs = Reader(Canned(["<answer>C, A</answer>", "<answer>A</answer>", "<answer>A, B, C</answer>"])).answer_mcq(qs)
    assert [o.prediction for o in outs] == ["A,C", "A", "A,B,C"]
    assert [o.correct for o in outs] == [True, False, False]


def test_oracle_style_backend_answers_from_meta_in_both_modes():
    qs = [mcq("q1", "B"), mcq("q2", "D"), MultipleChoiceQuestion(id="y", question="Yes?", options={"A": "yes",
                                                                  "B": "no"}, answer="A", dataset="fake")]
    oracle = Oracle({"q1": "B", "q2": "D", "y": "A"})
    assert all(o.correct for o in Reader(oracle).answer_mcq(qs))
    outs = Reader(oracle, answer_mode="logprob").answer_mcq(qs)
    assert [o.prediction for o in outs] == ["B", "D", "A"] and all(o.correct for o in outs)
    assert oracle.logprob_calls == 2  # one call per distinct letter set
    (multi,) = Reader(Oracle({"m": "A"}), answer_mode="logprob").answer_mcq([mcq("m", ["A", "C"])])
    assert not multi.correct and "logprob mode picks one letter" in multi.problem


def test_answer_open_parses_and_reports():
    qs = [OpenQuestion(id=f"o{i}", question="Why?", reference_answer="Because.", dataset="d") for i in range(3)]
    backend = Canned(["<answer>Because of X.</answer>", "no tag", Generation(text="", error="timeout")])
    outs = Reader(backend).answer_open(qs, [[passage("b:1", "book")]] * 3)
    assert [o.prediction for o in outs] == ["Because of X.", None, None]
    assert [o.problem for o in outs] == [None, "no <answer> tag", "generation failed: timeout"]
    assert not any(o.correct for o in outs)
    assert backend.requests[0].meta == {"task": "answer_open", "question_id": "o0", "passage_ids": ["b:1"]}


def test_logprob_mode_starts_an_open_reply_with_the_tag_and_stops_at_its_end():
    """A small model that never opens <answer> by itself (SmolLM2-135M writes on to the token limit) gets its reply
    started with the tag: the text it writes up to </answer> is its answer, a reply cut at the token limit still
    counts, and a model that writes the tag itself is read as before."""
    qs = [OpenQuestion(id=f"o{i}", question="Why?", reference_answer="Because.", dataset="d") for i in range(3)]
    backend = Canned([" Because of X. ", "Because of Y and", "<answer>Z.</answer>"])
    outs = Reader(backend, answer_mode="logprob").answer_open(qs)
    assert [o.prediction for o in outs] == ["Because of X.", "Because of Y and", "Z."]
    assert [o.problem for o in outs] == [None, None, None]
    assert all(r.meta["assistant_prefix"] == "<answer>" for r in backend.requests)
    assert backend.params[0].stop == ("</answer>",) and backend.params[0].max_new_tokens == 512
    plain = Canned(["no tag"])
    assert Reader(plain).answer_open(qs[:1])[0].problem == "no <answer> tag"  # generate mode: the model's own tag
    assert "assistant_prefix" not in plain.requests[0].meta and plain.params[0].stop == ()


def test_reader_rejects_a_backend_that_drops_requests():
    with pytest.raises(RuntimeError, match="1 results for 2 requests"):
        Reader(Canned(["<answer>A</answer>"])).answer_mcq([mcq("a"), mcq("b")])
    with pytest.raises(ValueError, match="answer_mode"):
        Reader(Canned([]), answer_mode="vote")

"""Records validate what users rely on, round-trip through JSONL and HF datasets, and errors name file/line/field."""

from __future__ import annotations

import json

import datasets
import pytest

from omnimed.data import (
    InstructionExample,
    LoadReport,
    Message,
    MultipleChoiceQuestion,
    OpenQuestion,
    Passage,
    Plan,
    PreferencePair,
    PromptCompletion,
    RecordError,
    ReflectiveLabels,
    UtilityExample,
    from_hf_dataset,
    iter_jsonl,
    load_record_set,
    read_records,
    save_record_set,
    to_hf_dataset,
    write_records,
)


def _examples() -> list:
    p1 = Passage(id="p1", source="guideline", title="Board advice", text="Use drug Q.", date="2021-04",
                 authority="National Board", metadata={"facts": ["f1"]})
    p2 = Passage(id="p2", source="graph", text="Zorvane | treats | Kelbris fever")
    return [
        MultipleChoiceQuestion(id="q1", question="Which drug?", options={"A": "Q", "B": "R", "C": "S"},
                               answer="A", dataset="world", gold_passages=["p1"], gold_sources=["guideline"]),
        MultipleChoiceQuestion(id="q2", question="Which two?", options={"A": "x", "B": "y", "C": "z"},
                               answer="A,C", dataset="biomedmcqs"),
        OpenQuestion(id="o1", question="Explain it.", reference_answer="Because.", dataset="longform"),
        p1,
        p2,
        InstructionExample(id="i1", instruction="Answer.", input="Which drug?", output="Q.", evidence=[p1],
                           labels=ReflectiveLabels(retrieval="[Retrieval]", relevance="[Relevant]",
                                                   support="[Fully supported]", utility="[Utility:5]")),
        Plan(question_id="q1", question="Which drug?", queries={"guideline": ["drug for Kelbris fever"], "book": []}),
        PreferencePair(prompt=[Message(role="user", content="plan?")],
                       chosen=[Message(role="assistant", content="<book></book>")],
                       rejected=[Message(role="assistant", content="<wiki>x</wiki>")]),
        UtilityExample(id="u1", query="Which drug?", passages=[p1, p2], teacher_scores=[0.9, 0.1]),
        PromptCompletion(id="c1", prompt=[Message(role="system", content="Be brief."),
                                          Message(role="user", content="Which drug?")],
                         completion=[Message(role="assistant", content="<answer>A</answer>")]),
    ]


def test_multi_letter_answers_are_parsed():
    q = _examples()[1]
    assert q.answer == ["A", "C"]


@pytest.mark.parametrize(
    "data, field",
    [
        ({"id": "1", "question": "x", "options": {"A": "a", "B": "b"}, "answer": "C", "dataset": "d"}, "answer"),
        ({"id": "1", "question": "x", "options": {"A": "a"}, "answer": "A", "dataset": "d"}, "options"),
        ({"id": "1", "question": "x", "options": {"a": "a", "b": "b"}, "answer": "a", "dataset": "d"}, "options"),
        ({"id": "1", "question": "", "options": {"A": "a", "B": "b"}, "answer": "A", "dataset": "d"}, "question"),
        ({"id": "1", "question": "x", "options": {"A": "a", "B": "b"}, "answer": "A", "dataset": "d", "oops": 1}, "oops"),
    ],
)
def test_invalid_question_names_field(data, field):
    with pytest.raises(RecordError) as info:
        MultipleChoiceQuestion.from_dict(data, path="qs.jsonl", line=7)
    assert info.value.field == field and info.value.line == 7 and str(info.value).startswith("qs.jsonl:7:")


def test_passage_rejects_unknown_source_and_bad_date():
    with pytest.raises(RecordError, match="source"):
        Passage.from_dict({"id": "p", "source": "blog", "text": "t"})
    with pytest.raises(RecordError, match="ISO date"):
        Passage.from_dict({"id": "p", "source": "book", "text": "t", "date": "April 2020"})


def test_plan_allows_at_most_three_queries_per_source():
    Plan(queries={"wiki": ["a", "b", "c"]})
    with pytest.raises(RecordError, match="at most 3"):
        Plan.from_dict({"queries": {"wiki": ["a", "b", "c", "d"]}})
    assert Plan(queries={"wiki": ["a"], "book": []}).sources_used() == ["wiki"]


def test_preference_pair_is_trl_conversational_and_checks_roles():
    pair = _examples()[7]
    assert pair.to_dict()["chosen"] == [{"role": "assistant", "content": "<book></book>"}]
    with pytest.raises(RecordError, match="assistant"):
        PreferencePair.from_dict({"prompt": [{"role": "user", "content": "q"}],
                                  "chosen": [{"role": "user", "content": "a"}],
                                  "rejected": [{"role": "assistant", "content": "b"}]})


def test_utility_scores_align_with_passages():
    with pytest.raises(RecordError, match="teacher_scores"):
        UtilityExample.from_dict({"id": "u", "query": "q", "teacher_scores": [1.0],
                                  "passages": [{"id": "p", "source": "book", "text": "t"}] * 2})


def test_jsonl_round_trip_keeps_every_kind(tmp_path):
    recs = _examples()
    digest = write_records(tmp_path / "r.jsonl", recs)
    assert len(digest) == 64
    back = read_records(tmp_path / "r.jsonl")
    assert back == recs
    assert read_records(tmp_path / "r.jsonl", Passage) == [r for r in recs if isinstance(r, Passage)]


def test_hf_round_trip_per_kind():
    for cls in (MultipleChoiceQuestion, Passage, InstructionExample, UtilityExample, Plan, PromptCompletion):
        recs = [r for r in _examples() if isinstance(r, cls)]
        ds = to_hf_dataset(recs)
        assert isinstance(ds, datasets.Dataset) and len(ds) == len(recs)
        assert from_hf_dataset(ds, cls) == recs
    with pytest.raises(ValueError, match="one record kind"):
        to_hf_dataset(_examples())


def test_a_record_set_is_a_dataset_a_researcher_can_use_as_it_is(tmp_path):
    """Splits are train / validation / test (the records' own, dev named validation), options, evidence, labels and
    plan queries are features (not JSON strings), and the instructions come in TRL's two SFT formats as well."""
    from trl.data_utils import is_conversational

    from omnimed.data.world import build_world

    save_record_set(tmp_path / "w", list(build_world(seed=0, size="tiny").records()))
    hf = tmp_path / "w" / "hf"
    mcq = datasets.load_from_disk(str(hf / "mcq"))
    assert set(mcq) == {"train", "validation", "test"}
    row = mcq["test"][0]
    assert {o["letter"] for o in row["options"]} >= {"A", "B"} and row["answer"][0] in {o["letter"] for o in row["options"]}
    inst = datasets.load_from_disk(str(hf / "instruction"))
    assert set(inst["train"].features["labels"]) == {"retrieval", "relevance", "support", "utility"}
    with_evidence = inst["train"].filter(lambda r: len(r["evidence"]) > 0)
    assert len(with_evidence) == 0 or with_evidence[0]["evidence"][0]["text"]
    assert list(datasets.load_from_disk(str(hf / "passage"))) == ["train"]
    for fmt, keys in (("sft_prompt_completion", {"id", "prompt", "completion"}), ("sft_messages", {"id", "messages"})):
        dd = datasets.load_from_disk(str(hf / fmt))
        assert {s: len(d) for s, d in dd.items()} == {s: len(d) for s, d in inst.items()}
        example = dd["train"][0]
        assert set(example) == keys and is_conversational(example)
    first = inst["train"][0]
    assert datasets.load_from_disk(str(hf / "sft_messages"))["train"][0]["messages"][-1]["content"] == first["output"]


def test_line_separator_inside_strings_keeps_records_whole(tmp_path):
    text = "first part\u2028second part\u2029third"
    path = tmp_path / "p.jsonl"
    write_records(path, [Passage(id="p", source="wiki", text=text), Passage(id="q", source="wiki", text="x")])
    assert [r.text for r in read_records(path)] == [text, "x"]
    assert len(list(iter_jsonl(path))) == 2


def test_malformed_lines_name_file_and_line_and_can_be_skipped(tmp_path):
    good = json.dumps({"kind": "passage", "id": "p", "source": "book", "text": "t"})
    bad_field = json.dumps({"kind": "passage", "id": "q", "source": "book", "text": ""})
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([good, "{broken", bad_field, good]) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"c.jsonl:2: invalid JSON"):
        read_records(path)
    report = LoadReport()
    recs = read_records(path, skip_invalid=True, report=report)
    assert len(recs) == 2 and report.read == 2
    assert [(s.line, s.field) for s in report.skipped] == [(2, None), (3, "text")]
    assert "2 skipped" in report.summary()


def test_record_set_writes_jsonl_hf_and_manifest_atomically(tmp_path):
    recs = _examples()
    manifest = save_record_set(tmp_path / "set", recs)
    assert manifest["counts"]["records"] == len(recs) and manifest["counts"]["passage"] == 2
    on_disk = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert on_disk["fingerprint"] == manifest["fingerprint"]
    assert load_record_set(tmp_path / "set") == recs
    assert sorted(p.name for p in (tmp_path / "set" / "hf").iterdir()) == sorted(
        {r.kind for r in recs} | {"sft_prompt_completion", "sft_messages"})
    for kind in {r.kind for r in recs}:
        assert isinstance(datasets.load_from_disk(str(tmp_path / "set" / "hf" / kind)), datasets.DatasetDict)
    # no temporary files left behind
    assert not [p for p in (tmp_path / "set").iterdir() if p.name.startswith(".")]
    # same records -> same fingerprint
    assert save_record_set(tmp_path / "set2", recs)["fingerprint"] == manifest["fingerprint"]

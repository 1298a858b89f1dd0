"""Benchmark loaders: invented fixtures in each real layout, malformed records, and the real files.

The fixtures under ``tests/fixtures/benchmarks`` are our own wording in the published layouts. Tests marked
``realdata`` read the copies under ``$OMNIMED_REALDATA`` and skip when it is unset.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.loaders.instructions import load_selfbiorag_instructions
from omnimed.data.loaders.longform import load_longform
from omnimed.data.loaders.multiple_choice import (
    MMLU_MEDICAL_SUBJECTS,
    load_biomedmcqs,
    load_medmcqa,
    load_medqa,
    load_mirage,
    load_mmlu,
)
from omnimed.data.loaders.pubmedqa_bioasq import load_bioasq, load_pubmedqa, load_pubmedqa_corpus
from omnimed.data.records import InstructionExample, MultipleChoiceQuestion, OpenQuestion, Passage

FIX = Path(__file__).parent / "fixtures" / "benchmarks"
LS = "\u2028"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_pretty(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    """1-based line of the first occurrence of ``needle`` (only ``\\n`` ends a line, as in JSON)."""
    text = path.read_text(encoding="utf-8")
    return text[: text.index(needle)].count("\n") + 1


def mcq(**overrides) -> dict:
    """A valid MedQA row; tests break one field at a time."""
    row = {
        "question": "Which sample organ pumps blood?",
        "answer": "Heart",
        "options": {"A": "Heart", "B": "Lung", "C": "Skin", "D": "Bone"},
        "meta_info": "step1",
        "answer_idx": "A",
        "metamap_phrases": ["organ"],
    }
    row.update(overrides)
    return row


# ----------------------------------------------------------------------------------------------- MIRAGE
def test_mirage_reads_every_dataset_with_stable_ids():
    recs = load_mirage(FIX / "mirage_benchmark.json")
    assert [r.id for r in recs] == ["medqa/0000", "medqa/0001", "pubmedqa/90000001", "mmlu/anatomy-0"]
    assert all(isinstance(r, MultipleChoiceQuestion) and r.split == "test" for r in recs)
    assert recs[1].answer == ["B"] and recs[1].dataset == "medqa"
    assert recs[2].options == {"A": "yes", "B": "no", "C": "maybe"} and recs[2].answer == ["C"]


def test_mirage_dataset_filter_and_unknown_name():
    assert {r.dataset for r in load_mirage(FIX / "mirage_benchmark.json", datasets=["pubmedqa"])} == {
        "pubmedqa"
    }
    with pytest.raises(ValueError, match="bioasq"):
        load_mirage(FIX / "mirage_benchmark.json", datasets=["bioasq"])


def test_mirage_error_names_line_and_record_key(tmp_path):
    data = json.loads((FIX / "mirage_benchmark.json").read_text(encoding="utf-8"))
    data["medqa"]["0001"]["answer"] = "E"
    path = write_pretty(tmp_path / "benchmark.json", data)
    with pytest.raises(RecordError) as info:
        load_mirage(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line_of(path, '"0001"')
    assert err.field == "medqa/0001.answer"
    assert "A', 'B', 'C', 'D" in err.message

    report = LoadReport()
    recs = load_mirage(path, skip_invalid=True, report=report)
    assert len(recs) == 3 and report.read == 3 and report.n_skipped == 1
    assert report.skipped[0].field == "medqa/0001.answer"


def test_whole_json_syntax_error_names_line(tmp_path):
    path = tmp_path / "benchmark.json"
    path.write_text('{\n  "medqa": {\n    "q1": {"question": "x",,}\n  }\n}\n', encoding="utf-8")
    with pytest.raises(RecordError) as info:
        load_mirage(path)
    assert info.value.line == 3 and "invalid JSON" in info.value.message


# ----------------------------------------------------------------------------------------------- MedQA
def test_medqa_reads_four_and_five_options_and_keeps_u2028_records_whole():
    path = FIX / "medqa_test.jsonl"
    assert len(path.read_text(encoding="utf-8").splitlines()) == 5  # splitlines would cut the U+2028 record
    recs = load_medqa(path)
    assert len(recs) == 3
    assert [r.id for r in recs] == ["medqa/medqa_test/1", "medqa/medqa_test/2", "medqa/medqa_test/3"]
    second = recs[1]
    assert second.question.count(LS) == 2 and second.question.endswith("Which sign is checked first?")
    assert sorted(second.options) == list("ABCDE") and second.answer == ["C"]
    assert second.metadata == {"meta_info": "step1", "metamap_phrases": ["dizzy", "standing"]}
    assert all(r.split == "test" and r.dataset == "medqa" for r in recs)


def test_medqa_answer_text_must_match_answer_idx(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [mcq(), mcq(answer="Lung"), mcq()])
    with pytest.raises(RecordError) as info:
        load_medqa(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, "answer")
    assert "text of option A" in err.message and "'Heart'" in err.message
    assert f"{path}:2: field 'answer'" in str(err)

    report = LoadReport()
    recs = load_medqa(path, skip_invalid=True, report=report)
    assert [r.id for r in recs] == ["medqa/train/1", "medqa/train/3"]
    assert all(r.split == "train" for r in recs)
    assert report.read == 2 and report.n_skipped == 1 and report.skipped[0].line == 2


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (mcq(answer_idx="F"), "answer_idx"),
        (mcq(options={"A": "Heart"}), "options"),
        (mcq(options={"1": "Heart", "2": "Lung"}), "options"),
        (mcq(question=""), "question"),
        ({k: v for k, v in mcq().items() if k != "answer_idx"}, "answer_idx"),
    ],
)
def test_medqa_malformed_rows_name_the_field(tmp_path, row, field):
    path = write_jsonl(tmp_path / "test.jsonl", [mcq(), row])
    with pytest.raises(RecordError) as info:
        load_medqa(path)
    assert (info.value.line, info.value.field) == (2, field)


def test_invalid_json_line_names_its_line(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(mcq()) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(RecordError) as info:
        load_medqa(path)
    assert info.value.line == 2 and "invalid JSON" in info.value.message


# ----------------------------------------------------------------------------------------------- MedMCQA
def test_medmcqa_maps_cop_to_letters_and_keeps_explanations():
    recs = load_medmcqa(FIX / "medmcqa_dev.jsonl")
    assert [r.id for r in recs] == ["medmcqa/aaaa-0001", "medmcqa/aaaa-0002"]
    first = recs[0]
    assert first.options == {"A": "Facial", "B": "Vagus", "C": "Accessory", "D": "Hypoglossal"}
    assert first.answer == ["C"] and first.split == "dev"
    assert first.metadata == {
        "exp": "Invented note.",
        "subject_name": "Anatomy",
        "topic_name": "Head and neck",
        "choice_type": "single",
    }
    assert recs[1].answer == ["A"]


@pytest.mark.parametrize("cop", [None, 0, 5, "x", True])
def test_medmcqa_cop_missing_or_out_of_range_is_an_error(tmp_path, cop):
    rows = [json.loads(line) for line in (FIX / "medmcqa_dev.jsonl").read_text(encoding="utf-8").splitlines()]
    if cop is None:
        del rows[1]["cop"]  # the unlabelled test split has no cop at all
    else:
        rows[1]["cop"] = cop
    path = write_jsonl(tmp_path / "test.jsonl", rows)
    with pytest.raises(RecordError) as info:
        load_medmcqa(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, "cop")
    assert "1-4" in info.value.message

    report = LoadReport()
    assert len(load_medmcqa(path, skip_invalid=True, report=report)) == 1
    assert report.as_dict() == {"read": 1, "skipped": 1, "excluded": {}}


# ----------------------------------------------------------------------------------------------- MMLU
def test_mmlu_folder_reads_subject_and_split_from_file_names():
    recs = load_mmlu(FIX / "mmlu")
    counts = Counter((r.metadata["subject"], r.split) for r in recs)
    assert counts == {("clinical_knowledge", "dev"): 1, ("anatomy", "val"): 3, ("astronomy", "val"): 1}
    assert {r.dataset for r in recs} == {"mmlu"}
    quoted = next(r for r in recs if "quoted comma" in r.question)
    assert "quoted comma, and a line break:\nwhich muscle" in quoted.question
    assert quoted.id == "mmlu/anatomy/val/2" and quoted.answer == ["A"]


def test_mmlu_medical_only_is_mmlu_med():
    recs = load_mmlu(FIX / "mmlu", medical_only=True)
    assert len(recs) == 4 and {r.dataset for r in recs} == {"mmlu_med"}
    assert {r.metadata["subject"] for r in recs} <= set(MMLU_MEDICAL_SUBJECTS)
    assert len(load_mmlu(FIX / "mmlu" / "val" / "anatomy_val.csv")) == 3


def test_mmlu_errors_give_csv_row_numbers(tmp_path):
    src = (FIX / "mmlu" / "val" / "anatomy_val.csv").read_text(encoding="utf-8")
    path = tmp_path / "anatomy_test.csv"
    path.write_text(src + "Sample question?,a,b,c,d,Z\nshort,row\n", encoding="utf-8")
    with pytest.raises(RecordError) as info:
        load_mmlu(path)
    # row 4 although the file line is 5: row 2 spans two lines
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 4, "answer")

    report = LoadReport()
    recs = load_mmlu(path, skip_invalid=True, report=report)
    assert len(recs) == 3 and all(r.split == "test" for r in recs)
    assert [(s.line, s.field) for s in report.skipped] == [(4, "answer"), (5, None)]
    assert "6 CSV columns" in report.skipped[1].message


# ----------------------------------------------------------------------------------------------- PubMedQA
def test_pubmedqa_gives_questions_and_their_abstracts():
    recs = load_pubmedqa(FIX / "pubmedqa_ori_pqal.json")
    questions = [r for r in recs if isinstance(r, MultipleChoiceQuestion)]
    passages = [r for r in recs if isinstance(r, Passage)]
    assert len(questions) == 2 and len(passages) == 2 and recs[:2] == questions
    q = questions[0]
    assert (
        q.id == "pubmedqa/90000001"
        and q.answer == ["C"]
        and q.options == {"A": "yes", "B": "no", "C": "maybe"}
    )
    assert q.gold_passages == ["pubmed/90000001"] and q.gold_sources == ["research"]
    assert q.metadata["long_answer"].startswith("Humming may lower")
    assert questions[1].answer == ["A"]
    p = passages[0]
    assert p.id == "pubmed/90000001" and p.source == "research" and p.title == "PubMed 90000001"
    assert p.text.startswith("BACKGROUND: Choir singers") and "\nRESULTS: Twelve invented" in p.text
    assert p.date == "2019" and p.url == "https://pubmed.ncbi.nlm.nih.gov/90000001/"
    assert p.metadata["meshes"] == ["Heart Rate", "Singing"]
    assert passages[1].date is None  # YEAR null in the file


def test_pubmedqa_corpus_is_only_passages_and_ignores_question_fields(tmp_path):
    assert [p.id for p in load_pubmedqa_corpus(FIX / "pubmedqa_ori_pqal.json")] == [
        "pubmed/90000001",
        "pubmed/90000002",
    ]
    data = json.loads((FIX / "pubmedqa_ori_pqal.json").read_text(encoding="utf-8"))
    for entry in data.values():
        del entry["final_decision"]  # like the unlabelled PQA-U file
    path = write_pretty(tmp_path / "ori_pqau.json", data)
    assert len(load_pubmedqa_corpus(path)) == 2


def test_pubmedqa_bad_entry_names_pmid_line_and_field(tmp_path):
    data = json.loads((FIX / "pubmedqa_ori_pqal.json").read_text(encoding="utf-8"))
    data["90000002"]["final_decision"] = "perhaps"
    data["90000001"]["YEAR"] = "19"
    path = write_pretty(tmp_path / "ori_pqal.json", data)
    report = LoadReport()
    assert load_pubmedqa(path, skip_invalid=True, report=report) == []
    assert report.read == 0
    assert [(s.line, s.field) for s in report.skipped] == [
        (line_of(path, '"90000001"'), "90000001.YEAR"),
        (line_of(path, '"90000002"'), "90000002.final_decision"),
    ]

    data["90000001"]["YEAR"] = 2019  # an int year is fine
    write_pretty(path, data)
    with pytest.raises(RecordError) as info:
        load_pubmedqa(path)
    assert (info.value.line, info.value.field) == (line_of(path, '"90000002"'), "90000002.final_decision")
    assert "expected yes, no or maybe, got 'perhaps'" in info.value.message


# ----------------------------------------------------------------------------------------------- BioASQ
def test_bioasq_yesno_become_mcqs_with_snippet_passages():
    report = LoadReport()
    recs = load_bioasq(FIX / "bioasq_golden.json", report=report)
    questions = [r for r in recs if isinstance(r, MultipleChoiceQuestion)]
    passages = [r for r in recs if isinstance(r, Passage)]
    assert [q.id for q in questions] == ["bioasq/5f00000000000000000000a1", "bioasq/5f00000000000000000000a4"]
    assert [q.answer for q in questions] == [["A"], ["B"]]
    assert questions[0].options == {"A": "yes", "B": "no"} and questions[0].gold_sources == ["research"]
    # the snippet shared by both questions is one passage
    assert [p.id for p in passages] == ["pubmed/90000011#abstract:0-76", "pubmed/90000012#title:0-45"]
    assert questions[0].gold_passages == [p.id for p in passages]
    assert questions[1].gold_passages == [passages[0].id]
    assert passages[0].parent_id == "pubmed/90000011" and passages[0].source == "research"
    assert passages[0].url == "https://pubmed.ncbi.nlm.nih.gov/90000011/"
    # factoid and summary: left out by type, counted in the report, neither raised nor called invalid
    assert report.read == 4 and report.n_skipped == 0
    assert sum(report.excluded.values()) == 2
    assert all("not yes/no" in reason for reason in report.excluded)


def test_bioasq_include_other_returns_open_questions():
    recs = load_bioasq(FIX / "bioasq_golden.json", include_other=True)
    open_qs = [r for r in recs if isinstance(r, OpenQuestion)]
    assert [q.metadata["type"] for q in open_qs] == ["factoid", "summary"]
    assert open_qs[0].reference_answer == "Walking did, in the invented study."
    assert open_qs[1].reference_answer == "Walking helped the invented volunteers."
    assert open_qs[0].gold_passages == ["pubmed/90000011#abstract:0-76"]
    assert sum(isinstance(r, Passage) for r in recs) == 2


def test_bioasq_bad_yesno_answer_and_snippet(tmp_path):
    data = json.loads((FIX / "bioasq_golden.json").read_text(encoding="utf-8"))
    data["questions"][3]["exact_answer"] = "unclear"
    data["questions"][0]["snippets"][1].pop("text")
    path = write_pretty(tmp_path / "golden.json", data)
    with pytest.raises(RecordError) as info:
        load_bioasq(path)
    assert info.value.field == "questions[0].snippets[1].text"
    assert (
        info.value.line == line_of(path, '"5f00000000000000000000a1"') - 1
    )  # the line of the question's "{"
    report = LoadReport()
    assert load_bioasq(path, skip_invalid=True, report=report) == []
    assert [s.field for s in report.skipped] == [
        "questions[0].snippets[1].text",
        "questions[3].exact_answer",
    ]
    assert sum(report.excluded.values()) == 2  # the two questions that are not yes/no


# ----------------------------------------------------------------------------------------------- Self-BioRAG
def test_selfbiorag_instructions_read_json_lines_in_a_json_file():
    recs = load_selfbiorag_instructions(FIX / "selfbiorag_instructions.json")
    assert all(isinstance(r, InstructionExample) for r in recs)
    assert [(r.id, r.dataset, r.input) for r in recs] == [
        ("seed_task_0", "symptom_explainer", f"Symptom: tinnitus{LS}(ringing in the ears)"),
        ("seed_task_1/0", "drug_class", "Sampleprofen"),
        ("seed_task_1/1", "drug_class", "Examplezepam"),
    ]
    assert recs[2].output == "Benzodiazepine" and recs[2].metadata == {"is_classification": True}


def test_selfbiorag_instructions_bad_instance_names_line_and_field(tmp_path):
    rows = [json.loads(line) for line in (FIX / "selfbiorag_instructions.json").open(encoding="utf-8")]
    rows[1]["instances"][1].pop("output")
    path = write_jsonl(tmp_path / "instructions.json", rows)
    with pytest.raises(RecordError) as info:
        load_selfbiorag_instructions(path)
    assert (info.value.line, info.value.field) == (2, "instances[1].output")
    report = LoadReport()
    assert len(load_selfbiorag_instructions(path, skip_invalid=True, report=report)) == 1
    assert report.as_dict() == {"read": 1, "skipped": 1, "excluded": {}}


# ----------------------------------------------------------------------------------------------- long-form QA
def test_longform_reads_open_questions():
    recs = load_longform(FIX / "longform_dev_long.json")
    assert [r.id for r in recs] == ["liveqa-900001", "medicationqa-900002", "expertqa-900003"]
    assert [r.dataset for r in recs] == ["liveqa", "medicationqa", "expertqa"]
    assert recs[0].reference_answer.startswith("Most hiccups stop") and recs[0].metadata == {"long": True}
    assert all(r.split == "dev" for r in recs)


def test_longform_missing_gold_names_index_and_line(tmp_path):
    data = json.loads((FIX / "longform_dev_long.json").read_text(encoding="utf-8"))
    data[1]["gold"] = None
    path = write_pretty(tmp_path / "dev_long.json", data)
    with pytest.raises(RecordError) as info:
        load_longform(path)
    assert info.value.field == "[1].gold"
    assert info.value.line == line_of(path, '"medicationqa-900002"') - 1
    report = LoadReport()
    assert len(load_longform(path, skip_invalid=True, report=report)) == 2 and report.n_skipped == 1
    kept = load_longform(path, allow_missing_gold=True)
    assert len(kept) == 3 and kept[1].reference_answer == "" and kept[1].metadata["missing_gold"] is True


# ----------------------------------------------------------------------------------------------- BioMedMCQs
def test_biomedmcqs_multi_answers_and_list_options():
    recs = load_biomedmcqs(FIX / "biomedmcqs.jsonl")
    assert [r.answer for r in recs] == [["A", "C"], ["A", "C"], ["A"]]
    assert recs[1].options == {"A": "Pyrostop", "B": "Sleepwell", "C": "Coolex"}
    assert recs[0].id == "biomedmcqs/b1" and recs[0].metadata == {"level": "easy"}
    listed = load_biomedmcqs(FIX / "biomedmcqs.json")
    assert len(listed) == 1 and listed[0].answer == ["A", "B"]


def test_biomedmcqs_answer_outside_options(tmp_path):
    rows = [json.loads(line) for line in (FIX / "biomedmcqs.jsonl").open(encoding="utf-8")]
    rows[2]["answer"] = "AD"
    path = write_jsonl(tmp_path / "mcqs.jsonl", rows)
    with pytest.raises(RecordError) as info:
        load_biomedmcqs(path)
    assert (info.value.line, info.value.field) == (3, "answer")
    assert "['A', 'B']" in info.value.message


# ----------------------------------------------------------------------------------------------- real files
REAL = os.environ.get("OMNIMED_REALDATA")
needs_real = pytest.mark.skipif(not REAL, reason="OMNIMED_REALDATA is unset; point it at ../shared/realdata")


@pytest.fixture
def real() -> Path:
    return Path(REAL or "")


@pytest.mark.realdata
@needs_real
def test_real_pubmedqa_pqal(real):
    path = real / "research/pubmedqa/data/ori_pqal.json"
    report = LoadReport()
    recs = load_pubmedqa(path, report=report)
    questions = [r for r in recs if isinstance(r, MultipleChoiceQuestion)]
    passages = [r for r in recs if isinstance(r, Passage)]
    assert (
        len(questions) == 1000 and len(passages) == 1000 and report.as_dict() == {"read": 2000, "skipped": 0, "excluded": {}}
    )
    letters = Counter(q.answer[0] for q in questions)
    assert letters == {"A": 552, "B": 338, "C": 110}  # yes / no / maybe
    ids = {p.id for p in passages}
    assert all(q.gold_passages[0] in ids for q in questions)
    assert sum(p.date is None for p in passages) == 58
    assert len(load_pubmedqa_corpus(path)) == 1000


@pytest.mark.realdata
@needs_real
def test_real_mmlu_med_dev_and_val(real):
    recs = load_mmlu(real / "qa/mmlu-dev-val/data", medical_only=True)
    val = Counter(r.metadata["subject"] for r in recs if r.split == "val")
    assert val == {
        "anatomy": 14,
        "clinical_knowledge": 29,
        "college_biology": 16,
        "college_medicine": 22,
        "medical_genetics": 11,
        "professional_medicine": 31,
    }
    assert sum(r.split == "dev" for r in recs) == 30
    assert {r.dataset for r in recs} == {"mmlu_med"}
    assert len({r.id for r in recs}) == len(recs) == 153


@pytest.mark.realdata
@needs_real
def test_real_longform_dev_and_train(real):
    folder = real / "qa/omnirag-longform"
    with pytest.raises(RecordError) as info:  # one dev item has "gold": null
        load_longform(folder / "dev_long.json")
    assert (info.value.line, info.value.field) == (576, "[82].gold")
    dev = load_longform(folder / "dev_long.json", allow_missing_gold=True)
    assert len(dev) == 233 and len({r.id for r in dev}) == 233
    assert Counter(r.dataset for r in dev) == {"medicationqa": 90, "expertqa": 75, "liveqa": 68}

    report = LoadReport()
    train = load_longform(folder / "train_long.json", skip_invalid=True, report=report)
    assert len(train) == 1165  # 1168 items: two have an empty question, one an empty gold
    assert [s.field for s in report.skipped] == ["[111].question", "[200].question", "[1112].gold"]
    assert all(r.split == "train" for r in train)


def test_skip_invalid_passes_over_a_line_that_is_not_json(tmp_path):
    path = tmp_path / "medmcqa.jsonl"
    good = '{"id": "m1", "question": "Which organ filters blood?", "opa": "kidney", "opb": "ear", "opc": "hair", "opd": "nail", "cop": 1}'
    path.write_text(good + "\n{not json\n" + good.replace("m1", "m2") + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"medmcqa.jsonl:2: invalid JSON"):
        load_medmcqa(path)
    report = LoadReport()
    recs = load_medmcqa(path, skip_invalid=True, report=report)
    assert [r.id for r in recs] == ["m1", "m2"] or len(recs) == 2
    assert report.n_skipped == 1 and report.skipped[0].line == 2

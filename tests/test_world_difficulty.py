"""The world's difficulty knobs: each one does what its docstring promises, at its extreme values, and a bad
value fails before anything is built, naming the key."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from omnimed.data.world import SIZES, World, build_world
from omnimed.data.world.difficulty import EASY, Difficulty, DifficultyConfig

HARD = {"aliases": 1.0, "twins": 1.0, "restate": 0.0, "superseded": 1.0, "multihop": 0.3, "self_contained": 0.3}


@pytest.fixture(scope="module")
def hard() -> World:
    # a small world with every knob at its hardest: 40 diseases keep it under a second
    return build_world(seed=3, size="tiny", difficulty=HARD)


def _passages(w: World) -> dict:
    return {p.id: p for p in w.passages}


def test_tiny_stays_easy_and_small_is_not() -> None:
    assert SIZES["tiny"].difficulty == EASY
    assert SIZES["small"].difficulty.aliases > 0 and SIZES["small"].difficulty.multihop > 0


def test_an_alias_in_the_question_is_absent_from_every_gold_passage(hard: World) -> None:
    by_id = _passages(hard)
    aliased = [q for q in hard.questions if q.metadata.get("named_by") == "alias"]
    assert len(aliased) >= 10
    for q in aliased:
        alias = q.metadata["subject_name"]
        subject = hard.model.entities[q.metadata["subject"]]
        assert alias in subject.aliases and alias in q.question and subject.name not in q.question
        for pid in q.gold_passages:
            assert alias.lower() not in by_id[pid].text.lower(), (q.id, pid)
    # the graph holds the synonym link: a names entry of the subject lists the alias
    names = {p.metadata["about"][0]: p.text for p in hard.passages if p.metadata.get("section") == "names"}
    assert all(q.metadata["subject_name"] in names[q.metadata["subject"]] for q in aliased)


def test_aliases_zero_names_every_subject_as_the_passages_do() -> None:
    w = build_world(seed=3, size="tiny", difficulty={**HARD, "aliases": 0.0})
    assert not any(q.metadata.get("named_by") == "alias" for q in w.questions)
    assert not any(p.metadata.get("section") == "names" for p in w.passages)


def test_twins_share_a_name_word_or_stem_and_two_symptoms_but_not_the_answers(hard: World) -> None:
    diseases = {d.entity.id: d for d in hard.model.diseases}
    assert len(hard.model.twins) == SIZES["tiny"].diseases
    for a, b in hard.model.twins:
        x, y = diseases[a], diseases[b]
        assert x.entity.name != y.entity.name
        assert x.entity.name.split()[0] == y.entity.name.split()[0] or x.entity.name[:3] == y.entity.name[:3]
        assert len({s.id for s in x.symptoms} & {s.id for s in y.symptoms}) >= 2 and x.system is y.system
        assert x.finding.id != y.finding.id and x.gene.id != y.gene.id


def test_restate_zero_keeps_findings_genes_and_mechanisms_out_of_the_graph(hard: World) -> None:
    graph_facts = {f for p in hard.passages if p.source == "graph" for f in p.metadata["facts"]}
    for d in hard.model.diseases:
        assert d.facts["finding"] not in graph_facts and d.facts["gene"] not in graph_facts
    for dr in hard.model.drugs:
        assert dr.facts["moa"] not in graph_facts
    easy = build_world(seed=3, size="tiny")
    graph_easy = {f for p in easy.passages if p.source == "graph" for f in p.metadata["facts"]}
    assert all(d.facts["gene"] in graph_easy for d in easy.model.diseases)


def test_a_superseded_recommendation_is_dated_before_its_successor_and_is_a_wrong_option(hard: World) -> None:
    by_id = _passages(hard)
    treatment = [q for q in hard.questions if q.metadata["relation"] == "first_line_treatment"]
    assert treatment
    for d in hard.model.diseases:
        assert len(d.chain) >= 2  # superseded=1.0: every current recommendation replaced an older one
        for old, new in zip(d.chain, d.chain[1:]):
            assert old.date < new.date and new.tier >= old.tier and new.replaces is old
            assert by_id[f"{old.doc}#1"].metadata["superseded_by"] == new.doc
    for q in treatment:
        outdated = q.metadata["outdated_entities"]
        assert q.metadata["answer_entity"] not in outdated
        assert set(outdated) <= set(q.metadata["option_entities"].values())
    assert any(q.metadata["outdated_entities"] for q in treatment)


def test_multihop_questions_need_two_facts_from_two_sources(hard: World) -> None:
    hops = [q for q in hard.questions if q.metadata["kind"] == "multi-hop"]
    assert len(hops) == round(0.3 * SIZES["tiny"].mcq)
    for q in hops:
        assert len(q.metadata["facts"]) == 2 and len(set(q.gold_sources)) >= 2, q.id
        assert hard.oracle.plan_supports(q, q.gold_passages)
        assert not any(hard.oracle.plan_supports(q, [p]) for p in q.gold_passages)  # no one passage suffices


def _compute(question: str) -> str:
    """Answer a self-contained question from its own text, as a reader with no knowledge would."""
    if m := re.search(r"activity of (\d+) U/L\. The laboratory's reference range is (\d+)-(\d+) U/L", question):
        v, lo, hi = map(int, m.groups())
        return "above the reference range" if v > hi else "within the reference range" if v >= lo else \
            "below the reference range"
    if m := re.search(r"half-life of (\d+) hours.* (\d+) hours later", question):
        h, t = map(int, m.groups())
        return f"{100 / 2 ** (t // h):g}%"
    m = re.search(r"as (\d+) doses of (\d+) mg per day", question)
    assert m, question
    return f"{int(m.group(1)) * int(m.group(2))} mg"


def test_a_self_contained_question_is_answerable_from_its_text_alone(hard: World) -> None:
    own = [q for q in hard.questions if q.metadata["kind"] == "self-contained"]
    assert len(own) == round(0.3 * SIZES["tiny"].mcq)
    for q in own:
        assert q.gold_passages == [] and q.metadata["needs_retrieval"] is False
        assert q.options[q.answer[0]] == _compute(q.question), q.question
        assert not hard.oracle.retrieval_needed(q)


def test_no_knowledge_sets_the_share_of_instructions_that_need_no_retrieval() -> None:
    none = build_world(seed=3, size="tiny", difficulty={**HARD, "no_knowledge": 0.0}).instructions
    every = build_world(seed=3, size="tiny", difficulty={**HARD, "no_knowledge": 1.0}).instructions
    assert all(ex.metadata["needs_retrieval"] is not False for ex in none)
    assert all(ex.metadata["needs_retrieval"] is False for ex in every)
    assert {"rewrite", "summary"} <= {ex.metadata["task"] for ex in every}


def test_instruction_mcqs_that_need_no_retrieval_are_answered_from_their_own_text() -> None:
    """The harder worlds' no-knowledge instructions include multiple-choice questions (a computation on numbers the
    question states, a general definition), so not every multiple-choice instruction needs retrieval; each is
    labelled [No Retrieval] and its output names the option its own text gives."""
    from omnimed.data.world.instructions import GLOSSARY

    every = build_world(seed=3, size="tiny", difficulty={**HARD, "no_knowledge": 1.0}).instructions
    mcqs = [ex for ex in every if ex.metadata["task"] == "mcq"]
    assert {ex.metadata["kind"] for ex in mcqs} == {"mcq_computation", "mcq_definition"}
    defined = dict(GLOSSARY)
    for ex in mcqs:
        stem, *lines = ex.input.split("\n")
        options = dict(line.split(". ", 1) for line in lines)
        letter = re.match(r"The answer is ([A-D]): ", ex.output).group(1)
        if ex.metadata["kind"] == "mcq_computation":
            assert options[letter] == _compute(stem), ex.input
        else:
            assert options[letter] == defined[re.search(r"defines '(.+)'", stem).group(1)], ex.input
        assert ex.labels.retrieval == "[No Retrieval]" and not ex.metadata["needs_retrieval"]
    retrieved = build_world(seed=3, size="tiny", difficulty={**HARD, "no_knowledge": 0.0}).instructions
    assert any(ex.metadata["task"] == "mcq" for ex in retrieved)  # multiple-choice instructions that need retrieval


@pytest.mark.parametrize("bad", [{"aliases": 1.5}, {"twins": -0.1}, {"multihop": 0.6, "self_contained": 0.6}])
def test_bad_knob_values_are_refused_naming_the_key(bad: dict) -> None:
    with pytest.raises(ValueError, match="world_difficulty"):
        DifficultyConfig(**bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        Difficulty(**{**Difficulty().as_dict(), **bad})


def test_a_bad_knob_fails_at_compose_time_with_one_line(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "omnimed.cli.evaluate", "task=retrieval", "knowledge=world_tiny",
         "knowledge.world_difficulty.aliases=2", f"paths.root={tmp_path}"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "world_difficulty.aliases=2" in out.stderr and "between 0 and 1" in out.stderr
    assert not any(tmp_path.iterdir())  # nothing built before the refusal

"""The synthetic world: determinism, the five source styles, question validity and oracle consistency."""

from __future__ import annotations

import time

import pytest

from omnimed.data.io import record_line
from omnimed.data.records import SOURCE_KINDS, InstructionExample, MultipleChoiceQuestion, Passage
from omnimed.data.world import SIZES, Oracle, World, build_world
from omnimed.data.world.questions import KINDS


@pytest.fixture(scope="module")
def world() -> World:
    return build_world(seed=0, size="tiny")


@pytest.fixture(scope="module")
def small() -> World:
    return build_world(seed=0, size="small")


def _lines(w: World) -> list[str]:
    return [record_line(r) for r in w.records()]


# ------------------------------------------------------------------------------------------------ determinism, sizes
def test_same_seed_gives_identical_records_and_other_seed_differs(world: World) -> None:
    again = build_world(seed=0, size="tiny")
    assert _lines(again) == _lines(world)
    assert again.splits == world.splits
    assert _lines(build_world(seed=1, size="tiny")) != _lines(world)


def test_tiny_builds_in_under_a_second() -> None:
    start = time.perf_counter()
    build_world(seed=3, size="tiny")
    assert time.perf_counter() - start < 1.0


def test_unknown_size_names_the_choices() -> None:
    with pytest.raises(ValueError) as err:
        build_world(size="huge")
    for name in SIZES:
        assert name in str(err.value)


def test_small_preset_has_the_promised_scale(small: World) -> None:
    c = small.counts()
    assert 2000 <= c["passages"] <= 6000
    assert 1000 <= c["instructions"] <= 2000
    assert 1500 <= c["mcq"] <= 2500
    # passages grow linearly with diseases (~16 each), so the large preset clears 100k passages with room to spare
    assert c["passages"] / c["diseases"] * SIZES["large"].diseases >= 102_000


def test_records_order_and_fictional_marker(world: World) -> None:
    recs = world.records()
    n_p, n_q, n_o = len(world.passages), len(world.questions), len(world.open_questions)
    assert recs[:n_p] == world.passages
    assert recs[n_p : n_p + n_q] == world.questions
    assert recs[n_p + n_q : n_p + n_q + n_o] == world.open_questions
    assert recs[n_p + n_q + n_o :] == world.instructions
    assert all(r.metadata.get("fictional") is True for r in recs)
    assert "FICTIONAL" in (World.__doc__ or "")
    assert len({r.id for r in recs}) == len(recs)


def test_splits_partition_questions_and_instructions(world: World) -> None:
    seen: list[str] = []
    for split, kinds in world.splits.items():
        assert split in ("train", "dev", "test")
        for ids in kinds.values():
            seen += ids
    expected = [r.id for r in [*world.questions, *world.open_questions, *world.instructions]]
    assert sorted(seen) == sorted(expected)
    for q in world.questions:
        assert q.id in world.splits[q.split]["mcq"]
    for ex in world.instructions:
        assert ex.id in world.splits[ex.metadata["split"]]["instruction"]


# ------------------------------------------------------------------------------------------------ source styles
def test_every_source_kind_present_in_its_style(world: World) -> None:
    by_source: dict[str, list[Passage]] = {s: [] for s in SOURCE_KINDS}
    for p in world.passages:
        by_source[p.source].append(p)
        assert p.parent_id and p.metadata["facts"] is not None
    assert all(by_source[s] for s in SOURCE_KINDS)
    assert all(p.date is None and p.authority is None for p in by_source["book"])
    assert any("mechanism of action is" in p.text for p in by_source["book"])
    assert any("pathophysiology" in p.text for p in by_source["book"])
    for p in by_source["guideline"]:
        assert p.date and len(p.date) == 10 and p.authority and p.authority in p.text
        assert p.metadata["authority_level"] in (1, 2, 3)
    assert {p.metadata["authority_tier"] for p in by_source["guideline"]} >= {"national board", "local panel"}
    for p in by_source["research"]:
        assert p.date and p.text.startswith("Background:") and "Results:" in p.text
    assert any("%" in p.text and "randomly assigned" in p.text for p in by_source["research"])
    assert any("genome-wide association" in p.text for p in by_source["research"])
    assert any("Signs and symptoms include" in p.text for p in by_source["wiki"])
    for p in by_source["graph"]:
        lines = p.text.split("\n")
        assert lines[0].startswith(p.title + ":")
        assert all(line.count(" | ") == 2 for line in lines[1:])
    concept_ids = [p.parent_id for p in by_source["graph"]]
    assert len(concept_ids) == len(set(concept_ids))  # one passage per concept


def test_sources_hold_different_facts(world: World) -> None:
    facts_of: dict[str, set[str]] = {s: set() for s in SOURCE_KINDS}
    for p in world.passages:
        facts_of[p.source].update(p.metadata["facts"])
    for s in SOURCE_KINDS:
        others = set().union(*(facts_of[o] for o in SOURCE_KINDS if o != s))
        assert facts_of[s] - others, f"{s} states no fact of its own"


def test_guidelines_supersede_and_current_recommendation_is_well_defined(world: World) -> None:
    recs = {
        p.parent_id: p
        for p in world.passages
        if p.source == "guideline" and p.metadata["section"] == "recommendation"
    }
    pairs = [(recs[p.metadata["supersedes"]], p) for p in recs.values() if "supersedes" in p.metadata]
    assert pairs
    for old, new in pairs:
        assert old.metadata["recommends"] != new.metadata["recommends"]
        assert old.date < new.date
        assert new.metadata["authority_level"] >= old.metadata["authority_level"]
        assert "no longer advised" in new.text and old.metadata["status"] == "superseded"
        assert new.metadata["not_advised"] == [old.metadata["recommends"]]
    for d in world.model.diseases:
        current = [g for g in d.guidelines if g.status == "current"]
        assert len(current) == 1
        cur = current[0]
        assert all(g.tier <= cur.tier for g in d.guidelines)
        assert all(g.date <= cur.date for g in d.chain)


# ------------------------------------------------------------------------------------------------ questions
def test_mcqs_are_valid_and_gold_passages_contain_the_answer(world: World) -> None:
    passages = {p.id: p for p in world.passages}
    assert {q.metadata["kind"] for q in world.questions} == set(KINDS)
    for q in world.questions:
        assert len(q.options) in (4, 5) and len(set(q.options.values())) == len(q.options)
        assert len(q.answer) == 1 and q.answer[0] in q.options
        assert q.gold_passages and q.gold_sources
        answer_text = q.options[q.answer[0]]
        for pid in q.gold_passages:
            assert answer_text.lower() in passages[pid].text.lower()
        assert q.gold_sources == [
            s for s in SOURCE_KINDS if any(passages[p].source == s for p in q.gold_passages)
        ]


def test_open_questions_have_reference_answers_and_covering_gold(world: World) -> None:
    assert world.open_questions
    for o in world.open_questions:
        assert len(o.reference_answer.split()) >= 12
        assert all(t in o.reference_answer for t in o.metadata["key_terms"])
        assert world.oracle.plan_supports(o, o.gold_passages)
        assert world.oracle.support(o, o.reference_answer, o.gold_passages[0]) in ("full", "partial")


def test_a_statement_that_only_restates_the_open_question_is_not_counted_correct(world: World) -> None:
    """PolyRAG's table 2 counts correct statements: echoing the question names its subject, which the reference
    names too, but states nothing of the answer."""
    verdict = world.oracle.statement_verdict
    for q in world.open_questions:
        assert verdict(q, q.question) == "not_mentioned"
        assert verdict(q, q.reference_answer) == "correct"
        for term in q.metadata["key_terms"]:
            assert verdict(q, f"{q.question.rstrip('.?')} involves {term}.") == "correct"
        other = next(p for p in world.open_questions if p.metadata["subject"] != q.metadata["subject"])
        wrong = [t for t in other.metadata["key_terms"] if t not in q.reference_answer]
        assert not wrong or verdict(q, f"It involves {wrong[0]}.") == "incorrect"


# ------------------------------------------------------------------------------------------------ oracle
def test_oracle_gold_is_relevant_and_fully_supported_distractors_are_not(world: World) -> None:
    o = world.oracle
    for q in world.questions:
        gold = q.options[q.answer[0]]
        for pid in q.gold_passages:
            assert o.is_relevant(q, pid)
            assert o.support(q, q.answer[0], pid) == "full"
            assert o.support(q, gold, pid) == "full"
            assert o.support(q.id, None, pid) == "full"
            assert o.utility(q, pid) == 5
        for letter, text in q.options.items():
            if letter != q.answer[0]:
                assert all(o.support(q, text, pid) != "full" for pid in q.gold_passages)
                assert all(o.support(q, letter, pid) == "none" for pid in q.gold_passages)
        assert o.plan_supports(q, q.gold_passages)
        assert sorted(o.gold_passages(q)) == sorted(q.gold_passages)
        assert o.answer(q) == gold


def test_oracle_accepts_ids_text_and_records(world: World) -> None:
    o = world.oracle
    q = world.questions[0]
    pid = q.gold_passages[0]
    passage = next(p for p in world.passages if p.id == pid)
    assert (
        o.support(q.question, None, passage)
        == o.support(q.id, None, pid)
        == o.support(q, None, passage)
        == "full"
    )
    with pytest.raises(KeyError):
        o.is_relevant("What is the capital of a country that does not exist?", pid)


def test_passage_of_another_disease_is_irrelevant_and_foreign_passages_count_for_nothing(
    world: World,
) -> None:
    o = world.oracle
    q = next(q for q in world.questions if q.metadata["kind"] == "treatment")
    subject = q.metadata["subject"]
    other = next(
        p
        for p in world.passages
        if p.source == "wiki" and p.metadata["about"] != [subject] and subject not in p.metadata["entities"]
    )
    assert not o.is_relevant(q, other)
    assert o.support(q, None, other) == "none"
    assert o.utility(q, other) == 1
    assert not o.plan_supports(q, [other])
    gold = next(p for p in world.passages if p.id == q.gold_passages[0])
    forged = Passage(id="elsewhere-1", source=gold.source, text=gold.text, metadata=gold.metadata)
    assert not o.is_relevant(q, forged) and o.support(q, None, forged) == "none"
    altered = gold.model_copy(update={"text": "Some other text entirely."})
    assert o.support(q, None, altered) == "none"


def test_superseded_guideline_does_not_support_the_old_drug_as_current_treatment(world: World) -> None:
    o = world.oracle
    d = next(d for d in world.model.diseases if len(d.chain) >= 2)
    old_g, new_g = d.chain[-2], d.chain[-1]
    old_p, new_p = f"{old_g.doc}#1", f"{new_g.doc}#1"
    q = MultipleChoiceQuestion(
        id="probe-treatment",
        question=f"Which drug is first-line for {d.entity.name} now?",
        options={"A": new_g.drug.name, "B": old_g.drug.name},
        answer="A",
        dataset="probe",
        metadata={
            "relation": "first_line_treatment",
            "subject": d.entity.id,
            "facts": [d.facts["first_line"]],
            "answer_entity": new_g.drug.id,
            "candidates": {new_g.drug.id: new_g.drug.name, old_g.drug.id: old_g.drug.name},
            "option_entities": {"A": new_g.drug.id, "B": old_g.drug.id},
        },
    )
    assert o.support(q, old_g.drug.name, old_p) == "none"  # its recommendation is outdated
    assert o.support(q, old_g.drug.name, new_p) == "none"  # says it is no longer advised
    assert o.support(q, "B", new_p) == "none"
    assert o.support(q, new_g.drug.name, new_p) == "full"
    assert o.support(q, new_g.drug.name, old_p) == "partial"  # about the disease, does not state the answer
    assert o.is_relevant(q, old_p)
    assert o.utility(q, new_p) == 5 and o.utility(q, old_p) == 2
    assert o.support_token(q, old_g.drug.name, old_p) == "[No support / Contradictory]"


def test_oracle_tokens_and_utilities(world: World) -> None:
    o = world.oracle
    q = world.questions[0]
    gold = q.options[q.answer[0]]
    pid = q.gold_passages[0]
    assert o.retrieval_token(q) == "[Retrieval]"
    assert o.relevance_token(q, pid) == "[Relevant]"
    assert o.support_token(q, gold, pid) == "[Fully supported]"
    assert o.passage_utility_token(q, pid) == "[Utility:5]"
    assert o.utility_score(q, pid) == 1.0
    assert o.answer_utility(q, f"The answer is {gold}.") == 5
    assert o.answer_utility(q, q.answer[0]) == 4
    wrong = next(t for letter, t in q.options.items() if letter != q.answer[0])
    assert o.answer_utility(q, wrong) == 2
    assert o.utility_token(q, "no idea") == "[Utility:1]"
    assert o.retrieval_needed("Define the word 'enzyme'.") is False
    assert o.retrieval_needed(f"Tell me about {world.model.diseases[0].entity.name}.") is True
    for p in world.passages[:50]:
        assert 1 <= o.utility(q, p) <= 5


def test_instruction_labels_are_the_oracles(world: World) -> None:
    o = world.oracle
    needs = [ex for ex in world.instructions if ex.metadata["needs_retrieval"]]
    general = [ex for ex in world.instructions if not ex.metadata["needs_retrieval"]]
    assert needs and general
    for ex in general:
        assert ex.labels.retrieval == "[No Retrieval]" and not ex.evidence
        assert o.retrieval_needed(ex) is False and o.retrieval_needed(ex.id) is False
    for ex in needs:
        assert len(ex.evidence) == 1 and ex.labels.retrieval == "[Retrieval]"
        ev = ex.evidence[0]
        assert ex.labels.relevance == o.relevance_token(ex, ev)
        assert ex.labels.support == o.support_token(ex, ex.output, ev)
        if ex.metadata["evidence_kind"] == "gold":
            assert ex.labels.support == "[Fully supported]" and ex.labels.utility == "[Utility:5]"
        assert len(ex.output.split()) <= 40
    assert isinstance(world.instructions[0], InstructionExample)


def test_oracle_from_saved_records_judges_the_same(world: World) -> None:
    import json

    from omnimed.data.records import record_type

    reread = []
    for line in _lines(world):
        obj = json.loads(line)
        reread.append(record_type(obj.pop("kind")).model_validate(obj))
    fresh = Oracle.from_records(reread)
    for q in world.questions[:10]:
        for p in world.passages[:40]:
            assert fresh.support(q, None, p) == world.oracle.support(q, None, p)
            assert fresh.utility(q.id, p.id) == world.oracle.utility(q, p)

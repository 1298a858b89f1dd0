"""Omni-RAG plan text: canonical formatting, round trips, and lenient parsing of malformed planner output."""

from __future__ import annotations

import random

import pytest

from omnimed.data.records import SOURCE_KINDS, Plan
from omnimed.knowledge.graph_text import parse_graph_query
from omnimed.knowledge.plan import PlanParse, format_plan, parse_plan

FULL = Plan(
    queries={
        "book": ["insulin resistance mechanism", "metformin pharmacology"],
        "guideline": ["first-line therapy for type 2 diabetes"],
        "research": [
            "metformin cardiovascular outcomes trial",
            "SGLT2 inhibitors HbA1c < 7%",
            "GLP-1 weight",
        ],
        "wiki": [],
        "graph": ["type 2 diabetes , first-line drug", "metformin , mechanism of action"],
    }
)


# ---------------------------------------------------------------------------------------------- format / round trip
def test_format_is_canonical() -> None:
    text = format_plan(FULL)
    assert text == (
        "<book>insulin resistance mechanism ; metformin pharmacology</book>"
        "<guideline>first-line therapy for type 2 diabetes</guideline>"
        "<research>metformin cardiovascular outcomes trial ; SGLT2 inhibitors HbA1c < 7% ; GLP-1 weight</research>"
        "<wiki></wiki>"
        "<graph>type 2 diabetes , first-line drug ; metformin , mechanism of action</graph>"
    )
    assert format_plan(FULL, sep="\n").count("\n") == 4


@pytest.mark.parametrize(
    "plan",
    [
        FULL,
        Plan(queries={s: [] for s in SOURCE_KINDS}),
        Plan(queries={"wiki": ["a", "b", "c"]}),
        Plan(queries={"graph": ["asthma"], "book": []}),
        Plan(),
    ],
    ids=["full", "all-empty", "one-source", "partial", "empty"],
)
def test_round_trip(plan: Plan) -> None:
    assert parse_plan(format_plan(plan)).plan == plan
    with_question = plan.model_copy(update={"question": "Which drug?", "question_id": "q7"})
    assert (
        parse_plan(format_plan(with_question), question="Which drug?", question_id="q7").plan == with_question
    )


def test_all_sources_writes_empty_tags_for_missing_ones() -> None:
    text = format_plan(Plan(queries={"guideline": ["x"]}), all_sources=True)
    assert text == "<book></book><guideline>x</guideline><research></research><wiki></wiki><graph></graph>"
    parsed = parse_plan(text)
    assert parsed.ok and parsed.plan.sources_used() == ["guideline"]


def test_format_refuses_queries_that_would_not_parse_back() -> None:
    with pytest.raises(ValueError, match="';'"):
        format_plan(Plan(queries={"book": ["a; b"]}))
    with pytest.raises(ValueError, match="tag markup"):
        format_plan(Plan(queries={"book": ["see </book> here"]}))
    with pytest.raises(ValueError, match="whitespace"):
        format_plan(FULL, sep=" | ")


# ---------------------------------------------------------------------------------------------- well-formed input
def test_all_five_sources_with_whitespace_and_newlines() -> None:
    text = """
    <book> anatomy of the pancreas ;
      beta cell function </book>
    <guideline>  </guideline>
    <research>metformin trial</research>

    <wiki>diabetes ;  history of insulin </wiki>
    <graph>
      type 2 diabetes , first-line drug ; metformin ,  mechanism of action
    </graph>
    """
    parsed = parse_plan(text, question="Q?", question_id="q1")
    assert isinstance(parsed, PlanParse) and parsed.ok, parsed.problems
    assert parsed.plan.question == "Q?" and parsed.plan.question_id == "q1"
    assert parsed.plan.queries == {
        "book": ["anatomy of the pancreas", "beta cell function"],
        "guideline": [],
        "research": ["metformin trial"],
        "wiki": ["diabetes", "history of insulin"],
        "graph": ["type 2 diabetes , first-line drug", "metformin , mechanism of action"],
    }
    assert parsed.plan.sources_used() == ["book", "research", "wiki", "graph"]


def test_empty_tags_mean_unused_sources() -> None:
    parsed = parse_plan(
        "<book></book><guideline></guideline><research></research><wiki></wiki><graph></graph>"
    )
    assert parsed.ok and parsed.plan.queries == {s: [] for s in SOURCE_KINDS}
    assert parsed.plan.sources_used() == []


def test_graph_queries_are_kept_whole() -> None:
    text = "<graph>type 2 diabetes , first-line drug, in adults ; HbA1c , target value</graph>"
    queries = parse_plan(text).plan.queries["graph"]
    assert queries == ["type 2 diabetes , first-line drug, in adults", "HbA1c , target value"]
    assert [parse_graph_query(q) for q in queries] == [
        ("type 2 diabetes", "first-line drug, in adults"),
        ("HbA1c", "target value"),
    ]
    bare = parse_plan("<graph>asthma</graph>")
    assert bare.plan.queries["graph"] == ["asthma"]
    assert any("no comma" in p for p in bare.problems)


def test_tags_are_case_insensitive_and_spaced_tags_are_read() -> None:
    parsed = parse_plan("<Book>a</Book>< wiki >b</ wiki >")
    assert parsed.plan.queries == {"book": ["a"], "wiki": ["b"]}
    assert parsed.problems == ["missing tags (sources unused): <guideline>, <research>, <graph>"]


def test_only_the_offered_sources_tags_can_be_missing() -> None:
    """Table 8 offers the planner one source: a plan with that source's tag alone is whole, not malformed."""
    assert parse_plan("<book>a ; b</book>", sources=["book"]).ok
    assert parse_plan("<wiki>a</wiki>", sources=["book"]).problems == ["missing tags (sources unused): <book>"]


# ---------------------------------------------------------------------------------------------- malformed input
def _problem(parsed: PlanParse, *words: str) -> str:
    found = [p for p in parsed.problems if all(w in p for w in words)]
    assert found, f"no problem with {words} in {parsed.problems}"
    return found[0]


def test_more_than_three_queries_keeps_the_first_three() -> None:
    parsed = parse_plan("<wiki>a ; b ; c ; d ; e</wiki>")
    assert parsed.plan.queries["wiki"] == ["a", "b", "c"]
    assert "5 given" in _problem(parsed, "more than 3 queries for wiki", "kept the first 3")


def test_unknown_tag_is_reported_with_its_offset() -> None:
    text = "<book>a</book><guideline>b</guideline><foo>x ; y</foo><wiki>c</wiki>"
    parsed = parse_plan(text)
    assert (
        _problem(parsed, "<foo>")
        == f"unknown tag <foo> at char {text.index('<foo>')} ignored with its content"
    )
    assert parsed.plan.queries == {"book": ["a"], "guideline": ["b"], "wiki": ["c"]}
    inside = parse_plan("<book>drug <b>dose</b> limits</book>")
    assert inside.plan.queries["book"] == ["drug dose limits"]  # markup dropped, words kept
    assert len([p for p in inside.problems if "unknown tag" in p]) == 2
    thinking = parse_plan("<think>the question asks; maybe</think><book>a</book>")
    assert thinking.plan.queries == {"book": ["a"]}
    _problem(thinking, "unknown tag <think> at char 0", "with its content")


def test_unclosed_tag_keeps_its_text() -> None:
    at_end = parse_plan("<book>a</book><research>trial of metformin ; dose")
    assert at_end.plan.queries["research"] == ["trial of metformin", "dose"]
    _problem(at_end, "unclosed <research> at char 14")
    ended = parse_plan("<book>a ; b<wiki>c</wiki>")
    assert ended.plan.queries == {"book": ["a", "b"], "wiki": ["c"]}
    _problem(ended, "unclosed <book> at char 0", "ended by <wiki> at char 11")
    mismatched = parse_plan("<book>a</guideline><wiki>c</wiki>")
    assert mismatched.plan.queries == {"book": ["a"], "wiki": ["c"]}
    _problem(mismatched, "<book> at char 0 closed by </guideline>")
    stray = parse_plan("</book><wiki>c</wiki>")
    _problem(stray, "stray </book> at char 0")


def test_duplicate_tag_keeps_the_first() -> None:
    parsed = parse_plan("<book>a</book><book>b ; c</book>")
    assert parsed.plan.queries == {"book": ["a"]}
    _problem(parsed, "duplicate tag <book> at char 14")


def test_empty_queries_are_dropped() -> None:
    parsed = parse_plan("<book>a ; ; b ;</book>")
    assert parsed.plan.queries["book"] == ["a", "b"]
    assert len([p for p in parsed.problems if "empty query" in p]) == 2
    only_separators = parse_plan("<wiki> ; </wiki>")
    assert only_separators.plan.queries["wiki"] == []


def test_text_outside_tags_is_ignored() -> None:
    text = "Here is my plan:\n<book>a</book> and that's it"
    parsed = parse_plan(text)
    assert parsed.plan.queries == {"book": ["a"]}
    assert _problem(parsed, "text outside tags ignored at char 0").endswith("'Here is my plan:'")
    _problem(parsed, f"text outside tags ignored at char {text.index('and')}", "and that's it")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "just some words",
        "<<<>>>",
        "</>",
        "<book",
        "book>a</book>",
        "<>;<>",
        "\x00\uffff<graph>",
        ";;;;",
        "<book>" * 50,
        "</book>" * 3,
    ],
)
def test_garbage_never_raises(text: str) -> None:
    parsed = parse_plan(text)
    assert isinstance(parsed.plan, Plan) and parsed.problems
    assert all(len(qs) <= 3 and all(q.strip() for q in qs) for qs in parsed.plan.queries.values())


def test_random_fragments_never_raise() -> None:
    rng = random.Random(0)
    pieces = [
        "<book>",
        "</book>",
        "<wiki>",
        "</wiki>",
        "<graph>",
        "</graph>",
        "<foo>",
        "</foo>",
        "<",
        ">",
        ";",
        ",",
        " ",
        "\n",
        "query",
        "term , question",
        "</",
        "<research>",
        "</guideline>",
    ]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        parsed = parse_plan(text)
        assert set(parsed.plan.queries) <= set(SOURCE_KINDS)
        assert all(len(qs) <= 3 for qs in parsed.plan.queries.values())
    assert parse_plan(None).problems == ["expected text, got NoneType"]  # type: ignore[arg-type]

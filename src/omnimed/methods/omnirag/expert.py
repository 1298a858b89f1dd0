"""The miniature's expert and judge: the world's oracle answering Omni-RAG's exploration, judging and planning
prompts (registered as oracle backend tasks, so the stages and the pipeline run unchanged against it).

- ``omnirag_explore`` {question_id, n_queries}: the oracle-guided explorer. The paper's expert (Qwen2.5-72B) writes
  varied queries of uneven quality; this one mixes, per source, queries aimed at the passages that state the gold
  facts (the topic's canonical name with what the source says about it) with poor ones an LLM also writes (the
  question's own words and alias, a wrong option's name, a bare relation phrase). How many aim well is drawn per
  question and source, so some sources get none. Which queries really find support is left to the judge, which
  searches them.
- ``omnirag_judge`` {question_id, passage_ids}: ``<answer>yes</answer>`` when the documents state a fact the gold
  answer rests on (:meth:`~omnimed.data.world.oracle.Oracle.supports_in_part`), else ``no``.
- ``omnirag_plan`` {question_id}: the oracle planner (an upper bound and a test fixture): only the well-aimed
  queries, in the sources that hold the gold facts, at most 3 each (also as Reflexion's and SeRTS's reviser: it
  ignores the feedback).
- ``omnirag_feedback`` {question_id, passage_ids}: Reflexion's and SeRTS's review (Prompt E.9): score 5 when the
  documents state a gold fact, else 1, with a suggestion.
- ``pseudo_document`` {question_id, source}: Query2Doc's pseudo-document (E.6): the text of the source's passage that
  states a gold fact, else the question's stem.
- ``graph_terms`` {question_id}: the question's terms (E.5): the gold facts' topics by their canonical names.
"""

from __future__ import annotations

import random
from typing import Any

from omnimed.data.records import MAX_QUERIES_PER_SOURCE, SOURCE_KINDS
from omnimed.generation.oracle import OracleBackend, Reply, register_task
from omnimed.knowledge.plan import format_queries

#: what a query asks about the topic, by the question's relation
RELATION_PHRASES: dict[str, str] = {
    "diagnosis": "clinical features",
    "has_finding": "physical examination findings",
    "pathophysiology": "pathophysiology",
    "mechanism_of_action": "mechanism of action",
    "trial_result": "randomized trial results",
    "causal_gene": "genetic association",
    "first_line_treatment": "first-line treatment recommendation",
    "first_line_mechanism": "first-line treatment",
    "trial_target": "randomized trial",
    "finding_gene": "gene",
    "computation": "reference range",
}
#: what each source says about a topic, for a query aimed at it
SOURCE_PHRASES: dict[str, str] = {
    "book": "mechanism of action and pathophysiology",
    "guideline": "current first-line treatment recommendation",
    "research": "randomized trial and genetic association study",
    "wiki": "signs, symptoms and examination findings",
    "graph": "related concepts",
}


def _query(source: str, term: str, phrase: str) -> str:
    """A query in the source's format: ``term , question`` for the graph, ``term phrase`` otherwise."""
    term = " ".join(term.replace(";", " ").replace(",", " ").split())
    return f"{term} , {phrase}" if source == "graph" else f"{term} {phrase}"


def aimed_queries(b: OracleBackend, question_id: str, source: str) -> list[str]:
    """Queries aimed at the passages of ``source`` that state a gold fact: each passage's topic by its canonical
    name, with the question's relation phrase and with the source's own phrase."""
    oracle = b.oracle
    info = oracle.facts_of(b.question(question_id))
    relation = RELATION_PHRASES.get(info["relation"], info["relation"].replace("_", " "))
    out: list[str] = []
    for p in oracle.passages_stating(info["facts"]):
        if p.source != source:
            continue
        for topic in p.metadata.get("about", [])[:1]:
            names = oracle.entity_names(topic)
            if names:
                out += [_query(source, names[0], relation), _query(source, names[0], SOURCE_PHRASES[source])]
    return list(dict.fromkeys(out))


def poor_queries(b: OracleBackend, question_id: str, source: str) -> list[str]:
    """Queries an LLM also writes that rarely find the gold facts: the question's opening words, a wrong option's
    name with the relation phrase, the relation phrase or the source phrase alone."""
    q = b.question(question_id)
    info = b.oracle.facts_of(q)
    relation = RELATION_PHRASES.get(info["relation"], info["relation"].replace("_", " "))
    words = " ".join(q.question.replace(";", " ").replace(",", " ").split()[:9])
    wrong = [text for letter, text in getattr(q, "options", {}).items() if letter not in getattr(q, "answer", [])]
    out = [_query(source, words, relation) if source == "graph" else words]
    out += [_query(source, text, relation) for text in wrong[:3]]
    out += [_query(source, "disease", relation), _query(source, "patient", SOURCE_PHRASES[source])]
    return list(dict.fromkeys(out))


def explore(b: OracleBackend, question_id: str, n: int) -> dict[str, list[str]]:
    """``n`` queries per source, a drawn number of them aimed well (0 to 3, at most as many as exist)."""
    plan: dict[str, list[str]] = {}
    for source in SOURCE_KINDS:
        rng = random.Random(f"omnirag-explore:{question_id}:{source}")
        aimed, poor = aimed_queries(b, question_id, source), poor_queries(b, question_id, source)
        take = min(len(aimed), rng.randint(0, 3), n)
        chosen = rng.sample(aimed, take) + [q for q in poor if q not in aimed]
        while len(chosen) < n:  # too few distinct poor ones: vary the generic phrase
            chosen.append(_query(source, f"topic {len(chosen)}", SOURCE_PHRASES[source]))
        chosen = chosen[:n]
        rng.shuffle(chosen)
        plan[source] = chosen
    return plan


@register_task("omnirag_explore", ("question_id", "n_queries"))
def _explore(b: OracleBackend, m: dict[str, Any]) -> Reply:
    text = format_queries(explore(b, m["question_id"], int(m["n_queries"])))
    return Reply(text, text)


@register_task("omnirag_judge", ("question_id", "passage_ids"))
def _judge(b: OracleBackend, m: dict[str, Any]) -> Reply:
    verdict = "yes" if b.oracle.supports_in_part(b.question(m["question_id"]), m["passage_ids"]) else "no"
    return Reply(f"The documents were checked against the gold answer. <answer>{verdict}</answer>", verdict)


@register_task("omnirag_plan", ("question_id",))
def _plan(b: OracleBackend, m: dict[str, Any]) -> Reply:
    queries = {s: aimed_queries(b, m["question_id"], s)[:MAX_QUERIES_PER_SOURCE] for s in SOURCE_KINDS}
    text = format_queries(queries, all_sources=True)
    return Reply(text, text)


@register_task("omnirag_feedback", ("question_id", "passage_ids"))
def _feedback(b: OracleBackend, m: dict[str, Any]) -> Reply:
    if b.oracle.supports_in_part(b.question(m["question_id"]), m["passage_ids"]):
        score, advice = 5, "The documents state what the answer rests on; keep these queries."
    else:
        score, advice = 1, "None of the documents states the needed fact: name the subject as the sources do."
    text = f"<suggestion>{advice}</suggestion>\n<score>{score}</score>"
    return Reply(text, str(score))


def _gold_passages(b: OracleBackend, question_id: str) -> list[Any]:
    return b.oracle.passages_stating(b.oracle.facts_of(b.question(question_id))["facts"])


@register_task("pseudo_document", ("question_id", "source"))
def _pseudo_document(b: OracleBackend, m: dict[str, Any]) -> Reply:
    stating = [p.text for p in _gold_passages(b, m["question_id"]) if p.source == m["source"]]
    text = f"<passage>{stating[0] if stating else b.question(m['question_id']).question}</passage>"
    return Reply(text, text)


@register_task("graph_terms", ("question_id",))
def _graph_terms(b: OracleBackend, m: dict[str, Any]) -> Reply:
    topics = [t for p in _gold_passages(b, m["question_id"]) for t in p.metadata.get("about", [])[:1]]
    names = [b.oracle.entity_names(t)[:1] for t in dict.fromkeys(topics)]
    terms = list(dict.fromkeys(n[0].replace(",", " ") for n in names if n))[:3]
    text = f"<term>{' , '.join(terms)}</term>"
    return Reply(text, text)

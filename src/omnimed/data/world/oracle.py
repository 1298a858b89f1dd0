"""The world's oracle: exact answers to what the papers ask a teacher LLM.

In the papers a large LLM (GPT-4 for Self-BioRAG's critic data, Qwen2.5-72B as Omni-RAG's judge, an LLM's answer
likelihood for PolyRAG's utilities) labels retrieval need, relevance, support and utility. In the miniature setting
the synthetic world's oracle stands in for that teacher: it knows the ground truth, so its labels are exact, cost
nothing and make every downstream number interpretable.

How it knows. Every world passage lists the fact ids it states (``metadata["facts"]``), its topic entities
(``about``) and, for guidelines, which drugs it marks as outdated or no longer advised. Every world question lists
the fact ids that make its gold answer correct (``facts``), its subject entity, its gold answer entity and the
names of plausible answers (``candidates``). The oracle needs nothing else, so it works equally on a freshly built
world and on records read back from disk (:meth:`Oracle.from_records`).

Rules (question ``q`` with required facts ``F`` and subject ``s``; passage ``p`` stating facts ``P``):

- **retrieval needed**: a world question or a retrieval instruction needs retrieval (its answer lives only in the
  world's text); an instruction answerable from its own input or from general language (definitions, arithmetic,
  extraction) does not. Unknown text needs retrieval iff it names a concept of the world.
- **relevant**: ``p`` is a world passage and (``s`` is one of its topics, or ``P`` holds any fact of ``F``).
  Passages not from the world are never relevant.
- **support** of an answer ``a`` (a letter, an option text, or free text naming a candidate; ``None`` means the gold
  answer):

  * ``full``: ``a`` is the gold answer and ``F`` is a subset of ``P``;
  * ``none``: ``p`` is not a world passage; or ``a`` is wrong and ``p`` either states the gold facts (it
    contradicts ``a``) or, for current-treatment questions, states that ``a``'s recommendation is outdated or
    that ``a`` is no longer advised;
  * ``partial``: otherwise, if ``p`` is relevant (about the question's entity, without stating the deciding fact);
  * ``none``: otherwise.

  For open (long-form) questions the answer counts as gold when it is the reference answer or names every key
  term; a single passage rarely states all facts of a long-form answer, so such passages are usually ``partial``.
- **plan supports**: the union of facts stated by the retrieved passages contains ``F``.
- **utility of a passage** (1-5): 5 states all of ``F``; 4 states some of ``F``; 3 about ``s`` without stating any
  of ``F``; 2 about ``s`` but outdated for the question (a superseded recommendation), or names ``s`` or the gold
  answer in passing; 1 otherwise. :meth:`Oracle.utility_score` maps it to [0, 1].
- **utility of an answer** (Self-RAG's ``[Utility:x]``, judged on the output): 5 a correct answer in a full
  sentence, 4 a correct bare answer (a letter or a name), 2 a wrong answer of the right type, 1 anything else; for
  open questions 5 all key terms, 3 some, 1 none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from omnimed.data.records import (
    InstructionExample,
    MultipleChoiceQuestion,
    OpenQuestion,
    Passage,
    Record,
    ReflectiveLabels,
)

Support = Literal["full", "partial", "none"]
QuestionLike = MultipleChoiceQuestion | OpenQuestion | InstructionExample | str
PassageLike = Passage | str
SUPPORT_TOKENS: dict[str, str] = {
    "full": "[Fully supported]",
    "partial": "[Partially supported]",
    "none": "[No support / Contradictory]",
}
_LETTER = re.compile(r"^\(?([A-Z])\)?[.:)]?$")
_WORD = re.compile(r"[A-Za-z0-9]+")


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


@dataclass(slots=True)
class _Spec:
    """What the oracle knows about one question or instruction."""

    id: str
    relation: str
    subject: str
    facts: tuple[str, ...]
    answer_entity: str | None
    candidates: dict[str, str]
    options: dict[str, str] = field(default_factory=dict)
    key_terms: tuple[str, ...] = ()
    reference: str = ""
    needs_retrieval: bool = True
    asked: str = ""  # the question's own text: naming what it names answers nothing


@dataclass(slots=True)
class _PassageInfo:
    passage: Passage
    facts: frozenset[str]
    about: frozenset[str]
    entities: frozenset[str]
    outdated: frozenset[str]


class Oracle:
    """Stand-in for a teacher LLM in the miniature setting: labels questions and passages from the ground truth.

    See the module docstring for the exact rules. Questions may be given as records, ids or (for the world's own
    questions) their text; passages as records or ids. Unknown passages are never relevant and support nothing;
    unknown questions raise ``KeyError``, except in :meth:`retrieval_needed`, which judges any text.
    """

    def __init__(self, passages: Iterable[Passage], questions: Iterable[Record] = ()) -> None:
        self._passages: dict[str, _PassageInfo] = {}
        first_words: dict[str, list[str]] = {}
        for p in passages:
            meta = p.metadata
            self._passages[p.id] = _PassageInfo(
                p,
                frozenset(meta.get("facts", ())),
                frozenset(meta.get("about", ())),
                frozenset(meta.get("entities", ())),
                frozenset(list(meta.get("outdated", ())) + list(meta.get("not_advised", ()))),
            )
            # one graph passage per concept: its title is the concept's name; its names entry lists the aliases
            names = meta.get("names", []) if meta.get("section") == "names" else [p.title] if p.title else []
            if p.source == "graph":
                for name in names:
                    first_words.setdefault(name.split()[0].lower(), []).append(name.lower())
        self._names_by_first_word = first_words
        self._specs: dict[str, _Spec] = {}
        self._by_text: dict[str, _Spec] = {}
        for q in questions:
            self.register(q)

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Oracle:
        """Build from any mix of records (e.g. ``World.records()`` read back from JSONL)."""
        recs = list(records)
        return cls(
            [r for r in recs if isinstance(r, Passage)], [r for r in recs if not isinstance(r, Passage)]
        )

    # ------------------------------------------------------------------------------------------ registration
    def register(self, record: Record) -> None:
        """Make a question or instruction known by id and by text (records without world metadata are ignored)."""
        spec = self._spec_of_record(record)
        if spec is None:
            return
        self._specs[spec.id] = spec
        for text in self._texts(record):
            self._by_text.setdefault(_norm(text), spec)

    @staticmethod
    def _texts(record: Record) -> list[str]:
        if isinstance(record, (MultipleChoiceQuestion, OpenQuestion)):
            return [record.question]
        if isinstance(record, InstructionExample):
            return [record.instruction + ("\n" + record.input if record.input else "")]
        return []

    @staticmethod
    def _spec_of_record(record: Record) -> _Spec | None:
        meta: dict[str, Any] = getattr(record, "metadata", {}) or {}
        if isinstance(record, InstructionExample) and not meta.get("needs_retrieval", True):
            return _Spec(
                record.id,
                meta.get("kind", "general"),
                "",
                (),
                None,
                {},
                reference=record.output,
                needs_retrieval=False,
            )
        if "facts" not in meta or not isinstance(
            record, (MultipleChoiceQuestion, OpenQuestion, InstructionExample)
        ):
            return None
        return _Spec(
            id=record.id,
            relation=meta.get("relation", ""),
            subject=meta.get("subject", ""),
            facts=tuple(meta["facts"]),
            answer_entity=meta.get("answer_entity"),
            candidates=dict(meta.get("candidates", {})),
            options=dict(meta.get("option_entities", {})),
            key_terms=tuple(meta.get("key_terms", ())),
            reference=record.reference_answer if isinstance(record, OpenQuestion) else "",
            needs_retrieval=bool(meta.get("needs_retrieval", True)),
            asked=record.question if isinstance(record, OpenQuestion) else "",
        )

    # ------------------------------------------------------------------------------------------ resolution
    def _spec(self, question: QuestionLike) -> _Spec:
        if isinstance(question, str):
            spec = self._specs.get(question) or self._by_text.get(_norm(question))
            if spec is None:
                raise KeyError(f"not a question of this world: {question[:80]!r}")
            return spec
        spec = self._specs.get(question.id)
        if spec is None:
            spec = self._spec_of_record(question)
        if spec is None:
            raise KeyError(f"record {question.id!r} carries no world metadata; the oracle cannot judge it")
        return spec

    def _passage(self, passage: PassageLike) -> _PassageInfo | None:
        if isinstance(passage, str):
            return self._passages.get(passage)
        info = self._passages.get(passage.id)
        if info is None or _norm(info.passage.text) != _norm(passage.text):
            return None  # same id but different text: not the world's passage
        return info

    def _resolve_answer(self, spec: _Spec, answer: str | None) -> tuple[bool, str | None]:
        """(is the answer the gold one, which candidate entity it names)."""
        if answer is None:
            return True, spec.answer_entity
        if spec.answer_entity is None:  # open question: judged by its key terms
            text = _norm(answer)
            if text == _norm(spec.reference) and text:
                return True, None
            return bool(spec.key_terms) and all(t.lower() in text for t in spec.key_terms), None
        m = _LETTER.match(answer.strip())
        if m and spec.options:
            ent = spec.options.get(m.group(1))
            return ent == spec.answer_entity, ent
        text = answer.lower()
        best: tuple[int, int, str] | None = None
        for ent, name in spec.candidates.items():
            pos = text.find(name.lower())
            if pos >= 0 and (best is None or (pos, -len(name)) < (best[0], best[1])):
                best = (pos, -len(name), ent)
        if best is None:
            return False, None
        return best[2] == spec.answer_entity, best[2]

    # ------------------------------------------------------------------------------------------ judgements
    def retrieval_needed(self, example: QuestionLike) -> bool:
        """Whether answering needs the world's knowledge (Self-RAG's RET). Any text is accepted."""
        spec: _Spec | None
        try:
            spec = self._spec(example)
        except KeyError:
            spec = None
        if spec is not None:
            return spec.needs_retrieval
        if isinstance(example, str):
            text = example
        elif isinstance(example, InstructionExample):
            text = example.instruction + " " + example.input
        else:
            text = getattr(example, "question", "")
        return self.mentions_world_concept(text)

    def mentions_world_concept(self, text: str) -> bool:
        """Whether ``text`` names a concept that has a graph entry in this world."""
        return bool(self._concepts_in(text))

    def _concepts_in(self, text: str) -> set[str]:
        """The (lower-cased) names of the world concepts ``text`` mentions."""
        low = text.lower()
        return {name for word in _WORD.findall(low) for name in self._names_by_first_word.get(word, ())
                if name in low}

    def statement_verdict(self, question: QuestionLike, statement: str) -> str:
        """PolyRAG's judgement of one statement of a long-form answer against the reference answer:
        ``incorrect`` when it names a world concept the reference does not (a wrong drug, gene, symptom...),
        else ``correct`` when it names a concept of the reference that the question does not name, or states a key
        term of the answer, else ``not_mentioned``: a statement that only restates the question ("Trourbitis: how
        it presents, ...") claims nothing, though it names the question's subject."""
        spec = self._spec(question)
        reference = _norm(spec.reference)
        named = self._concepts_in(statement)
        if any(name not in reference for name in named):
            return "incorrect"
        text = _norm(statement)
        if named - self._concepts_in(spec.asked) or any(t.lower() in text for t in spec.key_terms):
            return "correct"
        return "not_mentioned"

    def is_relevant(self, question: QuestionLike, passage: PassageLike) -> bool:
        """Whether the passage is about the question's entity or states a fact the answer rests on (REL)."""
        spec = self._spec(question)
        info = self._passage(passage)
        if info is None or not spec.facts:
            return False
        return spec.subject in info.about or any(f in info.facts for f in spec.facts)

    def support(self, question: QuestionLike, answer: str | None, passage: PassageLike) -> Support:
        """``full`` / ``partial`` / ``none``: does the passage support ``answer`` to the question (SUP)."""
        spec = self._spec(question)
        info = self._passage(passage)
        if info is None or not spec.facts:
            return "none"
        is_gold, ent = self._resolve_answer(spec, answer)
        states_gold = all(f in info.facts for f in spec.facts)
        if is_gold:
            if states_gold:
                return "full"
        else:
            if states_gold and spec.answer_entity is not None:
                return "none"  # the passage states the (single) correct answer, so it contradicts this one
            if (
                spec.relation == "first_line_treatment"
                and ent is not None
                and ent in info.outdated
                and spec.subject in info.about
            ):
                return (
                    "none"  # the passage marks this drug's recommendation as superseded or no longer advised
                )
        return "partial" if self.is_relevant(question, passage) else "none"

    def plan_supports(self, question: QuestionLike, passages: Iterable[PassageLike]) -> bool:
        """Omni-RAG's judge: does the text retrieved by a plan (all its passages together) support the gold answer."""
        spec = self._spec(question)
        if not spec.facts:
            return False
        stated: set[str] = set()
        for p in passages:
            info = self._passage(p)
            if info is not None:
                stated.update(info.facts)
        return all(f in stated for f in spec.facts)

    def supports_in_part(self, question: QuestionLike, passages: Iterable[PassageLike]) -> bool:
        """Omni-RAG's judge of one query's documents: they state at least one fact the gold answer rests on (all
        of them for a single-fact question; one hop of a multi-hop question, whose other hop another source's query
        finds)."""
        spec = self._spec(question)
        for p in passages:
            info = self._passage(p)
            if info is not None and info.facts & set(spec.facts):
                return True
        return False

    def facts_of(self, question: QuestionLike) -> dict[str, Any]:
        """What the oracle knows of a question: ``subject`` and ``answer_entity`` (entity ids), ``relation``,
        ``facts`` (ids) and ``needs_retrieval``."""
        spec = self._spec(question)
        return {"subject": spec.subject, "answer_entity": spec.answer_entity, "relation": spec.relation,
                "facts": list(spec.facts), "needs_retrieval": spec.needs_retrieval}

    def passages_stating(self, facts: Iterable[str]) -> list[Passage]:
        """The world's passages that state any of ``facts``, in world order."""
        wanted = set(facts)
        return [info.passage for info in self._passages.values() if info.facts & wanted]

    def entity_names(self, entity: str) -> list[str]:
        """A world concept's names from its graph entries: the canonical name (its concept entry's title) first,
        then its other names; empty for an entity without a graph entry."""
        names: list[str] = []
        for pid in (f"graph:{entity}#1", f"graph:{entity}#2"):
            info = self._passages.get(pid)
            if info is None:
                continue
            meta = info.passage.metadata
            names += meta.get("names", []) if meta.get("section") == "names" else [info.passage.title]
        return list(dict.fromkeys(n for n in names if n))

    def utility(self, question: QuestionLike, passage: PassageLike) -> int:
        """How useful the passage is for answering the question, 1 (useless) to 5 (states the whole answer)."""
        spec = self._spec(question)
        info = self._passage(passage)
        if info is None or not spec.facts:
            return 1
        n_stated = sum(f in info.facts for f in spec.facts)
        if n_stated == len(spec.facts):
            return 5
        if n_stated:
            return 4
        if spec.subject in info.about:
            outdated = spec.relation == "first_line_treatment" and bool(info.outdated)
            return 2 if outdated else 3
        if spec.subject in info.entities or (
            spec.answer_entity is not None and spec.answer_entity in info.entities
        ):
            return 2
        return 1

    def utility_score(self, question: QuestionLike, passage: PassageLike) -> float:
        """:meth:`utility` mapped to [0, 1] (1 -> 0.0, 5 -> 1.0), e.g. as a distillation target."""
        return (self.utility(question, passage) - 1) / 4

    def answer_utility(self, question: QuestionLike, answer: str) -> int:
        """Self-RAG's perceived utility of an output, 1-5 (see the module docstring)."""
        spec = self._spec(question)
        if not spec.needs_retrieval and spec.answer_entity is None:
            return 5 if _norm(answer) == _norm(spec.reference) else 1
        if spec.answer_entity is None:
            text = _norm(answer)
            hits = sum(t.lower() in text for t in spec.key_terms)
            if text == _norm(spec.reference) or (spec.key_terms and hits == len(spec.key_terms)):
                return 5
            return 3 if hits else 1
        is_gold, ent = self._resolve_answer(spec, answer)
        if is_gold:
            bare = _LETTER.match(answer.strip()) or _norm(answer) == _norm(spec.candidates.get(ent or "", ""))
            return 4 if bare else 5
        return 2 if ent is not None else 1

    def answer(self, question: QuestionLike) -> str:
        """The gold answer's text (an option text, or the reference answer of an open question)."""
        spec = self._spec(question)
        if spec.answer_entity is None:
            return spec.reference
        return spec.candidates[spec.answer_entity]

    def gold_passages(self, question: QuestionLike) -> list[str]:
        """Ids of all passages that fully support the gold answer, in world order."""
        spec = self._spec(question)
        if not spec.facts:
            return []
        return [pid for pid, info in self._passages.items() if all(f in info.facts for f in spec.facts)]

    # ------------------------------------------------------------------------------------------ Self-RAG tokens
    def retrieval_token(self, example: QuestionLike) -> str:
        return "[Retrieval]" if self.retrieval_needed(example) else "[No Retrieval]"

    def retrieval_three_way_token(self, example: QuestionLike, sentence: str, evidence: PassageLike) -> str:
        """RET of one output sentence given the evidence quoted so far (Self-RAG's three-way RET): no retrieval
        for a task that needs no knowledge, continue when the evidence fully supports the sentence, else
        retrieve."""
        if not self.retrieval_needed(example):
            return "[No Retrieval]"
        return "[Continue to Use Evidence]" if self.support(example, sentence, evidence) == "full" else "[Retrieval]"

    def relevance_token(self, question: QuestionLike, passage: PassageLike) -> str:
        return "[Relevant]" if self.is_relevant(question, passage) else "[Irrelevant]"

    def support_token(self, question: QuestionLike, answer: str | None, passage: PassageLike) -> str:
        return SUPPORT_TOKENS[self.support(question, answer, passage)]

    def utility_token(self, question: QuestionLike, answer: str) -> str:
        """``[Utility:x]`` of an output (Self-RAG judges the response, not the passage)."""
        return f"[Utility:{self.answer_utility(question, answer)}]"

    def passage_utility_token(self, question: QuestionLike, passage: PassageLike) -> str:
        return f"[Utility:{self.utility(question, passage)}]"

    def reflective_labels(
        self, example: QuestionLike, answer: str, evidence: PassageLike | None = None
    ) -> ReflectiveLabels:
        """All four Self-RAG labels of one (example, output, evidence) triple; REL and SUP need evidence."""
        labels = ReflectiveLabels(
            retrieval=self.retrieval_token(example), utility=self.utility_token(example, answer)
        )
        if evidence is not None and self.retrieval_needed(example):
            labels.relevance = self.relevance_token(example, evidence)
            labels.support = self.support_token(example, answer, evidence)
        return labels

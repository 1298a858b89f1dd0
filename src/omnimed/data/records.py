"""Typed records that every part of omnimed speaks.

Each record is a pydantic model: construction validates types and invariants (an answer letter must name an
option, a plan holds at most three queries per source, ...). ``Record.from_dict`` turns a validation failure into a
:class:`RecordError` naming the file, line and field, which is what loaders use.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from omnimed.data.errors import RecordError

SOURCE_KINDS: tuple[str, ...] = ("book", "guideline", "research", "wiki", "graph")
SourceKind = Literal["book", "guideline", "research", "wiki", "graph"]
MAX_QUERIES_PER_SOURCE = 3
_LETTERS = re.compile(r"^[A-Z]$")


class Record(BaseModel):
    """Base of all records: strict about unknown keys, convertible to plain dicts and JSON."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    kind: ClassVar[str] = "record"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any, *, path: str = "<dict>", line: int | None = None):
        """Validate ``data``; on failure raise RecordError naming path, line and the first bad field."""
        if not isinstance(data, dict):
            raise RecordError(path, line, None, f"expected a JSON object for a {cls.kind}, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or None
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown field for a {cls.kind}; expected one of {sorted(cls.model_fields)}"
            raise RecordError(path, line, loc, msg) from None


class MultipleChoiceQuestion(Record):
    kind: ClassVar[str] = "mcq"

    id: str
    question: str = Field(min_length=1)
    options: dict[str, str]
    answer: list[str] = Field(min_length=1, description="correct option letter(s); several for multi-answer sets")
    dataset: str
    split: str = "test"
    gold_passages: list[str] = Field(default_factory=list)
    gold_sources: list[SourceKind] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("answer", mode="before")
    @classmethod
    def _letters(cls, v: Any) -> Any:
        if isinstance(v, str):  # "B" or "AC" or "A,C"
            return [c for c in v.replace(",", "").replace(" ", "").upper()]
        return v

    @field_validator("options")
    @classmethod
    def _option_keys(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) < 2:
            raise ValueError("a multiple-choice question needs at least two options")
        for k in v:
            if not _LETTERS.match(k):
                raise ValueError(f"option keys must be single capital letters, got {k!r}")
        return v

    @field_validator("answer")
    @classmethod
    def _answer_in_options(cls, v: list[str], info: ValidationInfo) -> list[str]:
        options = info.data.get("options") or {}
        for a in v:
            if a not in options:
                raise ValueError(f"answer {a!r} is not one of the options {sorted(options)}")
        return v


class OpenQuestion(Record):
    kind: ClassVar[str] = "open"

    id: str
    question: str = Field(min_length=1)
    reference_answer: str
    dataset: str
    split: str = "test"
    gold_passages: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Passage(Record):
    kind: ClassVar[str] = "passage"

    id: str
    source: SourceKind
    title: str = ""
    text: str = Field(min_length=1)
    date: str | None = Field(default=None, description="ISO date (YYYY, YYYY-MM or YYYY-MM-DD)")
    authority: str | None = None
    url: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("date")
    @classmethod
    def _iso(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^\d{4}(-\d{2}(-\d{2})?)?$", v):
            raise ValueError(f"expected an ISO date YYYY[-MM[-DD]], got {v!r}")
        return v


RETRIEVAL_LABELS = ("[Retrieval]", "[No Retrieval]", "[Continue to Use Evidence]")
RELEVANCE_LABELS = ("[Relevant]", "[Irrelevant]")
SUPPORT_LABELS = ("[Fully supported]", "[Partially supported]", "[No support / Contradictory]")
UTILITY_LABELS = tuple(f"[Utility:{i}]" for i in range(1, 6))


class ReflectiveLabels(BaseModel):
    """Self-RAG reflective labels of one example; any may be unknown (None)."""

    model_config = ConfigDict(extra="forbid")
    retrieval: Literal["[Retrieval]", "[No Retrieval]", "[Continue to Use Evidence]"] | None = None
    relevance: Literal["[Relevant]", "[Irrelevant]"] | None = None
    support: Literal["[Fully supported]", "[Partially supported]", "[No support / Contradictory]"] | None = None
    utility: Literal["[Utility:1]", "[Utility:2]", "[Utility:3]", "[Utility:4]", "[Utility:5]"] | None = None


class InstructionExample(Record):
    kind: ClassVar[str] = "instruction"

    id: str
    instruction: str = Field(min_length=1)
    input: str = ""
    output: str
    evidence: list[Passage] = Field(default_factory=list)
    labels: ReflectiveLabels = Field(default_factory=ReflectiveLabels)
    dataset: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


class Plan(Record):
    """Queries per knowledge source (Omni-RAG): 0 to 3 per source, an empty list means the source is unused."""

    kind: ClassVar[str] = "plan"

    question_id: str = ""
    question: str = ""
    queries: dict[SourceKind, list[str]] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("queries")
    @classmethod
    def _at_most_three(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for src, qs in v.items():
            if len(qs) > MAX_QUERIES_PER_SOURCE:
                raise ValueError(f"source {src!r} has {len(qs)} queries; at most {MAX_QUERIES_PER_SOURCE} allowed")
            if any(not q.strip() for q in qs):
                raise ValueError(f"source {src!r} has an empty query")
        return v

    def sources_used(self) -> list[str]:
        return [s for s in SOURCE_KINDS if self.queries.get(s)]


class SourceQuery(Record):
    """One query an expert wrote for one knowledge source while exploring a training question (Omni-RAG's planning
    exploration), and, once judged, whether the documents it retrieves support the gold answer (``judgement``:
    positive / negative) with the ids of those documents."""

    kind: ClassVar[str] = "source_query"

    id: str
    question_id: str
    source: SourceKind
    query: str = Field(min_length=1)
    judgement: Literal["positive", "negative"] | None = None
    passage_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class PromptCompletion(Record):
    """An SFT example in TRL's conversational prompt-completion format: the prompt's messages (system, user, ...)
    and the assistant's reply. Training renders both with the model's chat template, so a prompt built by the
    code that asks at inference (e.g. the reader's) is trained on exactly as it will be asked."""

    kind: ClassVar[str] = "prompt_completion"

    id: str
    prompt: list[Message] = Field(min_length=1)
    completion: list[Message] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _turns(self) -> PromptCompletion:
        if self.prompt[-1].role == "assistant":
            raise ValueError("prompt must end with a system or user message, not an assistant one")
        if any(m.role != "assistant" for m in self.completion):
            raise ValueError("completion holds assistant messages only")
        return self


class PreferencePair(Record):
    """A DPO pair in TRL's conversational format: prompt, chosen and rejected are message lists."""

    kind: ClassVar[str] = "preference"

    id: str = ""
    prompt: list[Message] = Field(min_length=1)
    chosen: list[Message] = Field(min_length=1)
    rejected: list[Message] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _assistant_turns(self) -> PreferencePair:
        for name in ("chosen", "rejected"):
            if getattr(self, name)[-1].role != "assistant":
                raise ValueError(f"{name} must end with an assistant message")
        return self


class UtilityExample(Record):
    """A query with candidate passages and one teacher utility score per passage (PolyRAG distillation)."""

    kind: ClassVar[str] = "utility"

    id: str
    query: str = Field(min_length=1)
    passages: list[Passage] = Field(min_length=1)
    teacher_scores: list[float]
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aligned(self) -> UtilityExample:
        if len(self.teacher_scores) != len(self.passages):
            raise ValueError(
                f"teacher_scores has {len(self.teacher_scores)} values for {len(self.passages)} passages"
            )
        return self


RECORD_TYPES: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (
        MultipleChoiceQuestion,
        OpenQuestion,
        Passage,
        InstructionExample,
        PromptCompletion,
        Plan,
        SourceQuery,
        PreferencePair,
        UtilityExample,
    )
}


def record_type(kind: str) -> type[Record]:
    try:
        return RECORD_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {sorted(RECORD_TYPES)}") from None

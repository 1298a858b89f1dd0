"""Record sets as Hugging Face datasets a researcher can use as they are: typed features (options, evidence, labels
and plan queries as lists and structs, not JSON strings), one ``DatasetDict`` per record kind with the usual
``train`` / ``validation`` / ``test`` splits, and the instruction examples also in TRL's two SFT formats,
conversational ``prompt`` / ``completion`` and ``messages``.

Only ``metadata`` stays a JSON string: its keys differ from record to record, and one Arrow column has one schema.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, TypeVar

from omnimed.data.records import Record

R = TypeVar("R", bound=Record)

#: split names as datasets' conventions spell them; a kind without splits (the corpus) is one ``train`` split
_SPLIT_NAMES = {"dev": "validation", "val": "validation", "valid": "validation"}
#: the TRL SFT formats written beside a set's instruction examples
TRL_FORMATS = ("sft_prompt_completion", "sft_messages")


def _features(kind: str):
    """The ``datasets.Features`` of one record kind's rows."""
    from datasets import Features, List, Value

    text, floats = Value("string"), Value("float64")
    message = {"role": text, "content": text}
    passage = {"id": text, "source": text, "title": text, "text": text, "date": text, "authority": text,
               "url": text, "parent_id": text, "metadata": text}
    question = {"id": text, "question": text, "dataset": text, "split": text, "gold_passages": List(text),
                "metadata": text}
    by_kind: dict[str, dict[str, Any]] = {
        "passage": passage,
        "mcq": {**question, "options": List({"letter": text, "text": text}), "answer": List(text),
                "gold_sources": List(text)},
        "open": {**question, "reference_answer": text},
        "instruction": {"id": text, "instruction": text, "input": text, "output": text,
                        "evidence": List(passage),
                        "labels": {"retrieval": text, "relevance": text, "support": text, "utility": text},
                        "dataset": text, "metadata": text},
        "prompt_completion": {"id": text, "prompt": List(message), "completion": List(message), "metadata": text},
        "preference": {"id": text, "prompt": List(message), "chosen": List(message), "rejected": List(message),
                       "metadata": text},
        "plan": {"question_id": text, "question": text, "queries": List({"source": text, "queries": List(text)}),
                 "metadata": text},
        "source_query": {"id": text, "question_id": text, "source": text, "query": text, "judgement": text,
                         "passage_ids": List(text), "metadata": text},
        "utility": {"id": text, "query": text, "passages": List(passage), "teacher_scores": List(floats),
                    "metadata": text},
    }
    return Features(by_kind[kind])


def _passage_row(p: dict[str, Any]) -> dict[str, Any]:
    return {**p, "metadata": json.dumps(p["metadata"], ensure_ascii=False)}


def hf_row(record: Record) -> dict[str, Any]:
    """One record as a row of its kind's features."""
    row = record.to_dict()
    row["metadata"] = json.dumps(row["metadata"], ensure_ascii=False)
    if record.kind == "mcq":
        row["options"] = [{"letter": k, "text": v} for k, v in row["options"].items()]
    for name in ("evidence", "passages"):
        if name in row:
            row[name] = [_passage_row(p) for p in row[name]]
    if record.kind == "plan":  # the sources as listed: an empty list (source unused) is kept
        row["queries"] = [{"source": s, "queries": qs} for s, qs in row["queries"].items()]
    return row


def from_hf_row(cls: type[R], row: dict[str, Any]) -> R:
    """The record a row of :func:`hf_row` came from."""
    data = dict(row)
    data["metadata"] = json.loads(data["metadata"])
    if cls.kind == "mcq":
        data["options"] = {o["letter"]: o["text"] for o in data["options"]}
    for name in ("evidence", "passages"):
        if name in data:
            data[name] = [{**p, "metadata": json.loads(p["metadata"])} for p in data[name]]
    if cls.kind == "plan":
        data["queries"] = {q["source"]: q["queries"] for q in data["queries"]}
    return cls.model_validate(data)


def to_hf_dataset(records: list[R]):
    """A ``datasets.Dataset`` of one record kind, with its typed features."""
    import datasets

    kinds = {r.kind for r in records}
    if len(kinds) > 1:
        raise ValueError(f"one HF dataset holds one record kind; got {sorted(kinds)}")
    kind = kinds.pop() if kinds else "passage"
    return datasets.Dataset.from_list([hf_row(r) for r in records], features=_features(kind))


def from_hf_dataset(ds, cls: type[R]) -> list[R]:
    return [from_hf_row(cls, row) for row in ds]


def split_of(record: Record) -> str | None:
    """A record's split as written (a question's field, an instruction's metadata), None for the corpus."""
    return getattr(record, "split", None) or getattr(record, "metadata", {}).get("split")


def _by_split(records: list[R]) -> dict[str, list[R]]:
    splits: dict[str, list[R]] = defaultdict(list)
    for r in records:
        name = split_of(r) or "train"
        splits[_SPLIT_NAMES.get(name, name)].append(r)
    return dict(splits)


def trl_rows(records: list[Record], fmt: str) -> list[dict[str, Any]]:
    """Instruction examples in one of TRL's SFT formats (:data:`TRL_FORMATS`): the user turn as the chat layout
    writes it (instruction, input, evidence), the assistant turn the output."""
    from omnimed.data.text import user_text

    rows = []
    for r in records:
        user = {"role": "user", "content": user_text(r.instruction, r.input, r.evidence)}
        reply = {"role": "assistant", "content": r.output}
        if fmt == "sft_prompt_completion":
            rows.append({"id": r.id, "prompt": [user], "completion": [reply]})
        else:
            rows.append({"id": r.id, "messages": [user, reply]})
    return rows


def record_set_datasets(records: list[Record]) -> dict[str, Any]:
    """``{name: DatasetDict}`` for a record set: one per record kind (splits train / validation / test as the
    records say), and the instruction examples in each of TRL's SFT formats."""
    import datasets

    from omnimed.data.io import group_by_kind

    groups = group_by_kind(records)
    out = {kind: datasets.DatasetDict({split: to_hf_dataset(rs) for split, rs in _by_split(recs).items()})
           for kind, recs in groups.items()}
    for fmt in TRL_FORMATS if "instruction" in groups else ():
        out[fmt] = datasets.DatasetDict({split: datasets.Dataset.from_list(trl_rows(rs, fmt))
                                         for split, rs in _by_split(groups["instruction"]).items()})
    return out

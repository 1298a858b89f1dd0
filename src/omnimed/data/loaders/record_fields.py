"""Typed field checks shared by the benchmark loaders; each failure names the record's file, line and field.

A loader reads a raw JSON object (or CSV row) through these accessors, builds the omnimed record with
:func:`build_record` (whose validation errors are renamed to the source's own field names) and, where one raw
item gives several records, gathers them with :func:`collect_groups`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.io import collect
from omnimed.data.loaders.record_locations import At
from omnimed.data.records import Record

__all__ = [
    "answer_letters",
    "as_object",
    "build_record",
    "collect_groups",
    "letter_options",
    "optional_text",
    "publication_year",
    "required_text",
    "split_from_stem",
    "type_name",
]

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_SPLIT_TOKENS = {
    "train": "train",
    "training": "train",
    "dev": "dev",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
}


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type for error messages (``null`` for None, else the Python type name)."""
    return "null" if value is None else type(value).__name__


# ----------------------------------------------------------------------------------------------- field checks
def as_object(obj: Any, at: At, what: str = "a JSON object") -> dict[str, Any]:
    """``obj`` when it is a JSON object; otherwise an error at ``at`` saying ``what`` was expected."""
    if not isinstance(obj, dict):
        raise at.error(None, f"expected {what}, got {type_name(obj)}")
    return obj


def required_text(obj: dict[str, Any], name: str, at: At, *, allow_empty: bool = False) -> str:
    """A required string field; numbers are accepted as text (some option columns hold bare numbers)."""
    if name not in obj:
        raise at.error(name, "missing; expected a string")
    value = obj[name]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise at.error(name, f"expected a string, got {type_name(value)}")
    if not allow_empty and not value.strip():
        raise at.error(name, "expected a non-empty string")
    return value


def optional_text(obj: dict[str, Any], name: str, at: At) -> str | None:
    """An optional string field: None when missing or null, an error when it holds anything but a string."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise at.error(name, f"expected a string or null, got {type_name(value)}")
    return value


def letter_options(raw: Any, at: At, name: str = "options") -> dict[str, str]:
    """Options as ``{letter: text}`` from a dict with letter keys or a list (lettered A, B, ...)."""
    if isinstance(raw, list):
        if len(raw) > len(_LETTERS):
            raise at.error(name, f"expected at most {len(_LETTERS)} options, got {len(raw)}")
        raw = dict(zip(_LETTERS, raw))
    elif isinstance(raw, dict):
        raw = {str(k).strip().upper(): v for k, v in raw.items()}
    else:
        raise at.error(
            name, f"expected a dict {{A: text, ...}} or a list of option texts, got {type_name(raw)}"
        )
    options: dict[str, str] = {}
    for letter in raw:
        if len(letter) != 1 or letter not in _LETTERS:
            raise at.error(name, f"expected single-letter option keys A-Z, got {letter!r}")
        options[letter] = required_text(raw, letter, At(at.path, at.line, at.field(name)), allow_empty=True)
    if len(options) < 2:
        raise at.error(name, f"expected at least two options, got {len(options)}")
    return options


def answer_letters(raw: Any, options: dict[str, str], at: At, name: str = "answer") -> list[str]:
    """One or several answer letters from ``"B"``, ``"AC"``, ``"A,C"``, ``"A, C"`` or ``["A", "C"]``."""
    if isinstance(raw, str):
        letters = [c for c in re.sub(r"[\s,;/]+", "", raw).upper()]
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        letters = [x.strip().upper() for x in raw]
    else:
        raise at.error(name, f"expected option letter(s) like 'B', 'AC' or ['A', 'C'], got {type_name(raw)}")
    if not letters:
        raise at.error(name, "expected at least one option letter, got none")
    for letter in letters:
        if letter not in options:
            raise at.error(name, f"expected option letter(s) among {sorted(options)}, got {raw!r}")
    return list(dict.fromkeys(letters))


def publication_year(value: Any, at: At, name: str) -> str | None:
    """A publication year as an ISO ``YYYY`` string (None when unknown)."""
    if value is None or value == "":
        return None
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not re.fullmatch(r"\d{4}", text):
        raise at.error(name, f"expected a four-digit year or null, got {value!r}")
    return text


def split_from_stem(stem: str, default: str = "test") -> str:
    """The split a file name announces (``train.jsonl``, ``dev_long.json``, ``training12b.json``)."""
    for token in re.split(r"[^a-z]+", stem.lower()):
        for prefix, split in _SPLIT_TOKENS.items():
            if token == prefix or (prefix == "train" and token.startswith("train")):
                return split
    return default


def build_record(
    cls: type[Record], data: dict[str, Any], at: At, renames: dict[str, str] | None = None
) -> Any:
    """Validate a record; a failure names the source's field (via ``renames``) and the record's location."""
    try:
        return cls.from_dict(data, path=str(at.path), line=at.line)
    except RecordError as err:
        name = err.field
        if name and renames:
            head, dot, rest = name.partition(".")
            name = renames.get(head, head) + dot + rest
        raise at.error(name, err.message) from None


def collect_groups(
    items: Iterable[Any],
    report: LoadReport | None,
    skip_invalid: bool,
    convert: Callable[[Any], list[Record]],
) -> list[Record]:
    """Like :func:`collect` for raw items that each yield several records; ``report.read`` counts records."""
    local = LoadReport()
    groups: list[Any] = collect(items, local, skip_invalid, convert)  # type: ignore[arg-type]
    records = [rec for group in groups for rec in group]
    if report is not None:
        report.read += len(records)
        report.skipped.extend(local.skipped)
        for reason, n in local.excluded.items():
            report.exclude(reason, n)
    return records

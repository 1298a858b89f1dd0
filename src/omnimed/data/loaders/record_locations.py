"""Where a raw benchmark record lives: its file, its line and, in a whole-JSON file, its key.

Benchmark loaders report a malformed record by file, line and field. JSONL and CSV give the line directly; for
a whole-JSON file :func:`read_json_with_lines` maps each member of the top container (and, with ``depth=2``,
one level down) to the line where it starts, and :class:`At` puts the record's key at the head of the field
path (``medqa/0001.answer``, ``[12].gold``) so the record is named even where the line is ambiguous.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnimed.data.errors import RecordError
from omnimed.data.io import check_file, iter_jsonl, read_json, read_text

__all__ = ["At", "iter_list_or_jsonl", "read_json_with_lines"]


@dataclass(frozen=True)
class At:
    """Where a raw record lives: file, line (None when unknown) and, in whole-JSON files, its key."""

    path: Path
    line: int | None
    key: str | None = None

    def field(self, name: str | None) -> str | None:
        """The field path as reported: ``name``, or ``key.name`` when the record has a key."""
        if self.key is None:
            return name
        if name is None:
            return self.key
        return f"{self.key}{'' if name.startswith('[') else '.'}{name}"

    def error(self, name: str | None, message: str) -> RecordError:
        """A RecordError at this record's file and line, on field ``name`` (see :meth:`field`)."""
        return RecordError(self.path, self.line, self.field(name), message)


# ----------------------------------------------------------------------------------------------- whole-JSON lines
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _LineCounter:
    """Turns increasing character offsets into 1-based line numbers without rescanning the text."""

    def __init__(self, text: str):
        self.text, self.pos, self.line = text, 0, 1

    def at(self, pos: int) -> int:
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _member_lines(text: str, depth: int = 1) -> dict[tuple[str | int, ...], int]:
    """Line of each member of a valid JSON document's top container, keyed by its path (key or list index).

    ``depth=2`` also maps the members of containers one level down (MIRAGE ``{dataset: {qid: ...}}``,
    BioASQ ``{questions: [...]}``). Only JSON whitespace is skipped, so U+2028 inside strings is harmless.
    """
    lines: dict[tuple[str | int, ...], int] = {}
    counter = _LineCounter(text)

    def skip(pos: int) -> int:
        return _WS.match(text, pos).end()  # type: ignore[union-attr]

    def scan(pos: int, prefix: tuple[str | int, ...], level: int) -> int:
        """Scan the container starting at ``pos``; return the position just after it."""
        opener = text[pos]
        if opener not in "[{":
            return _DECODER.raw_decode(text, pos)[1]
        closer = "}" if opener == "{" else "]"
        pos = skip(pos + 1)
        index = 0
        while text[pos] != closer:
            member_pos = pos
            key: str | int = index
            if opener == "{":
                key, pos = _DECODER.raw_decode(text, pos)
                pos = skip(skip(pos) + 1)  # the colon
            lines[(*prefix, key)] = counter.at(member_pos)
            if level < depth and text[pos] in "[{":
                pos = scan(pos, (*prefix, key), level + 1)
            else:
                pos = _DECODER.raw_decode(text, pos)[1]
            pos = skip(pos)
            if text[pos] == ",":
                pos = skip(pos + 1)
            index += 1
        return pos + 1

    start = skip(0)
    if start < len(text):
        scan(start, (), 1)
    return lines


def read_json_with_lines(path: Path, depth: int = 1) -> tuple[Any, dict[tuple[str | int, ...], int]]:
    """The parsed document (errors name the file and line) plus the line of each top-level member."""
    data = read_json(path)
    return data, _member_lines(read_text(path), depth)


def iter_list_or_jsonl(path: Path) -> Iterator[tuple[At, Any]]:
    """Items of a file that is either a JSON list or JSONL (one object per line, whatever the suffix)."""
    with open(check_file(path), "rb") as fh:  # bytes: the first one tells, whatever the encoding of the rest
        head = fh.read(4096).lstrip()
    if head.startswith(b"["):
        data, lines = read_json_with_lines(path)
        for i, obj in enumerate(data):
            yield At(path, lines.get((i,)), f"[{i}]"), obj
    else:
        for lineno, obj in iter_jsonl(path):
            yield At(path, lineno), obj

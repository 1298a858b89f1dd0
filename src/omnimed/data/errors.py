"""Errors and skip reports for reading data: every problem names its file, line and field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class RecordError(ValueError):
    """A record that cannot be read: says where (file, line or key) and what was expected."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str):
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


@dataclass
class Skipped:
    path: str
    line: int | None
    field: str | None
    message: str


@dataclass
class LoadReport:
    """Counts what a loader read and, with ``skip_invalid``, what it skipped and why."""

    read: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    #: records left out by design, not because they are invalid (e.g. BioASQ questions that are not yes/no)
    excluded: dict[str, int] = field(default_factory=dict)

    def skip(self, err: RecordError) -> None:
        self.skipped.append(Skipped(err.path, err.line, err.field, err.message))

    def exclude(self, reason: str, n: int = 1) -> None:
        self.excluded[reason] = self.excluded.get(reason, 0) + n

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)

    def summary(self, limit: int = 5) -> str:
        text = f"{self.read} records read, {self.n_skipped} skipped as invalid"
        for reason, n in self.excluded.items():
            text += f", {n} left out ({reason})"
        for s in self.skipped[:limit]:
            where = s.path if s.line is None else f"{s.path}:{s.line}"
            text += f"\n  skipped {where}: {s.field or ''} {s.message}".rstrip()
        if self.n_skipped > limit:
            text += f"\n  ... and {self.n_skipped - limit} more"
        return text

    def as_dict(self) -> dict:
        return {"read": self.read, "skipped": self.n_skipped, "excluded": dict(self.excluded)}

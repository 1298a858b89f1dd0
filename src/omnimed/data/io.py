"""Reading and writing records: line-by-line JSONL, HF datasets, record sets with a manifest (written atomically
through :mod:`omnimed.data.artifacts`).

JSONL is read by iterating the file, never with ``str.splitlines()``: real files hold U+2028 inside strings and
``splitlines`` would cut a record in two.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from omnimed.data.artifacts import atomic_path, atomic_write_json
from omnimed.data.errors import LoadReport, RecordError
from omnimed.data.records import RECORD_TYPES, Record, record_type

R = TypeVar("R", bound=Record)
T = TypeVar("T")


# ----------------------------------------------------------------------------------------------- raw reading
def iter_jsonl(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for each non-blank line. A line that is not valid JSON raises RecordError
    naming the line, or with ``skip_invalid`` is counted in ``report`` and passed over."""
    path = Path(path)
    with open(path, encoding="utf-8", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                err = RecordError(path, lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})")
                if not skip_invalid:
                    raise err from None
                if report is not None:
                    report.skip(err)
                continue
            yield lineno, obj


def read_json(path: str | Path) -> Any:
    """Load a whole JSON document, naming the file (and line) when it is not valid JSON."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise RecordError(path, exc.lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})") from None


def collect(
    items: Iterable[T], report: LoadReport | None, skip_invalid: bool, convert: Callable[[T], R | None]
) -> list[R]:
    """Convert raw items, raising on the first RecordError or, with ``skip_invalid``, counting it in ``report``."""
    out: list[R] = []
    for item in items:
        try:
            rec = convert(item)
        except RecordError as err:
            if not skip_invalid:
                raise
            if report is not None:
                report.skip(err)
            continue
        if rec is not None:
            out.append(rec)
            if report is not None:
                report.read += 1
    return out


# ----------------------------------------------------------------------------------------------- records
def read_records(
    path: str | Path,
    cls: type[R] | None = None,
    *,
    skip_invalid: bool = False,
    report: LoadReport | None = None,
) -> list[R]:
    """Read our own records JSONL. Lines carry a ``kind`` key; ``cls`` restricts to (and checks) one kind."""

    def convert(item: tuple[int, Any]) -> R | None:
        lineno, obj = item
        if not isinstance(obj, dict):
            raise RecordError(path, lineno, None, "expected a JSON object")
        obj = dict(obj)
        kind = obj.pop("kind", None)
        if cls is not None:
            if kind is not None and kind != cls.kind:
                return None
            return cls.from_dict(obj, path=str(path), line=lineno)
        if kind not in RECORD_TYPES:
            raise RecordError(path, lineno, "kind", f"expected one of {sorted(RECORD_TYPES)}, got {kind!r}")
        return record_type(kind).from_dict(obj, path=str(path), line=lineno)

    return collect(iter_jsonl(path, skip_invalid=skip_invalid, report=report), report, skip_invalid, convert)


def record_line(rec: Record) -> str:
    return json.dumps({"kind": rec.kind, **rec.to_dict()}, ensure_ascii=False)


def write_records(path: str | Path, records: Iterable[Record]) -> str:
    """Write records as JSONL atomically; returns the sha256 of the file's bytes (its fingerprint)."""
    digest = hashlib.sha256()
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            line = record_line(rec) + "\n"
            fh.write(line)
            digest.update(line.encode("utf-8"))
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- HF datasets
def to_hf_dataset(records: list[R]):
    """A ``datasets.Dataset`` of one record kind; free-keyed dict fields are stored as JSON strings."""
    import datasets

    kinds = {r.kind for r in records}
    if len(kinds) > 1:
        raise ValueError(f"one HF dataset holds one record kind; got {sorted(kinds)}")
    return datasets.Dataset.from_list([r.to_hf_row() for r in records])


def from_hf_dataset(ds, cls: type[R]) -> list[R]:
    return [cls.from_hf_row(row) for row in ds]


def group_by_kind(records: Iterable[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.kind, []).append(r)
    return groups


def save_record_set(
    out_dir: str | Path, records: list[Record], *, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``out_dir/records.jsonl``, ``out_dir/hf`` (a DatasetDict, one split per record kind) and
    ``out_dir/manifest.json`` with counts and the fingerprint (sha256 of records.jsonl). Each file is atomic and
    the manifest is written last, so a directory with a manifest is complete."""
    import datasets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    fingerprint = write_records(out / "records.jsonl", records)
    groups = group_by_kind(records)
    dd = datasets.DatasetDict({kind: to_hf_dataset(recs) for kind, recs in groups.items()})
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with atomic_path(out / "hf", is_dir=True) as tmp:
            dd.save_to_disk(str(tmp))
    finally:
        if bars:
            datasets.enable_progress_bars()
    counts = {"records": len(records), **dict(Counter(r.kind for r in records))}
    manifest = {"counts": counts, "fingerprint": fingerprint, "files": {"jsonl": "records.jsonl", "hf": "hf"}}
    manifest.update(extra or {})
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


def load_record_set(out_dir: str | Path, cls: type[R] | None = None) -> list[R]:
    """Read a record set written by :func:`save_record_set` (its JSONL), optionally one kind only."""
    out = Path(out_dir)
    if not (out / "manifest.json").exists():
        raise FileNotFoundError(f"{out}: no manifest.json; not a complete omnimed record set")
    return read_records(out / "records.jsonl", cls)

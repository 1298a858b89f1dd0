"""Reading and writing records: line-by-line JSONL, HF datasets, record sets with a manifest (written atomically
through :mod:`omnimed.data.artifacts`).

JSONL is read by iterating the file, never with ``str.splitlines()``: real files hold U+2028 inside strings and
``splitlines`` would cut a record in two.
"""

from __future__ import annotations

import codecs
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


# ----------------------------------------------------------------------------------------------- text files
# Every reader of a file a user points at goes through these: a missing file or a folder is named as such, and a
# byte that is not valid UTF-8 is reported as a RecordError with the file and line (the codec's own message names
# neither: "'utf-8' codec can't decode byte 0xe4 in position 49").
def check_file(path: str | Path) -> Path:
    """``path`` as a Path when it is an existing file; FileNotFoundError or IsADirectoryError naming it if not."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a folder; expected a file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    return path


def not_text_error(path: str | Path, encoding: str, exc: UnicodeDecodeError) -> RecordError:
    """The RecordError for a file that ``encoding`` cannot decode: the line and byte of the first bad byte, found
    by decoding the file again line by line (a text stream decodes in chunks, so its position is not the line)."""
    label = "UTF-8" if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig") else encoding
    codec = "utf-8" if label == "UTF-8" else encoding
    expected = f"expected {label} text (re-save the file as {label})"
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode(codec)
            except UnicodeDecodeError as bad:
                byte = raw[bad.start]
                return RecordError(
                    path, lineno, None,
                    f"not valid {label}: byte 0x{byte:02x} at byte {bad.start + 1} of the line ({bad.reason}); {expected}",
                )
    return RecordError(path, None, None, f"not valid {label} ({exc.reason}); {expected}")


def text_lines(path: str | Path, *, encoding: str = "utf-8", newline: str | None = None) -> Iterator[str]:
    """The lines of a text file, as ``open(path, encoding=encoding, newline=newline)`` yields them; a missing file,
    a folder or an undecodable byte raises an error naming the file (and line)."""
    path = check_file(path)
    with open(path, encoding=encoding, newline=newline) as fh:
        try:
            yield from fh
        except UnicodeDecodeError as exc:
            raise not_text_error(path, encoding, exc) from None


def read_text(path: str | Path, *, encoding: str = "utf-8") -> str:
    """A whole text file, as ``Path.read_text`` reads it; errors name the file (and line) like :func:`text_lines`."""
    path = check_file(path)
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as exc:
        raise not_text_error(path, encoding, exc) from None


def json_error_message(exc: json.JSONDecodeError) -> str:
    """``invalid JSON (<reason>: column N)``. The reason is phrased to be followed by a position ("Unterminated
    string starting at"), so the colon form reads right where "(<reason> at column N)" gave "at at"."""
    return f"invalid JSON ({exc.msg}: column {exc.colno})"


# ----------------------------------------------------------------------------------------------- raw reading
def iter_jsonl(
    path: str | Path, *, skip_invalid: bool = False, report: LoadReport | None = None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for each non-blank line. A line that is not valid JSON raises RecordError
    naming the line, or with ``skip_invalid`` is counted in ``report`` and passed over."""
    path = Path(path)
    for lineno, line in enumerate(text_lines(path, newline="\n"), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            err = RecordError(path, lineno, None, json_error_message(exc))
            if not skip_invalid:
                raise err from None
            if report is not None:
                report.skip(err)
            continue
        yield lineno, obj


def read_json(path: str | Path) -> Any:
    """Load a whole JSON document, naming the file (and line) when it is not valid JSON."""
    path = Path(path)
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(path, exc.lineno, None, json_error_message(exc)) from None


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


def group_by_kind(records: Iterable[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.kind, []).append(r)
    return groups


def save_record_set(
    out_dir: str | Path, records: list[Record], *, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``out_dir/records.jsonl``, ``out_dir/hf/<name>/`` (a DatasetDict per record kind with its train /
    validation / test splits, and the instruction examples in TRL's SFT formats: :mod:`omnimed.data.hf`) and
    ``out_dir/manifest.json`` with counts and the fingerprint (sha256 of records.jsonl). Each file is atomic and
    the manifest is written last, so a directory with a manifest is complete."""
    import datasets

    from omnimed.data.hf import record_set_datasets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    fingerprint = write_records(out / "records.jsonl", records)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with atomic_path(out / "hf", is_dir=True) as tmp:
            for name, dd in record_set_datasets(records).items():
                dd.save_to_disk(str(tmp / name))
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

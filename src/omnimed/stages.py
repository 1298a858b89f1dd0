"""What every build stage shares: a folder named after what produced it, resumable progress, a manifest last.

A stage (teacher labelling, critic annotation, pair construction, ...) processes items one batch at a time and
appends each finished batch to ``progress.jsonl`` (flushed and synced), so an interrupted run continues where it
stopped and loses at most the batch in flight. When every item is done, the stage writes its record set
(``records.jsonl``, ``hf/``) and then ``manifest.json``: a folder with a manifest is complete, and running the stage
again with the same settings does nothing. The settings' key is stored in the manifest and in ``stage.json`` at the
start; a folder built with other settings is refused rather than mixed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnimed.data.io import atomic_write_json, read_json, save_record_set
from omnimed.data.records import Record


@dataclass
class StageResult:
    """Where a stage's output is, its counts, and whether it was already there (nothing was done)."""

    path: Path
    counts: dict[str, Any]
    reused: bool


def batches(items: Sequence[Any], size: int, progress: bool = True, label: str = "") -> Iterator[Sequence[Any]]:
    """``items`` in batches of ``size``, advancing a rich progress bar that counts items."""
    from rich.progress import Progress

    size = max(1, size)
    with Progress(disable=not progress) as bar:
        task = bar.add_task(label, total=len(items))
        for start in range(0, len(items), size):
            chunk = items[start:start + size]
            yield chunk
            bar.advance(task, len(chunk))


class StageError(ValueError):
    """A stage folder that cannot be used as asked; the message names the folder and what to do."""


def settings_key(settings: Mapping[str, Any]) -> str:
    """12 hex digits identifying a stage's settings (and its inputs' fingerprints, when they are part of them)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: stage-config fields that change where or how fast a stage runs, not what it makes
NOT_SETTINGS = ("out", "batch_size")


def open_stage(name: str, cfg: Any, *, root: str | Path = ".", **inputs: Any) -> "StageDir":
    """The folder of stage ``name`` for the dataclass config ``cfg`` (its ``out`` fixes the folder); the settings
    key covers every field but :data:`NOT_SETTINGS`, plus ``inputs`` (models, corpora, versions it reads)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SETTINGS}
    return StageDir(name, {**settings, **inputs}, root=root, out=getattr(cfg, "out", None))


class StageDir:
    """The output folder of one stage run. ``settings`` (JSON-able) decide the key; ``out`` fixes the folder,
    otherwise it is ``<root>/builds/<stage>/<key>``."""

    def __init__(self, stage: str, settings: Mapping[str, Any], *, root: str | Path = ".",
                 out: str | Path | None = None) -> None:
        self.stage = stage
        self.settings = dict(settings)
        self.key = settings_key({"stage": stage, **self.settings})
        self.path = Path(out) if out else Path(root) / "builds" / stage / self.key
        self.manifest_path = self.path / "manifest.json"
        self.progress_path = self.path / "progress.jsonl"

    # ------------------------------------------------------------------------------------------------ state
    def finished(self) -> bool:
        """Whether this folder already holds this stage's complete output for these settings."""
        if not self.manifest_path.is_file():
            return False
        self._check_key(read_json(self.manifest_path).get("stage", {}), self.manifest_path)
        return True

    def _check_key(self, meta: Mapping[str, Any], where: Path) -> None:
        if meta.get("key") not in (None, self.key) or meta.get("name") not in (None, self.stage):
            raise StageError(
                f"{where}: this folder was built by stage {meta.get('name')!r} with other settings (key "
                f"{meta.get('key')}, now {self.key}); choose another output folder or delete it to rebuild"
            )

    def start(self) -> dict[str, dict[str, Any]]:
        """Open the folder for work; returns the items finished by an earlier, interrupted run (id -> result)."""
        self.path.mkdir(parents=True, exist_ok=True)
        info = self.path / "stage.json"
        if info.is_file():
            self._check_key(read_json(info), info)
        else:
            atomic_write_json(info, {"name": self.stage, "key": self.key, "settings": self.settings})
        done: dict[str, dict[str, Any]] = {}
        if self.progress_path.is_file():
            with self.progress_path.open(encoding="utf-8") as fh:
                for line in fh:
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError:  # the last line of a run killed mid-write
                        break
                    done[item["id"]] = item
        return done

    def append(self, results: Iterable[Mapping[str, Any]]) -> None:
        """Record finished items (each a dict with an ``id``); durable before this returns."""
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
        if not lines:
            return
        with self.progress_path.open("a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def finish(self, records: list[Record], **extra: Any) -> dict[str, Any]:
        """Write the record set, then the manifest (counts, fingerprint, the stage's settings and ``extra``)."""
        stage_meta = {"name": self.stage, "key": self.key, "settings": self.settings}
        return save_record_set(self.path, records, extra={"stage": stage_meta, **extra})

    def manifest(self) -> dict[str, Any]:
        return read_json(self.manifest_path)

"""What every stage, index and export shares: the one atomic-write helper, the settings key that names an output
folder, the package versions a manifest records, and the stage folder with resumable progress.

Atomic writes: a file or folder is written under a hidden sibling name (``.<name>.<host>-<pid>-<random>.tmp``) and
renamed into place, so a reader sees the old complete output or the new one, never half of one. A folder that
already exists is moved aside first and put back if the swap fails. What is published gets the modes the process
umask allows (the temp files start owner-only), so a team folder stays readable. The temp files of a writer that was
killed (this host, a process that no longer runs) are removed by the next write of the same output.

Stage folders: a stage (teacher labelling, critic annotation, pair construction, ...) processes items one batch at
a time and appends each finished batch to ``progress.jsonl`` (flushed and synced), so an interrupted run continues
where it stopped and loses at most the batch in flight; a torn last line (a kill mid-append) is cut on the next
start. An item is done only when its backend answered: an item whose call failed is not recorded, so the next run
asks again, and a stage whose failed items pass ``max_failed_share`` (default 5%) raises :class:`RunFailed` without
writing a manifest. When every item is done (or failed within the bound), the stage writes its record set
(``records.jsonl``, ``hf/``) and then ``manifest.json``: a folder with a manifest is complete, and running the stage
again with the same settings does nothing but ask for the items listed as failed. The settings' key is stored in the
manifest and in ``stage.json`` at the start; a folder built with other settings is refused rather than mixed, and
the refusal names the settings that changed (an input folder spelled another way, relative or absolute, is not one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------- atomic writes
TMP_SUFFIX = ".tmp"


def _writer_tag() -> str:
    """``<host>-<pid>``: whose temp file it is, so a later run can tell a dead writer's leftovers from a live one's
    (on a shared disk, another machine's writers are never touched)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temp files and folders that killed writers of ``path`` on this host left beside it; returns
    them. A writer killed in the middle of a folder swap (the old folder moved aside, the new one not yet in place)
    is rolled back: its old folder is put back."""
    host = socket.gethostname()
    removed = []
    for prefix in (f".{path.name}.old-", f".{path.name}."):
        for item in path.parent.glob(f"{prefix}{host}-*"):
            rest = item.name[len(prefix) + len(host) + 1:]
            pid = rest.split("-", 1)[0]
            if not pid.isdigit() or _is_running(int(pid)):
                continue
            old = prefix.endswith(".old-")
            if not (old or item.name.endswith(TMP_SUFFIX)):
                continue
            if old and not path.exists():
                os.replace(item, path)
                log.warning("%s: put back the previous folder that a killed writer had moved aside", path)
                continue
            if item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
            removed.append(item)
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publishable(tmp: Path) -> None:
    """Give ``tmp`` (and, for a folder, everything in it) the modes the umask allows: mkstemp and mkdtemp create
    owner-only entries, and libraries may too."""
    mask = _umask()
    for item in [tmp, *(tmp.rglob("*") if tmp.is_dir() else ())]:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


@contextmanager
def atomic_path(path: str | Path, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (an empty folder with ``is_dir``) to write into; on success it
    replaces ``path`` in one rename (an existing folder is moved aside, then deleted), on error it is removed and
    ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    prefix = f".{path.name}.{_writer_tag()}-"
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=TMP_SUFFIX, dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=TMP_SUFFIX, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        _publishable(tmp)
        if is_dir and path.exists():
            old = path.with_name(f".{path.name}.old-{_writer_tag()}-{uuid.uuid4().hex[:8]}")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, synced to disk before the rename."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------- where outputs go
@dataclass
class PathsConfig:
    """Where a run's outputs land: checkpoints and builds under ``root``, the model / call / tokenization cache
    under ``cache``, the run's own files (metrics, logs) in ``output_dir`` (Hydra's run folder)."""

    root: str = "."
    checkpoints: str = "checkpoints"
    cache: str = "${oc.env:OMNIMED_CACHE,${oc.env:HOME}/.cache/omnimed}"
    output_dir: str = "${hydra:runtime.output_dir}"


# ----------------------------------------------------------------------------------------------- keys, lineage
def settings_key(settings: Any, length: int = 12) -> str:
    """Hex digits identifying a stage's or index's settings (and its inputs' fingerprints, when they are part of
    them): the same settings always give the same key, so the output folder can be named by it."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:length]


def files_digest(root: Path, files: Iterable[Path]) -> str:
    """sha256 (hex) over ``files`` in path order, each as its path relative to ``root`` then its bytes: equal
    digests, the same files with the same contents (model weights, a package's source)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


PACKAGES = (
    "omnimed", "torch", "lightning", "transformers", "peft", "trl", "datasets", "accelerate", "deepspeed",
    "hydra-core", "wandb", "sentence-transformers", "tokenizers", "safetensors",
)  # fmt: skip


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed version of each package (``not installed`` for a missing one), for manifests and run lineage."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# ----------------------------------------------------------------------------------------------- stage folders
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


# ----------------------------------------------------------------------------------------------- failed calls
#: the share of a run's items (a stage's examples, an evaluation's questions) whose backend calls may fail before
#: the run fails as a whole (``max_failed_share`` of ``omnimed-build`` and ``omnimed-evaluate``)
MAX_FAILED_SHARE = 0.05


@dataclass(frozen=True)
class Failed:
    """An item whose backend call failed (connection, timeout, server error, after the backend's own retries). It
    is neither done nor dropped: nothing is recorded for it, and the next run asks again. ("Dropped" is the papers'
    word for a reply that came back without a valid label.)"""

    id: str
    error: str


class RunFailed(RuntimeError):
    """Too many backend calls of a run failed: nothing was published as a result. The message names the backend,
    how many failed and the first error."""


def check_failures(errors: Sequence[str], total: int, *, what: str, backend: str, max_share: float,
                   kept: str, unit: str = "items") -> str | None:
    """None when no call failed; a one-line warning when ``len(errors)`` of ``total`` items failed within
    ``max_share``; :class:`RunFailed` above it. ``kept`` says what survives for the next run."""
    if not errors:
        return None
    share = len(errors) / max(1, total)
    summary = (f"{what}: {len(errors)} of {total} {unit} ({share:.1%}) got no answer from {backend}; first error: "
               f"{errors[0]}")
    if share > max_share:
        raise RunFailed(f"{summary}. That is above max_failed_share={max_share:g}, so nothing was recorded as a "
                        f"result; {kept}")
    return f"{summary} (within max_failed_share={max_share:g}); {kept}"


def check_max_failed_share(share: float) -> None:
    """Refuse a ``max_failed_share`` that is not a share (before a run does any work)."""
    if not 0 <= share <= 1:
        raise ValueError(f"max_failed_share={share}: expected a share between 0 and 1")


def describe_backend(backend: Any) -> str:
    """``<name> backend <model>`` and, for a server, its URL: how failure messages name the backend."""
    inner = getattr(backend, "backend", backend)  # a CachedBackend wraps the real one
    url = getattr(inner, "base_url", None)
    return f"{backend.name} backend {backend.model_id!r}" + (f" at {url}" if url else "")


#: stage-config fields that change where or how fast a stage runs, not what it makes
NOT_SETTINGS = ("out", "batch_size")


def open_stage(name: str, cfg: Any, *, root: str | Path = ".", **inputs: Any) -> StageDir:
    """The folder of stage ``name`` for the dataclass config ``cfg`` (its ``out`` fixes the folder); the settings
    key covers every field but :data:`NOT_SETTINGS`, plus ``inputs`` (models, corpora, versions it reads)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SETTINGS}
    return StageDir(name, {**settings, **inputs}, root=root, out=getattr(cfg, "out", None))


def changed_settings(stored: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The settings whose values differ, two strings that name the same existing file or folder from here
    (``./builds/x`` and ``/abs/builds/x``) counting as one value, inside nested settings too (a knowledge config's
    index folder): a stage's key holds an input folder as spelled."""
    def same(a: Any, b: Any) -> bool:
        if a == b:
            return True
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, str) and isinstance(b, str) and a and b and os.path.exists(a):
            return os.path.realpath(a) == os.path.realpath(b)
        return False

    return sorted(k for k in set(stored) | set(now) if k not in stored or k not in now or not same(stored[k], now[k]))


class StageDir:
    """The output folder of one stage run. ``settings`` (JSON-able) decide the key; ``out`` fixes the folder,
    otherwise it is ``<root>/builds/<stage>/<key>``, or the folder of that stage built or begun with the same
    settings where an input folder was spelled another way (``./builds/x`` and ``/abs/builds/x``), so a second
    spelling resumes or reuses the work instead of starting it again."""

    def __init__(self, stage: str, settings: Mapping[str, Any], *, root: str | Path = ".",
                 out: str | Path | None = None) -> None:
        self.stage = stage
        self.settings = dict(settings)
        self.key = settings_key({"stage": stage, **self.settings})
        if out:
            self.path = Path(out)
        else:
            keyed = Path(root) / "builds" / stage / self.key
            self.path = keyed if keyed.exists() else self._same_settings(keyed.parent) or keyed
        self.manifest_path = self.path / "manifest.json"
        self.progress_path = self.path / "progress.jsonl"

    def _same_settings(self, parent: Path) -> Path | None:
        """A folder under ``parent`` that this stage built or began with these settings, spelled another way."""
        from omnimed.data.io import read_json

        for info in sorted(parent.glob("*/stage.json")) if parent.is_dir() else []:
            try:
                meta = read_json(info)
            except (OSError, ValueError):
                continue
            if not isinstance(meta, Mapping) or meta.get("name") != self.stage:
                continue
            stored = meta.get("settings")
            if isinstance(stored, Mapping) and not changed_settings(stored, self.settings):
                log.info("%s: %s was built with these settings, an input folder spelled another way: using it",
                         self.stage, info.parent)
                return info.parent
        return None

    # ------------------------------------------------------------------------------------------------ state
    def finished(self) -> bool:
        """Whether this folder already holds this stage's complete output for these settings."""
        from omnimed.data.io import read_json

        if not self.manifest_path.is_file():
            return False
        manifest = read_json(self.manifest_path)
        self._check_key(manifest.get("stage", {}), self.manifest_path)
        # items whose calls failed (within the bound) are asked again: the output is complete only without them
        return not manifest.get("failed", {}).get("ids")

    def _check_key(self, meta: Mapping[str, Any], where: Path) -> None:
        if meta.get("name") not in (None, self.stage):
            raise StageError(f"{where}: this folder was built by stage {meta.get('name')!r}, not {self.stage!r}; "
                             "choose another output folder")
        if meta.get("key") in (None, self.key):
            return
        stored = meta.get("settings")
        changed = changed_settings(stored, self.settings) if isinstance(stored, Mapping) else None
        if changed == []:  # the same settings, an input folder spelled another way (relative / absolute)
            return
        what = ("; ".join(f"{k}: {stored.get(k)!r} then, {self.settings.get(k)!r} now" for k in changed[:4])
                if changed else "its stored settings are not readable")
        raise StageError(f"{where}: this folder was built by stage {self.stage!r} with other settings (key "
                         f"{meta.get('key')}, now {self.key}: {what}); choose another output folder or delete it "
                         "to rebuild")

    def start(self) -> dict[str, dict[str, Any]]:
        """Open the folder for work; returns the items finished by an earlier, interrupted run (id -> result)."""
        from omnimed.data.io import read_json

        self.path.mkdir(parents=True, exist_ok=True)
        info = self.path / "stage.json"
        if info.is_file():
            self._check_key(read_json(info), info)
        else:
            atomic_write_json(info, {"name": self.stage, "key": self.key, "settings": self.settings})
        return self._read_progress()

    def _read_progress(self) -> dict[str, dict[str, Any]]:
        """The items of ``progress.jsonl`` (id -> result). A last line without its newline is the torn append of a
        killed run: it is cut off (and logged), so the next append starts on a line of its own. A complete line
        that is not a JSON object with an ``id`` is corruption, named by line."""
        done: dict[str, dict[str, Any]] = {}
        if not self.progress_path.is_file():
            return done
        data = self.progress_path.read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            log.warning("%s: cutting a torn last line (%d bytes) left by an interrupted run", self.progress_path,
                        len(data) - whole)
            with self.progress_path.open("r+b") as fh:
                fh.truncate(whole)
                fh.flush()
                os.fsync(fh.fileno())
        # split on newlines only: str.splitlines would also cut at U+2028 inside a JSON string
        for lineno, line in enumerate(data[:whole].decode("utf-8").split("\n"), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StageError(f"{self.progress_path}:{lineno}: not valid JSON ({exc.msg}: column {exc.colno}); the "
                                 "progress file is corrupt: delete the stage folder to rebuild") from None
            if not isinstance(item, dict) or "id" not in item:
                raise StageError(f"{self.progress_path}:{lineno}: a progress line is an object with an `id`")
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

    def process(self, todo: Sequence[Any], work: Callable[[Sequence[Any]], list[Mapping[str, Any] | Failed]], *,
                total: int, backend: str, max_failed: float = MAX_FAILED_SHARE, batch_size: int = 32,
                progress: bool = True, label: str = "") -> list[Failed]:
        """Run ``work`` on ``todo`` one batch at a time; each batch's done items (dicts with an ``id``) are
        appended to the progress file as it returns, its :class:`Failed` items are not. Returns the failed items
        when they are at most ``max_failed`` of the stage's ``total`` items, else raises :class:`RunFailed` naming
        ``backend`` and the first error (and the stage writes no manifest)."""
        failed: list[Failed] = []
        for batch in batches(todo, batch_size, progress, label or self.stage):
            results = work(batch)
            self.append(r for r in results if not isinstance(r, Failed))
            failed += [r for r in results if isinstance(r, Failed)]
        note = check_failures([f.error for f in failed], total, what=f"stage {self.stage}", backend=backend,
                              max_share=max_failed, kept=f"the items done are kept in {self.progress_path}, and the "
                              "next run of the stage asks only for the others")
        if note:
            log.warning(note)
        return failed

    def finish(self, records: list, *, failed: Sequence[Failed] = (), **extra: Any) -> dict[str, Any]:
        """Write the record set, then the manifest (counts, fingerprint, the stage's settings and ``extra``). Items
        in ``failed`` are listed in it, and the next run of the stage asks for them again."""
        from omnimed.data.io import save_record_set

        stage_meta = {"name": self.stage, "key": self.key, "settings": self.settings}
        if failed:
            extra["failed"] = {"count": len(failed), "ids": [f.id for f in failed], "first_error": failed[0].error}
        return save_record_set(self.path, records, extra={"stage": stage_meta, **extra})

    def manifest(self) -> dict[str, Any]:
        from omnimed.data.io import read_json

        return read_json(self.manifest_path)

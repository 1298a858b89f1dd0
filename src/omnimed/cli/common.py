"""What every Hydra entry point shares: the console, a check of ``task=`` before Hydra composes (train and
evaluate tasks share ``conf/task/``), and :func:`one_line_errors`, which turns a user's mistake (a missing
mandatory key, a bad path, file or value) into one line and exit code 2 instead of a traceback. Where ``conf/``
lives is :mod:`omnimed.conf`."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from omnimed.conf import conf_dir

console = Console(stderr=True)


# ----------------------------------------------------------------------------------------------- task check
# omnimed-train and omnimed-evaluate share conf/task/: a training task's defaults list starts with `task_schema`, an
# evaluation task's with `<kind>_task_schema` (qa_task_schema, retrieval_task_schema, ...). Hydra would offer every
# file of the folder to both apps (and the ConfigStore's schemas too) and fail on the wrong kind with an opaque
# "Could not load 'task/qa_task_schema'", so both entry points check `task=NAME` before Hydra composes.
APPS = {"train": "omnimed-train", "evaluate": "omnimed-evaluate"}
_TASK_OVERRIDE = re.compile(r"^\+{0,2}task=(.*)$", re.DOTALL)
_CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def _schema_kind(entry: str) -> str | None:
    """``train`` for ``task_schema``, ``evaluate`` for ``<kind>_task_schema``, None for anything else."""
    name = entry.strip().lstrip("/").removeprefix("task/")
    if name == "task_schema":
        return "train"
    if name.endswith("_task_schema"):
        return "evaluate"
    return None


def _first_default(path: Path) -> str | None:
    """The first entry of the defaults list of a task YAML (``_self_`` skipped), None without one."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    defaults = data.get("defaults") if isinstance(data, dict) else None
    for entry in defaults if isinstance(defaults, list) else []:
        if isinstance(entry, str) and entry.strip() != "_self_":
            return entry
        if isinstance(entry, dict):  # e.g. {"override /model": x}: not a schema, the kind is unknown
            return None
    return None


def task_catalog(dirs: list[str | Path] | None = None) -> dict[str, str | None]:
    """Every task YAML under ``<conf>/task/`` (and ``<dir>/task/`` of each extra config dir): its name (path
    relative to ``task/`` without ``.yaml``) -> ``train``, ``evaluate`` or None (no recognisable schema). A task
    whose defaults start with another task of the folder inherits that task's kind."""
    roots = [Path(d) / "task" for d in [conf_dir(), *(dirs or [])]]
    firsts: dict[str, str | None] = {}
    for root in roots:
        if root.is_dir():
            for path in sorted(root.rglob("*.yaml")):
                firsts.setdefault(path.relative_to(root).with_suffix("").as_posix(), _first_default(path))

    def kind(name: str, seen: frozenset[str] = frozenset()) -> str | None:
        first = firsts.get(name)
        if first is None:
            return None
        direct = _schema_kind(first)
        if direct is not None:
            return direct
        parent = first.strip().lstrip("/").removeprefix("task/")
        if parent in firsts and parent not in seen:
            return kind(parent, seen | {name})
        return None

    return {name: kind(name) for name in firsts}


def requested_tasks(argv: list[str]) -> list[str] | None:
    """Task names that ``argv`` selects with ``task=``/``+task=``/``++task=`` (each of a sweep ``a,b`` or
    ``choice(a,b)``); None when a value is not a plain list of names (``glob(...)``, an interpolation) or Hydra's
    search path is changed, so only Hydra can tell."""
    names: list[str] = []
    for arg in argv:
        if re.match(r"^\+{0,2}hydra\.searchpath=", arg):
            return None
        m = _TASK_OVERRIDE.match(arg)
        if not m:
            continue
        value = m.group(1).strip()
        for fn in ("choice(", "sort(", "shuffle("):
            if value.startswith(fn) and value.endswith(")"):
                value = value[len(fn) : -1]
        if any(c in value for c in "()[]{}$*?") or "=" in value:
            return None
        for part in value.split(","):
            part = part.strip().strip("'\"").strip()
            if part and part != "null":
                names.append(part)
    return names


def _extra_config_dirs(argv: list[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if arg in _CONFIG_DIR_FLAGS and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--config-dir="):
            out.append(arg.split("=", 1)[1])
    return out


def check_task_choice(app: str, argv: list[str] | None = None) -> None:
    """Stop (exit code 2) with a clear message when ``argv`` names a task that does not exist or belongs to the
    other app; the message lists the tasks of ``app`` (``train`` or ``evaluate``), read from the task YAMLs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = requested_tasks(argv)
    if not names:
        return
    catalog = task_catalog(_extra_config_dirs(argv))
    valid = sorted(n for n, k in catalog.items() if k == app)
    problems = []
    for name in names:
        kind = catalog.get(name, "missing")
        if kind == app or kind is None:
            continue  # ours, or a file whose kind cannot be read: Hydra validates it
        if kind == "missing":
            problems.append(f"task={name}: no such task (no conf/task/{name}.yaml)")
        else:
            other = APPS[kind]
            problems.append(f"task={name} is an {other} task, not an {APPS[app]} one: run `{other} task={name}`")
    if problems:
        print("\n".join([*problems, f"{APPS[app]} tasks: {', '.join(valid) or '(none)'}"]), file=sys.stderr)
        raise SystemExit(2)


def checks_task(app: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for a ``@hydra.main`` entry point: :func:`check_task_choice` on the command line before Hydra
    composes (only when called as the command, i.e. without arguments)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def entry(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs:
                check_task_choice(app)
            return fn(*args, **kwargs)

        return entry

    return wrap


# ----------------------------------------------------------------------------------------------- user errors
#: what a user fixes on the command line or on disk: a bad value or record (ValueError, which covers RecordError,
#: KnowledgeError and the config checks), a path that is missing, a folder where a file is expected, ...
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def fail(app: str, message: str, code: int = 2) -> None:
    """End the command with ``<app>: error: <message>`` as ONE line on stderr (newlines in the message are
    joined with "; ", and rich does not wrap it) and exit code ``code``."""
    text = "; ".join(part.strip() for part in str(message).splitlines() if part.strip()) or "unknown error"
    console.print(f"[bold red]{app}: error:[/] {escape(text)}", soft_wrap=True, highlight=False)
    raise SystemExit(code)


def missing_keys(cfg: Any) -> list[str]:
    """The full keys of the composed config whose value is mandatory (``???``) and unset, sorted. Read without
    resolving interpolations (``OmegaConf.missing_keys`` resolves them, and one that fails would hide the answer)."""
    if not isinstance(cfg, DictConfig):
        return []
    found: list[str] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif node == "???":
            found.append(key)

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return sorted(found)


def one_line_errors(app: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for the task function of a ``@hydra.main`` entry point (put it under ``@hydra.main``).

    Before the function runs, a mandatory key left unset (``???``) ends the command naming the key; while it runs,
    :data:`USER_ERRORS` end it with their message. Either way one line on stderr and exit code 2 (see :func:`fail`)
    instead of Hydra's "Error executing job" traceback with exit code 1. ``HYDRA_FULL_ERROR=1`` lets the errors
    through, with their traceback, for a bug report."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                return fn(cfg, *args, **kwargs)
            missing = missing_keys(cfg)
            if missing:
                fail(app, f"missing mandatory value(s): {', '.join(missing)}; set "
                          f"{' '.join(k + '=...' for k in missing)} on the command line")
            try:
                return fn(cfg, *args, **kwargs)
            except USER_ERRORS as err:
                fail(app, str(err) or type(err).__name__)

        return run

    return wrap

"""Which code computed a finished run, as a table's report says it: a run's ``code.json``
(:func:`omnimed.tracking.code_version`, written when it started) against today's source, counting only the files an
evaluation run can import, so that a change to the report writers here, to training or to a benchmark does not
name every kept cell as computed by other code."""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from omnimed.tracking import CODE_FILE, PACKAGE, source_digest


@lru_cache(maxsize=32)
def _changed_files(commit: str) -> tuple[str, ...] | None:
    """The package's files that differ between ``commit`` and the working tree, None when git cannot say."""
    try:
        res = subprocess.run(["git", "diff", "--name-only", "--relative", commit, "--", "."], cwd=PACKAGE,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(res.stdout.split()) if res.returncode == 0 else None


#: the entry point of every evaluation run (each cell of a table): the files it can import are the code its numbers
#: depend on (:func:`run_code_files`)
RUN_ENTRY = "cli/evaluate.py"


@lru_cache(maxsize=1)
def run_code_files() -> frozenset[str]:
    """The package's files (relative to it) that an ``omnimed-evaluate`` process can import: from
    :data:`RUN_ENTRY`, every ``omnimed`` import followed, function-level ones included; a subpackage other than
    ``cli`` is taken whole once reached, since its registries import their members by name. The package map
    (ARCHITECTURE.md) keeps the report writers of ``tables/``, training, the benchmarks and the other CLIs out of
    it, so a change there cannot alter a finished run's numbers."""
    todo, seen, whole = [PACKAGE / RUN_ENTRY, PACKAGE / "__init__.py"], set(), set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for parts in (n.split(".") for n in names if n.startswith("omnimed.")):
                top = PACKAGE / parts[1]
                if top.is_dir() and parts[1] != "cli":
                    if parts[1] not in whole:  # listed once, however many of its imports are met
                        whole.add(parts[1])
                        todo += top.rglob("*.py")
                else:
                    module = PACKAGE.joinpath(*parts[1:])
                    todo += [module.with_suffix(".py"), module / "__init__.py", top / "__init__.py"]
    return frozenset(p.relative_to(PACKAGE).as_posix() for p in seen)


def other_code(run_dir: Path) -> str | None:
    """None when the run in ``run_dir`` was computed by today's code, or by code that differs only where no run
    reaches (:func:`run_code_files`); otherwise one line saying what differs: the commit it ran at and the run's
    files changed since, or that it predates the record."""
    path = run_dir / CODE_FILE
    if not path.is_file():
        return code_difference(None)
    try:
        saved: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"computed by unknown code ({path} unreadable: {exc})"
    return code_difference(saved, str(path))


def code_difference(saved: Any, where: str = CODE_FILE) -> str | None:
    """:func:`other_code` for a run's :data:`CODE_FILE` record already read (``saved``; None: the run has none),
    e.g. one kept in a table's stored cells after its run folder is gone."""
    if saved is None:
        return "computed before runs recorded their code (no code.json; today's code may differ)"
    if not isinstance(saved, Mapping):
        return f"computed by unknown code ({where} holds no JSON object)"
    if saved.get("source") == source_digest():
        return None
    commit = saved.get("commit")
    at = f"at commit {commit[:10]}{' with uncommitted changes' if saved.get('dirty') else ''}" if commit else \
        "outside git"
    files = _changed_files(commit) if commit else None
    if files is not None:
        files = tuple(f for f in files if f in run_code_files())
        if not files and not saved.get("dirty"):  # only code no run imports changed: the same computation
            return None
    if not files:
        return f"computed by other code ({at}): the package's source differs from today's"
    shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
    return f"computed by other code ({at}); changed since in src/omnimed: {shown}"

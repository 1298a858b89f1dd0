"""Which code computed a result: a digest of the omnimed package's source beside the git commit it was checked out
at. Every evaluation run records it (``code.json`` in its folder), so a reproduced table that keeps a finished run
instead of running it again can say when today's code differs from the code that computed it: a change to a metric
or a pipeline otherwise passes unseen, since the run's config is still the same."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

#: the file an evaluation run writes beside ``metrics.json``
CODE_FILE = "code.json"
PACKAGE = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over the package's Python files (their paths and bytes): equal digests, the same code."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def code_version() -> dict[str, Any]:
    """What :data:`CODE_FILE` holds: the source digest, the commit and whether the checkout had uncommitted
    changes (commit and dirty are None outside git)."""
    from omnimed.tracking import git_state

    return {"source": source_digest(), **git_state(PACKAGE)}


@lru_cache(maxsize=32)
def _changed_files(commit: str) -> tuple[str, ...] | None:
    """The package's files that differ between ``commit`` and the working tree, None when git cannot say."""
    try:
        res = subprocess.run(["git", "diff", "--name-only", "--relative", commit, "--", "."], cwd=PACKAGE,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(res.stdout.split()) if res.returncode == 0 else None


def other_code(run_dir: Path) -> str | None:
    """None when the run in ``run_dir`` was computed by today's code; otherwise one line saying what differs: the
    commit it ran at and the package files changed since, or that it predates the record."""
    path = run_dir / CODE_FILE
    if not path.is_file():
        return "computed before runs recorded their code (no code.json; today's code may differ)"
    try:
        saved: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"computed by unknown code ({path} unreadable: {exc})"
    if not isinstance(saved, Mapping):
        return f"computed by unknown code ({path} holds no JSON object)"
    if saved.get("source") == source_digest():
        return None
    commit = saved.get("commit")
    at = f"at commit {commit[:10]}{' with uncommitted changes' if saved.get('dirty') else ''}" if commit else \
        "outside git"
    files = _changed_files(commit) if commit else None
    if not files:
        return f"computed by other code ({at}): the package's source differs from today's"
    shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
    return f"computed by other code ({at}); changed since in src/omnimed: {shown}"

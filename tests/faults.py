"""Kill a process at a chosen point of its writes (SIGKILL: no cleanup, no ``finally``), for the fault-injection
tests. A point is one of:

- ``torn-append:N``: the N-th append to a stage's progress file writes half of its bytes, then the process dies;
- ``after-append:N``: the process dies right after the N-th append (between two batches);
- ``publish:NAME``: the process dies just before a temp file or folder is renamed to ``NAME`` (its temp is left);
- ``swap:NAME``: the process dies in the middle of replacing the folder ``NAME`` (the old folder moved aside, the
  new one not yet in place).

In a test: :func:`killed_at` forks, arms the point in the child and runs a function there (the parent's imports,
knowledge base and world are shared, so a run costs no start-up). As a script, for a console entry point run in a
fresh process::

    python tests/faults.py POINT omnimed.cli.train:main [overrides ...]
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    """Patch this process so that it kills itself at ``point``."""
    from omnimed.data import artifacts

    kind, _, arg = point.partition(":")
    if kind in ("torn-append", "after-append"):
        target, calls = int(arg), [0]
        append = artifacts.StageDir.append

        def patched(self, results):
            calls[0] += 1
            if calls[0] != target:
                return append(self, results)
            if kind == "after-append":
                append(self, results)
                _die()
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results).encode()
            with self.progress_path.open("ab") as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
                os.fsync(fh.fileno())
            _die()

        artifacts.StageDir.append = patched
    elif kind in ("publish", "swap"):
        replace = os.replace

        def patched_replace(src, dst, *args, **kwargs):
            name = Path(dst).name
            if kind == "publish" and name == arg and str(src).endswith(artifacts.TMP_SUFFIX):
                _die()
            replace(src, dst, *args, **kwargs)
            if kind == "swap" and name.startswith(f".{arg}.old-"):
                _die()

        os.replace = patched_replace
    else:
        raise ValueError(f"unknown fault point {point!r}")


def killed_at(point: str, fn: Callable[[], object], timeout: float = 300.0) -> bool:
    """Run ``fn`` in a forked child armed with ``point``; True when the child was killed there, False when it
    finished without reaching the point (an exception in ``fn`` fails the calling test)."""
    import time

    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        code = 0
        try:
            arm(point)
            fn()
        except BaseException:  # noqa: BLE001 - reported to the parent through the exit code
            import traceback

            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"the child armed with {point} ran past {timeout:g} s")
        time.sleep(0.02)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, f"child died of signal {os.WTERMSIG(status)}"
        return True
    code = os.WEXITSTATUS(status)
    assert code == 0, f"the child armed with {point} failed (exit {code}); see the captured stderr"
    return False


def main() -> None:
    point, entry, *args = sys.argv[1:]
    module, _, func = entry.partition(":")
    arm(point)
    sys.argv = [entry, *args]
    getattr(importlib.import_module(module), func)()


if __name__ == "__main__":
    main()

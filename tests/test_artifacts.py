"""data/artifacts.py, what every stage, index and export relies on: writes are atomic and readable by the team
(the process umask, not owner-only), a killed write leaves nothing that outlives the next write of the same output,
and a stage's progress file survives a crash mid-append."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from omnimed.data.artifacts import StageDir, StageError, atomic_path, atomic_write_json, open_stage


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_outputs_follow_the_process_umask(tmp_path, umask_022):
    atomic_write_json(tmp_path / "manifest.json", {"a": 1})
    assert mode(tmp_path / "manifest.json") == 0o644
    with atomic_path(tmp_path / "hf", is_dir=True) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(b"x")
        os.chmod(tmp / "sub" / "weights.bin", 0o600)  # as a library might write it
    assert mode(tmp_path / "hf") == 0o755 and mode(tmp_path / "hf" / "sub") == 0o755
    assert mode(tmp_path / "hf" / "sub" / "weights.bin") == 0o644


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_temp_files_of_a_killed_write_are_removed_by_the_next_write(tmp_path):
    host = socket.gethostname()
    dead, alive = dead_pid(), os.getpid()
    stale_file = tmp_path / f".records.jsonl.{host}-{dead}-abc.tmp"
    stale_dir = tmp_path / f".hf.{host}-{dead}-def.tmp"
    stale_old = tmp_path / f".hf.old-{host}-{dead}-0a1b"
    live = tmp_path / f".records.jsonl.{host}-{alive}-ghi.tmp"  # a writer still running: never touched
    other = tmp_path / f".records.jsonl.elsewhere-{dead}-jkl.tmp"  # another machine's writer (shared disk)
    stale_file.write_text("half")
    for d in (stale_dir, stale_old):
        d.mkdir()
        (d / "x").write_text("half")
    live.write_text("busy")
    other.write_text("busy")
    atomic_write_json(tmp_path / "records.jsonl", [])
    with atomic_path(tmp_path / "hf", is_dir=True):
        pass
    assert not stale_file.exists() and not stale_dir.exists() and not stale_old.exists()
    assert live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["records.jsonl", "hf", live.name, other.name])


def test_a_failed_write_leaves_the_old_output_and_no_temp_file(tmp_path):
    atomic_write_json(tmp_path / "m.json", {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "m.json") as tmp:
        tmp.write_text("partial")
        raise RuntimeError("killed")
    assert json.loads((tmp_path / "m.json").read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


@dataclass
class Settings:
    n: int = 3
    out: str | None = None


def test_a_torn_last_line_of_progress_is_cut_and_resume_appends_whole_lines(tmp_path):
    stage = open_stage("demo", Settings(out=str(tmp_path / "s")))
    stage.start()
    stage.append([{"id": "a", "v": 1}, {"id": "b", "v": 2}])
    with stage.progress_path.open("a", encoding="utf-8") as fh:
        fh.write('{"id": "c", "v"')  # a crash mid-append
    again = open_stage("demo", Settings(out=str(tmp_path / "s")))
    assert set(again.start()) == {"a", "b"}
    again.append([{"id": "c", "v": 3}])
    lines = again.progress_path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]
    assert set(open_stage("demo", Settings(out=str(tmp_path / "s"))).start()) == {"a", "b", "c"}


def test_a_stage_folder_resumes_when_its_input_folder_is_spelled_another_way_and_names_a_real_change(
        tmp_path, monkeypatch):
    """The key holds an input folder as spelled; the same folder given relative or absolute resumes the work done,
    while a setting that changed is refused with its old and new values named."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "builds" / "explore").mkdir(parents=True)
    first = StageDir("demo", {"explore": str(tmp_path / "builds" / "explore"), "k": 5}, out=tmp_path / "s")
    first.start()
    first.append([{"id": "a"}])
    relative = StageDir("demo", {"explore": "./builds/explore", "k": 5}, out=tmp_path / "s")
    assert relative.key != first.key and set(relative.start()) == {"a"}
    with pytest.raises(StageError, match=r"k: 5 then, 3 now"):
        StageDir("demo", {"explore": "./builds/explore", "k": 3}, out=tmp_path / "s").start()
    with pytest.raises(StageError, match=r"explore: .* then, 'builds/other' now"):
        StageDir("demo", {"explore": "builds/other", "k": 5}, out=tmp_path / "s").start()


def test_a_keyed_stage_folder_is_found_again_when_its_input_folder_is_spelled_another_way(tmp_path, monkeypatch):
    """Without ``out`` the folder is named by the settings' key, which holds an input folder as spelled: the same
    input given relative after absolute finds the folder built (or begun) then instead of building it again under a
    new key; a real change of setting still gets a folder of its own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "builds" / "explore").mkdir(parents=True)
    absolute = StageDir("demo", {"explore": str(tmp_path / "builds" / "explore"), "k": 5}, root=tmp_path)
    absolute.start()
    absolute.append([{"id": "a"}])
    relative = StageDir("demo", {"explore": "./builds/explore", "k": 5}, root=tmp_path)
    assert relative.key != absolute.key and relative.path == absolute.path and set(relative.start()) == {"a"}
    absolute.finish([])
    assert StageDir("demo", {"explore": "builds/explore", "k": 5}, root=tmp_path).finished()
    other = StageDir("demo", {"explore": "./builds/explore", "k": 3}, root=tmp_path)
    assert other.path == tmp_path / "builds" / "demo" / other.key and other.start() == {}
    assert StageDir("demo2", {"explore": "./builds/explore", "k": 5}, root=tmp_path).path.parent.name == "demo2"
    nested = StageDir("kb", {"knowledge": {"path": str(tmp_path / "builds" / "explore"), "k": [1, 2]}}, root=tmp_path)
    nested.start()
    assert StageDir("kb", {"knowledge": {"path": "builds/explore", "k": [1, 2]}}, root=tmp_path).path == nested.path
    assert StageDir("kb", {"knowledge": {"path": "builds/explore", "k": [1, 3]}}, root=tmp_path).path != nested.path


def test_a_corrupt_complete_line_of_progress_is_named(tmp_path):
    stage = StageDir("demo", {"n": 1}, out=tmp_path / "s")
    stage.start()
    stage.progress_path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n', encoding="utf-8")
    with pytest.raises(StageError, match=r"progress\.jsonl:2"):
        stage.start()
    stage.progress_path.write_text('{"id": "a"}\n{"no_id": 1}\n', encoding="utf-8")
    with pytest.raises(StageError, match=r"progress\.jsonl:2.*id"):
        stage.start()

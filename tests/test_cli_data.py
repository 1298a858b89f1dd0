"""`omnimed-data` end to end: the world is byte-identical per seed, real files convert, bad input is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnimed.data import load_record_set

BIN = Path(sys.executable).parent / "omnimed-data"
FIX = Path(__file__).parent / "fixtures" / "benchmarks"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_world_is_byte_identical_for_the_same_seed(tmp_path):
    for name in ("a", "b"):
        res = run("world", "size=tiny", "seed=3", f"out={tmp_path / name}", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    a, b = (tmp_path / "a" / "records.jsonl").read_bytes(), (tmp_path / "b" / "records.jsonl").read_bytes()
    assert a == b
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["counts"]["records"] == len(a.splitlines())  # bytes.splitlines splits on \n, \r only
    assert manifest["counts"]["passage"] > 0 and manifest["counts"]["mcq"] > 0
    assert (tmp_path / "a" / "hf" / "mcq" / "dataset_dict.json").exists()
    res = run("world", "size=tiny", "seed=4", f"out={tmp_path / 'c'}", cwd=tmp_path)
    assert (tmp_path / "c" / "records.jsonl").read_bytes() != a


def test_convert_fixture_and_report_skips(tmp_path):
    res = run("convert", "format=medmcqa", f"path={FIX / 'medmcqa_dev.jsonl'}", f"out={tmp_path / 'm'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    records = load_record_set(tmp_path / "m")
    assert records and all(r.kind == "mcq" for r in records)


def test_convert_malformed_names_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q?", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 2}\n'
                   '{"id": "2", "question": "q?", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 9}\n')
    res = run("convert", "format=medmcqa", f"path={bad}", f"out={tmp_path / 'o'}", cwd=tmp_path)
    assert res.returncode != 0
    assert f"{bad}:2" in res.stderr and "cop" in res.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    res = run("convert", "format=medmcqa", f"path={bad}", f"out={tmp_path / 'o'}", "skip_invalid=true", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["counts"]["records"] == 1 and manifest["load_report"]["skipped"] == 1


def test_unknown_format_lists_the_known_ones(tmp_path):
    res = run("convert", "format=pdf", f"path={FIX}", f"out={tmp_path / 'x'}", cwd=tmp_path)
    assert res.returncode != 0 and "mirage" in res.stderr and "graph" in res.stderr


@pytest.mark.parametrize(
    "fmt, rel, kind, at_least",
    [
        ("mmlu", "qa/mmlu-dev-val/data/val", "mcq", 100),
        ("longform", "qa/omnirag-longform/train_long.json", "open", 1000),
        ("research", "research/pubmedqa/data/ori_pqal.json", "passage", 1000),
        ("book", "book/osbooks-anatomy-physiology", "passage", 900),
    ],
)
def test_convert_real_files(tmp_path, realdata, fmt, rel, kind, at_least):
    res = run("convert", f"format={fmt}", f"path={realdata / rel}", f"out={tmp_path / fmt}", "skip_invalid=true",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    manifest = json.loads((tmp_path / fmt / "manifest.json").read_text())
    assert manifest["counts"][kind] >= at_least

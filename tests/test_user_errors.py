"""User mistakes end a command with ONE line on stderr (no traceback, exit code 2) naming the path or config key,
the cause and what was expected, and leave no folder behind (issue 12): a folder given for a file, an empty
corpus folder, a byte that is not UTF-8, an invalid training config or a missing ``data.path``; the documented
MedOmniKB override composes; default run names do not depend on the clock; JSON errors read right; a plan
search without a plan says what it expected."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from omnimed.cli.common import conf_dir
from omnimed.data.errors import RecordError
from omnimed.data.formats import load_format
from omnimed.data.io import iter_jsonl, read_json
from omnimed.knowledge.build import build_knowledge_base
from omnimed.knowledge.config import KnowledgeConfig, register_index_configs
from omnimed.knowledge.types import KnowledgeError

BIN = Path(sys.executable).parent
NOT_UTF8 = b'{"question": "caf\xe4 au lait?", "options": {"A": "x", "B": "y"}, "answer_idx": "A"}\n'


def cli(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env,
                          check=False)


def one_line_error(res: subprocess.CompletedProcess, app: str) -> str:
    """The single stderr line of a refused command (exit code 2, no traceback)."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"{app}: error: "), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------- 5: one line, not a traceback
def test_data_convert_of_a_folder_or_a_non_utf8_file_is_one_line(tmp_path):
    folder = tmp_path / "medqa"
    folder.mkdir()
    line = one_line_error(cli("omnimed-data", "convert", "format=medqa", f"path={folder}", f"out={tmp_path / 'o'}",
                              cwd=tmp_path), "omnimed-data convert")
    assert f"{folder}: is a folder; expected a file (format=medqa)" in line
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(NOT_UTF8)
    line = one_line_error(cli("omnimed-data", "convert", "format=medqa", f"path={bad}", f"out={tmp_path / 'o'}",
                              cwd=tmp_path), "omnimed-data convert")
    assert f"{bad}:1: not valid UTF-8: byte 0xe4" in line and "expected UTF-8 text" in line
    assert not (tmp_path / "o").exists()


def test_index_of_an_empty_corpus_folder_is_one_line_and_creates_no_index_folder(tmp_path):
    empty = tmp_path / "realdata"
    empty.mkdir()
    res = cli("omnimed-index", "knowledge=realdata", f"knowledge.realdata_root={empty}", f"paths.root={tmp_path / 'r'}",
              f"hydra.run.dir={tmp_path / 'hydra'}", cwd=tmp_path)
    line = one_line_error(res, "omnimed-index")
    assert f"knowledge.realdata_root={empty}" in line and "ap2e_sections.jsonl" in line and "not found" in line
    assert not (tmp_path / "r").exists()  # no indexes/realdata/ left behind


@pytest.mark.parametrize(("fmt", "name", "data", "line"), [
    ("medqa", "q.jsonl", b'{"question": "a"}\n' + NOT_UTF8, 2),
    ("mmlu", "anatomy_val.csv", b'q1,a,b,c,d,A\n"q2 caf\xe4",a,b,c,d,B\n', 2),
    ("pubmedqa", "ori_pqal.json", b'{\n "1": {"QUESTION": "caf\xe4"}\n}\n', 2),
    ("biomedmcqs", "mcqs.json", b'[\n {"question": "q"},\n {"question": "\xff"}\n]\n', 3),
    ("selfbiorag_instructions", "inst.jsonl", b'{"instruction": "a"}\r\n{"instruction": "\xe4"}\r\n', 2),
    ("graph", "graph/HumanDiseaseOntology/src/ontology/doid.obo",
     b"format-version: 1.2\n\n[Term]\nid: DOID:4\nname: dis\xe4ase\n", 5),
])
def test_every_reader_names_the_file_and_line_of_a_non_utf8_byte(tmp_path, fmt, name, data, line):
    """One shared place (omnimed.data.io.text_lines / read_text) serves JSONL, CSV, whole JSON and OBO alike."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    with pytest.raises(RecordError) as info:
        load_format(fmt, tmp_path / "graph" if fmt == "graph" else path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert "not valid UTF-8" in str(info.value)


def test_hetionet_tsv_names_the_line_of_a_non_utf8_byte(tmp_path):
    from omnimed.data.loaders.hetionet import _iter_tsv

    path = tmp_path / "nodes.tsv"
    path.write_bytes(b"id\tname\tkind\r\nDisease::1\tdis\xe4ase\tDisease\r\n")
    with pytest.raises(RecordError, match=re.escape(f"{path}:2: not valid UTF-8")):
        list(_iter_tsv(path))


# ------------------------------------------------------------------------------------------- 6: nothing created
def test_train_with_an_invalid_config_is_one_line_and_creates_nothing(tmp_path):
    """data=records without data.path and task.lr=-1, in one run: both named on one line, no checkpoint folder."""
    res = cli("omnimed-train", f"paths.root={tmp_path / 'r'}", f"hydra.run.dir={tmp_path / 'hydra'}",
              "model=tiny-llama", "data=records", "task.lr=-1", "logger=none", cwd=tmp_path)
    line = one_line_error(res, "omnimed-train")
    assert "task.lr=-1.0: expected a learning rate > 0" in line
    assert "data.path is not set" in line and "set data.path=DIR" in line
    assert not (tmp_path / "r").exists()  # no checkpoints/sft/<run>/, no config.yaml or versions.json


def test_train_config_problems_are_checked_before_any_work():
    from omnimed.training.config import TrainConfig, config_problems, validate_train_config

    assert config_problems(TrainConfig()) == []
    cfg = TrainConfig()
    cfg.task.lr, cfg.task.warmup_ratio, cfg.data.batch_size, cfg.ckpt_path = 0.0, 1.5, 0, "auto"
    problems = config_problems(cfg)
    assert [p.split("=")[0] for p in problems] == ["task.lr", "task.warmup_ratio", "data.batch_size", "ckpt_path"]
    with pytest.raises(ValueError, match=r"^invalid training config: task\.lr=0\.0: expected a learning rate > 0; "):
        validate_train_config(cfg)


def test_records_data_path_that_is_not_utf8_names_file_and_line(tmp_path):
    from omnimed.training.config import TrainConfig
    from omnimed.training.engine import load_examples

    bad = tmp_path / "records.jsonl"
    bad.write_bytes(b'{"kind": "instruction", "instruction": "caf\xe4"}\n')
    cfg = TrainConfig()
    cfg.data.source, cfg.data.path = "records", str(bad)
    with pytest.raises(RecordError, match=re.escape(f"{bad}:1: not valid UTF-8")):
        load_examples(cfg)


# ------------------------------------------------------------------------------------------- 8: MedOmniKB override
def test_documented_medomnikb_files_override_composes(tmp_path):
    """conf/knowledge/medomnikb.yaml documents `knowledge.files.book=[...]`; it composes (no "not in struct"),
    and an empty folder there fails naming the key, before any index folder exists."""
    register_index_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("index", overrides=["knowledge=medomnikb", f"knowledge.files.book=[{tmp_path / 'book'}]",
                                          f"knowledge.files.wiki=[{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}]"])
    knowledge = OmegaConf.to_object(cfg.knowledge)
    assert knowledge.files["book"] == [str(tmp_path / "book")] and len(knowledge.files["wiki"]) == 2
    assert knowledge.files["guideline"] == [] and knowledge.corpus == "files"
    (tmp_path / "book").mkdir()
    knowledge.sources, knowledge.indexes, knowledge.retriever = ["book"], ["bm25"], "bm25"
    knowledge.rerank.enabled = False
    with pytest.raises(KnowledgeError, match=r"^knowledge\.files\.book: .*not found"):
        build_knowledge_base(knowledge, tmp_path / "root", progress=False)
    assert not (tmp_path / "root").exists()
    knowledge.files["book"] = [str(tmp_path / "missing")]
    with pytest.raises(KnowledgeError, match=r"knowledge\.files\.book: .*missing: no such file"):
        build_knowledge_base(knowledge, tmp_path / "root", progress=False)


# ------------------------------------------------------------------------------------------- 9: run names
def test_default_run_name_is_deterministic_and_sweep_jobs_sort_in_job_order(tmp_path):
    from omnimed.training.config import TrainConfig
    from omnimed.training.engine import claim_run_dir, default_run_name

    cfg = TrainConfig()
    name = default_run_name(cfg)
    assert re.fullmatch(r"smollm2-135m_world_small_s0_[0-9a-f]{8}", name), name
    assert default_run_name(TrainConfig()) == name  # no clock
    cfg.paths.root, cfg.logger.name, cfg.run_name = "/elsewhere", "csv", "ignored"  # not what is trained
    assert default_run_name(cfg) == name
    cfg.task.lr = 1e-3
    assert default_run_name(cfg) != name  # another config, another key
    jobs = [default_run_name(cfg, job_num=n) for n in (10, 2, 0, 1)]
    assert sorted(jobs) == [jobs[2], jobs[3], jobs[1], jobs[0]] and "_j002_" in jobs[1]
    # a second identical run gets its own folder, never the first one's
    first, second, third = (claim_run_dir(tmp_path, name) for _ in range(3))
    assert [first.name, second.name, third.name] == [name, f"{name}-2", f"{name}-3"]


# ------------------------------------------------------------------------------------------- 10: wording, plans
def test_json_errors_read_right(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b": "unterminated\n')
    with pytest.raises(RecordError) as info:
        list(iter_jsonl(path))
    assert str(info.value) == f"{path}:2: invalid JSON (Unterminated string starting at: column 7)"
    whole = tmp_path / "x.json"
    whole.write_text('{\n  "a": \n}\n')
    with pytest.raises(RecordError) as info:
        read_json(whole)
    assert str(info.value) == f"{whole}:3: invalid JSON (Expecting value: column 1)"
    assert " at at " not in str(info.value)


def test_search_plan_without_a_plan_says_what_it_expected():
    from omnimed.knowledge.base import KnowledgeBase

    kb = KnowledgeBase(KnowledgeConfig(), {})
    with pytest.raises(TypeError, match=r"expects a Plan or an Omni-RAG plan string .*got NoneType"):
        kb.search_plan(None)  # type: ignore[arg-type]


def test_the_commands_start_without_torch_so_a_config_error_is_told_at_once():
    """Every command's module imports in about a second: torch, transformers, PEFT and Lightning (about 9 s on these
    CPUs) load only when a run needs them, so ``--help`` and a config error do not wait for them (``omnimed.models``
    imported its loaders eagerly before, and every command paid for them)."""
    heavy = ("torch", "transformers", "peft", "lightning", "sentence_transformers")
    code = ("import sys\n"
            "import omnimed.cli.bench, omnimed.cli.build, omnimed.cli.compare, omnimed.cli.data, omnimed.cli.evaluate, "
            "omnimed.cli.index, omnimed.cli.reproduce, omnimed.cli.train\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"

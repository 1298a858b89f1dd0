"""Fault injection: a failure is never a success, and a kill loses nothing.

For every registered stage of the package (each needs its small settings in :data:`TINY_STAGES`, so a new stage is
covered as soon as it is registered):

- a backend that cannot be reached fails the stage (no manifest, the backend and the first error named), and a
  rerun with a working backend ends with exactly the output of an uninterrupted run;
- failed calls within ``max_failed_share`` are listed in the manifest and asked again, alone, by the next run;
- a process killed at several points (mid-append of the progress file, between batches, before a file is
  published, before the manifest, in the middle of swapping the ``hf/`` folder) and rerun each time ends byte for
  byte with the uninterrupted run's folder, with no temp file left.

A stage that calls no backend (``Stage.calls_backend`` false: it only reads the world and the knowledge base) has
no calls to fail and no progress file: it gets the kill points of publishing its files.

Evaluations: an unreachable backend exits non-zero with one line, leaves ``failed.json`` and no ``metrics.json``,
and a reproduced table's cell says ``failed: <reason>``; failed generations within the bound are counted apart
from unreadable answers. Training killed in the middle of its export is in ``test_train_cli.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faults import killed_at

from omnimed.data.artifacts import TMP_SUFFIX, RunFailed
from omnimed.generation.oracle import OracleBackend
from omnimed.generation.types import Generation
from omnimed.knowledge.config import KnowledgeConfig

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TINY_KB = KnowledgeConfig(name="world_tiny", world_size="tiny", indexes=["bm25"], retriever="bm25")
UNREACHABLE = "openai backend (teacher): cannot reach http://127.0.0.1:9/v1/chat/completions (ConnectError)"

#: the output folders of stages that another stage reads, built once by the ``stage_inputs`` fixture
INPUTS: dict[str, Path] = {}

#: small settings of every stage the package registers: 12 items in batches of 4 (a callable value is the folder of
#: a stage it reads, resolved when the stage runs)
TINY_STAGES = {
    "selfbiorag_critic_data": {"n_examples": 12, "evidence_k": 1, "batch_size": 4},
    "selfbiorag_generator_data": {"max_examples": 12, "top_k": 1, "batch_size": 4},
    "reader_data": {"n_examples": 12},
    # no diversity encoder: torch hangs in a child forked after the parent used its thread pool (tests/faults.py)
    "omnirag_explore": {"n_questions": 12, "n_queries": 2, "sources": ["book", "guideline", "wiki"], "batch_size": 4,
                        "diversity_encoder": None},
    "omnirag_judge": {"explore": lambda: str(INPUTS["omnirag_explore"]), "batch_size": 4},
    "omnirag_pairs": {"judge": lambda: str(INPUTS["omnirag_judge"])},
    "polyrag_utility": {"splits": ["train"], "n_questions": 12, "candidates": 3, "batch_size": 4},
    "polyrag_judge_data": {"splits": ["train"], "n_questions": 12, "candidates": 3, "batch_size": 4},
}


def calls_backend(name: str) -> bool:
    from omnimed.methods.registry import get_stage

    return get_stage(name).calls_backend


#: the stages whose backend calls can fail (the others only read the world and the knowledge base)
BACKEND_STAGES = sorted(n for n in TINY_STAGES if calls_backend(n))


def quiet(*args, **kwargs) -> None:
    return None


class Flaky:
    """A backend whose calls fail (``Generation.error``, as a real backend reports a call that failed after its
    retries) for the requests ``fails`` picks; counts ``generate`` calls and the requests they carried."""

    base_url = "http://127.0.0.1:9/v1"

    def __init__(self, inner, fails=lambda request: True) -> None:
        self.inner, self.fails, self.calls, self.asked = inner, fails, 0, set()
        self.name, self.model_id = inner.name, inner.model_id  # the same teacher, its server down

    def generate(self, requests, params):
        self.calls += 1
        self.asked |= {r.meta.get("question_id") for r in requests}
        out = self.inner.generate(requests, params)
        return [[Generation("", "error", error=UNREACHABLE)] if self.fails(r) else g for r, g in zip(requests, out)]


def ours() -> list[str]:
    """The stages this package registers (a test may have registered a plugin's too)."""
    from omnimed.methods.registry import get_stage, stage_names

    return [n for n in stage_names() if get_stage(n).run.__module__.startswith("omnimed.")]


def run_stage(name: str, out: Path, backend, kb, max_failed: float = 0.05):
    """Run stage ``name`` with its tiny settings into ``out``, the way ``omnimed-build`` does."""
    from omnimed.data.artifacts import PathsConfig
    from omnimed.generation.factory import BackendConfig
    from omnimed.methods.registry import get_stage
    from omnimed.methods.stages import BuildConfig, StageContext

    spec = get_stage(name)
    settings = {k: v() if callable(v) else v for k, v in TINY_STAGES[name].items()}
    stage_cfg = spec.config(**settings, out=str(out))
    cfg = BuildConfig(stage=stage_cfg, backend=BackendConfig(name="oracle"), knowledge=TINY_KB,
                      paths=PathsConfig(root=str(out.parent)), progress=False, max_failed_share=max_failed)
    ctx = StageContext(cfg, log=quiet)
    ctx.__dict__.update(backend=backend, knowledge_base=kb)  # the cached properties, given
    return spec.run(stage_cfg, ctx)


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory, world_tiny, kb_tiny):
    """The folders the stages that read another stage's output read (Omni-RAG's exploration, then judgements)."""
    root = tmp_path_factory.mktemp("inputs")
    for name in ("omnirag_explore", "omnirag_judge"):
        INPUTS[name] = run_stage(name, root / name, OracleBackend(world_tiny), kb_tiny).path
    return INPUTS


@pytest.fixture(scope="module")
def reference(tmp_path_factory, world_tiny, kb_tiny, stage_inputs):
    """Each stage's folder from one uninterrupted run with a working backend."""
    root = tmp_path_factory.mktemp("reference")
    return {name: files(run_stage(name, root / name, OracleBackend(world_tiny), kb_tiny).path) for name in ours()}


def test_every_registered_stage_is_fault_tested():
    assert sorted(ours()) == sorted(TINY_STAGES), "give a new stage its small settings in TINY_STAGES"


@pytest.mark.parametrize("name", BACKEND_STAGES)
def test_an_unreachable_backend_fails_the_stage_and_a_rerun_completes_it(name, tmp_path, world_tiny, kb_tiny,
                                                                         reference):
    out = tmp_path / name
    with pytest.raises(RunFailed) as err:
        run_stage(name, out, Flaky(OracleBackend(world_tiny)), kb_tiny)
    message = str(err.value)
    teacher = OracleBackend(world_tiny)
    assert (f"stage {name}: 12 of 12 items (100.0%) got no answer from {teacher.name} backend "
            f"{teacher.model_id!r} at http://127.0.0.1:9/v1; first error: {UNREACHABLE}") in message
    assert "max_failed_share=0.05" in message
    assert not (out / "manifest.json").exists() and not (out / "records.jsonl").exists()

    result = run_stage(name, out, OracleBackend(world_tiny), kb_tiny)
    assert not result.reused
    assert files(out) == reference[name]


@pytest.mark.parametrize("name", BACKEND_STAGES)
def test_failed_calls_within_the_bound_are_listed_and_asked_again_alone(name, tmp_path, world_tiny, kb_tiny,
                                                                        reference):
    out = tmp_path / name
    victim = json.loads(reference[name]["progress.jsonl"].decode().splitlines()[5])["id"]
    one_fails = Flaky(OracleBackend(world_tiny), lambda r: r.meta.get("question_id") == victim)
    with pytest.raises(RunFailed, match="1 of 12 items"):  # 8.3% is above the default 5%
        run_stage(name, out, one_fails, kb_tiny)
    assert not (out / "manifest.json").exists()

    result = run_stage(name, out, one_fails, kb_tiny, max_failed=0.1)  # asks only for the one item again
    assert one_fails.calls > 1 and result.counts["failed"] == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["failed"]["ids"] == [victim] and UNREACHABLE in manifest["failed"]["first_error"]
    assert victim not in (out / "records.jsonl").read_text()

    healed = Flaky(OracleBackend(world_tiny), lambda r: False)
    result = run_stage(name, out, healed, kb_tiny, max_failed=0.1)
    assert not result.reused and healed.asked == {victim}  # only the failed item is asked again
    got, want = files(out), reference[name]
    # the retried item's line comes last in the progress file (it is an append log); everything else is identical
    assert sorted(got.pop("progress.jsonl").splitlines()) == sorted(want["progress.jsonl"].splitlines())
    assert got == {k: v for k, v in want.items() if k != "progress.jsonl"}
    again = Flaky(OracleBackend(world_tiny), lambda r: False)
    assert run_stage(name, out, again, kb_tiny).reused and again.calls == 0


KILLS = [
    "torn-append:2",  # half of the second batch's lines reach the progress file
    "after-append:1",  # one more batch, then killed between batches
    "publish:records.jsonl",  # every item done; killed before the record file is in place
    "publish:manifest.json",  # records.jsonl and hf/ written; killed before the manifest
    "swap:hf",  # the previous hf/ moved aside, the new one not yet in place
]


@pytest.mark.parametrize("name", sorted(TINY_STAGES))
def test_killed_anywhere_then_rerun_equals_an_uninterrupted_run(name, tmp_path, world_tiny, kb_tiny, reference):
    out = tmp_path / name
    # a stage without backend calls appends no progress: it is killed while publishing its files
    points = KILLS if calls_backend(name) else [p for p in KILLS if "append:" not in p]
    for point in points:
        run = lambda: run_stage(name, out, OracleBackend(world_tiny), kb_tiny)
        assert killed_at(point, run), f"{point} was not reached"
        if point.startswith("torn-append"):
            assert not (out / "progress.jsonl").read_bytes().endswith(b"\n")  # a torn last line
    assert not (out / "manifest.json").exists()
    assert not (out / "hf").exists()  # the swap was cut: the old folder is aside, the new one a temp
    result = run_stage(name, out, OracleBackend(world_tiny), kb_tiny)
    assert not result.reused
    assert files(out) == reference[name]  # byte for byte, progress file included
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temp files left: {leftovers}"


# ----------------------------------------------------------------------------------------------- evaluations
def evaluate(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "omnimed-evaluate"), "backend=openai", "backend.base_url=http://127.0.0.1:9/v1",
           "backend.max_retries=0", "backend.timeout=2", "knowledge=world_tiny", "logger=none",
           f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, text=True, capture_output=True, timeout=300, check=False)


def test_an_evaluation_with_an_unreachable_backend_exits_non_zero_and_its_cell_says_why(tmp_path, world_tiny, kb_tiny):
    from omnimed.methods.selfbiorag.critic_data import CriticDataConfig, build_critic_data
    from omnimed.tables.manifest import load_manifest
    from omnimed.tables.reproduce import read_cell

    critic_data = build_critic_data(CriticDataConfig(n_examples=6, evidence_k=1, dev_fraction=0.5), kb=kb_tiny,
                                    teacher=OracleBackend(world_tiny), knowledge=TINY_KB, root=tmp_path, progress=False,
                                    log=quiet).path
    cases = {
        "qa": ["task=qa", "task.split=null", "task.limit=3"],  # generations fail: counted, above the bound
        "critic": ["task=critic_accuracy", "pipeline=selfbiorag", f"task.data={critic_data}"],  # scoring raises
    }
    manifest = load_manifest(REPO / "experiments" / "selfbiorag" / "table9.yaml")
    for name, overrides in cases.items():
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text('{"accuracy": 0.5}')  # an earlier run's result: cleared first
        res = evaluate(tmp_path, *overrides, f"hydra.run.dir={run_dir}")
        assert res.returncode == 1, res.stderr[-2000:]
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("omnimed-evaluate: error: ") and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "127.0.0.1:9" in last
        assert not (run_dir / "metrics.json").exists()
        reason = json.loads((run_dir / "failed.json").read_text())["reason"]
        assert reason == last.removeprefix("omnimed-evaluate: error: ")
        cell = read_cell(run_dir, manifest, "Utility")
        assert cell.ours is None and cell.status == f"failed: {reason[:240]}"
    assert "got no answer from openai backend" in json.loads((tmp_path / "runs/qa/failed.json").read_text())["reason"]


def test_failed_generations_within_the_bound_are_counted_apart_from_unreadable_answers(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from omnimed.conf import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.evaluation.qa import run_qa_evaluation
    from omnimed.generation import factory

    class OneFailsOneMumbles:
        """Question 0's call fails, question 1 gets an answer without a tag, the rest answer A."""

        name, model_id = "openai", "reader"

        def generate(self, requests, params):
            return [[Generation("", "error", error=UNREACHABLE)] if i == 0 else
                    [Generation("I think A" if i == 1 else "<answer>A</answer>")] for i, _ in enumerate(requests)]

    register_evaluate_configs()
    GlobalHydra.instance().clear()
    overrides = ["task=qa", "knowledge=world_tiny", "task.split=null", "task.limit=20", "pipeline=closed_book",
                 "pipeline.answer_mode=generate", "logger=none", f"paths.root={tmp_path}",
                 f"paths.cache={tmp_path}/cache", f"paths.output_dir={tmp_path}/run"]
    monkeypatch.setattr(factory, "build_backend", lambda *a, **k: OneFailsOneMumbles())
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        within = compose("evaluate", overrides=overrides)  # 1 of 20 = 5%: at the bound
        strict = compose("evaluate", overrides=[*overrides, "max_failed_share=0.04"])
    result = run_qa_evaluation(OmegaConf.to_object(within), tmp_path / "within")
    m = result.metrics
    assert m["failed_generations"] == 1 and m["missing_answers"] == 1 and m["n"] == 20
    assert result.problems == {"no <answer> tag": 1}
    rows = [json.loads(line) for line in (tmp_path / "within" / "predictions.jsonl").read_text().splitlines()]
    assert [r["error"] for r in rows].count(UNREACHABLE) == 1

    with pytest.raises(RunFailed, match=r"1 of 20 questions \(5.0%\) got no answer from openai backend 'reader'"):
        run_qa_evaluation(OmegaConf.to_object(strict), tmp_path / "strict")
    assert not (tmp_path / "strict" / "metrics.json").exists()
    assert (tmp_path / "strict" / "predictions.jsonl").exists()  # kept for the audit


def test_a_torn_temp_and_a_cut_swap_are_repaired_by_the_next_write(tmp_path):
    """The atomic writer itself: a folder swap cut by a kill is rolled back (the old folder put back), and a dead
    writer's temp file is removed, by the next write of the same output."""
    from omnimed.data.artifacts import atomic_path, atomic_write_text

    target = tmp_path / "index"
    with atomic_path(target, is_dir=True) as tmp:
        (tmp / "a").write_text("old")

    def swap() -> None:
        with atomic_path(target, is_dir=True) as tmp:
            (tmp / "a").write_text("new")

    assert killed_at("swap:index", swap)
    assert not target.exists() and len(list(tmp_path.glob(".index.old-*"))) == 1
    assert killed_at("publish:note.txt", lambda: atomic_write_text(tmp_path / "note.txt", "x"))
    assert len(list(tmp_path.glob(f".note.txt.*{TMP_SUFFIX}"))) == 1

    from omnimed.data.artifacts import remove_stale_temps

    remove_stale_temps(target)  # what the next write of the index does first
    assert (target / "a").read_text() == "old"
    atomic_write_text(tmp_path / "note.txt", "y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index", "note.txt"]
    assert os.stat(tmp_path / "note.txt").st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

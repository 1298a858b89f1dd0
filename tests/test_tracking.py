"""W&B never prompts: the mode follows WANDB_MODE, else the presence of credentials; secrets never reach a logged
config."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnimed.tracking import scrub_secrets, wandb_mode


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "missing-netrc"))
    return tmp_path


def test_offline_without_credentials_online_with_them(no_credentials, monkeypatch):
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"
    (no_credentials / ".netrc").write_text("machine api.wandb.ai login user password " + "p" * 40 + "\n")
    (no_credentials / ".netrc").chmod(0o600)
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.delenv("NETRC")
    assert wandb_mode() == "online"  # a `wandb login` netrc entry counts as credentials


def test_wandb_mode_wins_and_an_empty_one_reads_as_unset(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.setenv("WANDB_MODE", "")  # `WANDB_MODE= omnimed-train`: W&B itself rejects an empty mode
    assert wandb_mode() == "online"
    import os

    assert "WANDB_MODE" not in os.environ


def test_secrets_are_redacted_at_any_depth_but_token_settings_are_kept():
    cfg = {"backend": {"api_key": "sk-live", "base_url": "http://x"}, "hf_token": "hf_abc",
           "list": [{"password": "p"}], "model": {"special_tokens": ["[Retrieval]"], "max_new_tokens": 8}}
    out = scrub_secrets(cfg)
    assert out["backend"] == {"api_key": "<redacted>", "base_url": "http://x"}
    assert out["hf_token"] == "<redacted>" and out["list"] == [{"password": "<redacted>"}]
    assert out["model"] == {"special_tokens": ["[Retrieval]"], "max_new_tokens": 8}


def test_an_evaluation_finds_the_trained_models_its_config_points_at(tmp_path):
    """Exports of omnimed training runs (their run folder holds versions.json), merged or adapter, anywhere in the
    config, by the artifact name their training run logged (`<task>-<run>`); packaged or hub models are not."""
    from omnimed.tracking import trained_models

    for task, run in (("reader", "reader-miniature"), ("generator", "gen 1")):
        (tmp_path / task / run / "hf" / "adapter").mkdir(parents=True)
        (tmp_path / task / run / "versions.json").write_text("{}")
    (tmp_path / "plain" / "hf").mkdir(parents=True)  # an hf folder outside a training run
    config = {"model": {"name_or_path": str(tmp_path / "reader" / "reader-miniature" / "hf")},
              "pipeline": {"generator": str(tmp_path / "generator" / "gen 1" / "hf" / "adapter"), "top_k": 5},
              "others": [str(tmp_path / "plain" / "hf"), "HuggingFaceTB/SmolLM2-135M-Instruct", None]}
    assert trained_models(config) == {
        "reader-reader-miniature": (tmp_path / "reader" / "reader-miniature" / "hf").resolve(),
        "generator-gen-1": (tmp_path / "generator" / "gen 1" / "hf").resolve(),
    }


def test_a_run_is_credited_to_the_code_it_started_with_not_to_an_edit_made_while_it_ran(tmp_path, monkeypatch):
    """An evaluation takes its code's version when it starts (``start_run``); an edit to the package while it
    computes (a commit during an hours-long table) changes the next run's record, not this one's."""
    from omnimed import tracking
    from omnimed.evaluation.runner import start_run

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "metric.py").write_text("SCALE = 100\n")
    monkeypatch.setattr(tracking, "PACKAGE", package)
    tracking._code_version.cache_clear()
    try:
        start_run(tmp_path)
        started = tracking.code_version()
        (package / "sub" / "metric.py").write_text("SCALE = 1\n")  # edited while the run computes
        assert tracking.code_version() == started
        assert tracking.log_lineage(None, {})["git"] == started  # the logged lineage names the same code
        tracking._code_version.cache_clear()  # the next process
        assert tracking.source_digest() != started["source"]
    finally:
        tracking._code_version.cache_clear()


def test_the_code_a_run_depends_on_is_what_an_evaluation_process_imports():
    """A table names the cells that other code computed. Only the files an ``omnimed-evaluate`` process can import
    are that code: every omnimed module loaded by the evaluate CLI with every registered method and task is among
    them, and the report writers, training and the benchmarks are not."""
    import subprocess
    import sys

    from omnimed.tables.provenance import run_code_files
    from omnimed.tracking import PACKAGE

    probe = (
        "import sys\n"
        "import omnimed.cli.evaluate\n"
        "from omnimed.methods.registry import get_method, method_names\n"
        "import omnimed.evaluation.tasks\n"
        "import omnimed.generation.factory, omnimed.knowledge, omnimed.evaluation.runner\n"
        "[get_method(name) for name in method_names()]\n"
        "print('\\n'.join(m.__file__ for name, m in list(sys.modules.items())\n"
        "                 if name.startswith('omnimed') and getattr(m, '__file__', None)))\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    imported = {Path(f).resolve().relative_to(PACKAGE).as_posix() for f in res.stdout.split()}
    files = run_code_files()
    assert len(imported) > 50 and imported <= files, sorted(imported - files)
    assert {"cli/evaluate.py", "methods/registry.py", "evaluation/runner.py", "tracking.py"} <= files
    assert not {f for f in files if f.startswith(("tables/", "training/", "bench/"))}
    assert "cli/reproduce.py" not in files and "cli/train.py" not in files


def test_a_run_is_named_as_other_code_only_where_code_it_imports_changed(monkeypatch):
    """Report-writing and training changes leave a finished run's numbers as they were, so a table does not name
    its cells as computed by other code for them; a change to a method names the method's file; a run recorded
    with uncommitted changes cannot say what they were, so it stays named."""
    from omnimed.tables import provenance

    saved = {"source": "0" * 64, "commit": "a" * 40, "dirty": False}
    monkeypatch.setattr(provenance, "_changed_files", lambda commit: ("tables/report.py", "training/sft.py"))
    assert provenance.code_difference(saved) is None
    assert provenance.code_difference({**saved, "dirty": True}) == (
        f"computed by other code (at commit {'a' * 10} with uncommitted changes): the package's source differs "
        "from today's")
    monkeypatch.setattr(provenance, "_changed_files",
                        lambda commit: ("tables/report.py", "methods/baselines/query2doc.py"))
    assert provenance.code_difference(saved) == (
        f"computed by other code (at commit {'a' * 10}); changed since in src/omnimed: methods/baselines/query2doc.py")
    monkeypatch.setattr(provenance, "_changed_files", lambda commit: None)  # git cannot say: named
    assert provenance.code_difference(saved) == (
        f"computed by other code (at commit {'a' * 10}): the package's source differs from today's")

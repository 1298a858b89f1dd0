"""W&B never prompts: the mode follows WANDB_MODE, else the presence of credentials; secrets never reach a logged
config."""

from __future__ import annotations

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

"""The two seams of the house plan: the method registry and the objective registry, and what a runner gets from
them (the shared runner tail, the one backend lookup)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import pytest

from omnimed.methods import Method, build_method, get_method, method_names, register_method
from omnimed.methods.registry import get_stage, stage_names


def test_built_in_methods_and_stages_are_registered_by_their_packages():
    assert {"closed_book", "rag", "selfbiorag"} <= set(method_names())
    assert {"selfbiorag_critic_data", "selfbiorag_generator_data"} <= set(stage_names())
    assert get_method("rag")(get_method("rag").config(name="rag")).needs_knowledge()
    assert not get_method("closed_book")(get_method("closed_book").config()).needs_knowledge()
    sbr = get_method("selfbiorag")
    assert sbr.question_kinds == ("mcq",) and list(sbr.labels) == ["utility", "retrieval", "relevance", "support"]
    assert not sbr(sbr.config(retrieval="never")).needs_knowledge() and sbr(sbr.config()).needs_knowledge()


def test_unknown_names_fail_listing_what_is_registered():
    with pytest.raises(KeyError, match=r"pipeline='nope'.*closed_book, omnirag, original_question, polyrag, query2doc, rag"):
        get_method("nope")
    with pytest.raises(KeyError, match=r"stage='nope'.*selfbiorag_critic_data"):
        get_stage("nope")
    with pytest.raises(KeyError, match="no such method"):
        build_method(SimpleNamespace(name="nope"))


def test_a_second_method_under_a_taken_name_is_refused():
    @dataclass
    class Cfg:
        name: str = "rag"

    with pytest.raises(ValueError, match="registered twice"):
        @register_method
        class Shadow(Method):  # a plugin must not silently replace a paper's method
            name = "rag"
            config = Cfg

            def answer(self, questions, backend, kb, *, seed):
                return []
    assert get_method("rag").__name__ == "RAG"


def test_a_method_declaring_an_unknown_question_kind_is_refused():
    @dataclass
    class Cfg:
        name: str = "odd_kinds"

    with pytest.raises(ValueError, match="question_kinds"):
        @register_method
        class Odd(Method):
            name = "odd_kinds"
            config = Cfg
            question_kinds = ("essay",)

            def answer(self, questions, backend, kb, *, seed):
                return []


def test_default_label_reading_takes_the_label_the_output_starts_with():
    @dataclass
    class Cfg:
        name: str = "labels_probe"

    class Judge(Method):  # not registered: the default read_label is what is tested
        name = "labels_probe"
        config = Cfg
        labels: ClassVar[dict[str, tuple[str, ...]]] = {"verdict": ("[Yes]", "[No]")}

        def answer(self, questions, backend, kb, *, seed):
            return []

    judge = Judge(Cfg())
    assert judge.read_label("  [No] because", "verdict") == "[No]"
    assert judge.read_label("Well, [Yes]", "verdict") is None  # text before the label: outside the set


def test_the_objective_registry_builds_sft_dpo_and_distill_and_names_what_is_built():
    from omnimed.training.objectives import get_objective, objective_names

    assert objective_names() == ["distill", "dpo", "sft"]
    assert [get_objective(n).name for n in ("sft", "dpo", "distill")] == ["sft", "dpo", "distill"]
    assert get_objective("distill").export is not None and get_objective("sft").export is None
    with pytest.raises(ValueError, match=r"task.objective='listwise' \(task embedder\).*built objectives: distill, dpo, sft"):
        get_objective("listwise", "embedder")


def test_the_runner_tail_writes_predictions_and_metrics_without_a_logger(tmp_path):
    from omnimed.evaluation.runner import finish_run

    cfg = SimpleNamespace(run_name=None, logger=SimpleNamespace(name="none", project="p", entity=None, group=None,
                                                               job_type=None, tags=[]),
                          task=SimpleNamespace(name="qa", dataset="d"), pipeline=SimpleNamespace(name="m"),
                          knowledge=SimpleNamespace(name="k"), experiment=None)
    rows = [{"question_id": "q1", "prediction": "Ä"}, {"question_id": "q2", "prediction": None}]
    assert finish_run(cfg, tmp_path, rows=rows, metrics={"accuracy": 0.5}, run_name="r", job_type="evaluate-qa",
                      lineage={}, files={"extra.json": {"a": 1}}) is None
    assert [json.loads(line) for line in (tmp_path / "predictions.jsonl").open(encoding="utf-8")] == rows
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"accuracy": 0.5}
    assert json.loads((tmp_path / "extra.json").read_text()) == {"a": 1}


def test_the_oracle_backend_answers_from_the_knowledge_configs_world():
    from omnimed.generation.factory import BackendConfig
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.backends import run_backend

    backend = run_backend(BackendConfig(name="oracle", cache=False), model=None,
                          knowledge=KnowledgeConfig(name="world_tiny", world_size="tiny"), cache_root=".")
    assert backend.name == "oracle"


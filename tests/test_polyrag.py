"""PolyRAG on the tiny world: utility labels from a teacher (the oracle's exact utilities, a model's likelihood
difference), the distilled utility embedder through the engine, the views (authority table, dated timeliness),
the mixture under the composability constraint, the judges' data, and the method as a retrieval reranker through
``omnimed-evaluate`` with every view's score kept for audit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnimed.data.io import load_record_set
from omnimed.data.records import Passage, PromptCompletion, UtilityExample
from omnimed.generation.oracle import OracleBackend

BIN = Path(sys.executable).parent
quiet = lambda *a, **k: None  # noqa: E731


def _p(pid: str, text: str = "text", **kw) -> Passage:
    return Passage(id=pid, source=kw.pop("source", "guideline"), text=text, **kw)


@pytest.fixture(scope="module")
def utility(tmp_path_factory, world_tiny, kb_tiny):
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.polyrag.utility import UtilityConfig, build_utilities

    root = tmp_path_factory.mktemp("polyrag")
    knowledge = KnowledgeConfig(name="world_tiny", world_size="tiny")
    cfg = UtilityConfig(splits=["train", "test"], candidates=6, out=str(root / "utility"))
    return build_utilities(cfg, teacher=OracleBackend(world_tiny), kb=kb_tiny, knowledge=knowledge,
                           progress=False, log=quiet), cfg, knowledge


# ---------------------------------------------------------------------------------------------- utility labels
def test_the_oracle_teacher_scores_each_candidate_with_the_worlds_utility_and_writes_flagembedding_data(
        utility, world_tiny):
    result, _, _ = utility
    records = load_record_set(result.path, UtilityExample)
    assert records and {r.metadata["split"] for r in records} == {"train", "test"}
    for r in records[:20]:
        assert r.teacher_scores == [world_tiny.oracle.utility_score(r.id, p) for p in r.passages]
        assert set(r.metadata["gold_passages"]) & {p.id for p in r.passages if p.source != "graph"} \
            or all(g.startswith("graph:") for g in r.metadata["gold_passages"])
    rows = [json.loads(line) for line in (result.path / "flag_train.jsonl").read_text().splitlines()]
    assert len(rows) == sum(r.metadata["split"] == "train" for r in records)
    assert set(rows[0]) == {"query", "pos", "neg", "pos_scores", "neg_scores"}
    assert min(rows[0]["pos_scores"]) > max(rows[0]["neg_scores"], default=-1)
    assert result.counts["gold_ranked_first"] > 0.9


def test_a_rerun_does_nothing_and_a_killed_run_continues_without_asking_again(utility, kb_tiny, tmp_path, world_tiny):
    from omnimed.methods.polyrag.utility import build_utilities

    result, cfg, knowledge = utility

    class NoCalls:
        name, model_id = "oracle", OracleBackend(world_tiny).model_id

        def generate(self, requests, params):
            raise AssertionError("a finished stage asked its teacher")

    assert build_utilities(cfg, teacher=NoCalls(), kb=kb_tiny, knowledge=knowledge, progress=False,
                           log=quiet).reused
    # an interrupted run: half the questions in progress.jsonl, no manifest
    import dataclasses
    import shutil

    part = tmp_path / "part"
    shutil.copytree(result.path, part)
    (part / "manifest.json").unlink()
    lines = (part / "progress.jsonl").read_text().splitlines()
    (part / "progress.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    asked = []

    class Counting(OracleBackend):
        def generate(self, requests, params):
            asked.extend(r.meta["question_id"] for r in requests)
            return super().generate(requests, params)

    again = build_utilities(dataclasses.replace(cfg, out=str(part)), teacher=Counting(world_tiny), kb=kb_tiny,
                            knowledge=knowledge, progress=False, log=quiet)
    assert set(asked).isdisjoint(json.loads(x)["id"] for x in lines[: len(lines) // 2])
    assert len(set(asked)) == len(lines) - len(lines) // 2
    assert (part / "records.jsonl").read_text() == (result.path / "records.jsonl").read_text()
    assert again.counts == result.counts


def test_the_likelihood_teacher_is_the_answers_log_likelihood_with_the_passage_minus_without():
    from omnimed.data.records import MultipleChoiceQuestion
    from omnimed.methods.polyrag.utility import likelihood_utilities

    class Scorer:
        name, model_id = "fake", "fake"

        def score(self, requests, continuations):
            assert set(continuations) == {" aspirin"}
            return [-1.0 if "helpful" in r.prompt else -6.0 if "misleading" in r.prompt else -4.0 for r in requests]

    q = MultipleChoiceQuestion(id="q", question="Which drug?", options={"A": "aspirin", "B": "b"}, answer="A",
                               dataset="x")
    got = likelihood_utilities(Scorer(), q, [_p("g:1", "helpful text"), _p("g:2", "misleading"), _p("g:3", "other")])
    assert got == [3.0, -2.0, 0.0]


def test_the_teacher_must_fit_the_backend(world_tiny, kb_tiny):
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.polyrag.utility import UtilityConfig, build_utilities

    k = KnowledgeConfig(name="world_tiny", world_size="tiny")
    with pytest.raises(ValueError, match="stage.teacher=likelihood with backend=oracle"):
        build_utilities(UtilityConfig(teacher="likelihood"), teacher=OracleBackend(world_tiny), kb=kb_tiny,
                        knowledge=k, log=quiet)
    with pytest.raises(ValueError, match="stage.teacher='best': expected one of auto, likelihood, oracle"):
        build_utilities(UtilityConfig(teacher="best"), teacher=OracleBackend(world_tiny), kb=kb_tiny, knowledge=k,
                        log=quiet)


# ---------------------------------------------------------------------------------------------- distillation
def test_listwise_kl_is_zero_when_the_student_matches_the_teacher_and_ignores_other_windows():
    from omnimed.training.distill import listwise_kl

    teacher = torch.tensor([[2.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 3.0]])
    mask = torch.tensor([[True, True, False, False], [False, False, True, True]])
    assert listwise_kl(teacher.clone(), teacher, mask).item() == pytest.approx(0.0, abs=1e-6)
    student = torch.tensor([[0.0, 2.0, 9.0, 9.0], [9.0, 9.0, 3.0, 1.0]])
    t = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    s = torch.softmax(torch.tensor([0.0, 2.0]), 0)
    expected = float((t * (t.log() - s.log())).sum())  # both rows are the same swap
    assert listwise_kl(student, teacher, mask).item() == pytest.approx(expected, rel=1e-5)


def test_the_distilled_embedder_trains_through_the_engine_and_its_export_loads_as_sentence_transformers(
        utility, tmp_path):
    """task=utility_embed on the oracle's utilities: the loss falls and the export is a sentence-transformers folder
    that gives the trained module's embeddings. (Held-out ranking against the base model is measured on the table
    world, README "PolyRAG in miniature": on the tiny world MiniLM already ranks the teacher's best first.)"""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from sentence_transformers import SentenceTransformer

    from omnimed.cli.common import conf_dir
    from omnimed.training.config import register_train_configs
    from omnimed.training.engine import train

    result, _, _ = utility
    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=[
            "+preset=polyrag_utility_embed_miniature", f"data.path={result.path}", "data.val_fraction=0.2",
            "trainer.max_epochs=2", "task.lr=2e-4", "task.passage_window=8", "logger=none", "run_name=distill",
            f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"paths.output_dir={tmp_path}/out",
            "trainer.num_threads=2"])
    run = train(cfg)
    assert sum(run.losses[-2:]) / 2 < 0.6 * sum(run.losses[:2]) / 2, run.losses
    assert run.metrics["val/top1_agreement"] >= 0 and "val/loss" in run.metrics
    exported = SentenceTransformer(str(run.hf_dir), device="cpu")
    assert (run.hf_dir / "model.safetensors").is_file()
    texts = ["a query about a drug", "a passage about a disease"]
    from omnimed.models.config import named_model_config
    from omnimed.training.distill import DistillModule

    module = DistillModule(named_model_config(str(run.hf_dir)), cfg.task).eval()
    with torch.no_grad():
        mine = module.embed(texts).numpy()
    assert np.allclose(exported.encode(texts, normalize_embeddings=True), mine, atol=1e-5)
    # BERT's pooler takes no part in the mean-pooled embedding: frozen, so DDP has no parameter without a gradient
    assert module.frozen_unused and all(".pooler." in name for name in module.frozen_unused), module.frozen_unused
    # at the end of a fit on an accelerator the module drops its gradients and AdamW state (Lightning's teardown
    # would copy them to host memory); on the CPU they stay
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad])
    module.train().embed(texts).sum().backward()
    optimizer.step()
    module._trainer = SimpleNamespace(optimizers=[optimizer])
    module.on_train_end()
    assert optimizer.state and any(p.grad is not None for p in module.parameters())
    module._device = torch.device("meta")  # what the hook sees of a module on an accelerator
    module.on_train_end()
    assert not optimizer.state and all(p.grad is None for p in module.parameters())


def test_the_embedder_encodes_length_sorted_chunks_to_the_embeddings_of_one_padded_pass():
    """task.encode_batch_size: a batch's texts go through the encoder in chunks sorted by length, each padded only to
    its own longest text, and come back in their order with the embeddings (and gradients) of one pass over all."""
    import dataclasses

    from omnimed.conf import load_option
    from omnimed.models.config import named_model_config
    from omnimed.training.config import TaskConfig
    from omnimed.training.distill import DistillModule

    long = "a much longer passage about the dose of a drug in renal failure and how its levels are monitored"
    texts = ["short", long + ", then what the guideline of 2021 says of it", "mid length text here", "x", long,
             "two words", "a medium passage about a gene"]
    task = load_option("task", "utility_embed", TaskConfig)
    assert DistillModule(named_model_config("minilm-l6"), task).encode_batch_size == 32  # null: 32 on the CPU
    whole = DistillModule(named_model_config("minilm-l6"), dataclasses.replace(task, encode_batch_size=0)).eval()
    chunked = DistillModule(named_model_config("minilm-l6"), dataclasses.replace(task, encode_batch_size=2)).eval()
    chunked.load_state_dict(whole.state_dict())
    widths: dict[str, list[int]] = {"whole": [], "chunked": []}
    for name, module in (("whole", whole), ("chunked", chunked)):
        module.encoder[0].register_forward_pre_hook(
            lambda _, args, w=widths[name]: w.append(args[0]["input_ids"].shape[1]))
    one, parts = whole.embed(texts), chunked.embed(texts)
    assert torch.allclose(one, parts, atol=1e-6)
    assert len(widths["whole"]) == 1 and len(widths["chunked"]) == 4
    # chunks pad to a multiple of 8 (aligned shapes for bf16 kernels), never beyond the whole pass's width + 7
    assert widths["chunked"] == sorted(widths["chunked"]) and all(w % 8 == 0 for w in widths["chunked"])
    assert widths["chunked"][-1] - 8 < widths["whole"][0] <= widths["chunked"][-1]
    assert sum(w * 2 for w in widths["chunked"]) < 0.8 * widths["whole"][0] * len(texts)
    grads = [torch.autograd.grad(m.embed(texts)[1:3].sum(), m.encoder[0].auto_model.embeddings.word_embeddings.weight)
             [0] for m in (whole, chunked)]
    assert torch.allclose(*grads, atol=1e-5)


@pytest.mark.slow
def test_an_interrupted_distillation_resumes_mid_epoch_to_the_weights_of_an_uninterrupted_run(utility, tmp_path):
    """`task=utility_embed` stopped after 2 of an epoch's batches and resumed (`ckpt_path=last`) ends with the
    weights of a run that trained its 4 steps straight: the resumed run skips the batches already trained on. (Its
    loader was a plain shuffled DataLoader, which began the epoch again: a resumed run saw those batches twice.)"""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from safetensors.torch import load_file

    from omnimed.cli.common import conf_dir
    from omnimed.training.config import register_train_configs
    from omnimed.training.engine import train

    result, _, _ = utility

    def run(name: str, *extra: str):
        register_train_configs()
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose("train", overrides=[
                "+preset=polyrag_utility_embed_miniature", f"data.path={result.path}", "data.val_fraction=0.2",
                "data.batch_size=2", "task.passage_window=4", "task.scheduler=constant", "task.warmup_ratio=0",
                "trainer.max_epochs=1", "trainer.limit_val_batches=0", "trainer.checkpoint_every_n_steps=1",
                "logger=none", f"run_name={name}", f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache",
                f"paths.output_dir={tmp_path}/out-{name}", "trainer.num_threads=2", *extra])
        return train(cfg)

    straight = run("straight", "trainer.max_steps=4")
    assert len(straight.losses) == 4
    run("resumed", "trainer.max_steps=2")
    resumed = run("resumed", "trainer.max_steps=4", "ckpt_path=last")
    assert len(resumed.losses) == 2, resumed.losses  # the two steps left, not the epoch again
    a, b = (load_file(r.hf_dir / "model.safetensors") for r in (straight, resumed))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_embedder_trains_under_ddp_on_two_processes(utility, tmp_path):
    """`omnimed-train +preset=polyrag_utility_embed_miniature strategy=ddp trainer.devices=2` (gloo on CPU): it
    failed with DDP's "parameters that were not used in producing the loss" (the pooler) before the unused ones were
    frozen. The ranks share out the batches, the loss falls and rank 0 exports a folder that sentence-transformers
    loads. The encoder is the 2-layer XLM-RoBERTa in BGE-M3's layout (its pooler unused too, as BERT's): MiniLM
    trains through the engine above."""
    from sentence_transformers import SentenceTransformer

    result, _, _ = utility
    res = subprocess.run(
        [str(BIN / "omnimed-train"), "+preset=polyrag_utility_embed_miniature", "model=tiny-xlm-roberta",
         f"data.path={result.path}", "data.val_fraction=0.2", "data.batch_size=2", "trainer.max_epochs=4",
         "task.lr=1e-3", "task.passage_window=8", "logger=none", "run_name=distill-ddp", f"paths.root={tmp_path}",
         f"hydra.run.dir={tmp_path}/run", "strategy=ddp", "trainer.devices=2", "trainer.num_threads=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train/loss_last"] < metrics["train/loss_first"], metrics
    # each rank trains on every second batch of the epoch (not on all of them: an epoch is half the steps)
    n = sum(r.metadata.get("split") == "train" for r in load_record_set(result.path, UtilityExample))  # data.split
    batches = -(-(n - round(n * 0.2)) // 2)
    assert metrics["train/steps"] == 4 * (batches // 2), (metrics, n)
    assert "train/tokens" not in metrics  # no token count is kept for query batches (it read 0 before)
    hf = tmp_path / "checkpoints" / "utility_embed" / "distill-ddp" / "hf"
    assert SentenceTransformer(str(hf), device="cpu").encode(["a query"]).shape == (1, 64)



def test_distillation_refuses_a_causal_lm_and_a_bad_temperature():
    from omnimed.training.config import TrainConfig, config_problems

    cfg = TrainConfig()
    cfg.task.temperature, cfg.task.passage_window = 0.0, 0
    problems = " ; ".join(config_problems(cfg))
    assert "task.temperature=0.0: expected a softmax temperature > 0" in problems
    assert "task.passage_window=0: expected at least 1 passage per query" in problems
    from omnimed.training.distill import _module

    cfg = TrainConfig()
    cfg.task.objective, cfg.strategy.name = "distill", "fsdp2"
    assert "strategy='fsdp2': expected cpu or ddp with task.objective=distill" in " ; ".join(config_problems(cfg))
    cfg.strategy.name = "ddp"
    assert not config_problems(cfg)
    with pytest.raises(ValueError, match="trains a sentence-transformers encoder; model=.* kind='causal_lm'"):
        _module(cfg, None)


def test_utility_ranking_metrics_reward_the_teachers_order():
    from omnimed.evaluation.utility_ranking import graded, rank_metrics

    assert graded([0.0, 0.25, 1.0]) == [0, 1, 4] and graded([2.0, 2.0]) == [4, 4]
    r = UtilityExample(id="q", query="q", passages=[_p("a"), _p("b"), _p("c")], teacher_scores=[0.1, 0.9, 0.5])
    best = rank_metrics([r], {"q": ["b", "c", "a"]}, [1, 3])
    worst = rank_metrics([r], {"q": ["a", "c", "b"]}, [1, 3])
    assert best["hit@1"] == 1.0 and best["ndcg@3"] == pytest.approx(1.0)
    assert worst["hit@1"] == 0.0 and worst["hit@3"] == 1.0 and worst["ndcg@3"] < 0.8


# ---------------------------------------------------------------------------------------------- views, mixture
def test_authority_reads_the_issuer_table_then_the_source_then_the_default():
    from omnimed.methods.polyrag.views import AuthorityConfig, TimelinessConfig, authority, check_views

    cfg = AuthorityConfig(issuers=[["national health board", 1.0], ["regional society", 0.6]],
                          sources={"book": 0.8}, default=0.3)
    assert authority(_p("g:1", authority="National Health Board of Ulm"), cfg) == 1.0
    assert authority(_p("g:2", authority="Ulm Regional Society of Cardiac Medicine"), cfg) == 0.6
    assert authority(_p("b:1", source="book"), cfg) == 0.8
    assert authority(_p("g:3", authority="A blog"), cfg) == 0.3
    with pytest.raises(ValueError, match=r"pipeline.authority.issuers\[0\]=\['x', 2.0\]"):
        check_views(AuthorityConfig(issuers=[["x", 2.0]]), TimelinessConfig())
    with pytest.raises(ValueError, match="pipeline.timeliness.reference_date='soon-ish'"):
        check_views(AuthorityConfig(), TimelinessConfig(reference_date="soon-ish"))


def test_timeliness_halves_per_half_life_from_the_newest_candidate_and_reads_dates_in_text():
    from omnimed.methods.polyrag.views import TimelinessConfig, timeliness

    cfg = TimelinessConfig(half_life_years=5.0, undated=0.4)
    got = timeliness([_p("a", date="2020"), _p("b", date="2015"), _p("c", text="no date here"),
                      _p("d", text="In March 2010 the panel advised otherwise.")], cfg)
    assert got[0] == 1.0 and got[1] == pytest.approx(0.5, abs=0.01) and got[2] == 0.4
    assert got[3] == pytest.approx(0.25, abs=0.02)
    fixed = timeliness([_p("a", date="2020")], TimelinessConfig(reference_date="2030-01-01", half_life_years=10))
    assert fixed[0] == pytest.approx(0.5, abs=0.01)


def test_cover_takes_each_topics_best_before_any_topics_second_and_paper_weights_follow_the_domain():
    from omnimed.methods.polyrag.mixture import (
        PAPER_WEIGHTS,
        ComposabilityConfig,
        select,
        topics,
        weights_for,
    )

    y = [0.9, 0.8, 0.7, 0.2]
    topic = [0, 0, 0, 1]
    assert select(y, topic, 2, "cover") == [0, 3, 1, 2]
    assert select(y, topic, 2, "none") == [0, 1, 2, 3]
    e = np.array([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0]])
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    assert topics(e, ComposabilityConfig(eps=0.05, min_samples=2)) == [0, 0, 1]  # the lone one: a topic of its own
    assert weights_for("care", None) == PAPER_WEIGHTS["care"] and PAPER_WEIGHTS["care"]["timeliness"] == 0.0
    assert weights_for("policy", None)["authority"] == 0.1
    assert weights_for("care", {"utility": 1.0})["relevance"] == 0.0
    with pytest.raises(ValueError, match="pipeline.domain='surgery'"):
        weights_for("surgery", None)
    with pytest.raises(ValueError, match="pipeline.weights="):
        weights_for("care", {"novelty": 1.0})


def test_view_weights_given_on_the_command_line_replace_the_domains():
    """The view ablation's equal-weights row and a researcher's own mixture set ``pipeline.weights`` from the
    command line, as a whole dict or one view at a time; views left unset weigh 0, none set: the domain's."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omnimed.cli.common import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs
    from omnimed.methods.polyrag.mixture import PAPER_WEIGHTS, weights_for

    register_evaluate_configs()
    GlobalHydra.instance().clear()
    equal = "pipeline.weights={relevance: 0.2, utility: 0.2, supplement: 0.2, authority: 0.2, timeliness: 0.2}"
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        def weights(*overrides: str) -> dict[str, float]:
            cfg = compose("evaluate", overrides=["pipeline=polyrag", "pipeline.domain=care", *overrides]).pipeline
            return weights_for(cfg.domain, cfg.weights)

        assert weights(equal) == dict.fromkeys(PAPER_WEIGHTS["care"], 0.2)
        assert weights("pipeline.weights.utility=1") == {**dict.fromkeys(PAPER_WEIGHTS["care"], 0.0), "utility": 1.0}
        assert weights() == PAPER_WEIGHTS["care"]
        with pytest.raises(Exception, match="novelty"):
            weights("pipeline.weights={novelty: 1}")
    GlobalHydra.instance().clear()


# ---------------------------------------------------------------------------------------------- judges, method
def test_judge_data_labels_pairs_as_the_oracle_does_and_caps_each_label(tmp_path, world_tiny, kb_tiny):
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.polyrag.judge_data import JudgeDataConfig, build_judge_data
    from omnimed.methods.polyrag.judges import oracle_grade

    k = KnowledgeConfig(name="world_tiny", world_size="tiny")
    result = build_judge_data(JudgeDataConfig(judge="relevance", candidates=5, keep_per_label=10,
                                              out=str(tmp_path / "rel")),
                              teacher=OracleBackend(world_tiny), kb=kb_tiny, knowledge=k, progress=False, log=quiet)
    records = load_record_set(result.path, PromptCompletion)
    labels = result.counts["labels"]
    assert set(labels) <= set("ABCDE") and max(labels.values()) <= 10 and "A" in labels and "E" in labels
    for r in records[:10]:
        assert r.completion[0].content == oracle_grade(world_tiny.oracle, r.metadata["question_id"],
                                                       r.metadata["passage_id"])
        assert "Query:" in r.prompt[-1].content
    with pytest.raises(ValueError, match="stage.judge='novelty'"):
        build_judge_data(JudgeDataConfig(judge="novelty"), teacher=OracleBackend(world_tiny), kb=kb_tiny,
                         knowledge=k, log=quiet)


def test_judge_data_with_open_questions_labels_them_too_and_caps_each_kind_of_question_apart(tmp_path, world_tiny,
                                                                                             kb_tiny):
    """``stage.open_questions``: the world's open (long-form) questions of the splits are labelled beside the
    multiple-choice ones, each kind of question keeping at most ``keep_per_label`` pairs of a label, so the open
    questions' pairs are not crowded out; without it the multiple-choice pairs are exactly as before."""
    from collections import Counter

    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.methods.polyrag.judge_data import JudgeDataConfig, build_judge_data
    from omnimed.methods.polyrag.judges import oracle_grade

    k = KnowledgeConfig(name="world_tiny", world_size="tiny")
    built = {}
    for with_open in (False, True):
        result = build_judge_data(JudgeDataConfig(judge="relevance", candidates=5, keep_per_label=6,
                                                  open_questions=with_open, out=str(tmp_path / f"rel{with_open}")),
                                  teacher=OracleBackend(world_tiny), kb=kb_tiny, knowledge=k, progress=False,
                                  log=quiet)
        built[with_open] = (result.counts, load_record_set(result.path, PromptCompletion))
    open_ids = {q.id for q in world_tiny.open_questions}
    (_, plain_records), (mixed, mixed_records) = built[False], built[True]
    assert not any(r.metadata["question_id"] in open_ids for r in plain_records)
    opened = [r for r in mixed_records if r.metadata["question_id"] in open_ids]
    assert opened
    assert mixed["open_question_labels"] == dict(sorted(Counter(r.metadata["label"] for r in opened).items()))
    assert max(mixed["open_question_labels"].values()) <= 6
    kinds = {q.id: q.metadata["kind"] for q in [*world_tiny.questions, *world_tiny.open_questions]}
    for r in mixed_records:  # what data.val_group_by=kind groups the judge's validation loss by
        qid = r.metadata["question_id"]
        assert r.metadata["kind"] == (f"open:{kinds[qid]}" if qid in open_ids else kinds[qid])
    for r in opened:
        assert r.completion[0].content == oracle_grade(world_tiny.oracle, r.metadata["question_id"],
                                                       r.metadata["passage_id"])
    # the multiple-choice pairs are the same draw with or without the open questions beside them
    assert [r.id for r in mixed_records if r.metadata["question_id"] not in open_ids] == [r.id for r in plain_records]


@pytest.mark.parametrize("pool", [None, 4], ids=["searched", "candidate-pool"])
def test_polyrag_reranks_through_omnimed_evaluate_and_keeps_every_views_score(tmp_path, pool):
    out = tmp_path / "run"
    res = subprocess.run(
        [str(BIN / "omnimed-evaluate"), "task=retrieval", "task.queries=world", "task.methods=[dense,polyrag]",
         "pipeline=polyrag", "pipeline.domain=care", "backend=oracle", "knowledge=world_tiny", "logger=none",
         f"task.k={10 if pool else 3}", "task.ks=[3]", f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache",
         f"hydra.run.dir={out}", *([f"task.candidates={pool}"] if pool else [])],
        cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["polyrag/hit@3"] <= 1 and metrics["polyrag/queries"] == metrics["dense/queries"]
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["method"] == "polyrag"]
    assert mine and all(len(r["hits"]) <= (10 if pool else 3) for r in mine)
    if pool:  # PolyRAG orders the very pool the dense row orders (k=10 holds a whole pool)
        dense = {r["query_id"]: sorted(h["id"] for h in r["hits"]) for r in rows if r["method"] == "dense"}
        assert all(r["query_id"].endswith("@pool") and sorted(h["id"] for h in r["hits"]) == dense[r["query_id"]]
                   for r in mine)
    views = mine[0]["hits"][0]["views"]
    assert set(views) == {"relevance", "utility", "supplement", "authority", "timeliness", "y", "topic"}
    w = {"relevance": 0.35, "utility": 0.35, "supplement": 0.1, "authority": 0.2, "timeliness": 0.0}  # care
    for hit in mine[0]["hits"]:
        assert hit["score"] == pytest.approx(sum(w[v] * hit["views"][v] for v in w), abs=1e-5)
    # with the oracle's judges a candidate that states the answer gets the top relevance
    assert any(h["views"]["relevance"] == 1.0 for r in mine for h in r["hits"])


def test_trained_judges_give_the_relevance_and_supplement_views_on_the_runs_backend(tmp_path):
    """``pipeline.relevance_judge`` / ``supplement_judge`` name a judge's export, served by the run's backend kind
    (hf here; SmolLM2 as shipped stands in for a trained one): R and S become the judge's label probabilities.
    Without them R is the encoder's cosine and S is 0."""
    def hits(name: str, *judges: str) -> dict[tuple[str, str], dict]:
        out = tmp_path / name
        res = subprocess.run(
            [str(BIN / "omnimed-evaluate"), "task=retrieval", "task.queries=world", "task.methods=[polyrag]",
             "pipeline=polyrag", "pipeline.domain=policy", "backend=hf", "model=tiny-llama", "knowledge=world_tiny",
             "logger=none", "task.candidates=4", "task.max_queries=3", "task.k=5", "task.ks=[3]",
             f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"hydra.run.dir={out}", *judges],
            cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False)
        assert res.returncode == 0, res.stderr[-3000:]
        rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        return {(r["query_id"], h["id"]): h["views"] for r in rows for h in r["hits"]}

    plain = hits("plain")
    judged = hits("judged", "pipeline.relevance_judge=smollm2-135m", "pipeline.supplement_judge=smollm2-135m")
    assert plain.keys() == judged.keys() and len(plain) > 3   # the same pools of the 3 queries, all ranked
    assert all(v["supplement"] == 0.0 for v in plain.values())
    assert max(v["supplement"] for v in judged.values()) == pytest.approx(1.0)   # rescaled within each pool
    assert any(abs(judged[k]["relevance"] - plain[k]["relevance"]) > 1e-3 for k in plain)


def test_a_bad_polyrag_knob_fails_naming_its_key(tmp_path):
    res = subprocess.run(
        [str(BIN / "omnimed-evaluate"), "task=retrieval", "task.methods=[polyrag]", "pipeline=polyrag",
         "pipeline.composability.constraint=diverse", "backend=oracle", "knowledge=world_tiny", "logger=none",
         f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path, text=True, capture_output=True, timeout=300, check=False)
    assert res.returncode != 0
    assert "pipeline.composability.constraint='diverse'" in res.stderr + res.stdout


def test_table1_runs_polyrag_once_per_domain_with_that_domains_weights():
    """The row's column_overrides: each domain's HIT and NDCG columns come from one run with its paper weights;
    the baselines keep one sweep over the three question kinds."""
    from omnimed.tables.manifest import load_manifest
    from omnimed.tables.reproduce import for_training_seed, plan_rows, sweeps

    path = Path(__file__).resolve().parents[1] / "experiments" / "polyrag" / "table1.yaml"
    m = for_training_seed(load_manifest(path), 0)
    plans = {p.row.name: p for p in plan_rows(m, "miniature")}
    runs = sorted((extra, datasets) for _, datasets, extra in sweeps(plans["POLYRAG"], m))
    assert runs == [(["pipeline.domain=care"], {"world_mechanism": ["CARE/HIT@3", "CARE/NDCG@3"]}),
                    (["pipeline.domain=inquiry"], {"world_examination": ["INQUIRY/HIT@3", "INQUIRY/NDCG@3"]}),
                    (["pipeline.domain=policy"], {"world_treatment": ["POLICY/HIT@3", "POLICY/NDCG@3"]})]
    (baseline,) = sweeps(plans["BM25"], m)
    assert baseline[0] == "" and len(baseline[1]) == 3
    assert any("polyrag-utility-embed-miniature/hf" in o for o in plans["POLYRAG"].overrides)
    # R is the trained relevance judge, as in the paper (the judges table measured it against the encoder cosine)
    judge = "polyrag-relevance-judge-miniature-open-kinds/hf"
    assert any(o.startswith("pipeline.relevance_judge=") and o.endswith(judge) for o in plans["POLYRAG"].overrides)
    *_, pairs, training = m.prepare["miniature"]
    assert training.creates.endswith(judge)
    # the judge learns the open questions' pairs too (table 2 asks them) and takes three passes to keep every kind
    assert "stage.open_questions=true" in pairs.command and "trainer.max_steps=840" in training.command
    assert any(a.startswith("data.path=") and a.endswith(pairs.creates.rsplit("/", 1)[0]) for a in training.command)


def test_the_embedder_and_judge_presets_compose_with_the_papers_settings():
    """Section 5.1.3: the utility embedder is BGE-M3, 5 epochs, lr 1e-5, batch 16 per device, warmup 0.2, window
    50, temperature 0.05; the judges Qwen2.5 1.5B + LoRA, 5 epochs, lr 5e-5, batch 4, cosine."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omnimed.cli.common import conf_dir
    from omnimed.training.config import register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        embed = compose("train", overrides=["+preset=polyrag_utility_embed_paper"])
        judge = compose("train", overrides=["+preset=polyrag_judge_paper"])
        mini = compose("train", overrides=["+preset=polyrag_utility_embed_miniature", "paths.root=/r"])
        mini_judge = compose("train", overrides=["+preset=polyrag_judge_miniature"])
    t = embed.task
    assert (embed.model.name, t.objective, t.lr, t.warmup_ratio, t.passage_window, t.temperature) == \
        ("bge-m3", "distill", 1e-5, 0.2, 50, 0.05)
    assert embed.data.batch_size == 16 and embed.trainer.max_epochs == 5 and embed.data.record_kind == "utility"
    assert (judge.model.name, judge.task.objective, judge.task.lr, judge.task.scheduler) == \
        ("qwen2.5-1.5b-instruct", "sft", 5e-5, "cosine")
    assert judge.model.lora.enabled and judge.data.batch_size == 4 and judge.trainer.max_epochs == 5
    assert mini.model.name == "minilm-l6" and mini.data.path == "/r/builds/polyrag-miniature/utility"
    assert mini_judge.model.name == "smollm2-135m" and mini_judge.data.record_kind == "prompt_completion"


def test_the_view_ablation_is_a_table_of_ours_and_may_carry_no_published_number(tmp_path):
    import yaml

    from omnimed.tables.manifest import ManifestError, load_manifest

    src = Path(__file__).resolve().parents[1] / "experiments" / "polyrag" / "ablation.yaml"
    m = load_manifest(src)
    assert m.unpublished and all(not r.published for r in m.rows) and len(m.rows) == 9
    assert m.rows[-1].name == "equal weights" and any("pipeline.weights=" in o for o in m.rows[-1].overrides)
    data = yaml.safe_load(src.read_text())
    data["rows"][0]["published"] = {"CARE/HIT@3": 50.0}
    data.pop("prepare")
    bad = tmp_path / "experiments" / "polyrag" / "ablation.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises((ManifestError, ValueError), match="unpublished: true, but rows carry published numbers"):
        load_manifest(bad)

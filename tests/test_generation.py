"""Generation backends: the HF backend on the tiny model (and one check on the real SmolLM2), the call cache, the
world's oracle, the factory, and the OpenAI client against a scripted local server (retries, timeouts, concurrency,
the API key kept secret, missing server features). The real vLLM server is exercised in
test_generation_openai_server.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket

import pytest
import torch
from servers.fake_openai import TOKEN_LOGPROB, Script, fake_openai_server

from omnimed.data.world import build_world
from omnimed.generation.cache import CachedBackend
from omnimed.generation.factory import BackendConfig, build_backend
from omnimed.generation.hf import HFBackend, shared_prefix_groups
from omnimed.generation.openai_backend import OpenAIBackend
from omnimed.generation.oracle import TASKS, UNLIKELY, OracleBackend
from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams
from omnimed.models.config import ModelConfig

TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")
REFLECTIVE = ["[Retrieval]", "[No Retrieval]"]
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tiny() -> HFBackend:
    return HFBackend(TINY, batch_size=3)


@pytest.fixture(scope="module")
def world():
    return build_world(0, "tiny")


# ----------------------------------------------------------------------------------------------------------- HF
def test_hf_greedy_is_deterministic_and_batch_invariant(tiny):
    reqs = [Request("the patient"), Request("a drug that is given twice daily"), Request(CHAT),
            Request(CHAT, {"assistant_prefix": "<answer>"})]
    params = SamplingParams(max_new_tokens=6)
    batched = [g[0].text for g in tiny.generate(reqs, params)]
    alone = [tiny.generate([r], params)[0][0].text for r in reqs]
    assert batched == alone == [g[0].text for g in tiny.generate(reqs, params)]
    assert all(g[0].tokens == 6 and g[0].finish_reason == "length" for g in tiny.generate(reqs, params))
    (gens,) = tiny.generate(reqs[:1], dataclasses.replace(params, n=3))  # greedy n: the same text n times
    assert [g.text for g in gens] == [batched[0]] * 3


def test_hf_sampling_is_seeded_and_stops_cut_the_text(tiny):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=2, seed=7)
    first = [g.text for g in tiny.generate([Request("the patient")], params)[0]]
    assert first == [g.text for g in tiny.generate([Request("the patient")], params)[0]] and len(first) == 2
    greedy = tiny.generate([Request("the patient")], SamplingParams(max_new_tokens=6))[0][0].text
    stop = greedy.split()[1]
    (cut,) = tiny.generate([Request("the patient")], SamplingParams(max_new_tokens=6, stop=(stop,)))[0]
    assert cut.text == greedy[: greedy.index(stop)] and cut.finish_reason == "stop"


def _hand_logprobs(backend: HFBackend, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(backend.model(torch.tensor([ids])).logits[0].float(), -1)


def test_hf_score_equals_a_hand_computation(tiny):
    tok = tiny.tokenizer
    cases = [("the patient", " has fever"), ("dose:", "5mg"), ("the patient", "")]
    got = tiny.score([Request(p) for p, _ in cases], [c for _, c in cases])
    for (prompt, cont), value in zip(cases, got):
        p, full = tok(prompt)["input_ids"], tok(prompt + cont)["input_ids"]
        k = next((i for i, (a, b) in enumerate(zip(p, full)) if a != b), min(len(p), len(full)))
        logp = _hand_logprobs(tiny, full)
        expected = sum(float(logp[i - 1, full[i]]) for i in range(k, len(full)))
        assert value == pytest.approx(expected, abs=1e-4)
    assert got[2] == 0.0
    # a chat prompt scores the continuation of its rendered template
    (chat,) = tiny.score([Request(CHAT)], [" yes"])
    assert chat == pytest.approx(tiny.score([Request(tiny.render(Request(CHAT)))], [" yes"])[0], abs=1e-4)


def test_hf_next_token_logprobs_cover_added_special_tokens():
    backend = HFBackend(dataclasses.replace(TINY, special_tokens=REFLECTIVE), batch_size=2)
    reqs = [Request("Question: is aspirin an NSAID?\n"), Request(CHAT)]
    lps = backend.next_token_logprobs(reqs, [*REFLECTIVE, "the"])
    for req, row in zip(reqs, lps):
        ids = backend._encode(backend.render(req), req)
        last = _hand_logprobs(backend, ids)[-1]
        for token, value in row.items():
            assert value == pytest.approx(float(last[backend.token_id(token)]), abs=1e-4)
    # added tokens survive decoding; end-of-sequence and padding do not
    tok = backend.tokenizer
    ids = tok("yes", add_special_tokens=False)["input_ids"] + [backend.token_id("[Retrieval]"), tok.eos_token_id, 5]
    assert backend.decode(ids) == ("yes[Retrieval]", len(ids) - 2, True)
    with pytest.raises(GenerationError, match=r"\[Nope\]"):
        backend.next_token_logprobs(reqs, ["[Nope]"])


def test_hf_branches_of_one_prompt_share_its_computation_and_score_as_if_alone():
    backend = HFBackend(dataclasses.replace(TINY, special_tokens=REFLECTIVE), batch_size=2)
    shared = "Three solved questions, then the question the branches below all continue. " * 4
    tails = ["[Retrieval]<p>aspirin</p>", "[Retrieval]<p>a much longer passage about ibuprofen doses</p>", "x",
             "[No Retrieval]"]
    reqs = [Request(CHAT + [{"role": "user", "content": shared}], {"assistant_prefix": t}) for t in tails]
    reqs += [Request("an unrelated short prompt"), Request("another")]  # groups of one: no prefix
    encoded = [backend._encode(backend.render(r), r) for r in reqs]
    groups = shared_prefix_groups(encoded)
    assert sorted(map(sorted, (m for _, m in groups))) == [[0, 1, 2, 3], [4], [5]]
    prefix = next(p for p, m in groups if len(m) == 4)
    assert prefix >= 32 and all(encoded[i][:prefix] == encoded[0][:prefix] for i in range(4))
    def check(requests):
        for req, row in zip(requests, backend.next_token_logprobs(requests, [*REFLECTIVE, "the"])):
            last = _hand_logprobs(backend, backend._encode(backend.render(req), req))[-1]
            for token, value in row.items():
                assert value == pytest.approx(float(last[backend.token_id(token)]), abs=1e-4)

    check(reqs)
    assert len(backend._caches) == 5  # the shared prompt and the four branches after it
    # the next step continues each branch (as Self-BioRAG's answer follows REL): computed from the kept caches
    steps = [Request(r.prompt, {"assistant_prefix": r.meta["assistant_prefix"] + "[Relevant] The answer is"})
             for r in reqs[:4]]
    calls = []
    handle = backend.model.register_forward_hook(
        lambda _m, args, kw, _o: calls.append(kw.get("input_ids", args[0] if args else None).shape), with_kwargs=True)
    try:
        check(steps)
    finally:
        handle.remove()
    new_tokens = [len(backend._encode(backend.render(b), b)) - len(a) for a, b in zip(encoded, steps)]
    assert [shape[1] for shape in calls[:4]] == new_tokens and max(new_tokens) < 16  # then the 4 hand checks
    lean = HFBackend(dataclasses.replace(TINY, special_tokens=REFLECTIVE), batch_size=2, prefix_cache_mb=0)
    for a, b in zip(lean.next_token_logprobs(steps, REFLECTIVE), backend.next_token_logprobs(steps, REFLECTIVE)):
        assert a == pytest.approx(b, abs=1e-4)
    assert not lean._caches
    # share_prefix=False (the default on a GPU): whole rows in padded batches, the same numbers, in one pass here
    assert lean.share_prefix  # the default on the CPU
    whole = HFBackend(dataclasses.replace(TINY, special_tokens=REFLECTIVE), batch_size=6, share_prefix=False)
    passes = []
    handle = whole.model.register_forward_hook(lambda *_: passes.append(1))
    try:
        rows = whole.next_token_logprobs(reqs, REFLECTIVE)
    finally:
        handle.remove()
    assert len(passes) == 1
    for a, b in zip(rows, lean.next_token_logprobs(reqs, REFLECTIVE)):
        assert a == pytest.approx(b, abs=1e-4)
    tight = HFBackend(dataclasses.replace(TINY, special_tokens=REFLECTIVE), batch_size=2, prefix_cache_mb=1e-3)
    tight.next_token_logprobs(reqs, REFLECTIVE)  # over the bound: only the most recent cache stays
    assert len(tight._caches) == 1 and tight._kept_bytes == next(iter(tight._caches.values())).nbytes


def test_hf_too_long_prompt_is_reported_not_dropped():
    backend = HFBackend(TINY, max_length=5)
    out = backend.generate([Request("word " * 20), Request("hi")], SamplingParams(max_new_tokens=2))
    assert out[0][0].error and "max_length is 5" in out[0][0].error and out[1][0].error is None
    with pytest.raises(GenerationError, match="max_length"):
        backend.score([Request("word " * 20)], [" x"])


def test_hf_loads_an_exported_folder(tiny, tmp_path):
    from omnimed.training.export import export_hf

    folder = export_hf(tiny.model, tiny.tokenizer, tmp_path / "export")
    again = HFBackend(str(folder))
    reqs, params = [Request("the patient"), Request(CHAT)], SamplingParams(max_new_tokens=5)
    assert [g[0].text for g in again.generate(reqs, params)] == [g[0].text for g in tiny.generate(reqs, params)]
    assert again.model_id.startswith("export@") and again.model_id != tiny.model_id


def test_hf_smollm2_answers_greedily_and_batch_invariantly():
    smol = HFBackend(ModelConfig(), batch_size=2)
    reqs = [Request("The capital of France is"), Request([{"role": "user", "content": "What is 2+2?"}])]
    params = SamplingParams(max_new_tokens=4)
    batched = [g[0].text for g in smol.generate(reqs, params)]
    assert batched == [smol.generate([r], params)[0][0].text for r in reqs]
    assert "Paris" in batched[0]
    (lps,) = smol.next_token_logprobs(reqs[:1], [" Paris", " London"])
    assert lps[" Paris"] > lps[" London"]


# ----------------------------------------------------------------------------------------------------------- cache
class Counting:
    """A backend that counts the requests it is sent and can fail once it has seen ``fail_after``."""

    name, model_id = "counting", "m"

    def __init__(self, fail_after: int | None = None, error_on: str | None = None):
        self.calls, self.fail_after, self.error_on = 0, fail_after, error_on

    def _count(self, n: int) -> None:
        self.calls += n
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("interrupted")

    def generate(self, requests, params):
        self._count(len(requests))
        return [[Generation(text=f"{r.prompt}/{params.max_new_tokens}",
                            error="HTTP 503" if r.prompt == self.error_on else None)] for r in requests]

    def score(self, requests, continuations):
        self._count(len(requests))
        return [-float(len(c)) for c in continuations]

    def next_token_logprobs(self, requests, tokens):
        self._count(len(requests))
        return [{t: -float(i) for i, t in enumerate(tokens)} for _ in requests]


def test_cache_second_call_costs_nothing_and_returns_the_same(tmp_path):
    reqs = [Request(f"q{i}", {"question_id": f"q{i}"}) for i in range(5)]
    first = CachedBackend(Counting(), tmp_path)
    results = (first.generate(reqs, SamplingParams()), first.score(reqs, ["a", "bb", "c", "", "dd"]),
               first.next_token_logprobs(reqs, ["x", "y"]))
    assert first.backend.calls == 15 and first.misses == 15 and first.hits == 0
    again = CachedBackend(Counting(), tmp_path)  # a new process would see the same file
    assert (again.generate(reqs, SamplingParams()), again.score(reqs, ["a", "bb", "c", "", "dd"]),
            again.next_token_logprobs(reqs, ["x", "y"])) == results
    assert again.backend.calls == 0 and again.hits == 15 and again.misses == 0 and len(again) == 15
    # greedy: the seed does not change the output, so it is not another call; other parameters are
    again.generate(reqs, SamplingParams(seed=3))
    assert again.backend.calls == 0
    again.generate(reqs, SamplingParams(max_new_tokens=7))
    assert again.backend.calls == 5
    again.score(reqs[:1], ["zz"])  # another continuation, another call
    assert again.backend.calls == 6


def test_the_call_cache_lives_under_the_runs_cache_unless_the_environment_names_a_folder(tmp_path, monkeypatch,
                                                                                         world_tiny):
    """``$OMNIMED_GENERATION_CACHE`` (the test session's own folder, a shared disk) wins over ``paths.cache``; an
    explicit ``backend.cache_dir`` wins over both."""
    from omnimed.generation.factory import BackendConfig, build_backend
    from omnimed.models.cache import generation_cache_dir

    monkeypatch.delenv("OMNIMED_GENERATION_CACHE", raising=False)
    assert generation_cache_dir(tmp_path / "runs") == tmp_path / "runs" / "generation"
    monkeypatch.setenv("OMNIMED_GENERATION_CACHE", str(tmp_path / "shared"))
    assert generation_cache_dir(tmp_path / "runs") == tmp_path / "shared"
    cached = build_backend(BackendConfig(name="oracle"), world=world_tiny, cache_root=tmp_path / "runs")
    assert cached.path.parent == tmp_path / "shared"
    own = build_backend(BackendConfig(name="oracle", cache_dir=str(tmp_path / "own")), world=world_tiny)
    assert own.path.parent == tmp_path / "own"


def test_an_oracle_reply_cached_under_other_rules_is_not_served(tmp_path, world_tiny, monkeypatch):
    """The oracle's replies are its code's rules, not a model's weights: a verdict cached before a rule changed is
    stale, so the call cache keys oracle replies by a digest of the rules' source (and the world's knobs)."""
    import omnimed.generation.oracle as oracle_module

    q = world_tiny.open_questions[0]
    echo = [Request("", {"task": "judge_statement", "question_id": q.id, "statement": q.question})]
    with monkeypatch.context() as old_rules:
        old_rules.setattr(oracle_module, "rules_digest", lambda: "before")
        old_rules.setattr(type(world_tiny.oracle), "statement_verdict", lambda self, question, statement: "correct")
        for _ in range(2):  # under the same rules the second process is served from the cache
            stale = CachedBackend(OracleBackend(world_tiny), tmp_path)
            assert stale.generate(echo, SamplingParams())[0][0].text == "<label>correct</label>"
        assert (stale.hits, stale.misses) == (1, 0)
    now = CachedBackend(OracleBackend(world_tiny), tmp_path)
    assert now.generate(echo, SamplingParams())[0][0].text == "<label>not_mentioned</label>"
    assert (now.hits, now.misses) == (0, 1)
    assert str(world_tiny.difficulty) in now.identity and oracle_module.rules_digest() in now.identity


def test_cache_resumes_an_interrupted_stage_and_retries_failures(tmp_path):
    reqs = [Request(f"q{i}") for i in range(10)]
    first = CachedBackend(Counting(fail_after=8), tmp_path, batch_size=4)
    with pytest.raises(RuntimeError, match="interrupted"):
        first.generate(reqs, SamplingParams())
    again = CachedBackend(Counting(error_on="q9"), tmp_path, batch_size=4)
    out = again.generate(reqs, SamplingParams())
    assert again.backend.calls == 2 and again.hits == 8  # the two finished batches were kept
    assert [g[0].text for g in out] == [f"q{i}/256" for i in range(10)] and out[9][0].error == "HTTP 503"
    third = CachedBackend(Counting(), tmp_path)
    third.generate(reqs, SamplingParams())
    assert third.backend.calls == 1  # only the failed request is asked again


# ----------------------------------------------------------------------------------------------------------- oracle
def test_oracle_answers_world_mcqs_and_judges_with_reflective_tokens(world):
    oracle = OracleBackend(world)
    qs = world.questions
    gens = oracle.generate([Request("ignored", {"task": "answer_mcq", "question_id": q.id}) for q in qs],
                           SamplingParams())
    assert [g[0].text for g in gens] == [f"<answer>{q.answer[0]}</answer>" for q in qs]
    for q in qs:
        meta = {"task": "answer_mcq", "question_id": q.id, "assistant_prefix": "<answer>"}
        (row,) = oracle.next_token_logprobs([Request("ignored", meta)], list(q.options))
        assert max(row, key=row.get) == q.answer[0]
        assert sorted(row.values()) == [UNLIKELY] * (len(q.options) - 1) + [0.0]
    q, p = qs[0], world.passages[0]
    cases = {
        "retrieval": world.oracle.retrieval_token(q),
        "relevance": world.oracle.relevance_token(q, p),
        "support": world.oracle.support_token(q, None, p),
        "utility": world.oracle.utility_token(q, q.options[q.answer[0]]),
        "passage_utility": world.oracle.passage_utility_token(q, p),
    }
    for task, expected in cases.items():
        meta = {"task": task, "question_id": q.id, "passage_id": p.id, "answer": q.options[q.answer[0]]}
        if task == "support":
            meta.pop("answer")
        assert oracle.generate([Request("", meta)], SamplingParams())[0][0].text == expected
        assert oracle.score([Request("", meta)], [expected]) == [0.0]
    gold = {"task": "answer_mcq", "question_id": q.id}
    assert oracle.score([Request("", gold)] * 3, [f"<answer>{q.answer[0]}</answer>", "<answer>", "<answer>Z"]) \
        == [0.0, 0.0, UNLIKELY]


def test_oracle_reports_what_it_cannot_answer(world):
    oracle = OracleBackend(world)
    with pytest.raises(GenerationError, match="known tasks: .*answer_mcq.*relevance"):
        oracle.generate([Request("", {"task": "summarise_the_world"})], SamplingParams())
    with pytest.raises(GenerationError, match="needs meta passage_id"):
        oracle.generate([Request("", {"task": "relevance", "question_id": world.questions[0].id})], SamplingParams())
    with pytest.raises(GenerationError, match="not a question of this world"):
        oracle.generate([Request("", {"task": "retrieval", "question_id": "nope"})], SamplingParams())
    assert {"answer_mcq", "retrieval", "relevance", "support", "utility", "judge_statement"} <= set(TASKS)
    with pytest.raises(GenerationError, match="needs meta question_id, statement"):
        oracle.generate([Request("", {"task": "judge_statement"})], SamplingParams())


# ----------------------------------------------------------------------------------------------------------- factory
def test_factory_builds_each_backend_or_says_why_not(world, tmp_path):
    cached = build_backend(BackendConfig(name="hf", model="tiny-llama", cache_dir=str(tmp_path)))
    assert isinstance(cached, CachedBackend) and isinstance(cached.backend, HFBackend)
    assert cached.model_id.startswith("tiny-llama@")
    assert isinstance(build_backend(BackendConfig(name="oracle", cache=False), world=world), OracleBackend)
    remote = build_backend(BackendConfig(name="openai", cache=False), model=ModelConfig())
    assert isinstance(remote, OpenAIBackend) and remote.model_id == "smollm2-135m"
    with pytest.raises(GenerationError, match="backend=openai"):  # no vllm in this environment
        build_backend(BackendConfig(name="vllm", cache=False))
    with pytest.raises(GenerationError, match="backend=oracle answers from the synthetic world"):
        build_backend(BackendConfig(name="oracle"))
    with pytest.raises(GenerationError, match="expected one of hf, vllm, openai, oracle"):
        build_backend(BackendConfig(name="gpt"))
    from omegaconf import OmegaConf

    node = OmegaConf.structured(BackendConfig(name="openai", model="m", cache=False))
    assert build_backend(node).model_id == "m"


def test_vllm_backend_explains_the_alternative_without_vllm():
    from omnimed.generation.vllm_backend import VLLMBackend

    with pytest.raises(GenerationError, match="backend=openai"):
        VLLMBackend("whatever")


# ----------------------------------------------------------------------------------------------------------- openai
KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("OMNIMED_TEST_KEY", KEY)
    return "OMNIMED_TEST_KEY"


def _client(url: str, key_env: str, **kw) -> OpenAIBackend:
    return OpenAIBackend(url, "served", api_key_env=key_env, backoff=0.01, **kw)


def test_openai_generates_via_both_endpoints_and_sends_the_key(key_env):
    with fake_openai_server() as (url, rec):
        client = _client(url, key_env)
        out = client.generate([Request("hi"), Request(CHAT), Request(CHAT, {"assistant_prefix": "<a>"})],
                              SamplingParams(max_new_tokens=5, stop=("\n",)))
    assert [g[0].text for g in out] == ["echo:hi", "chat:hello", "chat:<a>"]
    assert sorted(rec.paths) == ["/v1/chat/completions"] * 2 + ["/v1/completions"]
    assert set(rec.auth) == {f"Bearer {KEY}"}
    body = rec.bodies[rec.paths.index("/v1/completions")]
    assert body["model"] == "served" and body["max_tokens"] == 5 and body["stop"] == ["\n"]
    prefixed = [b for b in rec.bodies if b.get("continue_final_message")]
    assert prefixed and prefixed[0]["messages"][-1] == {"role": "assistant", "content": "<a>"}


def test_openai_retries_transient_errors_then_succeeds(key_env):
    with fake_openai_server(Script(fail=[503, 429, 500], retry_after="0")) as (url, rec):
        out = _client(url, key_env, max_retries=3).generate([Request("hi")], SamplingParams())
    assert out[0][0].text == "echo:hi" and out[0][0].error is None and len(rec.paths) == 4
    with fake_openai_server(Script(fail=[503] * 10)) as (url, rec):
        out = _client(url, key_env, max_retries=2).generate([Request("hi")], SamplingParams())
    assert "HTTP 503" in out[0][0].error and "after 3 attempts" in out[0][0].error and len(rec.paths) == 3
    with fake_openai_server(Script(fail=[400])) as (url, rec):  # a client error is not retried
        out = _client(url, key_env).generate([Request("hi")], SamplingParams())
    assert "HTTP 400" in out[0][0].error and "scripted failure 400" in out[0][0].error and len(rec.paths) == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_wrong_port_is_a_clear_error_and_the_key_never_leaks(key_env, caplog):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    client = _client(url, key_env, max_retries=2)
    with caplog.at_level(logging.DEBUG):
        (gens,) = client.generate([Request("hi")], SamplingParams(n=2))
        with pytest.raises(GenerationError) as err:
            client.score([Request("hi")], [" there"])
    assert len(gens) == 2 and all(g.text == "" and g.finish_reason == "error" for g in gens)
    assert f"cannot reach {url}" in gens[0].error and "after 3 attempts" in gens[0].error
    assert "cannot reach" in str(err.value)
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 4 and all("cannot reach" in m for m in retries)  # logged as they happen
    # a careless server quoting the Authorization header in its error body
    with fake_openai_server(Script(fail=[401], leak_auth=True)) as (good, _):
        leaked = _client(good, key_env).generate([Request("hi")], SamplingParams())[0][0].error
    assert "HTTP 401" in leaked and "Bearer ***" in leaked
    texts = [repr(client), str(err.value), gens[0].error, leaked, caplog.text]
    assert all(KEY not in t for t in texts) and not any(KEY in str(v) for v in vars(client).values())


def test_openai_times_out_slow_servers(key_env):
    with fake_openai_server(Script(delay=1.0)) as (url, rec):
        out = _client(url, key_env, timeout=0.2, max_retries=1).generate([Request("hi")], SamplingParams())
    assert "timed out after 0.2 s" in out[0][0].error and len(rec.paths) == 2


def test_openai_bounds_concurrency(key_env):
    with fake_openai_server(Script(delay=0.15)) as (url, rec):
        out = _client(url, key_env, concurrency=3).generate([Request(f"q{i}") for i in range(12)],
                                                            SamplingParams())
    assert [g[0].text for g in out] == [f"echo:q{i}" for i in range(12)]
    assert rec.max_in_flight == 3


def test_openai_scores_by_echo_with_server_token_ids(key_env):
    with fake_openai_server() as (url, rec):
        client = _client(url, key_env)
        # the fake tokenizer has one token per character, each scored TOKEN_LOGPROB
        assert client.score([Request("ab"), Request(CHAT)], ["cde", ""]) == [3 * TOKEN_LOGPROB, 0.0]
        lps = client.next_token_logprobs([Request("ab", {"assistant_prefix": "<"})], ["A", "B"])
        assert lps == [{"A": TOKEN_LOGPROB, "B": TOKEN_LOGPROB}]
        echoed = [b["prompt"] for b in rec.bodies if b.get("echo")]
        assert [ord(c) for c in "ab<A"] in echoed and [ord(c) for c in "ab<B"] in echoed
        with pytest.raises(GenerationError, match="'AB' is not one token"):
            client.next_token_logprobs([Request("ab")], ["AB"])

        async def inside_a_running_loop():
            return client.score([Request("ab")], ["c"])

        assert asyncio.run(inside_a_running_loop()) == [TOKEN_LOGPROB]


def test_openai_scoring_needs_logprobs_and_tokenize(key_env):
    with fake_openai_server(Script(echo_logprobs=False)) as (url, _):
        with pytest.raises(GenerationError, match="supports logprobs with echo"):
            _client(url, key_env).score([Request("ab")], ["c"])
    with fake_openai_server(Script(tokenize=False)) as (url, _):
        with pytest.raises(GenerationError, match="no /tokenize"):
            _client(url, key_env).next_token_logprobs([Request("ab")], ["c"])


def test_openai_cache_keys_the_server_and_extra_body_but_no_secret(key_env, tmp_path):
    """The served model name alone is not the model: another server, or another ``extra_body`` (vLLM's
    ``skip_special_tokens``), must be asked again, not answered from a stale cache entry."""
    reqs, params = [Request("hi"), Request(CHAT)], SamplingParams(max_new_tokens=4)
    with fake_openai_server() as (url_a, rec_a), fake_openai_server() as (url_b, rec_b):
        first = CachedBackend(_client(url_a, key_env), tmp_path)
        first.generate(reqs, params)
        assert len(rec_a.paths) == 2
        CachedBackend(_client(url_a, key_env), tmp_path).generate(reqs, params)
        assert len(rec_a.paths) == 2  # same server, same options: from the cache
        other_server = CachedBackend(_client(url_b, key_env), tmp_path)
        other_server.generate(reqs, params)
        assert len(rec_b.paths) == 2 and other_server.misses == 2
        raw = CachedBackend(_client(url_a, key_env, extra_body={"skip_special_tokens": False}), tmp_path)
        raw.generate(reqs, params)
        assert len(rec_a.paths) == 4 and raw.misses == 2
        assert rec_a.bodies[-1]["skip_special_tokens"] is False
        # a trailing slash is the same server
        assert CachedBackend(_client(url_a + "/", key_env), tmp_path).identity == first.identity
    # no credential in what keys the cache: not the key from the environment, not a password in the URL
    with_password = _client("http://user:s3cret@127.0.0.1:9/v1?token=abc", key_env)
    identity = CachedBackend(with_password, tmp_path).identity
    assert "s3cret" not in identity and "abc" not in identity and KEY not in identity
    assert identity == "served@http://127.0.0.1:9/v1#{}"

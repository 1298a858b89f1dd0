"""SFT on tiny-llama: loss masking, packing, dynamic padding, tokenization cache, training dynamics, LoRA."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from omnimed.data.records import InstructionExample, Passage
from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.loading import load_tokenizer
from omnimed.training import data as data_mod
from omnimed.training.config import DataConfig, TaskConfig
from omnimed.training.data import (
    PadToLongestCollator,
    SFTDataModule,
    length_grouped_batches,
    pack_sequences,
    real_token_fraction,
)
from omnimed.training.resume import ResumableBatchSampler, ResumableDataLoader
from omnimed.training.sft import SFTModule, _no_loss_scaler, optimizer_groups
from omnimed.training.tokenize import IGNORE_INDEX, format_example, tokenize_prompt_completion

PARAGRAPH = [["<paragraph>", "</paragraph>"]]
TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")
SENTENCES = [
    "Metformin is usually the first-line drug, together with diet and exercise.",
    "Hypertension is defined as a blood pressure of 140/90 mmHg or higher.",
    "Common symptoms of influenza include fever, cough and sore throat.",
    "Antibiotics do not treat viral infections.",
    "Asthma causes wheezing, and inhaled corticosteroids reduce inflammation.",
    "Kidney function is assessed with serum creatinine.",
]
QUESTIONS = [
    "What is the first-line treatment for type 2 diabetes?",
    "What is the most likely diagnosis?",
    "Which evidence supports this answer?",
    "Is the passage relevant?",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY)


@pytest.fixture(scope="module")
def special_tokenizer():
    """tiny-llama with the paragraph markers and reflection tokens registered as special tokens."""
    return load_tokenizer(
        replace(TINY, special_tokens=["<paragraph>", "</paragraph>", "[Retrieval]", "[Relevant]"])
    )


def make_examples(n: int, seed: int = 0, max_sentences: int = 6) -> list[InstructionExample]:
    """Deterministic examples of varied length, some with evidence in the prompt and in the output."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        answer = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, max_sentences)))
        evidence = [Passage(id=f"p{i}", source="guideline", text=rng.choice(SENTENCES))] if i % 3 == 0 else []
        if i % 2 == 0:
            answer = f"[Retrieval]<paragraph>{rng.choice(SENTENCES)}</paragraph>[Relevant]{answer}"
        out.append(
            InstructionExample(
                id=str(i), instruction=QUESTIONS[i % len(QUESTIONS)], output=answer, evidence=evidence
            )
        )
    return out


def supervised_text(tokenizer, labels: list[int]) -> str:
    return tokenizer.decode([t for t in labels if t != IGNORE_INDEX])


def tokenize_one(tokenizer, prompt: str, completion: str, max_length: int = 512, mask_spans=PARAGRAPH):
    feats = tokenize_prompt_completion(
        {"prompt": [prompt], "completion": [completion]}, tokenizer, max_length, mask_spans
    )
    return feats["input_ids"][0], feats["labels"][0]


# ----------------------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("template", ["chat", "plain"])
def test_prompt_tokens_are_masked(tokenizer, template):
    ex = InstructionExample(
        id="1",
        instruction="What is the most likely diagnosis?",
        input="Chest pain.",
        output="Acute myocardial infarction.",
        evidence=[Passage(id="p", source="book", title="Cardio", text="ST elevation.")],
    )
    f = format_example(ex, tokenizer, template)
    assert "<paragraph>Cardio\nST elevation.</paragraph>" in f["prompt"]
    ids, labels = tokenize_one(tokenizer, f["prompt"], f["completion"])
    n_prompt = len(tokenizer(f["prompt"], add_special_tokens=False)["input_ids"])
    assert all(lab == IGNORE_INDEX for lab in labels[:n_prompt])
    assert supervised_text(tokenizer, labels) == "Acute myocardial infarction.<|im_end|>"
    assert ids[-1] == tokenizer.eos_token_id and labels[-1] == tokenizer.eos_token_id
    assert ids.count(tokenizer.eos_token_id) == f["prompt"].count("<|im_end|>") + 1  # no doubled EOS


def test_a_model_is_asked_at_inference_in_the_text_it_was_trained_on(tokenizer):
    """`model.prompt_layout` decides the layout in training and at inference alike: `plain` (Self-RAG's released
    weights) even for a tokenizer with a chat template, `chat` through the template; anything else is refused."""
    from omnimed.models.layout import request_prompt
    from omnimed.training.tokenize import template_mode

    ex = InstructionExample(id="1", instruction="Choose one.", input="Q?\nA. x", output="A")
    train = format_example(ex, tokenizer, template_mode("plain"))
    assert train["prompt"] == request_prompt("Choose one.", "Q?\nA. x", "plain") == (
        "### Instruction:\nChoose one.\n\n### Input:\nQ?\nA. x\n\n### Response:\n")
    chat = format_example(ex, tokenizer, template_mode("chat"))
    asked = request_prompt("Choose one.", "Q?\nA. x", "chat")
    assert chat["prompt"] == tokenizer.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match="model.prompt_layout='selfrag'; expected chat or plain"):
        template_mode("selfrag")


def test_bpe_merge_across_prompt_boundary(tokenizer):
    """A token merged across the prompt/completion boundary is prompt (masked); ids are the joint text's ids."""
    prompt, completion = "Answer: metfor", "min lowers glucose."
    ids, labels = tokenize_one(tokenizer, prompt, completion)
    joint = tokenizer(prompt + completion, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == joint["input_ids"] + [tokenizer.eos_token_id]
    straddling = [i for i, (s, e) in enumerate(joint["offset_mapping"]) if s < len(prompt) < e]
    assert straddling, "the test text should produce a token crossing the boundary"
    assert all(labels[i] == IGNORE_INDEX for i in straddling)
    assert supervised_text(tokenizer, labels) == " lowers glucose.<|im_end|>"


@pytest.mark.parametrize("tok_name", ["tokenizer", "special_tokenizer"])
def test_several_paragraph_spans_masked(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    completion = (
        "[Retrieval]<paragraph>Metformin lowers glucose.</paragraph>[Relevant]Use metformin."
        "[Retrieval]<paragraph>Diet and exercise help.</paragraph>[Relevant]Also diet."
    )
    prompt = "Question: <paragraph>Prompt evidence.</paragraph>\nAnswer:"
    _, labels = tokenize_one(tok, prompt, completion)
    kept = supervised_text(tok, labels)
    assert kept == "[Retrieval][Relevant]Use metformin.[Retrieval][Relevant]Also diet.<|im_end|>"
    for hidden in ("Metformin lowers", "Diet and exercise", "paragraph", "Prompt evidence"):
        assert hidden not in kept
    # every token whose text lies inside a span (markers included) is masked
    text = prompt + completion
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = [
        (text.index(a), text.index(b) + len("</paragraph>"))
        for a, b in [
            ("<paragraph>Metformin", "</paragraph>[Relevant]Use"),
            ("<paragraph>Diet", "</paragraph>[Relevant]Also"),
        ]
    ]
    for i, (s, e) in enumerate(offsets):
        if any(a <= s and e <= b for a, b in spans):
            assert labels[i] == IGNORE_INDEX


def test_unclosed_span_masks_to_end(tokenizer):
    _, labels = tokenize_one(tokenizer, "Q:", " Yes.<paragraph>cut short by trunc")
    assert supervised_text(tokenizer, labels) == " Yes.<|im_end|>"


def test_truncation_keeps_prefix(tokenizer):
    ids, labels = tokenize_one(tokenizer, "Q:", " " + " ".join(SENTENCES), max_length=10)
    assert len(ids) == len(labels) == 10 and ids[-1] != tokenizer.eos_token_id


def test_labels_align_with_input_ids_and_model_shifts(tokenizer):
    """Labels sit on the token they name (unshifted); the HF model shifts them: its loss equals CE of
    logits[t] against labels[t+1]."""
    f = format_example(make_examples(1)[0], tokenizer)
    ids, labels = tokenize_one(tokenizer, f["prompt"], f["completion"])
    assert len(ids) == len(labels)
    assert all(lab in (IGNORE_INDEX, tok) for tok, lab in zip(ids, labels))
    module = SFTModule(TINY, TaskConfig(), tokenizer)
    module.configure_model()
    x, y = torch.tensor([ids]), torch.tensor([labels])
    with torch.no_grad():
        out = module(x, torch.ones_like(x), y)
        manual = torch.nn.functional.cross_entropy(out.logits[0, :-1], y[0, 1:], ignore_index=IGNORE_INDEX)
        unshifted = torch.nn.functional.cross_entropy(out.logits[0], y[0], ignore_index=IGNORE_INDEX)
    assert torch.allclose(out.loss, manual, atol=1e-5)
    assert not torch.allclose(out.loss, unshifted, atol=1e-3)


# ----------------------------------------------------------------------------------------------- batching
def data_cfg(**kw) -> DataConfig:
    return DataConfig(**{"batch_size": 8, "val_fraction": 0.0, "num_workers": 0, **kw})


def epoch_fraction(loader) -> float:
    real = total = 0
    for batch in loader:
        real += int(batch["attention_mask"].sum())
        total += batch["attention_mask"].numel()
    return real / total


def test_packing_keeps_labels_and_fills_blocks(tokenizer):
    task = TaskConfig(max_length=64, mask_spans=PARAGRAPH)
    dm = SFTDataModule(make_examples(40), tokenizer, data_cfg(packing=True), task)
    dm.setup("fit")
    blocks = dm.train_dataset
    assert all(n == 64 for n in blocks["length"][:-1])
    # the packed blocks carry every supervised label of the examples, in order (blocks that hold only
    # prompt tokens are dropped, which loses no supervised label)
    feats = dm.tokenized()
    feats = feats.select(dm._permutation(len(feats)))
    packed = pack_sequences(
        {"input_ids": feats["input_ids"], "labels": feats["labels"]}, 64, tokenizer.eos_token_id
    )

    def supervised(rows):
        return [lab for row in rows for lab in row if lab != IGNORE_INDEX]

    assert supervised(packed["labels"]) == supervised(feats["labels"])
    assert [list(x) for x in blocks["labels"]] == packed["labels"]
    for ids, labels in zip(blocks["input_ids"], blocks["labels"]):
        assert all(lab in (IGNORE_INDEX, tok) for tok, lab in zip(ids, labels))
    assert epoch_fraction(dm.train_dataloader()) >= 0.9


def test_length_grouped_padding_is_mostly_real_tokens(tokenizer):
    task = TaskConfig(max_length=256, mask_spans=PARAGRAPH)
    dm = SFTDataModule(make_examples(96, max_sentences=8), tokenizer, data_cfg(), task)
    dm.setup("fit")
    lengths = dm.train_dataset["length"]
    assert max(lengths) > 3 * min(lengths), "the test needs varied lengths"
    loader = dm.train_dataloader()
    batches = list(loader)
    assert sum(b["input_ids"].size(0) for b in batches) == len(lengths)
    assert epoch_fraction(batches) >= 0.9
    assert min(real_token_fraction(b) for b in batches) >= 0.75
    for b in batches:  # padding is right-padding with pad ids, -100 labels, no attention
        pad = b["attention_mask"] == 0
        assert (b["labels"][pad] == IGNORE_INDEX).all() and (
            b["input_ids"][pad] == tokenizer.pad_token_id
        ).all()
    # the same batches without length grouping waste far more
    random_order = torch.utils.data.DataLoader(
        dm.train_dataset.select_columns(["input_ids", "attention_mask", "labels"]),
        batch_size=8,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        collate_fn=PadToLongestCollator(tokenizer.pad_token_id),
    )
    assert epoch_fraction(random_order) < epoch_fraction(batches)


def test_length_grouped_batches_shard_and_resume():
    """Fixed length-homogeneous batches; two ranks take disjoint whole batches; a new order each epoch; a
    restored loader skips the batches already trained on."""
    rng = random.Random(0)
    lengths = [rng.randint(5, 200) for _ in range(101)]
    batches = length_grouped_batches(lengths, 4, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(101))
    full = [b for b in batches if len(b) == 4]
    padded = sum(max(lengths[i] for i in b) * 4 for b in full)
    assert padded <= 1.05 * sum(lengths[i] for b in full for i in b)
    ranks = [ResumableBatchSampler(batches, shuffle=True, seed=1, rank=r, world_size=2) for r in range(2)]
    shares = [list(s) for s in ranks]
    assert len(shares[0]) == len(shares[1]) == len(batches) // 2
    flat = [{i for b in share for i in b} for share in shares]
    assert not flat[0] & flat[1]
    ranks[0].set_epoch(1)
    assert list(ranks[0]) != shares[0]
    # mid-epoch resume: a loader restored to "3 batches done" yields the remaining ones
    ds = list(range(101))
    loader = ResumableDataLoader(
        ds, batch_sampler=ResumableBatchSampler(batches, shuffle=True, seed=1), collate_fn=list
    )
    epoch = list(loader)
    loader.load_state_dict({"epoch": 0, "batches_done": 3})
    assert list(loader) == epoch[3:]


def test_split_is_deterministic(tokenizer):
    task = TaskConfig(max_length=128)
    cfg = data_cfg(val_fraction=0.25, shuffle_seed=3)
    a = SFTDataModule(make_examples(20), tokenizer, cfg, task)
    b = SFTDataModule(make_examples(20), tokenizer, cfg, task)
    a.setup("fit"), b.setup("fit")
    assert len(a.val_dataset) == 5 and len(a.train_dataset) == 15
    assert sorted(map(tuple, a.val_dataset["input_ids"])) == sorted(map(tuple, b.val_dataset["input_ids"]))


def test_tokenization_cache_hit_on_second_setup(tokenizer, tmp_path, monkeypatch):
    task = TaskConfig(max_length=128, mask_spans=PARAGRAPH)
    examples = make_examples(24)
    first = SFTDataModule(examples, tokenizer, data_cfg(), task, cache_dir=tmp_path)
    first.prepare_data()  # tokenizes and writes the cache file ...
    assert first.cache_hit is False and first.cache_file.exists()
    first.setup("fit")  # ... which setup (on every rank) then reads
    assert first.cache_hit is True

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(data_mod, "tokenize_prompt_completion", no_tokenizing)
    second = SFTDataModule(make_examples(24), tokenizer, data_cfg(), task, cache_dir=tmp_path)
    second.setup("fit")
    assert second.cache_hit is True
    assert second.train_dataset["input_ids"] == first.train_dataset["input_ids"]
    # split and packing work on the cached (file-backed) features too
    for packing in (False, True):
        split = SFTDataModule(
            examples, tokenizer, data_cfg(val_fraction=0.25, packing=packing), task, cache_dir=tmp_path
        )
        split.setup("fit")
        assert split.cache_hit is True and len(split.val_dataset) > 0
        assert len(list(split.train_dataloader())) > 0
    # anything the features depend on changes the key
    assert (
        SFTDataModule(
            examples, tokenizer, data_cfg(), replace(task, max_length=64), cache_dir=tmp_path
        ).cache_key
        != first.cache_key
    )
    assert (
        SFTDataModule(
            examples, tokenizer, data_cfg(), replace(task, mask_spans=[]), cache_dir=tmp_path
        ).cache_key
        != first.cache_key
    )
    assert (
        SFTDataModule(examples, tokenizer, data_cfg(), task, cache_dir=tmp_path, template="plain").cache_key
        != first.cache_key
    )
    assert (
        SFTDataModule(examples[:-1], tokenizer, data_cfg(), task, cache_dir=tmp_path).cache_key
        != first.cache_key
    )


def test_examples_too_long_for_max_length_are_counted_and_reported(tokenizer, tmp_path, caplog):
    """An example whose prompt fills task.max_length keeps no supervised token and is dropped: the data module
    counts it (the engine puts the count into metrics.json) and warns with the count and max_length, on a cache
    hit as well as when it tokenizes."""
    long_prompt = " ".join(SENTENCES * 4)  # well over 64 tokens; the short ones fit with their answer
    examples = [
        InstructionExample(id=str(i), instruction=long_prompt if i in (1, 4, 7) else QUESTIONS[i % len(QUESTIONS)],
                           output=SENTENCES[i % len(SENTENCES)])
        for i in range(10)
    ]
    task = TaskConfig(max_length=64, mask_spans=PARAGRAPH)
    for attempt in ("tokenizes", "cache hit"):
        caplog.clear()
        dm = SFTDataModule(examples, tokenizer, data_cfg(val_fraction=0.2), task, cache_dir=tmp_path)
        with caplog.at_level("WARNING", logger=data_mod.__name__):
            dm.setup("fit")
        assert dm.cache_hit is (attempt == "cache hit")
        assert (dm.dropped_too_long, dm.num_examples) == (3, 10)
        assert len(dm.train_dataset) + len(dm.val_dataset) == 7
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("dropped 3 of 10 examples" in w and "task.max_length=64" in w
                   and f"task.max_length={dm.needed_length} keeps every example whole" in w for w in warnings), warnings
    # the suggested max_length keeps every example whole: nothing dropped or cut, and nothing is said
    assert dm.needed_length > 64
    caplog.clear()
    roomy = SFTDataModule(examples, tokenizer, data_cfg(), replace(task, max_length=dm.needed_length))
    with caplog.at_level("WARNING", logger=data_mod.__name__):
        roomy.setup("fit")
    assert (roomy.dropped_too_long, roomy.truncated, roomy.needed_length) == (0, 0, dm.needed_length)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # one token less cuts the longest examples' end (their EOS): counted as cut short, not dropped
    tight = SFTDataModule(examples, tokenizer, data_cfg(), replace(task, max_length=dm.needed_length - 1))
    tight.setup("fit")
    assert tight.dropped_too_long == 0 and tight.truncated >= 1


# ----------------------------------------------------------------------------------------------- training
class Recorder(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def fit(model_cfg: ModelConfig, task: TaskConfig, tokenizer, max_steps: int, val_fraction: float = 0.0,
        callbacks: tuple[L.Callback, ...] = (), **trainer_kwargs: Any):
    L.seed_everything(0, verbose=False)
    dm = SFTDataModule(
        make_examples(32, max_sentences=3), tokenizer, data_cfg(batch_size=4, val_fraction=val_fraction), task
    )
    module = SFTModule(model_cfg, task, tokenizer)
    rec = Recorder()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[rec, *callbacks],
        **trainer_kwargs,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: thread hand-offs cost more than they save on a shared machine
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        torch.set_num_threads(threads)
    return trainer, module, rec


@pytest.fixture(scope="module")
def full_run(tokenizer):
    task = TaskConfig(
        lr=3e-3, weight_decay=0.1, warmup_ratio=0.2, scheduler="cosine", max_length=128, mask_spans=PARAGRAPH
    )
    return fit(TINY, task, tokenizer, max_steps=30, val_fraction=0.2)


def test_training_loss_decreases(full_run):
    trainer, _, rec = full_run
    assert trainer.global_step == 30 and len(rec.losses) == 30
    first, last = sum(rec.losses[:3]) / 3, sum(rec.losses[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    for key in ("train/loss", "train/tokens", "train/lr", "val/loss"):
        assert key in trainer.callback_metrics


def test_scheduler_warms_up_then_decays(full_run):
    _, _, rec = full_run
    lrs, peak = rec.lrs, 3e-3
    warmup = 6  # ceil(0.2 * 30)
    assert lrs[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(lrs[: warmup + 1]))
    assert lrs[warmup] == pytest.approx(peak)
    assert all(a >= b for a, b in itertools.pairwise(lrs[warmup:]))
    assert lrs[-1] < 0.05 * peak


def test_weight_decay_groups(full_run):
    _, module, _ = full_run
    opt = module.trainer.optimizers[0]
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert decayed and all("norm" not in names[i] and not names[i].endswith("bias") for i in decayed)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(module.model.parameters()))


def test_after_fit_gradients_and_optimizer_state_are_dropped_only_off_the_cpu(full_run, tokenizer):
    """On an accelerator, Lightning's teardown would copy the gradients and Adam's state to host memory (three model
    copies: 21.6 GB of RSS for a 1.24B model on an H200); the module drops them at the end of fit. On the CPU, where
    the copy costs nothing, they stay for a checkpoint saved after fit."""
    from omnimed.training.release import release_training_state

    _, module, _ = full_run  # a CPU fit: kept
    assert module.trainer.optimizers[0].state and any(p.grad is not None for p in module.parameters())
    trainer, small, _ = fit(TINY, TaskConfig(max_length=64), tokenizer, max_steps=2)
    optimizer = trainer.optimizers[0]
    assert optimizer.state
    release_training_state(small, trainer.optimizers)
    assert not optimizer.state and all(p.grad is None for p in small.parameters())
    assert optimizer.param_groups[0]["params"], "the optimizer itself stays usable"


def test_adamw_runs_its_fused_kernel_where_lightning_can_clip_around_it(full_run, tokenizer):
    """One process at full precision or in bf16: torch's fused AdamW (one kernel for all parameters); fp16 keeps
    the per-parameter loop, because its gradients stay scaled until the optimizer step."""
    _, module, _ = full_run
    assert module.trainer.optimizers[0].defaults["fused"] is True
    mixed = SFTModule(TINY, TaskConfig(max_length=64), tokenizer)
    mixed.trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert mixed._adamw().keywords == {"fused": True}
    fp16 = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))  # a GPU's fp16: CPU runs bf16
    assert _no_loss_scaler(SimpleNamespace(precision_plugin=mixed.trainer.precision_plugin))
    assert not _no_loss_scaler(SimpleNamespace(precision_plugin=fp16))


class GradNormAtStep(L.Callback):
    """The total gradient norm the optimizer stepped with (read after its step: Lightning's closure computes and
    clips the gradients inside ``optimizer.step``), i.e. after clipping."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        def record(optimizer, args, kwargs) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        trainer.optimizers[0].register_step_post_hook(record)


def test_bf16_clips_gradients_for_the_fused_adamw(tokenizer):
    """bf16 mixed precision has no loss scale, so the fused AdamW trains there and its gradients arrive clipped to
    trainer.gradient_clip_val (Lightning's mixed-precision plugin alone refuses to clip for a fused optimizer)."""
    task = TaskConfig(lr=3e-3, warmup_ratio=0.0, scheduler="constant", max_length=128, mask_spans=PARAGRAPH)
    norms = GradNormAtStep()
    trainer, _, rec = fit(TINY, task, tokenizer, max_steps=6, callbacks=(norms,), precision="bf16-mixed",
                          gradient_clip_val=0.05)
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(norms.norms) == 6 and max(norms.norms) <= 0.05 * (1 + 1e-3), norms.norms
    assert all(math.isfinite(x) for x in rec.losses) and rec.losses[-1] < rec.losses[0], rec.losses


def test_lora_trains_only_adapters(tokenizer):
    cfg = replace(TINY, lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
    task = TaskConfig(lr=1e-2, warmup_ratio=0.0, scheduler="constant", max_length=128, mask_spans=PARAGRAPH)
    probe = SFTModule(cfg, task, tokenizer)
    probe.configure_model()
    before = {n: p.detach().clone() for n, p in probe.model.named_parameters()}
    trainer, module, _ = fit(cfg, task, tokenizer, max_steps=4)
    params = dict(module.model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    in_opt = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert in_opt == {id(params[n]) for n in trainable}
    assert len(optimizer_groups(module.model, 0.0)[0]["params"]) == len(trainable)
    for n, p in params.items():  # frozen weights (from disk) unchanged; LoRA B left its zero init
        if n in trainable and "lora_B" in n:
            assert not torch.equal(p.detach(), before[n])
        elif n not in trainable:
            assert torch.equal(p.detach(), before[n]), n


def test_checkpoint_round_trip(full_run, tokenizer, tmp_path):
    """Hyperparameters are plain dicts that rebuild the module; configure_model is idempotent on load; a
    consolidated state dict rebuilds an exportable model."""
    trainer, module, _ = full_run
    assert isinstance(module.hparams["model_cfg"], dict) and "tokenizer" not in module.hparams
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    loaded = SFTModule.load_from_checkpoint(path, tokenizer=tokenizer)
    assert loaded.model_cfg == module.model_cfg and loaded.task_cfg == module.task_cfg
    model = loaded.model
    loaded.configure_model()
    assert loaded.model is model
    for (n, a), (_, b) in zip(module.model.state_dict().items(), loaded.model.state_dict().items()):
        assert torch.equal(a, b), n
    exported = module.build_model_for_export({"state_dict": module.state_dict()})
    for (n, a), (_, b) in zip(module.model.state_dict().items(), exported.state_dict().items()):
        assert torch.equal(a, b), n



def test_a_lora_checkpoint_holds_what_trains_and_reloads_to_the_same_model(tokenizer, tmp_path):
    """The frozen base weights stay out of a LoRA run's checkpoint; loading, resuming and exporting put them back."""
    cfg = replace(TINY, lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
    task = TaskConfig(lr=1e-2, warmup_ratio=0.0, scheduler="constant", max_length=128, mask_spans=PARAGRAPH)
    trainer, module, _ = fit(cfg, task, tokenizer, max_steps=2)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]
    trained = {f"model.{n}" for n, p in module.model.named_parameters() if p.requires_grad}
    assert set(saved) == trained
    loaded = SFTModule.load_from_checkpoint(path, tokenizer=tokenizer)
    exported = module.build_model_for_export(torch.load(path, weights_only=True))
    for (name, value), got, out in zip(module.model.state_dict().items(), loaded.model.state_dict().values(),
                                       exported.state_dict().values()):
        assert torch.equal(value, got) and torch.equal(value, out), name
    with pytest.raises(ValueError, match="lacks 1 trained parameters"):
        module.build_model_for_export({"state_dict": dict(list(saved.items())[1:])})

# ----------------------------------------------------------------------------------------------- loss and micro-batches
def _module_and_batch(cfg: ModelConfig, task: TaskConfig, tokenizer) -> tuple[SFTModule, dict[str, torch.Tensor]]:
    """An SFT module with its model built, and the first training batch of 8 examples in batches of 4."""
    module = SFTModule(cfg, task, tokenizer)
    module.configure_model()
    dm = SFTDataModule(make_examples(8), tokenizer, data_cfg(batch_size=4), task)
    dm.setup("fit")
    return module, next(iter(dm.train_dataloader()))


def test_the_loss_is_the_models_own_with_the_head_on_supervised_positions_only(tokenizer):
    cfg = replace(TINY, lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
    module, batch = _module_and_batch(cfg, TaskConfig(max_length=128, mask_spans=PARAGRAPH), tokenizer)
    with torch.no_grad():
        ours, n_targets = module._loss(batch)
        hf = module.model(**batch, use_cache=False).loss
    assert int(n_targets) == int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert torch.allclose(ours, hf, rtol=0, atol=1e-5)


def _loss_and_grads(module: SFTModule, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    module.model.zero_grad(set_to_none=True)
    loss, _ = module._loss(batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-with-token-rows"])
def test_the_chunked_head_gives_the_plain_loss_and_gradients_without_holding_the_logits(lora, special_tokenizer,
                                                                                       monkeypatch):
    """task.head_chunk_positions changes memory, not training: the same loss and the same gradient of every
    trained parameter (the tied head's weight under full fine-tuning; under LoRA the added tokens' rows too), and no
    [positions, vocab] tensor is kept for backward."""
    cfg = replace(TINY, special_tokens=["<paragraph>", "</paragraph>", "[Retrieval]", "[Relevant]"],
                  lora=LoraSettings(enabled=lora, r=4, alpha=8, dropout=0.0))
    task = TaskConfig(max_length=128, mask_spans=PARAGRAPH)
    module, batch = _module_and_batch(cfg, task, special_tokenizer)
    plain_loss, plain_grads = _loss_and_grads(module, batch)
    vocab = module.model.get_output_embeddings().weight.size(0)
    module.task_cfg = replace(task, head_chunk_positions=7)  # several chunks and a short last one
    saved: list[torch.Size] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        chunked_loss, chunked_grads = _loss_and_grads(module, batch)
    assert int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) > 7
    assert chunked_loss.item() == pytest.approx(plain_loss.item(), rel=1e-6)
    assert set(chunked_grads) == set(plain_grads) and any("token" in n or "embed" in n for n in plain_grads)
    for name, grad in plain_grads.items():
        assert torch.allclose(chunked_grads[name], grad, rtol=1e-4, atol=1e-6), name
    assert not [shape for shape in saved if len(shape) == 2 and shape[1] == vocab and shape[0] > 7]
    from omnimed.training import chunked_head

    asked: list[tuple[bool, bool]] = []
    original = chunked_head.chunked_cross_entropy

    def spy(*args, need_hidden=False, need_weight=False, **kwargs):
        asked.append((need_hidden, need_weight))
        return original(*args, need_hidden=need_hidden, need_weight=need_weight, **kwargs)

    monkeypatch.setattr(chunked_head, "chunked_cross_entropy", spy)
    with torch.no_grad():  # validation: the same loss, no gradient computed
        assert module._loss(batch)[0].item() == pytest.approx(plain_loss.item(), rel=1e-6)
    _loss_and_grads(module, batch)
    # training: both gradients (under LoRA the head's weight carries the added tokens' trained rows)
    assert asked == [(False, False), (True, True)]


def test_the_chunked_head_refuses_a_head_it_cannot_apply(tokenizer):
    from omnimed.training.chunked_head import supervised_loss_sum

    module = SFTModule(TINY, TaskConfig(head_chunk_positions=8), tokenizer)
    module.configure_model()
    model = module.model
    head = model.get_output_embeddings()
    class Quantized(torch.nn.Linear):  # a layer of another computation (a quantized one) under nn.Linear's name
        def forward(self, x):
            return super().forward(x.round())

    ids = torch.tensor([[5, 6, 7, 8]])
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for other in (torch.nn.Linear(head.in_features, head.out_features, bias=True),
                  Quantized(head.in_features, head.out_features, bias=False)):
        model.set_output_embeddings(other)
        with pytest.raises(ValueError, match=r"positions=8: .* is a (Linear|Quantized); .*plain bias-free"):
            supervised_loss_sum(model, kwargs, torch.tensor([0, 1]), torch.tensor([6, 7]), 8)
    model.set_output_embeddings(head)
    original = type(model).forward

    def scaled(self, *args, **kwargs):  # a model that changes its logits after the head (Gemma's soft-capping)
        out = original(self, *args, **kwargs)
        out.logits = out.logits * 2
        return out

    model.forward = scaled.__get__(model)
    with pytest.raises(ValueError, match="does not return its head's output as its logits"):
        supervised_loss_sum(model, kwargs, torch.tensor([0, 1]), torch.tensor([6, 7]), 8)
    from omnimed.training.config import TrainConfig, config_problems

    cfg = TrainConfig()
    cfg.task.head_chunk_positions = 0
    assert any("task.head_chunk_positions=0: expected null or a number" in p for p in config_problems(cfg))
    cfg.task.head_chunk_positions, cfg.task.objective = 1024, "distill"
    assert any("an embedder has no LM head" in p for p in config_problems(cfg))
    cfg.task.objective = "dpo"  # DPO's token log-probs are chunked too
    assert not any("head_chunk_positions" in p for p in config_problems(cfg))


def test_micro_batches_cover_every_row_once_within_the_budget():
    from omnimed.training.micro_batches import micro_batches

    lengths = torch.tensor([5, 12, 3, 9, 12, 1])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    batch = {"input_ids": torch.arange(72).view(6, 12) * mask, "attention_mask": mask, "labels": mask.clone()}
    assert len(micro_batches(batch, None)) == 1 and len(micro_batches(batch, 72)) == 1
    chunks = micro_batches(batch, 24)
    assert all(c["input_ids"].numel() <= 24 or c["input_ids"].size(0) == 1 for c in chunks)
    got = sorted(tuple(row[row != 0].tolist()) for c in chunks for row in c["input_ids"])
    assert got == sorted(tuple(row[row != 0].tolist()) for row in batch["input_ids"])
    for c in chunks:  # each chunk trimmed to its own longest row, no row cut
        assert int(c["attention_mask"].sum(1).max()) == c["input_ids"].size(1)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        micro_batches({**batch, "lengths": lengths}, 24)


def test_a_batch_run_as_micro_batches_takes_the_same_optimizer_step(tokenizer, monkeypatch):
    """task.micro_batch_tokens changes memory, not training: the same losses and the same adapter weights; also
    when the step runs extra weight-0 passes (what an FSDP2 rank with fewer chunks than another does, so that every
    rank gathers the shards as often)."""
    cfg = replace(TINY, lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
    task = TaskConfig(lr=1e-2, warmup_ratio=0.0, scheduler="constant", max_length=128, mask_spans=PARAGRAPH)
    _, whole, rec_whole = fit(cfg, task, tokenizer, max_steps=3)
    _, chunked, rec_chunked = fit(cfg, replace(task, micro_batch_tokens=40), tokenizer, max_steps=3)
    monkeypatch.setattr(SFTModule, "_passes_on_every_rank", lambda self, chunks: chunks + 2)
    _, padded, rec_padded = fit(cfg, replace(task, micro_batch_tokens=40), tokenizer, max_steps=3)
    for module, record in ((chunked, rec_chunked), (padded, rec_padded)):
        assert record.losses == pytest.approx(rec_whole.losses, rel=1e-5)
        params = dict(module.model.named_parameters())
        for name, param in whole.model.named_parameters():
            if param.requires_grad:
                diff = (params[name] - param).abs().max().item()
                assert diff < 1e-5, (name, diff)


def test_micro_batches_are_not_used_where_backward_passes_do_not_simply_add_up(tokenizer, caplog):
    from types import SimpleNamespace

    from omnimed.training.config import TrainConfig, config_problems

    module = SFTModule(TINY, TaskConfig(micro_batch_tokens=256), tokenizer)
    module._trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace())
    with caplog.at_level("WARNING"):
        module.on_fit_start()
    assert module._micro_batch_tokens is None
    assert "task.micro_batch_tokens=256 is not used with SimpleNamespace on 2 process(es)" in caplog.text
    cfg = TrainConfig()
    cfg.task.micro_batch_tokens = 0
    assert any("task.micro_batch_tokens=0" in p for p in config_problems(cfg))
    cfg.task.micro_batch_tokens, cfg.task.objective = 256, "dpo"
    assert any("SFT batches only" in p for p in config_problems(cfg))


def test_the_validation_loss_is_also_logged_per_group_and_the_groups_average_to_it(tokenizer, monkeypatch):
    """data.val_group_by: val/loss/<value> is each group's per-token mean, so the groups' means weighted by their
    supervised tokens give val/loss; training batches are as without it."""
    examples = [e.model_copy(update={"metadata": {"kind": "even" if i % 2 == 0 else "odd"}})
                for i, e in enumerate(make_examples(24, max_sentences=3))]
    task = TaskConfig(lr=1e-3, max_length=128, mask_spans=PARAGRAPH)
    dm = SFTDataModule(examples, tokenizer, data_cfg(batch_size=4, val_fraction=0.5, val_group_by="kind"), task)
    module = SFTModule(TINY, task, tokenizer)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    metrics = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert dm.val_groups == ["even", "odd"] and "group" not in dm.train_dataset.column_names
    tokens = {g: sum(n for n, grp in zip(dm.val_dataset["supervised"], dm.val_dataset["group"]) if grp == i)
              for i, g in enumerate(dm.val_groups)}
    assert all(tokens.values())
    mean = sum(float(metrics[f"val/loss/{g}"]) * n for g, n in tokens.items()) / sum(tokens.values())
    assert mean == pytest.approx(float(metrics["val/loss"]), rel=1e-5)
    assert float(metrics["val/loss/even"]) != pytest.approx(float(metrics["val/loss/odd"]))
    # the chunked head gives every group the same per-token mean, never holding the whole [positions, vocab] logits
    module.task_cfg = replace(task, head_chunk_positions=5)
    import omnimed.training.sft as sft_module

    def whole_head(*_args, **_kwargs):
        raise AssertionError("the whole head's logits were computed under task.head_chunk_positions")

    monkeypatch.setattr(sft_module, "supervised_logits", whole_head)
    chunked = trainer.validate(module, datamodule=dm, verbose=False)[0]
    for key in ("val/loss", "val/loss/even", "val/loss/odd"):
        assert float(chunked[key]) == pytest.approx(float(metrics[key]), rel=1e-6), key
    from omnimed.training.config import TrainConfig, config_problems

    cfg = TrainConfig()
    cfg.data.val_group_by, cfg.data.packing = "kind", True
    assert any(p.startswith("data.val_group_by='kind': expected null with packing") for p in config_problems(cfg))
    bare = [e.model_copy(update={"metadata": {}}) if i == 3 else e for i, e in enumerate(examples)]
    with pytest.raises(ValueError, match="data.val_group_by=kind: example '3' has no 'kind'"):
        SFTDataModule(bare, tokenizer, data_cfg(batch_size=4, val_fraction=0.5, val_group_by="kind"), task).setup()

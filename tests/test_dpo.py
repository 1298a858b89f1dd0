"""The `dpo` objective on tiny-llama: loss and gradient equal TRL's DPOTrainer on the same pairs (LoRA adapter-disabled
reference and frozen-copy reference), pair tokenization against TRL's, dropped/cached pairs, precomputed reference
log-probs, an overfit run through the engine, the planner presets, and 2-process DeepSpeed ZeRO-3 on CPU."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from omnimed.data.io import read_records, save_record_set
from omnimed.data.records import PreferencePair, RecordError
from omnimed.models.config import LoraSettings, ModelConfig
from omnimed.models.loading import load_causal_lm, load_tokenizer
from omnimed.training.config import DataConfig, TaskConfig
from omnimed.training.dpo import REWARD_METRICS, DPOModule
from omnimed.training.dpo_data import REF_COLUMNS, DPODataModule
from omnimed.training.tokenize import IGNORE_INDEX

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TINY = ModelConfig(name="tiny-llama", source="tiny", name_or_path="tiny-llama")
TINY_LORA = replace(TINY, lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
TOPICS = ["type 2 diabetes", "hypertension", "influenza", "asthma", "kidney function", "vitamin D deficiency",
          "myocardial infarction", "pneumonia"]


def plan_pairs(n: int) -> list[PreferencePair]:
    """Planner-like pairs: the chosen plan names the question's topic per source, the rejected one does not."""
    pairs = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        pairs.append(PreferencePair(
            id=f"pair-{i}",
            prompt=[{"role": "user", "content": f"Question {i}: what is the treatment for {topic}?"}],
            chosen=[{"role": "assistant", "content": f"guideline: {topic} treatment\nbook: {topic}"}],
            rejected=[{"role": "assistant", "content": "web: the patient was given 500 mg of amoxicillin"}],
        ))
    return pairs


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY)


# ----------------------------------------------------------------------------------------------- against TRL
TRL_PAIRS = [
    {"prompt": [{"role": "user", "content": "What is the first-line treatment for type 2 diabetes?"}],
     "chosen": [{"role": "assistant", "content": "Metformin is usually the first-line drug."}],
     "rejected": [{"role": "assistant", "content": "Antibiotics do not treat viral infections."}]},
    {"prompt": [{"role": "user", "content": "Is the passage relevant?"}],
     "chosen": [{"role": "assistant", "content": "Yes, the passage is relevant."}],
     "rejected": [{"role": "assistant", "content": "Kidney function is assessed with serum creatinine and the "
                                                   "estimated glomerular filtration rate."}]},
]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("reference", ["lora_adapter_disabled", "frozen_copy", "lora_chunked_head"])
def test_loss_and_gradient_equal_trl_dpo_trainer(tokenizer, tmp_path, reference):
    """Our DPO loss, its gradient w.r.t. every trainable parameter, and the reward statistics equal TRL 1.16's
    `DPOTrainer.compute_loss` (loss_type sigmoid, beta 0.1) to 1e-5, on the same two pairs, model and reference:
    the reference is the policy with its LoRA adapter disabled (TRL given a base model and a `peft_config`) or a
    frozen copy of the full model (ours loads its own from the config, TRL is given one). The trainable weights
    are perturbed first so that the policy differs from the reference. ``lora_chunked_head``: the LoRA case with
    ``task.head_chunk_positions`` (each token's log-prob a few positions at a time, no whole logits).

    What is compared: both losses are computed on *our* batch (our data module's tokenization and collator: chosen
    rows then rejected rows), given to TRL as `input_ids`, `attention_mask` and `completion_mask` = our labels !=
    -100. Tokenization is compared apart: TRL tokenizes the whole rendered conversation and keeps the chat
    template's trailing newline after `<|im_end|>` as a completion token; our SFT tokenization (used for pairs
    too) ends the completion at `<|im_end|>` (EOS). Otherwise the ids and the supervised positions are the same.
    TRL runs without bf16 autocast (its CPU default would cast the frozen reference's head to bf16)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from omnimed.models.lora import build_lora_config

    lora = reference != "frozen_copy"
    task = TaskConfig(max_length=256, beta=0.1, head_chunk_positions=5 if reference == "lora_chunked_head" else None)
    pairs = [PreferencePair(id=str(i), **p) for i, p in enumerate(TRL_PAIRS)]
    dm = DPODataModule(pairs, tokenizer, DataConfig(batch_size=2, val_fraction=0.0), task)
    dm.setup("fit")
    rows = [dm.train_dataset[i] for i in range(2)]
    ours = dm.collator()(rows)

    torch.manual_seed(0)
    base = load_causal_lm(TINY, tokenizer, for_training=True)
    args = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, beta=0.1, loss_type=["sigmoid"],
                     max_length=256, report_to=[], use_cpu=True, bf16=False, save_strategy="no")
    kwargs = ({"peft_config": build_lora_config(base, TINY_LORA.lora)} if lora
              else {"ref_model": load_causal_lm(TINY, tokenizer, for_training=False)})
    trainer = DPOTrainer(model=base, args=args, train_dataset=Dataset.from_list(TRL_PAIRS),
                         processing_class=tokenizer, **kwargs)
    model = trainer.model
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * (0.1 if lora else 0.02))

    # tokenization: TRL's = ours + the template's trailing newline; same supervised positions
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    for row, trl_row in zip(rows, trainer.train_dataset):
        for side in ("chosen", "rejected"):
            trl_ids = trl_row["prompt_ids"] + trl_row[f"{side}_ids"]
            assert trl_ids == row[f"{side}_input_ids"] + newline
            trl_supervised = [0] * len(trl_row["prompt_ids"]) + [1] * len(trl_row[f"{side}_ids"])
            assert trl_supervised[:-1] == [int(t != IGNORE_INDEX) for t in row[f"{side}_labels"]]

    model.zero_grad()
    trl_loss = trainer.compute_loss(model, {"input_ids": ours["input_ids"], "attention_mask": ours["attention_mask"],
                                            "completion_mask": (ours["labels"] != IGNORE_INDEX).long()})
    trl_loss.backward()
    trl_grads = _grads(model)
    trl_stats = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    model.zero_grad()
    module = DPOModule(TINY_LORA if lora else TINY, task, tokenizer)
    module.model = model
    loss, stats = module.pair_loss(ours)
    loss.backward()
    grads = _grads(model)
    assert module.uses_adapter_reference is lora and (module.reference_model() is None) is lora

    loss_diff = abs(loss.item() - trl_loss.item())
    grad_diff = max((grads[n] - trl_grads[n]).abs().max().item() for n in trl_grads)
    print(f"{reference}: loss {loss.item():.7f} vs TRL {trl_loss.item():.7f} (|diff| {loss_diff:.1e}); "
          f"max |grad diff| {grad_diff:.1e} over {len(grads)} tensors")
    assert abs(loss.item() - math.log(2)) > 1e-3  # the perturbed policy is not its reference
    assert loss_diff < 1e-5 and set(grads) == set(trl_grads) and grad_diff < 1e-5
    assert any(g.abs().max() > 1e-3 for g in grads.values())
    for name in REWARD_METRICS:
        assert stats[name].item() == pytest.approx(trl_stats[name], abs=1e-5), name


def _perturbed_lora_module(task: TaskConfig, tokenizer) -> DPOModule:
    """A LoRA DPOModule on tiny-llama whose trained weights are moved off their start, so that the policy differs
    from its reference (the adapter switched off)."""
    torch.manual_seed(0)
    module = DPOModule(TINY_LORA, task, tokenizer)
    module.configure_model()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return module


def test_a_shared_prompt_scores_each_pair_as_its_two_rows_do(tokenizer):
    """DPOModule scores a pair as one row whose prompt its two completions share (the rejected tokens after the
    pair's longest common prefix, at their own positions, masked from the chosen ones): the sequence log-probs, the
    loss and its gradient equal those of the batch's 2B rows, for completions that differ from their first token,
    that share their first tokens (the common prefix reaches into the completions) and of different lengths; the
    packed batch has half the rows and fewer positions."""
    from omnimed.training.dpo_logps import sequence_log_probs

    same_start = PreferencePair(
        id="same-start", prompt=[{"role": "user", "content": "Which drug, A or B?"}],
        chosen=[{"role": "assistant", "content": "The answer is A: metformin."}],
        rejected=[{"role": "assistant", "content": "The answer is B: amoxicillin, 500 mg three times a day."}])
    task = TaskConfig(max_length=256)
    dm = DPODataModule([*plan_pairs(3), same_start], tokenizer, DataConfig(batch_size=4, val_fraction=0.0), task)
    dm.setup("fit")
    rows = [dm.train_dataset[i] for i in range(4)]
    batch = dm.collator()(rows)
    module = _perturbed_lora_module(task, tokenizer)
    out = {}
    for share in (False, True):
        module.share_prompts = share
        inputs = module.pair_inputs(batch)
        module.model.zero_grad()
        loss, _ = module.pair_loss(batch)
        loss.backward()
        with torch.no_grad():
            logps = sequence_log_probs(module.model, inputs)
        out[share] = inputs, loss.item(), _grads(module.model), logps
    (rows_in, loss, grads, logps), (packed, shared_loss, shared_grads, shared_logps) = out[False], out[True]
    assert (rows_in.shared, packed.shared) == (False, True)
    assert packed.model_kwargs["input_ids"].shape[0] == 4 and rows_in.model_kwargs["input_ids"].shape[0] == 8
    assert packed.model_kwargs["input_ids"].numel() < rows_in.model_kwargs["input_ids"].numel()
    same = next(r for r in rows if "A: metformin" in tokenizer.decode(r["chosen_input_ids"]))
    completions = [[t for t in same[f"{side}_labels"] if t != IGNORE_INDEX] for side in ("chosen", "rejected")]
    assert completions[0][:3] == completions[1][:3]  # this pair's common prefix reaches into its completions
    torch.testing.assert_close(shared_logps, logps, rtol=0, atol=1e-4)
    assert abs(shared_loss - loss) < 1e-6 and abs(loss - math.log(2)) > 1e-3
    assert max((shared_grads[n] - grads[n]).abs().max().item() for n in grads) < 1e-6


def test_the_chunked_head_scores_pairs_as_the_whole_head_does_without_holding_its_logits(tokenizer):
    """task.head_chunk_positions under DPO (LoRA): the policy's and the reference's sequence log-probs, the loss
    and the gradient of every trained weight equal the whole head's, and no [positions, vocab] tensor is kept for
    backward. A head that trains (full fine-tuning) is refused, naming the key."""
    task = TaskConfig(max_length=256)
    dm = DPODataModule(plan_pairs(3), tokenizer, DataConfig(batch_size=3, val_fraction=0.0), task)
    dm.setup("fit")
    batch = dm.collator()([dm.train_dataset[i] for i in range(3)])
    module = _perturbed_lora_module(task, tokenizer)
    vocab = module.model.get_output_embeddings().weight.size(0)
    out = {}
    for chunk in (None, 4):
        module.task_cfg = replace(task, head_chunk_positions=chunk)
        module.model.zero_grad()
        saved: list[torch.Size] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
            loss, stats = module.pair_loss(batch)
        loss.backward()
        out[chunk] = loss.item(), _grads(module.model), module.reference_log_probs(batch), saved
    (loss, grads, ref, whole_saved), (c_loss, c_grads, c_ref, c_saved) = out[None], out[4]
    assert int((batch["labels"] != IGNORE_INDEX).sum()) > 4  # several chunks
    assert abs(c_loss - loss) < 1e-6 and abs(loss - math.log(2)) > 1e-3
    torch.testing.assert_close(c_ref, ref, rtol=1e-6, atol=1e-5)  # sums of about -100
    assert max((c_grads[n] - grads[n]).abs().max().item() for n in grads) < 1e-6
    assert any(len(s) == 2 and s[1] == vocab for s in whole_saved)  # the whole head keeps its logits ...
    assert not [s for s in c_saved if len(s) == 2 and s[1] == vocab and s[0] > 4]  # ... the chunked one none

    full = DPOModule(TINY, replace(task, head_chunk_positions=4), tokenizer)
    full.configure_model()
    with pytest.raises(ValueError, match=r"task.head_chunk_positions=4 .* needs the output head frozen"):
        full.pair_loss(batch)


# ----------------------------------------------------------------------------------------------- data
def test_pairs_are_stacked_chosen_then_rejected_with_sft_masking(tokenizer):
    pairs = plan_pairs(3)
    dm = DPODataModule(pairs, tokenizer, DataConfig(batch_size=3, val_fraction=0.0), TaskConfig(max_length=256))
    dm.setup("fit")
    rows = [dm.train_dataset[i] for i in range(3)]
    batch = dm.collator()(rows)
    assert set(batch) == {"input_ids", "attention_mask", "labels"} and batch["input_ids"].shape[0] == 6
    for half, side in ((slice(0, 3), "chosen"), (slice(3, 6), "rejected")):
        for row, ids, labels in zip(rows, batch["input_ids"][half], batch["labels"][half]):
            n = len(row[f"{side}_input_ids"])
            assert ids[:n].tolist() == row[f"{side}_input_ids"] and (labels[n:] == IGNORE_INDEX).all()
    supervised = {tokenizer.decode([t for t in r["chosen_labels"] if t != IGNORE_INDEX]) for r in rows}
    assert supervised == {f"{p.chosen[0].content}<|im_end|>" for p in pairs}
    with pytest.raises(ValueError, match="data.packing"):
        DPODataModule(pairs, tokenizer, DataConfig(packing=True), TaskConfig())


def test_pairs_too_long_are_dropped_counted_reported_and_the_features_cached(tokenizer, tmp_path):
    """A pair whose prompt leaves no supervised token within task.max_length is dropped and counted, with the
    max_length that keeps every pair whole; the features are cached under a fingerprint (a second module reads
    them); the validation split is the same on every run."""
    pairs = plan_pairs(10)
    for i in (2, 5):
        long_prompt = [{"role": "user", "content": "Antibiotics? " * 40}]
        pairs[i] = PreferencePair(**{**pairs[i].to_dict(), "prompt": long_prompt})
    task, data = TaskConfig(max_length=64), DataConfig(batch_size=2, val_fraction=0.25)
    first = DPODataModule(pairs, tokenizer, data, task, cache_dir=tmp_path)
    first.setup("fit")
    assert (first.dropped_too_long, first.num_examples) == (2, 10) and first.needed_length > 64
    assert first.cache_hit is False and first.cache_file.name.startswith("dpo-") and first.cache_file.exists()
    again = DPODataModule(pairs, tokenizer, data, task, cache_dir=tmp_path)
    again.setup("fit")
    assert again.cache_hit is True and again.dropped_too_long == 2
    assert again.val_dataset["chosen_input_ids"] == first.val_dataset["chosen_input_ids"]
    assert len(first.train_dataset) + len(first.val_dataset) == 8
    roomy = DPODataModule(pairs, tokenizer, data, replace(task, max_length=first.needed_length))
    roomy.setup("fit")
    assert (roomy.dropped_too_long, roomy.truncated) == (0, 0)


def test_a_malformed_preference_record_is_rejected_with_its_file_and_line(tmp_path):
    good = {"kind": "preference", **plan_pairs(1)[0].to_dict()}
    bad = {**good, "id": "bad", "chosen": [{"role": "user", "content": "book: x"}]}
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"records\.jsonl.*2.*chosen must end with an assistant message"):
        read_records(path, PreferencePair)


# ----------------------------------------------------------------------------------------------- training
class Losses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def _fit(model_cfg: ModelConfig, task: TaskConfig, tokenizer, steps: int = 3):
    L.seed_everything(0, verbose=False)
    dm = DPODataModule(plan_pairs(12), tokenizer, DataConfig(batch_size=4, val_fraction=0.25), task)
    module = DPOModule(model_cfg, task, tokenizer)
    rec = Losses()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[rec],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        torch.set_num_threads(threads)
    return module, dm, rec.losses


@pytest.mark.parametrize("model_cfg", [TINY_LORA, TINY], ids=["lora", "full"])
def test_precomputed_reference_log_probs_train_as_computing_them_on_the_fly(tokenizer, model_cfg):
    """Precomputed reference log-probs (columns of the datasets, one model per step) give the same losses as the
    reference computed every step: the first (log 2: the policy is its reference at step 0) and the next two,
    where the policy has moved. The stored columns equal the reference's log-probs on the same pairs; the frozen
    copy of full fine-tuning is dropped once they are stored, and never enters the checkpoint or the export."""
    task = TaskConfig(lr=5e-3, warmup_ratio=0.0, scheduler="constant", max_length=128)
    live, _, live_losses = _fit(model_cfg, task, tokenizer)
    pre, dm, pre_losses = _fit(model_cfg, replace(task, precompute_ref_log_probs=True), tokenizer)
    assert live_losses[0] == pytest.approx(math.log(2), abs=1e-6)
    torch.testing.assert_close(torch.tensor(pre_losses), torch.tensor(live_losses), rtol=0, atol=1e-5)
    assert all(c in dm.train_dataset.column_names and c in dm.val_dataset.column_names for c in REF_COLUMNS)
    rows = [dm.train_dataset[i] for i in range(4)]
    batch = dm.collator()(rows)
    stored = torch.cat([batch.pop(REF_COLUMNS[0]), batch.pop(REF_COLUMNS[1])])
    fresh = DPOModule(model_cfg, task, tokenizer)
    fresh.configure_model()  # the untrained policy: its reference (adapter off, or a frozen copy) is pre's
    torch.testing.assert_close(stored, fresh.reference_log_probs(batch), rtol=0, atol=1e-5)
    assert pre._frozen == [] and (live._frozen != []) is (model_cfg is TINY)
    assert all(k.startswith("model.") for k in live.state_dict())
    exported = live.build_model_for_export({"state_dict": live.state_dict()})
    assert exported.state_dict().keys() == live.model.state_dict().keys()


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omnimed.cli.common import conf_dir
    from omnimed.training.config import register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def _records(folder: Path, n: int) -> Path:
    save_record_set(folder, plan_pairs(n))
    return folder


def test_an_overfit_run_through_the_engine_raises_reward_accuracy(tmp_path):
    """`task=planner_dpo` on preference records through `omnimed.training.engine.train`: the loss falls from log 2
    and the reward accuracy rises from 0 (step 0: policy = reference, every reward 0); TRL's metric names are
    logged for train and val, tokens are counted, and the LoRA export loads."""
    from omnimed.models.exported import load_exported
    from omnimed.training.engine import train

    data = _records(tmp_path / "pairs", 16)
    cfg = _compose("task=planner_dpo", "model=tiny-llama", "data=records", "data.record_kind=preference",
                   f"data.path={data}", "data.batch_size=4", "data.val_fraction=0.25", "task.lr=5e-3",
                   "task.scheduler=constant", "task.warmup_ratio=0", "task.max_length=128", "trainer.max_steps=15",
                   "trainer.val_check_interval=15", "trainer.checkpoint_every_n_steps=15", "logger=csv",
                   f"paths.root={tmp_path}", f"paths.cache={tmp_path}/cache", f"paths.output_dir={tmp_path}/out",
                   "run_name=overfit", "trainer.num_threads=1")
    result = train(cfg)
    with open(Path(result.logger_dir) / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    steps = [r for r in rows if r.get("train/rewards/accuracies")]
    acc = [float(r["train/rewards/accuracies"]) for r in steps]
    print("losses", [round(x, 3) for x in result.losses], "reward accuracies", acc)
    assert len(steps) == 15 and acc[0] == 0.0 and float(steps[0]["train/rewards/margins"]) == 0.0
    assert sum(acc[-3:]) / 3 >= 0.9, acc
    assert result.losses[0] == pytest.approx(math.log(2), abs=1e-6)
    assert sum(result.losses[-3:]) / 3 < 0.5 * math.log(2), result.losses
    m = result.metrics
    for key in ("val/loss", *(f"val/{k}" for k in REWARD_METRICS), *(f"train/{k}" for k in REWARD_METRICS)):
        assert key in m, key
    assert m["val/rewards/accuracies"] >= 0.75 and m["val/loss"] < math.log(2)
    assert m["train/tokens"] > 0 and m["train/tokens_per_s"] > 0 and m["data/dropped_too_long"] == 0
    model, _ = load_exported(result.hf_dir)
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 5, 9]])).logits).all()


@pytest.mark.parametrize(("study", "task", "searched"), [
    ("planner", "planner_sft", {"task.lr", "task.warmup_ratio", "model.lora.r"}),
    ("planner_dpo", "planner_dpo", {"task.lr", "task.beta", "model.lora.r"}),
])
def test_the_planner_studies_search_keys_their_runs_have(study, task, searched):
    """`-m hparams_search=planner|planner_dpo`: the planner's miniature preset plus a search space for Hydra's
    Optuna sweeper, the trials in a W&B group of their own. Every searched key is one the run config has, so a
    trial's value changes the run (the sweeper's trials themselves run in test_train_sweeps's critic study)."""
    from omegaconf import OmegaConf

    cfg = _compose(f"hparams_search={study}")
    assert cfg.logger.group == f"optuna-{study}" and cfg.task.name == task and cfg.run_name is None
    space = yaml.safe_load((REPO / "conf" / "hparams_search" / f"{study}.yaml").read_text())["hydra"]["sweeper"]
    assert set(space["params"]) == searched and space["study_name"] == study
    for key in searched:
        assert OmegaConf.select(cfg, key) is not None, key


def test_beta_must_be_positive():
    from omegaconf import OmegaConf

    from omnimed.training.config import validate_train_config

    cfg = _compose("task=planner_dpo", "task.beta=0", "paths.output_dir=out")
    with pytest.raises(ValueError, match=r"task\.beta=0\.0: expected a reward temperature > 0"):
        validate_train_config(OmegaConf.to_object(cfg))


# ----------------------------------------------------------------------------------------------- presets
def test_planner_presets_compose_with_the_papers_settings():
    """Omni-RAG's planner presets (appendix D.4: LoRA, batch 64, SFT lr 2.5e-4 for 5 epochs, DPO lr 5e-6 for 3):
    the paper batch is data.batch_size x 8 GPUs x accumulation; the miniature DPO starts from the miniature SFT
    planner's export."""
    sft = _compose("+preset=omnirag_planner_sft_paper")
    dpo = _compose("+preset=omnirag_planner_dpo_paper")
    for cfg, lr, epochs in ((sft, 2.5e-4, 5), (dpo, 5e-6, 3)):
        assert cfg.model.lora.enabled and cfg.strategy.name == "deepspeed" and cfg.task.lr == lr
        assert cfg.data.batch_size * cfg.trainer.devices * cfg.trainer.accumulate_grad_batches == 64
        assert cfg.trainer.max_epochs == epochs and cfg.trainer.max_steps == -1
    assert (sft.task.objective, dpo.task.objective, dpo.task.beta) == ("sft", "dpo", 0.1)
    assert dpo.model.name_or_path.endswith(f"checkpoints/{sft.task.name}/{sft.run_name}/hf")

    mini_sft = _compose("+preset=omnirag_planner_sft_miniature", "paths.root=/r")
    mini_dpo = _compose("+preset=omnirag_planner_dpo_miniature", "paths.root=/r")
    assert mini_sft.model.name == "smollm2-135m" and mini_sft.data.record_kind == "prompt_completion"
    assert mini_dpo.data.record_kind == "preference" and mini_dpo.data.path == "/r/builds/omnirag-miniature/pairs_matched/dpo"
    assert mini_dpo.model.name_or_path == f"/r/checkpoints/{mini_sft.task.name}/{mini_sft.run_name}/hf"
    assert mini_dpo.model.lora.enabled and mini_dpo.strategy.name == "cpu" and mini_dpo.trainer.max_steps == 60


# ----------------------------------------------------------------------------------------------- ZeRO-3
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("precompute", [False, True], ids=["reference_every_step_chunked_head",
                                                          "precomputed_reference"])
def test_zero3_two_processes_lora_dpo_trains_and_exports(tmp_path, precompute):
    """`omnimed-train task=planner_dpo strategy=deepspeed_zero3` on 2 CPU processes (DeepSpeed's CPU accelerator,
    gloo), LoRA on tiny-llama: a few steps with a finite loss, validation, and a loadable export. Precomputed, each
    rank scores half of the pairs and the halves are all-gathered; computed every step, the policy and the reference
    score their tokens through the chunked head (task.head_chunk_positions), the head gathered by ZeRO-3 inside its
    call. The step-0 loss is log 2 either way: it was not
    before `omnimed.models.lora` re-initialised the adapters that zero.Init partitions (B kept nn.Linear's random
    init, so the policy did not start as its reference)."""
    from omnimed.models.exported import load_exported

    data = _records(tmp_path / "pairs", 12)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [str(BIN / "omnimed-train"), f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/hydra_run",
         f"paths.cache={tmp_path}/cache", "task=planner_dpo", "model=tiny-llama", "data=records",
         "data.record_kind=preference", f"data.path={data}", "data.batch_size=2", "data.val_fraction=0.34",
         "task.max_length=128", "task.lr=1e-2", f"task.precompute_ref_log_probs={precompute}",
         "strategy=deepspeed_zero3", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=3",
         "trainer.max_epochs=-1", "trainer.val_check_interval=3", "logger=csv", "run_name=z3dpo",
         *([] if precompute else ["task.head_chunk_positions=16"])],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "hydra_run" / "metrics.json").read_text())
    assert metrics["train/steps"] == 3 and math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    # step 0: the policy is its reference, so the loss is log 2 exactly when every pair got its own reference
    # log-probs (precomputed: rank 0's first batch holds pairs that rank 1 scored)
    assert metrics["train/loss_first"] == pytest.approx(math.log(2), abs=1e-5)
    assert metrics["train/loss_last"] != metrics["train/loss_first"]
    run = tmp_path / "checkpoints" / "planner_dpo" / "z3dpo"
    assert len(sorted((run / "lightning" / "last.ckpt").rglob("*model_states.pt"))) == 2
    model, _ = load_exported(run / "hf")
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 5, 9]])).logits).all()

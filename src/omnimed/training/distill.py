"""Utility distillation (PolyRAG 5.1.3; the data in FlagEmbedding's distillation layout): a sentence-transformers
bi-encoder learns to rank each query's passage window as a teacher's utility scores do.

For a query q with passages d_1..d_n (its window, at most ``task.passage_window``) and teacher scores t_i, the
loss is the listwise KL divergence

    KL( softmax(t / teacher_temperature) || softmax(cos(q, d) / temperature) )

averaged over the batch's queries (``task.temperature``: the paper's 0.05; ``task.teacher_temperature``: the
scale of the teacher's scores, 1.0 for log-likelihood differences in nats). With ``task.in_batch_negatives`` the
student's softmax also runs over the other queries' passages, where the teacher puts no mass. Logged: ``train/loss``,
``val/loss`` and ``val/top1_agreement`` (the student's best passage is the teacher's best).

The model is loaded with :func:`omnimed.models.loading.load_encoder` (MiniLM, BGE-M3, a folder) and exported as a
sentence-transformers folder, which ``SentenceTransformer(path)`` loads and ``knowledge.dense.encoder=<path>`` or
``pipeline.utility_encoder=<path>`` use. Optimizer and schedule: AdamW with ``task.warmup_ratio`` warmup and
``task.scheduler`` decay, as :class:`~omnimed.training.sft.SFTModule`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from omnimed.training.data import chunked
from omnimed.training.objectives import Objective, register_objective
from omnimed.training.resume import ResumableBatchSampler, ResumableDataLoader, data_parallel_ranks, trainer_progress


def listwise_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(teacher || student) where both are softmaxes of logits over the row's ``mask``ed
    entries (``teacher`` is -inf, or anything, off its own window: its mass there is 0)."""
    neg = torch.finfo(student.dtype).min
    log_s = F.log_softmax(student.masked_fill(~mask, neg), dim=-1)
    t = F.softmax(teacher.masked_fill(~mask, neg), dim=-1)
    kl = (t * (torch.log(t.clamp_min(1e-12)) - log_s)).masked_fill(t == 0, 0.0)
    return kl.sum(-1).mean()


class DistillDataModule(L.LightningDataModule):
    """Utility examples (:class:`~omnimed.data.records.UtilityExample`) as (query, passage texts, teacher scores)
    batches; ``data.val_fraction`` of the queries (drawn with ``data.shuffle_seed``) validate."""

    def __init__(self, records: Sequence[Any], data_cfg: Any, task_cfg: Any) -> None:
        super().__init__()
        from omnimed.data.text import index_text

        self.data_cfg, self.task_cfg = data_cfg, task_cfg
        window = task_cfg.passage_window
        items = [(r.query, [index_text(p) for p in r.passages[:window]], list(r.teacher_scores[:window]))
                 for r in records]
        order = list(range(len(items)))
        random.Random(data_cfg.shuffle_seed).shuffle(order)
        n_val = round(len(items) * data_cfg.val_fraction)
        self.val_items = [items[i] for i in order[:n_val]]
        self.train_items = [items[i] for i in order[n_val:]]
        self.num_examples = len(items)
        if not self.train_items:
            raise ValueError(f"data.val_fraction={data_cfg.val_fraction} leaves no training query of {len(items)}")

    @staticmethod
    def collate(items: Sequence[tuple[str, list[str], list[float]]]) -> dict[str, Any]:
        return {"queries": [q for q, _, _ in items], "passages": [p for _, p, _ in items],
                "scores": [s for _, _, s in items]}

    def _loader(self, items: list, *, train: bool) -> DataLoader:
        """The training core's resumable loader over fixed batches of queries (the training ones already in a
        seeded random order): each epoch visits the batches in a new order, each data-parallel rank takes every
        ``world_size``-th batch, and a mid-epoch resume skips exactly the batches already trained on."""
        trainer = getattr(self, "trainer", None)
        num_replicas, rank = data_parallel_ranks(trainer)
        sampler = ResumableBatchSampler(chunked(range(len(items)), self.data_cfg.batch_size), shuffle=train,
                                        seed=self.data_cfg.shuffle_seed, rank=rank, world_size=num_replicas)
        return ResumableDataLoader(items, batch_sampler=sampler, collate_fn=self.collate,
                                   num_workers=self.data_cfg.num_workers,
                                   progress=(lambda: trainer_progress(trainer)) if train and trainer else None)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_items, train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.val_items, train=False) if self.val_items else []


def on_device(features: Mapping[str, Any], device: torch.device | str) -> dict[str, Any]:
    """An encoder's tokenized features with their tensors moved to ``device`` (other values kept as they are)."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}


def freeze_unused(encoder: Any) -> list[str]:
    """Freeze the parameters that the sentence embedding does not depend on (BERT's pooler, which mean or CLS
    pooling of the token states never reads), found by one backward pass of a probe text; returns their names.
    They would get no gradient and never change anyway (AdamW skips them), but DDP refuses a step in which a
    trainable parameter took no part in the loss. The probe leaves torch's random state as it was (its dropout
    draws are forked off), so training draws what it drew without it."""
    device = encoder.device  # sentence-transformers loads onto a GPU when there is one
    features = on_device(encoder.preprocess(["probe"]), device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
        encoder(features)["sentence_embedding"].sum().backward()
    unused = []
    for name, p in encoder.named_parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
            unused.append(name)
        p.grad = None
    return unused


class DistillModule(L.LightningModule):
    """The bi-encoder and its listwise loss (module doc); ``model_cfg``: an encoder model config."""

    def __init__(self, model_cfg: Any, task_cfg: Any) -> None:
        super().__init__()
        from omnimed.models.loading import load_encoder

        self.model_cfg, self.task_cfg = model_cfg, task_cfg
        self.encoder = load_encoder(model_cfg).train()  # loaded in eval mode; trained with its dropout, as FlagEmbedding
        if task_cfg.max_length:
            self.encoder.max_seq_length = min(self.encoder.max_seq_length or task_cfg.max_length, task_cfg.max_length)
        self.frozen_unused = freeze_unused(self.encoder)
        if model_cfg.gradient_checkpointing:  # FlagEmbedding's BGE-M3 recipe: a 50-passage window's activations
            self.encoder.gradient_checkpointing_enable({"use_reentrant": False})

    @property
    def encode_batch_size(self) -> int:
        """Texts per encoder pass (0: all in one): ``task.encode_batch_size``, or when it is null 32 on the CPU and
        one pass elsewhere (on an H200 chunks of 32 made a step 2.6x slower; on 2 CPU cores 1.9x faster)."""
        chunk = self.task_cfg.encode_batch_size
        return chunk if chunk is not None else (32 if self.device.type == "cpu" else 0)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Normalised embeddings of ``texts`` in their order, encoded in chunks of :attr:`encode_batch_size` texts
        sorted by token length, so each chunk pads only to its own longest text (16 windows of 50 of the small
        world's passages padded whole are 30% padding); the embeddings are the same either way."""
        texts, chunk = list(texts), self.encode_batch_size
        if not chunk or len(texts) <= chunk:
            return self._encode(texts)
        lengths = [len(ids) for ids in self.encoder.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        parts = [self._encode([texts[i] for i in part], pad_to_multiple_of=8)  # widths aligned for bf16 kernels
                 for part in chunked(order, chunk)]
        return torch.cat(parts)[torch.tensor(order, device=self.device).argsort()]

    def _encode(self, texts: list[str], pad_to_multiple_of: int | None = None) -> torch.Tensor:
        padding = {"text": {"pad_to_multiple_of": pad_to_multiple_of}} if pad_to_multiple_of else None
        features = self.encoder.preprocess(texts, processing_kwargs=padding)  # tokenize() is deprecated in st 6
        features = on_device(features, self.device)
        return F.normalize(self.encoder(features)["sentence_embedding"], dim=-1)

    def logits(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(student logits, teacher logits, mask), each [queries, all passages of the batch]."""
        flat = [p for ps in batch["passages"] for p in ps]
        q, d = self.embed(batch["queries"]), self.embed(flat)
        student = q @ d.T / self.task_cfg.temperature
        teacher = torch.zeros_like(student)
        own = torch.zeros_like(student, dtype=torch.bool)
        start = 0
        for i, scores in enumerate(batch["scores"]):
            n = len(scores)
            teacher[i, start:start + n] = torch.tensor(scores, dtype=student.dtype) / self.task_cfg.teacher_temperature
            own[i, start:start + n] = True
            start += n
        # in-batch negatives: the student spreads mass over others' passages too; the teacher puts none there
        teacher = teacher.masked_fill(~own, torch.finfo(student.dtype).min)
        mask = torch.ones_like(own) if self.task_cfg.in_batch_negatives else own
        return student, teacher, mask

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        student, teacher, mask = self.logits(batch)
        loss = listwise_kl(student, teacher, mask)
        self.log("train/loss", loss, on_step=True, prog_bar=True, batch_size=len(batch["queries"]))
        return loss

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        student, teacher, mask = self.logits(batch)
        own = teacher > torch.finfo(teacher.dtype).min
        loss = listwise_kl(student, teacher, mask)
        agree = (student.masked_fill(~own, -math.inf).argmax(-1) == teacher.argmax(-1)).float().mean()
        n = len(batch["queries"])
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=n)
        self.log("val/top1_agreement", agree, on_epoch=True, sync_dist=True, batch_size=n)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        from omnimed.training.schedules import lr_schedule
        from omnimed.training.sft import optimizer_groups

        optimizer = torch.optim.AdamW(optimizer_groups(self.encoder, self.task_cfg.weight_decay), lr=self.task_cfg.lr)
        return {"optimizer": optimizer,
                "lr_scheduler": lr_schedule(optimizer, self.task_cfg, self.trainer.estimated_stepping_batches)}

    def on_train_end(self) -> None:
        """On an accelerator, drop the gradients and AdamW state before Lightning's teardown copies them to host
        memory, as the SFT module does (:mod:`omnimed.training.release`)."""
        from omnimed.training.release import release_after_fit

        release_after_fit(self)

    def export(self, folder: Path) -> None:
        """The trained encoder as a sentence-transformers folder (safetensors), swapped into place whole."""
        from omnimed.data.artifacts import atomic_path

        with atomic_path(folder, is_dir=True) as tmp:
            self.encoder.save(str(tmp), safe_serialization=True)


def _datamodule(cfg: Any, records: list, tokenizer: Any) -> DistillDataModule:
    return DistillDataModule(records, cfg.data, cfg.task)


def _module(cfg: Any, tokenizer: Any) -> DistillModule:
    if cfg.model.kind != "encoder":
        raise ValueError(f"task.objective=distill trains a sentence-transformers encoder; model={cfg.model.name} has "
                         f"kind={cfg.model.kind!r} (use model=minilm-l6, model=bge-m3 or an encoder folder)")
    return DistillModule(cfg.model, cfg.task)


def _export(module: DistillModule, tokenizer: Any, folder: Path, cfg: Any) -> None:
    module.export(folder)


register_objective(Objective("distill", datamodule=_datamodule, module=_module, export=_export))

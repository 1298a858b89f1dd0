"""``omnimed-bench distill``: our utility-distillation training step against sentence-transformers' own trainer, on
the same model, data, batch size, passage window and optimisation, in samples (queries) per second.

- **ours**: :class:`~omnimed.training.distill.DistillModule` (listwise KL between the teacher's softmax and the
  student's softmax over cosines / temperature) on batches of
  :class:`~omnimed.training.distill.DistillDataModule`, fitted by a Lightning ``Trainer`` (fp32, clipping 1.0, no
  logger, checkpoints or progress bar), as ``omnimed-train task=utility_embed`` trains it;
- **st**: ``SentenceTransformerTrainer`` with ``SentenceTransformerTrainingArguments``. Its loss is
  sentence-transformers' own ``DistillKLDivLoss`` (cosine similarity, the same student and teacher temperatures;
  query column embedded on its own, the passage columns merged into one forward pass, as ours does on an
  accelerator; on the CPU ours encodes length-sorted chunks of 32, ``encode_batch_size``, 0: one pass) less its
  ``student_temperature ** 2`` factor (:class:`ListwiseKLLoss`), so loss and gradients are ours exactly. Its dataset
  has the columns ``query, passage_0 .. passage_{window-1}, label`` (label: the teacher's score list), in our data
  module's batch order, read sequentially (the trainer's batch sampler is replaced); torch's AdamW
  (``optim=adamw_torch``, not the fused default: ours runs torch's AdamW) and the same linear schedule with the same
  warmup steps.

``accelerator=cuda`` with ``precision=bf16-mixed`` runs both sides on a GPU under bf16 autocast (ours: Lightning's
precision plugin; st: ``bf16=True``), each step's clock stamped after ``torch.cuda.synchronize`` and the peak GPU
memory reported; ``gradient_checkpointing`` turns it on in both encoders (``model.gradient_checkpointing`` of ours,
the trainer's argument of st's). ``model=bge-m3-shape`` is BGE-M3's architecture with random weights (issue 16's GPU
check: no hub there); ``data`` reads a utility record set built beforehand (``--data``) instead of labelling one.

Both start from the same weights (``minilm-l6``, the miniature preset's ``task=utility_embed`` settings: lr 1e-4,
temperature 0.05, teacher temperature 0.1, warmup ratio 0.2) and train on the same batches: utility examples the
world oracle labels (stage ``polyrag_utility`` on a BM25 knowledge base over the world of ``world_size``, built in
a temporary folder, the first ``window`` passages of each). Each side runs in its own process (``python -m
omnimed.bench.distill --side ours|st``, as ``omnimed-bench train`` does), so its peak RSS is its own; with
``repeats`` > 1 the order alternates (ours, st, st, ours, ...). ``isolate=False`` runs both sides in this process
instead, one after the other (tests; RSS then is the process's).

Each side trains ``warmup + steps`` optimizer steps, stamping the clock at the end of every step; reported over the
last ``steps``: samples per second (mean, and at the median step time), step times, CPU seconds per step, the
first-step training loss, the loss at initialisation in eval mode on the first batch (computed by each side's own
loss code before training, untimed: the losses must agree whatever dropout does), peak RSS. The comparison: the
ratio ours/st of samples/s (``goal_ratio`` 1.0: ``meets_goal``), the losses' differences (with ``dropout`` on, the
two sides draw different dropout masks, so only the eval-mode losses must match; with ``dropout=False`` every step's
loss should), whether the first batches are the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnimed.bench.train_config import check_sides

SIDES = ("ours", "st")


@dataclass
class DistillBenchConfig:
    """Everything both sides share; see the module doc. ``loss_rtol``: how close the losses that must match are
    (relative); ``isolate``: each side in its own process."""

    model: str = "minilm-l6"
    steps: int = 20
    warmup: int = 3
    batch_size: int = 4
    window: int = 8
    threads: int = 2
    lr: float = 1e-4
    temperature: float = 0.05
    teacher_temperature: float = 0.1
    warmup_ratio: float = 0.2
    max_length: int = 256
    dropout: bool = True
    seed: int = 0
    world_size: str = "small"
    world_seed: int = 0
    repeats: int = 1
    sides: list[str] = field(default_factory=lambda: list(SIDES))
    st_optim: str = "adamw_torch"
    isolate: bool = True
    accelerator: str = "cpu"
    precision: str = "32-true"
    gradient_checkpointing: bool = False
    encode_batch_size: int | None = None
    data: str | None = None
    goal_ratio: float = 1.0
    loss_rtol: float = 1e-4
    child_timeout_s: float = 1800.0

    def validate(self) -> None:
        if self.steps < 1 or self.warmup < 0 or self.batch_size < 1 or self.window < 2 or self.threads < 1:
            raise ValueError("steps >= 1, warmup >= 0, batch_size >= 1, window >= 2 and threads >= 1 are needed "
                             f"(got steps={self.steps}, warmup={self.warmup}, batch_size={self.batch_size}, "
                             f"window={self.window}, threads={self.threads})")
        check_sides(self.sides, SIDES)
        from omnimed.bench.train_config import ACCELERATORS, PRECISIONS

        if self.accelerator not in ACCELERATORS or self.precision not in PRECISIONS:
            raise ValueError(f"accelerator must be one of {ACCELERATORS} and precision one of {PRECISIONS} (got "
                             f"{self.accelerator!r}, {self.precision!r})")
        if self.precision == "bf16-mixed" and self.accelerator != "cuda":
            raise ValueError("precision=bf16-mixed is for accelerator=cuda (the CPU sides train in fp32)")

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def examples(self) -> int:
        """Training queries needed: one epoch of ``total_steps`` full batches."""
        return self.total_steps * self.batch_size


# ------------------------------------------------------------------------------------------------ shared set-up
def task_config(cfg: DistillBenchConfig) -> Any:
    """``conf/task/utility_embed.yaml`` with the bench's settings (both sides read theirs from it)."""
    from omnimed.conf import load_option
    from omnimed.training.config import TaskConfig

    return dataclasses.replace(load_option("task", "utility_embed", TaskConfig), lr=cfg.lr, weight_decay=0.0,
                               warmup_ratio=cfg.warmup_ratio, scheduler="linear", max_length=cfg.max_length,
                               temperature=cfg.temperature, teacher_temperature=cfg.teacher_temperature,
                               passage_window=cfg.window, in_batch_negatives=False,
                               encode_batch_size=cfg.encode_batch_size)


def warmup_steps(cfg: DistillBenchConfig) -> int:
    """LR warmup steps as ``DistillModule.configure_optimizers`` computes them, so the st side gets the same."""
    return math.ceil(cfg.warmup_ratio * max(cfg.total_steps, 1))


def build_data(cfg: DistillBenchConfig, root: Path) -> tuple[Path, dict[str, Any]]:
    """Utility examples for ``cfg.examples`` training queries, labelled by the world's oracle (stage
    ``polyrag_utility`` over a BM25 knowledge base built under ``root``); returns the record set's folder and
    counts."""
    from omnimed.generation.oracle import OracleBackend
    from omnimed.knowledge.build import build_knowledge_base
    from omnimed.knowledge.config import KnowledgeConfig
    from omnimed.knowledge.corpus import world_of
    from omnimed.methods.polyrag.utility import UtilityConfig, build_utilities

    started = time.perf_counter()
    knowledge = KnowledgeConfig(name=f"world_{cfg.world_size}", world_size=cfg.world_size, world_seed=cfg.world_seed,
                                indexes=["bm25"], retriever="bm25")
    kb = build_knowledge_base(knowledge, root / "kb", progress=False)
    stage = UtilityConfig(splits=["train"], n_questions=cfg.examples + 16, candidates=max(15, cfg.window),
                          seed=cfg.seed, out=str(root / "utility"))
    built = build_utilities(stage, teacher=OracleBackend(world_of(knowledge)), kb=kb, knowledge=knowledge,
                            progress=False, log=lambda *_a, **_k: None)
    records = load_examples(cfg, built.path)  # fails here, in the parent, when there are too few
    mean = statistics.fmean(len(r.passages) for r in records)
    return built.path, {"world_size": cfg.world_size, "examples": len(records), "window": cfg.window,
                        "mean_candidates": round(mean, 2), "teacher": "oracle", "build_s":
                        round(time.perf_counter() - started, 2)}


def load_examples(cfg: DistillBenchConfig, path: str | Path) -> list[Any]:
    """The first ``cfg.examples`` records of the set at ``path`` with at least ``cfg.window`` passages."""
    from omnimed.data.io import load_record_set
    from omnimed.data.records import UtilityExample

    records = [r for r in load_record_set(path, UtilityExample) if len(r.passages) >= cfg.window]
    if len(records) < cfg.examples:
        where, remedy = ((f"{path} (--data)", "another --data set") if cfg.data
                         else (f"the {cfg.world_size} world", "a larger --world-size"))
        raise ValueError(f"{where} gives {len(records)} training queries with >= {cfg.window} passages (--window); "
                         f"(warmup + steps) * batch_size = {cfg.examples} are needed: lower them or use {remedy}")
    return records[: cfg.examples]


def data_module(cfg: DistillBenchConfig, path: str | Path) -> Any:
    """Our data module over the examples: every query trains (no validation share), shuffled with ``cfg.seed``."""
    from omnimed.training.config import DataConfig
    from omnimed.training.distill import DistillDataModule

    data = DataConfig(batch_size=cfg.batch_size, val_fraction=0.0, shuffle_seed=cfg.seed, num_workers=0)
    return DistillDataModule(load_examples(cfg, path), data, task_config(cfg))


def batch_order(dm: Any) -> list[int]:
    """The indices of ``dm.train_items`` in the order our training loader yields them, batch after batch (read off
    the loader itself: iterating it draws from its generator before its sampler does)."""
    loader = dm.train_dataloader()
    position = {id(item): i for i, item in enumerate(dm.train_items)}
    loader.collate_fn = lambda items: [position[id(item)] for item in items]
    return [i for batch in loader for i in batch]


def batch_fingerprint(queries: Sequence[str], passages: Sequence[Sequence[str]],
                      scores: Sequence[Sequence[float]]) -> str:
    """A short hash of a batch's texts and teacher scores: equal on both sides when they train on the same batch."""
    blob = json.dumps([list(queries), [list(p) for p in passages], [[round(float(s), 6) for s in row]
                                                                     for row in scores]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def no_dropout(model: Any) -> None:
    """Set every dropout probability of ``model`` to 0 (transformers' attention reads its ``nn.Dropout``'s p)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def load_student(cfg: DistillBenchConfig) -> Any:
    """The encoder the st side trains, loaded and truncated as ``DistillModule`` loads its own."""
    from omnimed.models.config import named_model_config
    from omnimed.models.loading import load_encoder

    model = load_encoder(named_model_config(cfg.model)).train()
    model.max_seq_length = min(model.max_seq_length or cfg.max_length, cfg.max_length)
    return model


def model_config(cfg: DistillBenchConfig) -> Any:
    """``conf/model/<cfg.model>.yaml`` with the bench's gradient checkpointing."""
    from omnimed.models.config import named_model_config

    return dataclasses.replace(named_model_config(cfg.model), gradient_checkpointing=cfg.gradient_checkpointing)


@dataclass
class StepClock:
    """Wall clock and CPU time at the end of every optimizer step, samples and loss of every step."""

    start: float = 0.0
    cpu_start: float = 0.0
    ends: list[float] = field(default_factory=list)
    cpu_ends: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    threads: int | None = None
    sync: Callable[[], None] | None = None  # torch.cuda.synchronize on a GPU

    def begin(self) -> None:
        if self.sync:
            self.sync()
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def step_end(self) -> None:
        import torch

        if self.sync:
            self.sync()
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())
        if self.threads is None:
            self.threads = torch.get_num_threads()

    def summary(self, warmup: int, steps: int) -> dict[str, Any]:
        """Samples/s and step times over steps ``warmup+1 .. warmup+steps`` (from the end of step ``warmup``)."""
        n = warmup + steps
        if len(self.ends) < n or len(self.samples) < n:
            raise RuntimeError(f"only {len(self.ends)} steps ran ({len(self.samples)} batches seen); {n} were needed")
        begin = self.ends[warmup - 1] if warmup else self.start
        cpu_begin = self.cpu_ends[warmup - 1] if warmup else self.cpu_start
        seconds = self.ends[n - 1] - begin
        times = [b - a for a, b in zip([begin, *self.ends[warmup:n - 1]], self.ends[warmup:n])]
        samples = sum(self.samples[warmup:n])
        return {
            "timed_steps": steps, "warmup_steps": warmup, "timed_seconds": round(seconds, 4),
            "samples": samples, "samples_per_s": round(samples / seconds, 3),
            "samples_per_s_median_step": round(samples / steps / statistics.median(times), 3),
            "mean_step_s": round(seconds / steps, 4), "median_step_s": round(statistics.median(times), 4),
            "step_times_s": [round(t, 4) for t in times],
            "cpu_seconds_per_step": round((self.cpu_ends[n - 1] - cpu_begin) / steps, 4),
            "first_step_loss": self.losses[0] if self.losses else None,
            "losses": [round(v, 6) for v in self.losses[:n]], "threads": self.threads,
        }


# ------------------------------------------------------------------------------------------------ our side
def run_ours(cfg: DistillBenchConfig, data_path: str | Path) -> dict[str, Any]:
    """Our side: ``DistillModule`` + ``DistillDataModule`` under a Lightning ``Trainer`` (module doc)."""
    import lightning as L
    import torch
    from lightning.pytorch import Callback

    from omnimed.bench.train_measure import PeakRSS, peak_gpu_memory
    from omnimed.training.distill import DistillModule, listwise_kl

    torch.set_num_threads(cfg.threads)
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        dm = data_module(cfg, data_path)
        first = next(iter(dm.train_dataloader()))
        clock = StepClock(sync=torch.cuda.synchronize if cfg.accelerator == "cuda" else None)

        class StepTimer(Callback):
            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                clock.begin()

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                   batch_idx: int) -> None:
                clock.step_end()
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                clock.losses.append(float(loss.detach()))
                clock.samples.append(len(batch["queries"]))

        L.seed_everything(cfg.seed, workers=True, verbose=False)
        module = DistillModule(model_config(cfg), task_config(cfg))
        if not cfg.dropout:
            no_dropout(module.encoder)
        module.eval()
        module.to("cuda" if cfg.accelerator == "cuda" else "cpu")
        with torch.no_grad(), torch.autocast(cfg.accelerator, dtype=torch.bfloat16,
                                             enabled=cfg.precision == "bf16-mixed"):
            init_loss = float(listwise_kl(*module.logits(first)))
        module.train()
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-distill-") as tmp:
            trainer = L.Trainer(accelerator=cfg.accelerator, devices=1, precision=cfg.precision,
                                gradient_clip_val=1.0, max_steps=cfg.total_steps, max_epochs=1,
                                accumulate_grad_batches=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                limit_val_batches=0, use_distributed_sampler=False, log_every_n_steps=1,
                                callbacks=[StepTimer()], default_root_dir=tmp)
            setup_s = time.perf_counter() - t0
            trainer.fit(module, datamodule=dm)
    result = clock.summary(cfg.warmup, cfg.steps)
    result.update(rss.result(), **peak_gpu_memory(cfg.accelerator))
    result.update(side="ours", loop="lightning.Trainer.fit(DistillModule, DistillDataModule)",
                  loss_impl="omnimed.training.distill.listwise_kl", init_loss_eval=init_loss,
                  first_batch=batch_fingerprint(first["queries"], first["passages"], first["scores"]),
                  optimizer=type(trainer.optimizers[0]).__name__, setup_s=round(setup_s, 2),
                  rss_after_model_load_mb=round(rss_model_mb, 1))
    return result


# ------------------------------------------------------------------------------------------------ st side
def listwise_kl_loss_cls() -> type:
    """:class:`ListwiseKLLoss`, built on first use (sentence-transformers is imported only then)."""
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss

    class ListwiseKLLoss(DistillKLDivLoss):
        """sentence-transformers' ``DistillKLDivLoss`` over (query, passage_0 .. passage_{n-1}) with the teacher's
        score list as label, without the ``student_temperature ** 2`` factor it multiplies by (Hinton's gradient
        scaling): KL(softmax(label / teacher T) || softmax(cos / student T)), averaged over the batch's queries,
        which is ``listwise_kl`` of ours. ``forward(sentence_features, labels)`` is the base class's (query column
        on its own, the passage columns in one merged forward pass)."""

        def compute_loss_from_embeddings(self, embeddings: list[Any], labels: Any) -> Any:
            return super().compute_loss_from_embeddings(embeddings, labels) / self.student_temperature ** 2

    return ListwiseKLLoss


def st_rows(items: Sequence[tuple[str, list[str], list[float]]], window: int) -> list[dict[str, Any]]:
    """Our data module's items as the st side's dataset rows: ``query``, ``passage_0..``, ``label``."""
    rows = []
    for query, passages, scores in items:
        row: dict[str, Any] = {"query": query}
        row.update({f"passage_{j}": passages[j] for j in range(window)})
        row["label"] = [float(s) for s in scores[:window]]
        rows.append(row)
    return rows


def run_st(cfg: DistillBenchConfig, data_path: str | Path) -> dict[str, Any]:
    """sentence-transformers' side: ``SentenceTransformerTrainer`` + :class:`ListwiseKLLoss` (module doc)."""
    import datasets
    import torch
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.util import pairwise_cos_sim
    from torch.utils.data import BatchSampler, SequentialSampler
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback

    from omnimed.bench.train_measure import PeakRSS, peak_gpu_memory
    from omnimed.training.distill import on_device

    torch.set_num_threads(cfg.threads)
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        dm = data_module(cfg, data_path)
        order = batch_order(dm)[: cfg.examples]
        rows = st_rows([dm.train_items[i] for i in order], cfg.window)
        dataset = datasets.Dataset.from_list(rows)
        clock = StepClock(sync=torch.cuda.synchronize if cfg.accelerator == "cuda" else None)

        class StepTimer(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.begin()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.step_end()

        class BenchTrainer(SentenceTransformerTrainer):
            """The trainer reading the rows in order (ours) and recording every step's loss and samples."""

            def get_batch_sampler(self, dataset: Any, batch_size: int, drop_last: bool, *args: Any,
                                  **kwargs: Any) -> Any:
                return BatchSampler(SequentialSampler(dataset), batch_size, drop_last)

            def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                samples = len(inputs["label"])
                loss = super().training_step(model, inputs, *args, **kwargs)
                clock.losses.append(float(loss.detach()))
                clock.samples.append(samples)
                return loss

        torch.manual_seed(cfg.seed)
        model = load_student(cfg)
        if not cfg.dropout:
            no_dropout(model)
        loss = listwise_kl_loss_cls()(model, similarity_fct=pairwise_cos_sim, student_temperature=cfg.temperature,
                                      teacher_temperature=cfg.teacher_temperature)
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-distill-st-") as tmp:
            args = SentenceTransformerTrainingArguments(
                output_dir=tmp, per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=1,
                max_steps=cfg.total_steps, learning_rate=cfg.lr, weight_decay=0.0, optim=cfg.st_optim,
                lr_scheduler_type="linear", warmup_steps=warmup_steps(cfg), max_grad_norm=1.0,
                bf16=cfg.precision == "bf16-mixed", fp16=False, use_cpu=cfg.accelerator == "cpu",
                gradient_checkpointing=cfg.gradient_checkpointing,
                gradient_checkpointing_kwargs={"use_reentrant": False}, report_to=[], dataloader_num_workers=0,
                logging_steps=1, save_strategy="no", eval_strategy="no", disable_tqdm=True, seed=cfg.seed,
                data_seed=cfg.seed)
            trainer = BenchTrainer(model=model, args=args, train_dataset=dataset, loss=loss, callbacks=[StepTimer()])
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
            first_rows = [dataset[i] for i in range(min(cfg.batch_size, len(dataset)))]
            features, labels = trainer.collect_features(trainer.data_collator(first_rows))
            model.eval()
            model.to(args.device)
            features = [on_device(f, args.device) for f in features]
            with torch.no_grad(), torch.autocast(cfg.accelerator, dtype=torch.bfloat16, enabled=args.bf16):
                init_loss = float(loss(features, labels.to(args.device)))
            model.train()
            setup_s = time.perf_counter() - t0
            trainer.train()
    result = clock.summary(cfg.warmup, cfg.steps)
    result.update(rss.result(), **peak_gpu_memory(cfg.accelerator))
    first = [dm.train_items[i] for i in order[: cfg.batch_size]]
    result.update(side="st", loop="sentence_transformers.SentenceTransformerTrainer.train()",
                  loss_impl="ListwiseKLLoss(DistillKLDivLoss) / student_temperature**2", init_loss_eval=init_loss,
                  first_batch=batch_fingerprint([r["query"] for r in first_rows],
                                                [[r[f"passage_{j}"] for j in range(cfg.window)] for r in first_rows],
                                                [r["label"] for r in first_rows]),
                  first_batch_from_our_order=batch_fingerprint(*zip(*first)) if first else None,
                  optimizer=type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
                  setup_s=round(setup_s, 2),
                  rss_after_model_load_mb=round(rss_model_mb, 1))
    return result


RUNNERS: dict[str, Callable[[DistillBenchConfig, str | Path], dict[str, Any]]] = {"ours": run_ours, "st": run_st}


# ------------------------------------------------------------------------------------------------ the parent
def _run_child(side: str, cfg: DistillBenchConfig, data_path: Path, workdir: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its result (raising with its log tail on failure)."""
    cfg_path, out_path, log_path = (workdir / f"{name}-{side}.{ext}" for name, ext in
                                    (("config", "json"), ("result", "json"), ("log", "txt")))
    cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1"), WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "omnimed.bench.distill", "--side", side, "--config", str(cfg_path), "--data",
           str(data_path), "--out", str(out_path)]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=cfg.child_timeout_s)
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"distill bench side {side!r} failed (exit {proc.returncode}):\n"
                           f"{log_path.read_text(errors='replace')[-4000:]}")
    return json.loads(out_path.read_text())


def _close(a: float | None, b: float | None, rtol: float) -> bool | None:
    if a is None or b is None:
        return None
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def compare(ours: dict[str, Any], st: dict[str, Any], cfg: DistillBenchConfig) -> dict[str, Any]:
    """Ratios ours/st, the loss checks, whether both trained on the same first batch, the goal."""
    ratio = ours["samples_per_s"] / st["samples_per_s"]
    out: dict[str, Any] = {
        "ratio_samples_per_s": round(ratio, 3),
        "ratio_samples_per_s_median_step": round(ours["samples_per_s_median_step"] / st["samples_per_s_median_step"],
                                                 3),
        "ratio_cpu_seconds_per_step_st_over_ours": round(st["cpu_seconds_per_step"] / ours["cpu_seconds_per_step"], 3),
        "ratio_peak_rss": round(ours["peak_rss_mb"] / st["peak_rss_mb"], 3),
        "init_loss_eval": {"ours": ours["init_loss_eval"], "st": st["init_loss_eval"]},
        "init_loss_abs_diff": abs(ours["init_loss_eval"] - st["init_loss_eval"]),
        "init_loss_match": _close(ours["init_loss_eval"], st["init_loss_eval"], cfg.loss_rtol),
        "first_step_loss": {"ours": ours["first_step_loss"], "st": st["first_step_loss"]},
        "first_step_loss_abs_diff": abs(ours["first_step_loss"] - st["first_step_loss"]),
        # with dropout on the sides draw different masks: the training losses need not match then
        "first_step_loss_match": _close(ours["first_step_loss"], st["first_step_loss"], cfg.loss_rtol)
        if not cfg.dropout else None,
        "ratio_peak_gpu_allocated": round(ours["peak_gpu_allocated_mb"] / st["peak_gpu_allocated_mb"], 3)
        if "peak_gpu_allocated_mb" in ours and "peak_gpu_allocated_mb" in st else None,
        "same_first_batch": ours["first_batch"] == st["first_batch"] == st["first_batch_from_our_order"],
        "goal_ratio": cfg.goal_ratio,
        "meets_goal": ratio >= cfg.goal_ratio,
    }
    if not cfg.dropout:
        diffs = [abs(a - b) for a, b in zip(ours["losses"], st["losses"])]
        out["max_step_loss_abs_diff"] = max(diffs) if diffs else None
    return out


def bench_distill(cfg: DistillBenchConfig | None = None, log: Callable[[str], None] | None = None,
                  **overrides: Any) -> dict[str, Any]:
    """Benchmark our distillation step against ``SentenceTransformerTrainer``; returns a JSON-ready dict:
    ``config``, ``hardware``, ``data``, ``runs`` (every side's run, in run order), ``ours`` and ``st`` (each side's
    run with the median samples/s), ``comparison`` (:func:`compare`), ``ratios_per_repeat``, ``wall_s``."""
    import importlib.metadata as md

    from omnimed.bench.train import hardware

    cfg = dataclasses.replace(cfg or DistillBenchConfig(), **overrides)
    cfg.validate()
    say = log or (lambda _msg: None)
    started = time.time()
    hw = hardware()
    hw["versions"]["sentence-transformers"] = md.version("sentence-transformers")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="omnimed-bench-distill-") as tmp:
        if cfg.data:
            data_path = Path(cfg.data)
            data = {"path": str(data_path), "examples": len(load_examples(cfg, data_path)), "window": cfg.window}
        else:
            say(f"labelling {cfg.examples} training queries with the {cfg.world_size} world's oracle")
            data_path, data = build_data(cfg, Path(tmp))
        for rep in range(max(cfg.repeats, 1)):
            for side in (list(cfg.sides) if rep % 2 == 0 else list(reversed(cfg.sides))):
                say(f"repeat {rep + 1}/{cfg.repeats}: {side}")
                run = _run_child(side, cfg, data_path, Path(tmp)) if cfg.isolate else RUNNERS[side](cfg, data_path)
                run["repeat"] = rep
                runs.append(run)
    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "hardware": hw, "data": data, "runs": runs}
    for side in cfg.sides:
        side_runs = [r for r in runs if r["side"] == side]
        med = statistics.median(r["samples_per_s"] for r in side_runs)
        result[side] = min(side_runs, key=lambda r: abs(r["samples_per_s"] - med))
    if set(SIDES) <= set(cfg.sides):
        result["comparison"] = compare(result["ours"], result["st"], cfg)
        pairs: dict[int, dict[str, Any]] = {}
        for r in runs:
            pairs.setdefault(r["repeat"], {})[r["side"]] = r
        result["ratios_per_repeat"] = [round(p["ours"]["samples_per_s"] / p["st"]["samples_per_s"], 3)
                                       for p in pairs.values()]
    result["hardware"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.time() - started, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omnimed.bench.distill --side ours|st --config CFG.json --data RECORDS --out RESULT.json``: one
    side, one run, in the process :func:`bench_distill` starts; its result written atomically to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--config", required=True, help="a DistillBenchConfig as JSON")
    parser.add_argument("--data", required=True, help="the utility record set both sides train on")
    parser.add_argument("--out", required=True, help="where to write this side's result JSON")
    args = parser.parse_args(argv)
    cfg = DistillBenchConfig(**json.loads(Path(args.config).read_text()))
    cfg.validate()
    result = RUNNERS[args.side](cfg, args.data)
    from omnimed.data.artifacts import atomic_write_json

    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

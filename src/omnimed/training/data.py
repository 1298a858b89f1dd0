"""SFT data pipeline: cached tokenization, a deterministic split, packing or length-grouped dynamic padding.

:class:`SFTDataModule` takes instruction records, conversational prompt-completion records (TRL's message lists,
rendered with the chat template), or an HF ``datasets.Dataset`` of either or of ready ``prompt``/``completion``
strings, formats and tokenizes them once with ``Dataset.map`` into an Arrow file under
``cache_dir`` named by a fingerprint of everything the features depend on, and serves batches in one of two ways:

* ``packing``: examples (each ending with EOS) are concatenated and cut into ``max_length`` blocks, labels carried
  along, so nearly every position is a real token;
* otherwise: :func:`length_grouped_batches` puts examples of similar length in the same batch and
  :class:`PadToLongestCollator` pads each batch only to its own longest example.

Batches are served by ``omnimed.training.resume``'s resumable loader: fixed index batches visited in a new order
each epoch, sharded across data-parallel ranks, and skipped exactly on a mid-epoch resume.

Both keep the fraction of real (non-pad) tokens per step high; :func:`real_token_fraction` measures it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from omnimed.data.hf import to_hf_dataset
from omnimed.data.records import Record
from omnimed.training.config import DataConfig, TaskConfig
from omnimed.training.resume import (
    ResumableBatchSampler,
    ResumableDataLoader,
    data_parallel_ranks,
    trainer_progress,
)
from omnimed.training.tokenize import (
    FORMAT_VERSION,
    IGNORE_INDEX,
    TemplateMode,
    format_batch,
    is_conversational,
    tokenize_prompt_completion,
    uses_chat_template,
)

log = logging.getLogger(__name__)

FEATURES = ("input_ids", "attention_mask", "labels")
#: the column of each example's group index under ``data.val_group_by`` (names in ``SFTDataModule.val_groups``)
GROUP = "group"
SFTData = datasets.Dataset | Sequence[Record | Mapping[str, Any]]


# ----------------------------------------------------------------------------------------------- batches
def real_token_fraction(batch: Mapping[str, torch.Tensor]) -> float:
    """Fraction of positions in ``batch`` that hold real tokens (``attention_mask`` == 1), padding excluded."""
    mask = batch["attention_mask"]
    return float(mask.sum().item()) / max(mask.numel(), 1)


@dataclass
class PadToLongestCollator:
    """Stack examples into right-padded tensors, padding only to the longest example of the batch.

    ``input_ids`` are padded with ``pad_token_id``, ``attention_mask`` with 0 and ``labels`` with -100, so padding
    neither attends nor counts in the loss. Holds two ints rather than the tokenizer (unlike
    ``DataCollatorForSeq2Seq``): it pickles cheaply into DataLoader workers and does not depend on the tokenizer's
    ``padding_side``, which generation code sets to ``left``.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX

    def __call__(self, features: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        pads = {"input_ids": self.pad_token_id, "attention_mask": 0, "labels": self.label_pad_token_id}
        out = {}
        for key, pad in pads.items():
            rows = [list(f[key]) + [pad] * (longest - len(f[key])) for f in features]
            out[key] = torch.tensor(rows, dtype=torch.long)
        if GROUP in features[0]:  # each example's validation group (data.val_group_by)
            out[GROUP] = torch.tensor([f[GROUP] for f in features], dtype=torch.long)
        return out


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, *, seed: int, mega_batch_mult: int = 64
) -> list[list[int]]:
    """Index batches whose members have similar lengths, fixed for a run (seeded).

    A seeded permutation is cut into mega-batches of ``mega_batch_mult`` batches, each mega-batch is sorted by
    length and cut into batches. Mega-batches keep some randomness in which examples meet; the order in which the
    batches are visited is reshuffled every epoch by :class:`~omnimed.training.resume.ResumableBatchSampler`.
    """
    order = np.random.default_rng(seed).permutation(len(lengths)).tolist()
    mega = batch_size * mega_batch_mult
    batches: list[list[int]] = []
    for m in range(0, len(order), mega):
        chunk = sorted(order[m : m + mega], key=lambda i: lengths[i], reverse=True)
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    return batches


def chunked(indices: Sequence[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of ``indices``."""
    return [list(indices[b : b + batch_size]) for b in range(0, len(indices), batch_size)]


def pack_sequences(batch: Mapping[str, list[list[int]]], block_size: int, eos_token_id: int | None) -> dict:
    """Concatenate tokenized examples and cut the stream into ``block_size`` blocks (``Dataset.map`` batched).

    Examples already end with EOS (see ``tokenize_prompt_completion``); one cut short by truncation gets an EOS
    separator with label -100 (nothing was learned to end there). Labels travel with their tokens, so prompt and
    evidence masking survive packing. The last, shorter block is kept (the collator pads it); blocks without any
    supervised label are dropped. Attention is not reset at example boundaries (plain packing): the EOS
    separator tells the model a new example begins, as in pre-training.
    """
    ids_stream: list[int] = []
    label_stream: list[int] = []
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        ids_stream += ids
        label_stream += labels
        if eos_token_id is not None and ids and ids[-1] != eos_token_id:
            ids_stream.append(eos_token_id)
            label_stream.append(IGNORE_INDEX)
    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "length": []}
    for start in range(0, len(ids_stream), block_size):
        labels = label_stream[start : start + block_size]
        if all(lab == IGNORE_INDEX for lab in labels):
            continue
        ids = ids_stream[start : start + block_size]
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
        out["length"].append(len(ids))
    return out


# ----------------------------------------------------------------------------------------------- features
def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over what decides the token ids: the backend tokenizer's JSON (vocabulary, merges, added tokens,
    normalizer, pre-tokenizer; runtime truncation/padding state left out) and the special-token ids."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    extra = {
        "class": type(tokenizer).__name__,
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
    }
    payload = json.dumps([spec, extra], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def features_fingerprint(
    data_fingerprint: str,
    tokenizer: Any,
    max_length: int,
    mask_spans: Sequence[Sequence[str]],
    template: TemplateMode,
    format_version: str = FORMAT_VERSION,
) -> str:
    """Cache key of the tokenized features: data, tokenizer, max_length, mask spans, the prompt template (the
    chat template text when it is used, our plain layout's version otherwise) and the version of the features'
    format (:data:`~omnimed.training.tokenize.FORMAT_VERSION` for SFT; another objective's features, its own)."""
    use_chat = uses_chat_template(tokenizer, template)
    key = {
        "format": format_version,
        "data": data_fingerprint,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_length": int(max_length),
        "mask_spans": [list(p) for p in mask_spans],
        "template": tokenizer.chat_template if use_chat else "plain",
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def _features(
    batch: Mapping[str, list[Any]],
    tokenizer: Any,
    max_length: int,
    mask_spans: Sequence[Sequence[str]],
    template: TemplateMode,
) -> dict[str, list]:
    """Format (unless rows already hold prompt/completion) and tokenize a batch, counting each example's
    ``supervised`` tokens: one left with none (a prompt of ``max_length`` tokens or more) would have a 0/0 loss,
    and ``SFTDataModule`` drops, counts and reports it with the ``max_length`` that would keep it."""
    if "prompt" not in batch or "completion" not in batch or is_conversational(batch):
        batch = format_batch(batch, tokenizer, template)  # records, or conversational (message-list) rows
    feats = tokenize_prompt_completion(batch, tokenizer, max_length, mask_spans)
    feats["supervised"] = [sum(lab != IGNORE_INDEX for lab in labels) for labels in feats["labels"]]
    return feats


def as_dataset(data: SFTData) -> datasets.Dataset:
    """An HF dataset of the examples: records become rows of their kind's features, dicts are kept as rows."""
    if isinstance(data, datasets.Dataset):
        return data
    data = list(data)
    if not data:
        raise ValueError("no examples to train on")
    if all(isinstance(r, Record) for r in data):
        return to_hf_dataset(data)
    return datasets.Dataset.from_list([dict(r) for r in data])


# ----------------------------------------------------------------------------------------------- module
class SFTDataModule(L.LightningDataModule):
    """Tokenized, split and batched SFT examples.

    ``prepare_data`` (one process per node) tokenizes into the cache; ``setup`` (every process) reads the cache,
    splits deterministically (``val_fraction``, ``shuffle_seed``) and packs when ``data_cfg.packing``.
    ``cache_hit`` says whether the last tokenization read an existing cache file (after ``prepare_data`` wrote
    it, ``setup`` is a hit; a second run's ``prepare_data`` too).

    Args:
        data: records (instruction or prompt-completion), dict rows, or an HF dataset of them (or of
            ``prompt``/``completion`` rows).
        tokenizer: a fast HF tokenizer (the one the model was resized for).
        data_cfg: batch size, workers, val fraction, packing, seed, max_examples.
        task_cfg: max_length and mask_spans.
        cache_dir: folder of the tokenized Arrow files; None keeps everything in memory (no reuse across runs).
        template: ``auto`` (chat template when the tokenizer has one), ``chat`` or ``plain``.

    A subclass serving other features (``omnimed.training.dpo_data``) swaps the class attributes below: the
    batched ``Dataset.map`` function (same keyword arguments as :func:`_features`; it returns ``length``,
    ``supervised`` and ``full_length`` per example besides its features), the cache files' prefix, the format
    version in the cache key, and :meth:`batch_columns` / :meth:`collator`.
    """

    #: prefix of the cache files and name in the progress bar
    kind: str = "sft"
    #: version of the features' format, part of the cache key
    format_version: str = FORMAT_VERSION
    #: ``Dataset.map(batched=True)`` function making the features of a batch of raw rows
    featurize = staticmethod(_features)

    def __init__(
        self,
        data: SFTData,
        tokenizer: Any,
        data_cfg: DataConfig,
        task_cfg: TaskConfig,
        *,
        cache_dir: str | Path | None = None,
        template: TemplateMode = "auto",
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.data_cfg = data_cfg
        self.task_cfg = task_cfg
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.template = template
        self._raw = as_dataset(data)
        if data_cfg.max_examples is not None:
            self._raw = self._raw.select(range(min(data_cfg.max_examples, len(self._raw))))
        self.cache_key = features_fingerprint(
            self._raw._fingerprint, tokenizer, task_cfg.max_length, task_cfg.mask_spans, template,
            self.format_version,
        )
        self.cache_hit: bool | None = None
        # examples dropped for having no supervised token within task.max_length (a prompt at least that long),
        # out of num_examples; examples kept but cut short (the end of their completion lost); the max_length
        # that keeps every example whole. Set by tokenized()
        self.dropped_too_long: int | None = None
        self.truncated: int | None = None
        self.needed_length: int | None = None
        self.num_examples = len(self._raw)
        # data.val_group_by's values, in the order of the group indices the batches carry (set by setup)
        self.val_groups: list[str] = []
        self._kept: list[int] = []
        self.train_dataset: datasets.Dataset | None = None
        self.val_dataset: datasets.Dataset | None = None

    @property
    def cache_file(self) -> Path | None:
        """The Arrow file holding the tokenized features (None without a cache dir)."""
        return None if self.cache_dir is None else self.cache_dir / f"{self.kind}-{self.cache_key}.arrow"

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token to pad with")
        return pad

    def tokenized(self) -> datasets.Dataset:
        """The examples with a supervised token as features (``input_ids``, ``attention_mask``, ``labels``,
        ``length``), from the cache file when it exists, else computed by ``Dataset.map`` and written there;
        counts what ``max_length`` cut (``dropped_too_long``, ``truncated``, ``needed_length``)."""
        cache_file = self.cache_file
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            self.cache_hit = cache_file.exists()
        else:
            self.cache_hit = False
        feats = self._raw.map(
            self.featurize,
            batched=True,
            remove_columns=self._raw.column_names,
            fn_kwargs={
                "tokenizer": self.tokenizer,
                "max_length": self.task_cfg.max_length,
                "mask_spans": [list(p) for p in self.task_cfg.mask_spans],
                "template": self.template,
            },
            cache_file_name=str(cache_file) if cache_file is not None else None,
            load_from_cache_file=cache_file is not None,
            keep_in_memory=cache_file is None,
            new_fingerprint=self.cache_key,
            desc=f"Tokenizing {self.kind.upper()} examples",
        )
        supervised, full = feats["supervised"], feats["full_length"]
        keep = [i for i, n in enumerate(supervised) if n]
        self._kept = keep
        self.dropped_too_long = len(feats) - len(keep)
        self.truncated = sum(full[i] > self.task_cfg.max_length for i in keep)
        self.needed_length = max(full, default=0)
        return feats if len(keep) == len(feats) else feats.select(keep, keep_in_memory=True)

    def prepare_data(self) -> None:
        if self.cache_dir is not None:
            self.tokenized()

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        ds = self.tokenized()
        self._report_cut()
        if len(ds) == 0:
            raise ValueError(
                f"no example has a supervised token within task.max_length={self.task_cfg.max_length}"
            )
        if self.data_cfg.val_group_by:
            ds = self._with_groups(ds, self.data_cfg.val_group_by)
        train, val = self._split(ds)
        if GROUP in train.column_names:  # validation reads the groups; training batches stay [rows, length]
            train = train.remove_columns(GROUP)
        if self.data_cfg.packing:
            train, val = self._pack(train), (self._pack(val) if val is not None else None)
        self.train_dataset = train
        if val is not None:  # in length order: evaluation batches need no shuffling and pad least this way
            lengths = val["length"]
            val = val.select(sorted(range(len(val)), key=lengths.__getitem__), keep_in_memory=True)
        self.val_dataset = val

    def _with_groups(self, ds: datasets.Dataset, key: str) -> datasets.Dataset:
        """``ds`` with each example's group index (:data:`GROUP`): the value of the record's field ``key``, or of
        its metadata's; every example must have one."""
        columns = self._raw.column_names
        rows = self._raw.select(self._kept).select_columns([c for c in (key, "metadata", "id") if c in columns])
        values = []
        for i, row in enumerate(rows):
            metadata = row.get("metadata") or {}
            if isinstance(metadata, str):  # records keep their metadata as a JSON string (omnimed.data.hf)
                metadata = json.loads(metadata)
            value = row.get(key) if key in columns else metadata.get(key)
            if value is None:
                raise ValueError(f"data.val_group_by={key}: example {row.get('id', self._kept[i])!r} has no "
                                 f"{key!r} field or metadata; every example needs one to be grouped (records built "
                                 "before their stage wrote it: rebuild them, or set data.val_group_by=null)")
            values.append(str(value))
        self.val_groups = sorted(set(values))
        index = {name: g for g, name in enumerate(self.val_groups)}
        return ds.add_column(GROUP, [index[v] for v in values])

    def _report_cut(self) -> None:
        """Warn (once, on rank 0) about the examples ``max_length`` dropped or cut short, with the value that keeps
        them all. Counted from the feature rows, so a cache hit reports what the run that tokenized did."""
        if not (self.dropped_too_long or self.truncated):
            return
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        if getattr(rank_zero_only, "rank", 0) != 0:
            return
        limit, n = self.task_cfg.max_length, self.num_examples
        parts = []
        if self.dropped_too_long:
            parts.append(f"dropped {self.dropped_too_long} of {n} examples ({self.dropped_too_long / n:.1%}): their "
                         f"prompt leaves no completion token within task.max_length={limit}")
        if self.truncated:
            parts.append(f"cut the completion of {self.truncated} of {n} examples short at task.max_length={limit}")
        log.warning("; ".join(parts) + f"; task.max_length={self.needed_length} keeps every example whole")

    def _split(self, ds: datasets.Dataset) -> tuple[datasets.Dataset, datasets.Dataset | None]:
        """Deterministic split: the same seed and data give the same validation examples on every run/rank."""
        frac = self.data_cfg.val_fraction
        if frac <= 0 or len(ds) < 2:
            return ds, None
        n_val = min(max(1, round(frac * len(ds))), len(ds) - 1)
        order = self._permutation(len(ds))
        return ds.select(order[n_val:], keep_in_memory=True), ds.select(order[:n_val], keep_in_memory=True)

    def _permutation(self, n: int) -> list[int]:
        """A seeded permutation. Applied with ``select(keep_in_memory=True)``: only an index mapping over the
        cached Arrow file, which ``train_test_split``/``shuffle`` would instead write next to it."""
        return np.random.default_rng(self.data_cfg.shuffle_seed).permutation(n).tolist()

    def _pack(self, ds: datasets.Dataset) -> datasets.Dataset:
        """Shuffle (seeded, so blocks mix examples) and pack into ``max_length`` blocks."""
        ds = ds.select(self._permutation(len(ds)), keep_in_memory=True)
        return ds.map(
            pack_sequences,
            batched=True,
            batch_size=None,
            remove_columns=ds.column_names,
            fn_kwargs={"block_size": self.task_cfg.max_length, "eos_token_id": self.tokenizer.eos_token_id},
            keep_in_memory=True,
            desc="Packing",
        )

    def _batches(self, ds: datasets.Dataset, *, train: bool) -> list[list[int]]:
        """Index batches: length-grouped for unpacked training data, seeded chunks of the (full) blocks when
        packed, length order for validation."""
        bs, seed = self.data_cfg.batch_size, self.data_cfg.shuffle_seed
        if not train:
            return chunked(range(len(ds)), bs)  # val_dataset is already in length order
        if self.data_cfg.packing:
            return chunked(self._permutation(len(ds)), bs)
        return length_grouped_batches(ds["length"], bs, seed=seed)

    def _loader(self, ds: datasets.Dataset, *, train: bool) -> DataLoader:
        """A resumable DataLoader over fixed index batches: each epoch visits them in a new order (training),
        each data-parallel rank takes every ``world_size``-th batch (the training entry point runs the Trainer
        with ``use_distributed_sampler=False``), and a checkpoint records how many batches of the epoch were
        trained on, so a resumed run skips exactly those (see ``omnimed.training.resume``)."""
        trainer = getattr(self, "trainer", None)
        num_replicas, rank = data_parallel_ranks(trainer)
        # debug=overfit (Trainer(overfit_batches=N)) trains the same first N batches every epoch: no reshuffling
        # (Lightning cannot turn shuffling off itself, the sampler being ours)
        overfit = bool(trainer is not None and getattr(trainer, "overfit_batches", 0))
        sampler = ResumableBatchSampler(
            self._batches(ds, train=train),
            shuffle=train and not overfit,
            seed=self.data_cfg.shuffle_seed,
            rank=rank,
            world_size=num_replicas,
        )
        return ResumableDataLoader(
            ds.select_columns(self.batch_columns(ds)),
            batch_sampler=sampler,
            collate_fn=self.collator(),
            num_workers=self.data_cfg.num_workers,
            persistent_workers=self.data_cfg.num_workers > 0,
            progress=(lambda: trainer_progress(trainer)) if train and trainer is not None else None,
        )

    def batch_columns(self, ds: datasets.Dataset) -> list[str]:
        """The columns of ``ds`` the collator reads (the others stay out of the DataLoader's workers)."""
        return [*FEATURES, *([GROUP] if GROUP in ds.column_names else [])]

    def collator(self) -> Any:
        """The collate function making a batch of tensors from feature rows."""
        return PadToLongestCollator(self.pad_token_id)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        assert self.train_dataset is not None
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader | list:
        if self.train_dataset is None:
            self.setup("fit")
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, train=False)

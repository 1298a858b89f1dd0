"""DPO data: preference pairs tokenized, cached, split and batched as chosen + rejected halves of one batch.

:class:`DPODataModule` is :class:`~omnimed.training.data.SFTDataModule` with pair features. Each pair (TRL's
conversational ``prompt`` / ``chosen`` / ``rejected`` message lists: :class:`~omnimed.data.records.PreferencePair`)
becomes two SFT examples, prompt+chosen and prompt+rejected, rendered with the chat template by
:func:`~omnimed.training.tokenize.format_conversation` and tokenized as one string each by
:func:`~omnimed.training.tokenize.tokenize_prompt_completion`: prompt tokens are -100 in the labels exactly as in
SFT, the end-of-turn token is supervised, both are cut at ``task.max_length``. Everything else is SFT's: the
``Dataset.map`` cache under ``cache_dir`` keyed by a fingerprint, the deterministic val split, length-grouped
batches, the resumable loader, and the report of what ``max_length`` dropped (a pair whose chosen or rejected side
keeps no supervised token) or cut short.

:class:`PairCollator` stacks a batch as TRL's ``concatenated_forward`` does: the chosen sequences of the batch's
pairs, then their rejected sequences, all right-padded to the longest of both, so one forward pass scores both
sides. The batch has SFT's keys (``input_ids``, ``attention_mask``, ``labels``), so the engine counts its tokens as
it counts SFT's, plus ``ref_chosen_logps`` / ``ref_rejected_logps`` when the reference log-probs were precomputed
(:func:`with_reference_log_probs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import torch

from omnimed.training.data import PadToLongestCollator, SFTDataModule
from omnimed.training.tokenize import (
    IGNORE_INDEX,
    TemplateMode,
    format_conversation,
    tokenize_prompt_completion,
)

#: the two completions of a pair, in the order they are stacked in a batch
SIDES = ("chosen", "rejected")
#: per-pair features stored in the cache (each side's ids and labels; attention masks are all ones)
PAIR_FEATURES = tuple(f"{side}_{key}" for side in SIDES for key in ("input_ids", "labels"))
#: the precomputed reference log-probs, one column each
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
#: bumped whenever the features of :func:`pair_features` change, so stale caches are not reused
DPO_FORMAT_VERSION = "dpo-pairs-v1"


def pair_features(
    batch: Mapping[str, list[Any]],
    tokenizer: Any,
    max_length: int,
    mask_spans: Sequence[Sequence[str]],
    template: TemplateMode,
) -> dict[str, list]:
    """The features of a batch of conversational pairs (``Dataset.map(batched=True)``): each side's ``input_ids``
    and ``labels``; ``length`` (the longer side: what the pair costs in a padded batch); ``supervised`` (the
    fewer supervised tokens of the two sides: 0 drops the pair); ``full_length`` (the longer side before the cut:
    the ``max_length`` that keeps the pair whole)."""
    for column in ("prompt", *SIDES):
        if column not in batch:
            raise ValueError(f"DPO examples need prompt, chosen and rejected message lists; no {column!r} column "
                             f"(columns: {sorted(batch)}; data.record_kind=preference reads PreferencePair records)")
    out: dict[str, list] = {}
    per_side = {}
    for side in SIDES:
        texts = [format_conversation(p, c, tokenizer, template) for p, c in zip(batch["prompt"], batch[side])]
        feats = tokenize_prompt_completion({"prompt": [t["prompt"] for t in texts],
                                            "completion": [t["completion"] for t in texts]},
                                           tokenizer, max_length, mask_spans)
        out[f"{side}_input_ids"], out[f"{side}_labels"] = feats["input_ids"], feats["labels"]
        per_side[side] = feats
    chosen, rejected = per_side["chosen"], per_side["rejected"]
    out["length"] = [max(a, b) for a, b in zip(chosen["length"], rejected["length"])]
    out["full_length"] = [max(a, b) for a, b in zip(chosen["full_length"], rejected["full_length"])]
    out["supervised"] = [
        min(sum(t != IGNORE_INDEX for t in a), sum(t != IGNORE_INDEX for t in b))
        for a, b in zip(chosen["labels"], rejected["labels"])
    ]
    return out


@dataclass
class PairCollator:
    """A batch of B pairs as 2B right-padded rows: the B chosen sequences, then the B rejected ones (TRL's
    layout), with SFT's keys; plus the pairs' precomputed reference log-probs (float32, shape [B]) when the rows
    carry them."""

    pad_token_id: int

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [
            {"input_ids": f[f"{side}_input_ids"], "attention_mask": [1] * len(f[f"{side}_input_ids"]),
             "labels": f[f"{side}_labels"]}
            for side in SIDES for f in features
        ]
        batch = PadToLongestCollator(self.pad_token_id)(rows)
        for key in REF_COLUMNS:
            if key in features[0]:
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.float32)
        return batch


def with_reference_log_probs(
    ds: datasets.Dataset, chosen: Sequence[float], rejected: Sequence[float]
) -> datasets.Dataset:
    """``ds`` with the :data:`REF_COLUMNS` added, one value per row. The rows are copied into memory first (a
    split is an index mapping over the cache file, and a column can only join a flat table)."""
    if len(chosen) != len(ds) or len(rejected) != len(ds):
        raise ValueError(f"{len(chosen)} / {len(rejected)} reference log-probs for {len(ds)} pairs")
    flat = ds.flatten_indices(keep_in_memory=True) if ds._indices is not None else ds
    return flat.add_column(REF_COLUMNS[0], list(map(float, chosen))).add_column(
        REF_COLUMNS[1], list(map(float, rejected)))


class DPODataModule(SFTDataModule):
    """Preference pairs, tokenized into chosen/rejected features and batched by :class:`PairCollator`.

    Takes what :class:`~omnimed.training.data.SFTDataModule` takes (``data``: ``PreferencePair`` records, rows or an
    HF dataset of conversational ``prompt`` / ``chosen`` / ``rejected``); ``dropped_too_long``, ``truncated``,
    ``needed_length`` and ``num_examples`` count pairs, and ``data.batch_size`` too: a micro-batch runs twice as
    many sequences. Packing does not apply: a pair's two sequences must stay whole and aligned.
    """

    kind = "dpo"
    format_version = DPO_FORMAT_VERSION
    featurize = staticmethod(pair_features)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.data_cfg.packing:
            raise ValueError("data.packing=true: DPO pairs cannot be packed (each pair's chosen and rejected "
                             "sequences are scored whole); set data.packing=false")

    def batch_columns(self, ds: datasets.Dataset) -> list[str]:
        return list(PAIR_FEATURES) + [c for c in REF_COLUMNS if c in ds.column_names]

    def collator(self) -> PairCollator:
        return PairCollator(self.pad_token_id)

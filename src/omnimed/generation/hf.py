"""The ``hf`` backend: a transformers causal LM in this process, batched (the default backend, CPU or GPU).

Decisions that make its numbers trustworthy:

- Batches are left-padded with explicit position ids, so a prompt gives the same logits alone or in a batch;
  prompts are sorted by length before batching to waste little compute on padding.
- Generated text is decoded with special tokens kept (added tokens such as ``[Retrieval]`` survive); only
  padding and the end-of-sequence marker are removed.
- ``next_token_logprobs`` computes a prompt that several requests share once, and a request that continues one
  scored before only from where it left off; the padding gap this leaves is masked and positions continue, so the
  numbers equal a full forward pass (tested).
- ``score`` tokenizes the prompt and prompt + continuation and scores the tokens after their common prefix: the
  tokens the model would really see, also where the boundary merges into one token.
- ``model_id`` carries a fingerprint of the weight files, dtype and added tokens, so the on-disk cache never
  serves results of an older checkpoint exported to the same folder.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from omnimed.generation.fingerprint import fingerprint
from omnimed.generation.render import chunks, is_chat, render_with
from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams
from omnimed.models.config import ModelConfig, named_model_config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Cached:
    """A scored row's key/value cache, its attention mask (zeros where padding sat) and its length in tokens."""

    past: Any
    mask: torch.Tensor
    tokens: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.past.layers for t in (layer.keys, layer.values))


def shared_prefix_groups(rows: Sequence[Sequence[int]], min_tokens: int = 32) -> list[tuple[int, list[int]]]:
    """Group token rows that share most of their length: ``(prefix length, row indices)``, the prefix being the
    group's common start (at least ``min_tokens`` and half its shortest row; every row keeps one token after it).
    A row that shares too little is a group of its own with prefix 0. Self-BioRAG's branches (one question, many
    passages) share the demonstrations and the question, so their prompt is computed once instead of per branch."""
    groups: list[tuple[int, list[int]]] = []
    for i in sorted(range(len(rows)), key=lambda k: list(rows[k])):
        if groups:
            prefix, members = groups[-1]
            head, row = rows[members[0]], rows[i]
            n = next((k for k in range(min(prefix, len(row))) if head[k] != row[k]), min(prefix, len(row)))
            shortest = min(len(row), *(len(rows[j]) for j in members))
            n = min(n, shortest - 1)
            if n >= min_tokens and 2 * n >= shortest:
                groups[-1] = (n, [*members, i])
                continue
        groups.append((len(rows[i]), [i]))
    return [(prefix if len(members) > 1 else 0, members) for prefix, members in groups]


def _as_model_config(model: Any) -> ModelConfig:
    """A ``ModelConfig`` from a ``ModelConfig``, an OmegaConf node of one, or a ``conf/model`` name."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        cfg = named_model_config(model)
        # a name that is no conf/model file is a hub id or folder: here it is a causal LM, not an encoder
        return dataclasses.replace(cfg, kind="causal_lm") if cfg.source == "hub" else cfg
    from omegaconf import DictConfig, OmegaConf

    if isinstance(model, DictConfig):
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))  # type: ignore
    raise GenerationError(f"hf backend: cannot load a model from {type(model).__name__} {model!r}")


def _is_checkpoint_folder(model: Any) -> bool:
    if not isinstance(model, (str, Path)):
        return False
    path = Path(model)
    return path.is_dir() and ((path / "config.json").is_file() or (path / "adapter_config.json").is_file())


class HFBackend:
    """Generate, score and read next-token log-probabilities with a transformers model.

    ``model``: a ``ModelConfig``, a ``conf/model`` name, or a local HF folder (an ``omnimed-train`` export: a full
    model, or a LoRA adapter whose base is loaded first and merged for speed). Message prompts use the tokenizer's
    chat template when ``use_chat_template`` (else a plain ``Role: content`` rendering); strings are used as they
    are. ``max_length``: the longest prompt accepted, in tokens (default: the model's context size); a longer one
    fails that request (``Generation.error``; ``score`` raises). ``dtype``: overrides the config's.
    ``prefix_cache_mb``: memory for the key/value caches of scored prompts that ``next_token_logprobs`` keeps for
    their continuations (0 keeps none; prompts shared within one call are still computed once). ``share_prefix``:
    compute a prompt that one call's rows share once (default: on the CPU only; see ``BackendConfig``).
    """

    name = "hf"

    def __init__(
        self,
        model: ModelConfig | str,
        *,
        batch_size: int = 8,
        use_chat_template: bool = True,
        max_length: int | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        prefix_cache_mb: float = 2048,
        share_prefix: bool | None = None,
    ) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.batch_size = max(1, int(batch_size))
        self.model, self.tokenizer, self.model_id = self._load(model, dtype)
        self.model.to(self.device).eval()
        if self.tokenizer.pad_token_id is None:
            from omnimed.models.tokens import ensure_pad_token

            ensure_pad_token(self.tokenizer)
        self.template = self.tokenizer if use_chat_template and self.tokenizer.chat_template else None
        ctx = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = int(max_length or ctx or 2048)
        self._keep_arg = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._keep_last = {"logits_to_keep": 1} if self._keep_arg else {}
        self._caches: OrderedDict[tuple[int, ...], _Cached] = OrderedDict()
        self._cache_bytes = int(prefix_cache_mb * 2**20)
        self._kept_bytes = 0  # what the kept caches hold, kept beside them so keeping one more need not re-sum all
        self.share_prefix = self.device.type == "cpu" if share_prefix is None else bool(share_prefix)
        self._token_ids: dict[str, int] = {}  # get_vocab() builds the whole vocabulary each call: looked up once
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {self.tokenizer.eos_token_id}
        self._eos_ids = {int(i) for i in eos_ids if i is not None}

    def __repr__(self) -> str:
        return f"HFBackend({self.model_id!r}, device={self.device}, batch_size={self.batch_size})"

    # ------------------------------------------------------------------------------------------- loading
    @staticmethod
    def _load(model: Any, dtype: str | None) -> tuple[Any, Any, str]:
        from omnimed.models.loading import load_causal_lm, load_tokenizer, resolve_model_path, torch_dtype

        if _is_checkpoint_folder(model):
            from omnimed.models.exported import load_exported

            folder = Path(model).resolve()
            dtype = dtype or "float32"
            loaded, tokenizer = load_exported(folder, merge=True, dtype=torch_dtype(dtype))  # a LoRA adapter merged
            if tokenizer is None:
                raise GenerationError(f"hf backend: {folder} holds no tokenizer; export it with its tokenizer")
            loaded.requires_grad_(False)
            return loaded, tokenizer, f"{folder.name}@{fingerprint(folder, dtype)}"
        cfg = _as_model_config(model)
        if cfg.kind != "causal_lm":
            raise GenerationError(f"hf backend: model {cfg.name!r} is a {cfg.kind}, not a causal LM")
        if dtype:
            cfg = dataclasses.replace(cfg, dtype=dtype)
        tokenizer = load_tokenizer(cfg)
        loaded = load_causal_lm(cfg, tokenizer, for_training=False)
        folder = resolve_model_path(cfg)
        return loaded, tokenizer, f"{cfg.name}@{fingerprint(folder, cfg.dtype, tuple(cfg.special_tokens))}"

    # ------------------------------------------------------------------------------------------- prompts
    def render(self, request: Request) -> str:
        """The prompt text the model sees (chat template applied, assistant prefix appended)."""
        return render_with(request, self.template)

    def _encode(self, text: str, request: Request) -> list[int]:
        # a rendered chat template already holds its special tokens; a plain string gets the tokenizer's own
        return self.tokenizer(text, add_special_tokens=not is_chat(request))["input_ids"]

    def token_id(self, token: str) -> int:
        """The id of ``token``: a vocabulary entry (added tokens included) or text that encodes to one token."""
        if token not in self._token_ids:
            self._token_ids[token] = self._find_token_id(token)
        return self._token_ids[token]

    def _find_token_id(self, token: str) -> int:
        tid = self.tokenizer.get_vocab().get(token)
        if tid is None:
            ids = self.tokenizer(token, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                pieces = self.tokenizer.convert_ids_to_tokens(ids)
                raise GenerationError(f"hf backend ({self.model_id}): {token!r} is not a token of the vocabulary "
                                      f"(it encodes to {len(ids)} tokens: {pieces}); add it as a special token "
                                      "(ModelConfig.special_tokens) to score it as one")
            tid = ids[0]
        rows = self.model.get_output_embeddings().weight.shape[0]
        if tid >= rows:
            raise GenerationError(f"hf backend ({self.model_id}): {token!r} has id {tid} but the model has {rows} "
                                  "output rows; it was added to the tokenizer without resizing the model")
        return int(tid)

    def _batch(self, rows: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Left-padded ids, mask and position ids (so padding shifts no position)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device),
                "position_ids": positions.to(self.device)}

    def _last_logits(self, rows: Sequence[Sequence[int]], keep: int) -> torch.Tensor:
        """fp32 logits of the last ``keep`` positions of each (left-padded) row: [batch, keep, vocab]."""
        batch = self._batch(rows)
        if self._keep_arg:
            logits = self.model(**batch, logits_to_keep=keep).logits
        else:
            logits = self.model(**batch).logits
        return logits[:, -keep:, :].float()

    def _check_length(self, ids: Sequence[int]) -> str | None:
        if len(ids) > self.max_length:
            return f"prompt has {len(ids)} tokens; max_length is {self.max_length}"
        return None

    # ------------------------------------------------------------------------------------------- generate
    def decode(self, ids: Sequence[int]) -> tuple[str, int, bool]:
        """(text, tokens, ended): ``ids`` cut at the first end-of-sequence marker, padding dropped, special
        tokens kept."""
        ended = False
        kept: list[int] = []
        for t in ids:
            t = int(t)
            if t in self._eos_ids:
                ended = True
                break
            if t != self.tokenizer.pad_token_id:
                kept.append(t)
        text = self.tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text, len(kept), ended

    @torch.no_grad()
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        encoded = [self._encode(self.render(r), r) for r in requests]
        out: list[list[Generation] | None] = [None] * len(requests)
        todo = []
        for i, ids in enumerate(encoded):
            problem = self._check_length(ids)
            if problem:
                out[i] = [Generation(text="", finish_reason="error", error=problem)] * params.n
            else:
                todo.append(i)
        todo.sort(key=lambda i: len(encoded[i]))
        sample = params.temperature > 0
        kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if sample:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=None,
                          num_return_sequences=params.n)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        per_row = params.n if sample else 1
        for chunk in chunks(todo, self.batch_size):
            batch = self._batch([encoded[i] for i in chunk])
            if sample:
                torch.manual_seed(params.seed)
            seqs = self.model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1]:]
            for j, i in enumerate(chunk):
                rows = seqs[j * per_row : (j + 1) * per_row]
                gens = [self._finish(row.tolist(), params) for row in rows]
                out[i] = gens if sample else gens * params.n
        return out  # type: ignore[return-value]

    def _finish(self, ids: list[int], params: SamplingParams) -> Generation:
        text, n_tokens, ended = self.decode(ids)
        finish = "stop" if ended else ("length" if n_tokens >= params.max_new_tokens else "stop")
        cuts = [text.index(s) for s in params.stop if s and s in text]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        return Generation(text=text, finish_reason=finish, tokens=n_tokens)

    # ------------------------------------------------------------------------------------------- scoring
    @torch.no_grad()
    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        if len(requests) != len(continuations):
            raise GenerationError(f"hf backend: {len(requests)} requests but {len(continuations)} continuations")
        items: list[tuple[list[int], int]] = []  # (prompt + continuation ids, where the scored tokens start)
        for r, c in zip(requests, continuations):
            text = self.render(r)
            prompt, full = self._encode(text, r), self._encode(text + c, r)
            k = 0
            while k < min(len(prompt), len(full)) and prompt[k] == full[k]:
                k += 1
            problem = self._check_length(full)
            if problem:
                raise GenerationError(f"hf backend ({self.model_id}): cannot score: {problem}")
            items.append((full, max(k, 1)))
        out = [0.0] * len(items)
        order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
        for chunk in chunks(order, self.batch_size):
            rows = [items[i][0] for i in chunk]
            n_scored = [len(items[i][0]) - items[i][1] for i in chunk]
            if max(n_scored) == 0:
                continue
            # left padding aligns every row's end: the last m+1 positions predict the m scored tokens
            logprobs = torch.log_softmax(self._last_logits(rows, max(n_scored) + 1), dim=-1)
            for j, i in enumerate(chunk):
                m = n_scored[j]
                if m == 0:
                    continue
                targets = torch.tensor(rows[j][-m:], device=logprobs.device)
                picked = logprobs[j, -m - 1 : -1, :].gather(-1, targets[:, None])
                out[i] = float(picked.sum())
        return out

    @torch.no_grad()
    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        ids = {t: self.token_id(t) for t in tokens}
        encoded = [self._encode(self.render(r), r) for r in requests]
        for e in encoded:
            problem = self._check_length(e)
            if problem:
                raise GenerationError(f"hf backend ({self.model_id}): {problem}")
        out: list[dict[str, float]] = [{} for _ in requests]
        fresh = []
        for i, row in enumerate(encoded):
            hit = self._cached_prefix(row)
            if hit is None:
                fresh.append(i)
            else:  # a continuation of a row scored before: only its new tokens are computed
                out[i] = self._logprobs(self._extend(hit, row)[0][None], ids)[0]
        groups = (shared_prefix_groups([encoded[i] for i in fresh]) if self.share_prefix
                  else [(0, list(range(len(fresh))))] if fresh else [])
        for prefix, group in groups:
            group = sorted((fresh[g] for g in group), key=lambda i: len(encoded[i]))
            head = self._extend(None, encoded[group[0]][:prefix])[1] if prefix else None
            for chunk in chunks(group, self.batch_size):
                if head is None:
                    last = self._last_logits([encoded[i] for i in chunk], 1)
                else:
                    last = self._last_logits_after(head, [encoded[i] for i in chunk])
                for i, scores in zip(chunk, self._logprobs(last, ids)):
                    out[i] = scores
        return out

    @staticmethod
    def _logprobs(last: torch.Tensor, ids: dict[str, int]) -> list[dict[str, float]]:
        """Each row's log-probabilities of ``ids`` at its last position (``last``: [rows, positions, vocab]), read
        back in one transfer rather than one per token and row."""
        logprobs = torch.log_softmax(last[:, -1].float(), dim=-1)[:, list(ids.values())].tolist()
        return [dict(zip(ids, row)) for row in logprobs]

    # ------------------------------------------------------------------------------------------- prompt caches
    # Scored rows keep their key/value cache (least recently used dropped beyond ``prefix_cache_mb``): a row that
    # starts with a kept one computes only its new tokens, and rows sharing a long prompt compute it once. Self-BioRAG
    # asks REL, then the answer, SUP and USE, each a few tokens after the last, over one prompt and five passages.
    def _cached_prefix(self, row: Sequence[int]) -> _Cached | None:
        best = None
        for key, entry in self._caches.items():
            if len(key) < len(row) and (best is None or len(key) > len(best[0])) and tuple(row[:len(key)]) == key:
                best = (key, entry)
        if best is None:
            return None
        self._caches.move_to_end(best[0])
        return best[1]

    def _keep(self, key: Sequence[int], entry: _Cached) -> _Cached:
        if self._cache_bytes:
            replaced = self._caches.pop(tuple(key), None)
            self._kept_bytes += entry.nbytes - (replaced.nbytes if replaced is not None else 0)
            self._caches[tuple(key)] = entry
            while self._kept_bytes > self._cache_bytes and len(self._caches) > 1:
                self._kept_bytes -= self._caches.popitem(last=False)[1].nbytes
        return entry

    def _extend(self, entry: _Cached | None, row: Sequence[int]) -> tuple[torch.Tensor, _Cached]:
        """Run ``row``'s tokens after ``entry`` (a kept prefix of it) or from scratch: its last-position logits
        [1, vocab] and its cache entry, kept."""
        start = entry.tokens if entry is not None else 0
        new = torch.tensor([list(row[start:])], dtype=torch.long, device=self.device)
        past = copy.deepcopy(entry.past) if entry is not None else None
        mask = torch.ones((1, new.shape[1]), dtype=torch.long, device=self.device)
        mask = torch.cat([entry.mask, mask], 1) if entry is not None else mask
        positions = torch.arange(start, len(row), device=self.device)[None]
        result = self.model(input_ids=new, attention_mask=mask, position_ids=positions, past_key_values=past,
                            use_cache=True, **self._keep_last)
        return result.logits[0, -1:, :], self._keep(row, _Cached(result.past_key_values, mask, len(row)))

    def _last_logits_after(self, head: _Cached, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """fp32 last-position logits of ``rows``, all starting with ``head``'s tokens: [batch, 1, vocab]. The rest of
        each row is left-padded after the head (the mask hides the gap, positions continue from the head); each
        row's cache is kept."""
        n = head.tokens
        batch = self._batch([r[n:] for r in rows])
        past = copy.deepcopy(head.past)
        past.batch_repeat_interleave(len(rows))
        mask = torch.cat([head.mask.expand(len(rows), -1), batch["attention_mask"]], 1)
        out = self.model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"] + n,
                         past_key_values=past, use_cache=True, **self._keep_last)
        for j, row in enumerate(rows if self._cache_bytes else ()):
            one = DynamicCache()
            for layer, held in enumerate(out.past_key_values.layers):
                one.update(held.keys[j:j + 1].clone(), held.values[j:j + 1].clone(), layer)
            self._keep(row, _Cached(one, mask[j:j + 1], len(row)))
        return out.logits[:, -1:, :].float()

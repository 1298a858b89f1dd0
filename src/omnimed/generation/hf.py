"""The ``hf`` backend: a transformers causal LM in this process, batched (the default backend, CPU or GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams
from omnimed.models.config import ModelConfig, named_model_config


class HFBackend:
    """Generate, score and read next-token log-probabilities with a transformers model.

    ``model`` is a ``ModelConfig``, a ``conf/model`` name, or a folder written by ``omnimed-train`` (a full model,
    or a LoRA adapter whose base is loaded first). Message prompts go through the tokenizer's chat template; plain
    strings are used as they are. Decoding keeps added special tokens (reflective tokens survive) and drops only
    padding and end-of-sequence markers.
    """

    name = "hf"

    def __init__(self, model: ModelConfig | str, *, batch_size: int = 8, device: str | None = None) -> None:
        self.batch_size = batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, self.tokenizer, self.model_id = self._load(model)
        self.model.to(self.device).eval()
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def __repr__(self) -> str:
        return f"HFBackend({self.model_id!r}, device={self.device})"

    @staticmethod
    def _load(model: ModelConfig | str):
        from omnimed.models.loading import load_causal_lm, load_tokenizer

        if isinstance(model, str) and Path(model).is_dir():
            from omnimed.training.export import load_exported

            loaded, tokenizer = load_exported(model)
            if tokenizer is None:
                raise GenerationError(f"hf backend: {model} has no tokenizer files; export with omnimed-train")
            return loaded, tokenizer, str(Path(model).resolve())
        cfg = named_model_config(model) if isinstance(model, str) else model
        if cfg.kind != "causal_lm" and cfg.source == "hub":  # a bare hub id or folder given by name
            cfg = dataclasses.replace(cfg, kind="causal_lm")
        tokenizer = load_tokenizer(cfg)
        return load_causal_lm(cfg, tokenizer, for_training=False), tokenizer, f"{cfg.name}:{cfg.name_or_path}"

    # ------------------------------------------------------------------------------------------- prompts
    def render(self, request: Request) -> str:
        """The prompt text; ``meta["assistant_prefix"]`` starts the assistant's reply (e.g. ``<answer>``)."""
        if isinstance(request.prompt, str):
            return request.prompt
        text = self.tokenizer.apply_chat_template(request.prompt, tokenize=False, add_generation_prompt=True)
        return text + request.meta.get("assistant_prefix", "")

    def _ids(self, request: Request) -> list[int]:
        # a rendered chat template already holds its special tokens
        return self.tokenizer(self.render(request), add_special_tokens=isinstance(request.prompt, str))["input_ids"]

    def _token_id(self, token: str) -> int:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is not None and tid != self.tokenizer.unk_token_id and tid >= 0:
            return int(tid)
        ids = self.tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise GenerationError(f"hf backend ({self.model_id}): {token!r} is not one token of the vocabulary "
                                  f"(it encodes to {len(ids)} tokens); add it as a special token first")
        return int(ids[0])

    def _batch(self, rows: list[list[int]], side: str) -> dict[str, torch.Tensor]:
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            ids[i, sl] = torch.tensor(r)
            mask[i, sl] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    # ------------------------------------------------------------------------------------------- contract
    @torch.no_grad()
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        out: list[list[Generation]] = []
        drop = {t for t in (self.tokenizer.pad_token, self.tokenizer.eos_token) if t}
        for start in range(0, len(requests), self.batch_size):
            chunk = list(requests[start : start + self.batch_size])
            batch = self._batch([self._ids(r) for r in chunk], "left")
            kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "num_return_sequences": params.n,
                                      "pad_token_id": self.tokenizer.pad_token_id}
            if params.temperature > 0:
                torch.manual_seed(params.seed)
                kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            seqs = self.model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1]:]
            for i in range(len(chunk)):
                gens = []
                for seq in seqs[i * params.n : (i + 1) * params.n]:
                    tokens = [t for t in self.tokenizer.convert_ids_to_tokens(seq.tolist()) if t not in drop]
                    text = self.tokenizer.convert_tokens_to_string(tokens)
                    finish = "length" if len(tokens) >= params.max_new_tokens else "stop"
                    for stop in params.stop:
                        if stop in text:
                            text, finish = text[: text.index(stop)], "stop"
                    gens.append(Generation(text=text, finish_reason=finish, tokens=len(tokens)))
                out.append(gens)
        return out

    @torch.no_grad()
    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        """Continuation tokens are tokenized on their own and appended to the prompt's tokens."""
        out: list[float] = []
        pairs = [(self._ids(r), self.tokenizer(c, add_special_tokens=False)["input_ids"])
                 for r, c in zip(requests, continuations)]
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            batch = self._batch([p + c for p, c in chunk], "right")
            logprobs = torch.log_softmax(self.model(**batch).logits.float(), dim=-1)
            for i, (p, c) in enumerate(chunk):
                positions = torch.arange(len(p) - 1, len(p) + len(c) - 1, device=self.device)
                targets = batch["input_ids"][i, len(p) : len(p) + len(c)]
                out.append(float(logprobs[i, positions, targets].sum()))
        return out

    @torch.no_grad()
    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        ids = {t: self._token_id(t) for t in tokens}
        out: list[dict[str, float]] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = list(requests[start : start + self.batch_size])
            batch = self._batch([self._ids(r) for r in chunk], "left")
            last = torch.log_softmax(self.model(**batch).logits[:, -1, :].float(), dim=-1)
            out.extend({t: float(last[i, tid]) for t, tid in ids.items()} for i in range(len(chunk)))
        return out

"""The ``vllm`` backend: vLLM's engine in this process, for machines where ``import vllm`` works (GPU nodes).

vLLM is imported only when the backend is built. Without it (omnimed's own environment: vLLM pins other
transformers and torch versions) the constructor raises a :class:`GenerationError` that says what to do instead:
start vLLM's OpenAI-compatible server in its own environment and use ``backend=openai``.

Prompts are rendered and tokenized here with the same rules as the ``hf`` backend (chat template, assistant
prefix, special tokens for plain strings only) and given to vLLM as token ids, so both backends see the same
tokens. Scores come from ``SamplingParams(prompt_logprobs=0)``: the log-probability of every prompt token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnimed.generation.fingerprint import fingerprint
from omnimed.generation.render import is_chat, render_with
from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams

INSTALL_HINT = (
    "backend=vllm runs vLLM inside this process and needs `import vllm` to work here (a GPU machine with "
    "`pip install vllm`). omnimed's own environment does not hold vLLM; instead start vLLM's OpenAI-compatible "
    "server in its own environment (python -m vllm.entrypoints.openai.api_server --model FOLDER "
    "--served-model-name NAME) and use backend=openai backend.base_url=http://HOST:PORT/v1 backend.model=NAME"
)


class VLLMBackend:
    """``model``: a local HF folder or a hub id. ``engine_kwargs`` go to ``vllm.LLM`` as they are (e.g.
    ``tensor_parallel_size``, ``enforce_eager``)."""

    name = "vllm"

    def __init__(self, model: str | Path, *, dtype: str = "auto", max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.9, use_chat_template: bool = True, seed: int = 0,
                 **engine_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise GenerationError(f"{INSTALL_HINT} (import vllm failed: {exc})") from None
        model = str(model)
        self.llm = vllm.LLM(model=model, dtype=dtype, max_model_len=max_model_len, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.template = self.tokenizer if use_chat_template and getattr(self.tokenizer, "chat_template", None) \
            else None
        folder = Path(model)
        tag = fingerprint(folder, dtype) if folder.is_dir() else dtype
        self.model_id = f"{folder.name if folder.is_dir() else model}@{tag}"

    def __repr__(self) -> str:
        return f"VLLMBackend({self.model_id!r})"

    def _ids(self, request: Request, continuation: str = "") -> list[int]:
        text = render_with(request, self.template) + continuation
        return list(self.tokenizer(text, add_special_tokens=not is_chat(request))["input_ids"])

    def _prompt_logprobs(self, sequences: Sequence[list[int]]) -> list[list[float | None]]:
        """The log-probability of every token of each sequence given the ones before it (the first: None)."""
        from vllm import SamplingParams as VLLMSamplingParams

        params = VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in sequences], params, use_tqdm=False)
        rows = []
        for ids, o in zip(sequences, outs):
            row: list[float | None] = []
            for pos, entry in enumerate(o.prompt_logprobs or []):
                row.append(None if not entry else float(entry[ids[pos]].logprob))
            rows.append(row)
        return rows

    # ------------------------------------------------------------------------------------------- contract
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        from vllm import SamplingParams as VLLMSamplingParams

        sp = VLLMSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                max_tokens=params.max_new_tokens, stop=list(params.stop) or None, seed=params.seed,
                                skip_special_tokens=False, spaces_between_special_tokens=False)
        outs = self.llm.generate([{"prompt_token_ids": self._ids(r)} for r in requests], sp, use_tqdm=False)
        return [[Generation(text=c.text, finish_reason=c.finish_reason or "stop", tokens=len(c.token_ids))
                 for c in o.outputs] for o in outs]

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        if len(requests) != len(continuations):
            raise GenerationError(f"vllm backend: {len(requests)} requests but {len(continuations)} continuations")
        fulls, starts = [], []
        for r, c in zip(requests, continuations):
            prompt, full = self._ids(r), self._ids(r, c)
            k = 0
            while k < min(len(prompt), len(full)) and prompt[k] == full[k]:
                k += 1
            fulls.append(full)
            starts.append(max(k, 1))
        rows = self._prompt_logprobs(fulls)
        return [float(sum(v for v in row[k:] if v is not None)) for row, k in zip(rows, starts)]

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        vocab = self.tokenizer.get_vocab()
        cand = {}
        for t in tokens:
            ids = [vocab[t]] if t in vocab else self.tokenizer(t, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise GenerationError(f"vllm backend ({self.model_id}): {t!r} is not one token of the vocabulary "
                                      f"(it encodes to {len(ids)} tokens); add it as a special token to score it")
            cand[t] = int(ids[0])
        prompts = [self._ids(r) for r in requests]
        rows = iter(self._prompt_logprobs([p + [tid] for p in prompts for tid in cand.values()]))
        return [{t: float(next(rows)[-1]) for t in cand} for _ in prompts]

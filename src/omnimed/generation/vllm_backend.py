"""The ``vllm`` backend: vLLM's engine in this process, when vLLM is installed (GPU machines).

Without it (the CPU default), run vLLM's OpenAI-compatible server and use ``backend=openai`` with its URL.
"""

from __future__ import annotations

from collections.abc import Sequence

from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams


class VLLMBackend:
    name = "vllm"

    def __init__(self, model: str, *, dtype: str = "auto", max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.9, trust_remote_code: bool = False) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise GenerationError(
                "backend=vllm needs the vllm package in this environment (GPU machines: pip install vllm). "
                "Without it, start vLLM's OpenAI-compatible server and use backend=openai "
                "backend.base_url=http://HOST:PORT/v1"
            ) from exc
        self.model_id = model
        self.llm = LLM(model=model, dtype=dtype, max_model_len=max_model_len, trust_remote_code=trust_remote_code,
                       gpu_memory_utilization=gpu_memory_utilization)
        self.tokenizer = self.llm.get_tokenizer()

    def _text(self, request: Request) -> str:
        if isinstance(request.prompt, str):
            return request.prompt
        return self.tokenizer.apply_chat_template(request.prompt, tokenize=False, add_generation_prompt=True)

    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        from vllm import SamplingParams as VSP

        sp = VSP(n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                 stop=list(params.stop) or None, seed=params.seed, skip_special_tokens=False)
        outs = self.llm.generate([self._text(r) for r in requests], sp)
        return [[Generation(text=c.text, finish_reason=c.finish_reason or "stop", tokens=len(c.token_ids))
                 for c in o.outputs] for o in outs]

    def _prompt_logprobs(self, texts: list[str]) -> list[list[tuple[int, float]]]:
        """(token id, log-prob) of every prompt token after the first, via vLLM's ``prompt_logprobs``."""
        from vllm import SamplingParams as VSP

        outs = self.llm.generate(texts, VSP(max_tokens=1, prompt_logprobs=0, temperature=0.0))
        rows = []
        for o in outs:
            ids = o.prompt_token_ids
            rows.append([(ids[i], lp[ids[i]].logprob) for i, lp in enumerate(o.prompt_logprobs) if lp])
        return rows

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        prompts = [self._text(r) for r in requests]
        n_prompt = [len(self.tokenizer(p)["input_ids"]) for p in prompts]
        rows = self._prompt_logprobs([p + c for p, c in zip(prompts, continuations)])
        return [sum(v for _, v in row[n - 1:]) for row, n in zip(rows, n_prompt)]

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        values = self.score([r for r in requests for _ in tokens], [t for _ in requests for t in tokens])
        it = iter(values)
        return [{t: next(it) for t in tokens} for _ in requests]

"""The ``openai`` backend: any OpenAI-compatible server (vLLM's, TGI, a hosted API), called asynchronously with
bounded concurrency, retries with exponential backoff and timeouts.

The API key is read from the environment variable named by ``api_key_env`` when a request is sent; it is never
stored in the object's fields, its repr, the cache key, logs or error messages.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in RETRY_STATUS
    return isinstance(exc, (httpx.TransportError, httpx.TimeoutException))


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model_id = model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.base_url!r}, model={self.model_id!r}, key from ${self.api_key_env})"

    # ------------------------------------------------------------------------------------------- transport
    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _post(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, path: str, body: dict) -> dict:
        async with sem:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.max_retries),
                wait=wait_exponential(multiplier=0.5, max=8), reraise=True,
            ):
                with attempt:
                    response = await client.post(f"{self.base_url}{path}", json=body, headers=self._headers())
                    response.raise_for_status()
                    return response.json()
        raise AssertionError("unreachable")

    def _run(self, path: str, bodies: list[dict]) -> list[dict | BaseException]:
        async def main() -> list[dict | BaseException]:
            sem = asyncio.Semaphore(self.concurrency)
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                return await asyncio.gather(*(self._post(client, sem, path, b) for b in bodies),
                                            return_exceptions=True)

        return asyncio.run(main())

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, httpx.HTTPStatusError):
            return f"HTTP {exc.response.status_code} from {self.base_url}: {exc.response.text[:300]}"
        return f"{type(exc).__name__} calling {self.base_url} after {self.max_retries} attempts: {exc}"

    # ------------------------------------------------------------------------------------------- contract
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        common: dict[str, Any] = {"model": self.model_id, "max_tokens": params.max_new_tokens,
                                  "temperature": params.temperature, "top_p": params.top_p, "n": params.n,
                                  "seed": params.seed, **({"stop": list(params.stop)} if params.stop else {})}
        chat = [not isinstance(r.prompt, str) for r in requests]
        bodies = [{**common, "messages": r.prompt} if c else {**common, "prompt": r.prompt}
                  for r, c in zip(requests, chat)]
        out: list[list[Generation]] = []
        # one gather per endpoint keeps concurrency bounded across the whole batch
        results: dict[int, dict | BaseException] = {}
        for is_chat, path in ((True, "/chat/completions"), (False, "/completions")):
            idx = [i for i, c in enumerate(chat) if c == is_chat]
            if idx:
                results.update(zip(idx, self._run(path, [bodies[i] for i in idx])))
        for i in range(len(requests)):
            res = results[i]
            if isinstance(res, BaseException):
                out.append([Generation(text="", finish_reason="error", error=self._describe(res))] * params.n)
                continue
            out.append([
                Generation(text=(c.get("message") or {}).get("content") or c.get("text") or "",
                           finish_reason=c.get("finish_reason") or "stop",
                           tokens=int((res.get("usage") or {}).get("completion_tokens", 0)) // max(1, params.n))
                for c in res["choices"]
            ])
        return out

    def _echo_logprobs(self, texts: list[str], prompts: list[str]) -> list[list[float]]:
        """Log-probabilities of the tokens of each ``text`` that lie after its ``prompt`` (server echo)."""
        bodies = [{"model": self.model_id, "prompt": t, "max_tokens": 0, "echo": True, "logprobs": 0,
                   "temperature": 0.0} for t in texts]
        out = []
        for res, prompt in zip(self._run("/completions", bodies), prompts):
            if isinstance(res, BaseException):
                raise GenerationError(f"openai backend: scoring failed: {self._describe(res)}")
            lp = (res["choices"][0].get("logprobs") or {})
            offsets, values = lp.get("text_offset"), lp.get("token_logprobs")
            if not offsets or values is None:
                raise GenerationError(f"openai backend: {self.base_url} returned no echoed log-probabilities; "
                                      "scoring needs a server with echo + logprobs on /completions (vLLM has it)")
            out.append([v for off, v in zip(offsets, values) if off >= len(prompt) and v is not None])
        return out

    def _text(self, request: Request) -> str:
        if not isinstance(request.prompt, str):
            raise GenerationError("openai backend: score / next_token_logprobs need plain-text prompts (render "
                                  "the chat template first); chat endpoints return no prompt log-probabilities")
        return request.prompt

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        prompts = [self._text(r) for r in requests]
        return [sum(v) for v in self._echo_logprobs([p + c for p, c in zip(prompts, continuations)], prompts)]

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        """Each candidate is scored by echoing prompt + token: tokens far down the ranking (new special tokens)
        are scored too, which a top-k ``logprobs`` list would miss."""
        prompts = [self._text(r) for r in requests]
        texts = [p + t for p in prompts for t in tokens]
        values = self._echo_logprobs(texts, [p for p in prompts for _ in tokens])
        out, it = [], iter(values)
        for _ in prompts:
            row = {}
            for t in tokens:
                lp = next(it)
                if len(lp) != 1:
                    raise GenerationError(f"openai backend: {t!r} is {len(lp)} tokens for {self.model_id}, "
                                          "not one; next_token_logprobs takes single tokens")
                row[t] = lp[0]
            out.append(row)
        return out

"""The ``openai`` backend: any OpenAI-compatible server (vLLM's, TGI, a hosted API), called asynchronously with
bounded concurrency, retries with exponential backoff, and timeouts.

- ``generate``: ``/v1/completions`` for string prompts, ``/v1/chat/completions`` for messages (the server applies
  the chat template; ``meta["assistant_prefix"]`` is sent as an open assistant turn, vLLM's
  ``continue_final_message``). A request that still fails after its retries becomes ``Generation(error=...)``.
- ``score`` / ``next_token_logprobs``: prompts are turned into token ids by the server (vLLM's ``/tokenize``, chat
  template included), then ``/v1/completions`` echoes prompt + continuation with ``max_tokens=0, logprobs=0``
  and the continuation's log-probabilities are read back. Each candidate token is scored by its own echo, so a
  token far down the ranking (a newly added special token) is scored exactly, which a top-k list would miss.
  Servers without ``/tokenize`` or echoed log-probabilities raise :class:`GenerationError` saying so.
- Retried: connection errors, timeouts, HTTP 408/409/429 and 5xx (honouring ``Retry-After``); other HTTP errors
  fail at once with the server's message.

The API key is read from the environment variable named by ``api_key_env`` each time a request is sent. It is
never stored on the object, and never appears in its repr, the cache key, log lines or error messages.

``model_id`` is only the served model name, so the on-disk cache keys a call by :attr:`OpenAIBackend.cache_identity`:
the model name, the server (``base_url`` without any ``user:password@``, query or fragment) and ``extra_body``
(which changes the output, e.g. vLLM's ``skip_special_tokens``). Another server or another ``extra_body`` is another
cache entry, never a stale answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from omnimed.generation.render import assistant_prefix
from omnimed.generation.types import Generation, GenerationError, Request, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_STATUS = frozenset({408, 409, 429})


class _Failed(Exception):
    """One request's final failure, already described without secrets."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        return code in RETRY_STATUS or code >= 500
    return isinstance(exc, httpx.TransportError)  # connection refused/reset, timeouts, protocol errors


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # handed back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=worker, name="omnimed-openai")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class OpenAIBackend:
    """``base_url`` ends in ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``); ``model`` is the served model name.

    ``concurrency``: requests in flight at once; ``timeout``: seconds per attempt; ``max_retries``: retries after
    the first attempt; ``backoff``: first wait in seconds, doubled each retry up to ``max_backoff``.
    ``extra_body``: fields merged into every completion request (e.g. vLLM's ``skip_special_tokens: false`` so
    added special tokens survive in generated text).
    """

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
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.model_id = model
        self.api_key_env = api_key_env
        self.concurrency = max(1, int(concurrency))
        self.timeout = float(timeout)
        self.max_retries = max(0, int(max_retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.extra_body = dict(extra_body or {})

    def __repr__(self) -> str:
        return (f"OpenAIBackend({self.base_url!r}, model={self.model_id!r}, key from ${self.api_key_env}, "
                f"concurrency={self.concurrency})")

    @property
    def cache_identity(self) -> str:
        """What the call cache keys this backend's answers by: the served model, the server and ``extra_body``
        (sorted JSON). Credentials are never part of it: the key lives in the environment, and a ``user:pass@`` in
        ``base_url`` as well as its query and fragment are dropped."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        server = urlunsplit((parts.scheme.lower(), netloc.lower(), parts.path.rstrip("/"), "", ""))
        body = json.dumps(self.extra_body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        return f"{self.model_id}@{server}#{body}"

    # ------------------------------------------------------------------------------------------- transport
    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def _redact(self, text: str) -> str:
        key = self._key()
        return text.replace(key, "***") if key else text

    def _describe(self, exc: BaseException, url: str, attempts: int) -> str:
        if isinstance(exc, httpx.HTTPStatusError):
            body = exc.response.text.strip().replace("\n", " ")[:300]
            what = f"HTTP {exc.response.status_code} from {url}: {body}"
        elif isinstance(exc, httpx.TimeoutException):
            what = f"timed out after {self.timeout:g} s calling {url} ({type(exc).__name__})"
        elif isinstance(exc, httpx.TransportError):
            what = f"cannot reach {url} ({type(exc).__name__}: {exc})"
        else:
            what = f"{type(exc).__name__} calling {url}: {exc}"
        tries = f"after {attempts} attempt{'s' if attempts > 1 else ''}"
        return self._redact(f"openai backend ({self.model_id}): {what} [{tries}]")

    def _wait(self, state: RetryCallState) -> float:
        """Exponential backoff, or the server's ``Retry-After`` (capped) when it sends one."""
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, httpx.HTTPStatusError):
            after = exc.response.headers.get("retry-after", "")
            if after.replace(".", "", 1).isdigit():
                return min(float(after), self.max_backoff)
        return min(self.backoff * 2 ** (state.attempt_number - 1), self.max_backoff)

    async def _post(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, url: str, body: dict) -> dict:
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("%s; retrying (%d/%d)", self._describe(exc, url, state.attempt_number),
                        state.attempt_number, self.max_retries)

        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.max_retries + 1),
                wait=self._wait, before_sleep=before_sleep, reraise=True,
            ):
                with attempt:
                    attempts += 1
                    async with sem:
                        response = await client.post(url, json=body, headers=headers)
                    response.raise_for_status()
                    return response.json()
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a body that is not JSON
            raise _Failed(self._describe(exc, url, attempts)) from None
        raise AssertionError("unreachable")

    def _post_all(self, calls: Sequence[tuple[str, dict]]) -> list[dict | _Failed]:
        """POST every ``(url, body)`` with at most ``concurrency`` in flight; failures are returned, not raised."""

        async def main() -> list[dict | _Failed]:
            sem = asyncio.Semaphore(self.concurrency)
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
                results = await asyncio.gather(*(self._post(client, sem, u, b) for u, b in calls),
                                               return_exceptions=True)
            for r in results:  # anything but a described failure is a bug: surface it
                if isinstance(r, BaseException) and not isinstance(r, _Failed):
                    raise r
            return list(results)  # type: ignore[arg-type]

        return _run_sync(main()) if calls else []

    # ------------------------------------------------------------------------------------------- generate
    def _completion_body(self, request: Request, params: SamplingParams) -> tuple[str, dict]:
        body: dict[str, Any] = {"model": self.model_id, "max_tokens": params.max_new_tokens,
                                "temperature": params.temperature, "top_p": params.top_p, "n": params.n,
                                "seed": params.seed, **self.extra_body}
        if params.stop:
            body["stop"] = list(params.stop)
        prefix = assistant_prefix(request)
        if isinstance(request.prompt, str):
            return f"{self.base_url}/completions", {**body, "prompt": request.prompt + prefix}
        if prefix:  # start the assistant's reply: an open final assistant message
            messages = [*request.prompt, {"role": "assistant", "content": prefix}]
            body.update(add_generation_prompt=False, continue_final_message=True)
        else:
            messages = list(request.prompt)
        return f"{self.base_url}/chat/completions", {**body, "messages": messages}

    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        results = self._post_all([self._completion_body(r, params) for r in requests])
        out: list[list[Generation]] = []
        for res in results:
            if isinstance(res, _Failed):
                out.append([Generation(text="", finish_reason="error", error=str(res)) for _ in range(params.n)])
                continue
            choices = sorted(res.get("choices") or [], key=lambda c: c.get("index", 0))
            if not choices:
                err = self._redact(f"openai backend ({self.model_id}): reply without choices: {str(res)[:300]}")
                out.append([Generation(text="", finish_reason="error", error=err) for _ in range(params.n)])
                continue
            used = int((res.get("usage") or {}).get("completion_tokens") or 0)
            out.append([
                Generation(text=(c.get("message") or {}).get("content") or c.get("text") or "",
                           finish_reason=c.get("finish_reason") or "stop", tokens=used // len(choices))
                for c in choices
            ])
        return out

    # ------------------------------------------------------------------------------------------- scoring
    def _tokenize_body(self, request: Request, continuation: str = "") -> dict:
        prefix = assistant_prefix(request) + continuation
        if isinstance(request.prompt, str):
            return {"model": self.model_id, "prompt": request.prompt + prefix, "add_special_tokens": True}
        if prefix:
            return {"model": self.model_id, "messages": [*request.prompt, {"role": "assistant", "content": prefix}],
                    "add_generation_prompt": False, "continue_final_message": True}
        return {"model": self.model_id, "messages": list(request.prompt), "add_generation_prompt": True}

    def _tokenize(self, bodies: Sequence[dict]) -> list[list[int]]:
        url = f"{self.root}/tokenize"
        out = []
        for res in self._post_all([(url, b) for b in bodies]):
            if isinstance(res, _Failed):
                hint = (" (this server has no /tokenize: scoring needs vLLM's OpenAI-compatible server)"
                        if "HTTP 404" in str(res) or "HTTP 405" in str(res) else "")
                raise GenerationError(f"{res}{hint}")
            if not isinstance(res.get("tokens"), list):
                raise GenerationError(f"openai backend ({self.model_id}): {url} returned no token ids; scoring "
                                      "needs vLLM's /tokenize")
            out.append([int(t) for t in res["tokens"]])
        return out

    def _echo(self, sequences: Sequence[list[int]]) -> list[list[float | None]]:
        """The log-probability of every token of each id sequence given the ones before it (the first: None)."""
        body = {"model": self.model_id, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0.0}
        url = f"{self.base_url}/completions"
        out = []
        for ids, res in zip(sequences, self._post_all([(url, {**body, "prompt": ids}) for ids in sequences])):
            if isinstance(res, _Failed):
                raise GenerationError(str(res))
            choice = (res.get("choices") or [{}])[0]
            values = (choice.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(values, list) or len(values) < len(ids):
                raise GenerationError(
                    f"openai backend ({self.model_id}): {self.base_url} returned no echoed prompt log-probabilities; "
                    "score / next_token_logprobs need a server that supports logprobs with echo on /v1/completions "
                    "(vLLM does)")
            out.append(values[: len(ids)])
        return out

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        """Sum of the log-probabilities of the tokens after the common prefix of tokenize(prompt) and
        tokenize(prompt + continuation): the same tokens the ``hf`` backend scores."""
        if len(requests) != len(continuations):
            raise GenerationError(f"openai backend: {len(requests)} requests but {len(continuations)} continuations")
        ids = self._tokenize([self._tokenize_body(r) for r in requests]
                             + [self._tokenize_body(r, c) for r, c in zip(requests, continuations)])
        prompts, fulls = ids[: len(requests)], ids[len(requests):]
        starts = []
        for p, f in zip(prompts, fulls):
            k = 0
            while k < min(len(p), len(f)) and p[k] == f[k]:
                k += 1
            starts.append(max(k, 1))
        todo = [i for i, f in enumerate(fulls) if len(f) > starts[i]]
        out = [0.0] * len(requests)
        for i, values in zip(todo, self._echo([fulls[i] for i in todo])):
            out[i] = float(sum(v for v in values[starts[i]:] if v is not None))
        return out

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        cand = self._tokenize([{"model": self.model_id, "prompt": t, "add_special_tokens": False} for t in tokens])
        for t, ids in zip(tokens, cand):
            if len(ids) != 1:
                raise GenerationError(f"openai backend ({self.model_id}): {t!r} is not one token of the served "
                                      f"model's vocabulary (it encodes to {len(ids)} tokens: {ids}); add it as "
                                      "a special token to score it")
        prompts = self._tokenize([self._tokenize_body(r) for r in requests])
        values = iter(self._echo([p + ids for p in prompts for ids in cand]))
        return [{t: float(next(values)[-1]) for t in tokens} for _ in prompts]

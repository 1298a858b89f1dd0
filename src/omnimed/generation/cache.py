"""An on-disk cache in front of any backend: rerunning a stage costs no calls, an interrupted stage resumes.

Every request is keyed by sha256 of (backend, model, method, prompt, meta, and the sampling parameters /
continuation / token set); results live in one SQLite file (WAL mode, so several processes can share it), written
as each batch completes. Failed generations (``Generation.error``) are not cached, so a rerun retries them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omnimed.generation.types import Backend, Generation, Request, SamplingParams


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


class CachedBackend:
    """``backend`` with every call memoised in ``<cache_dir>/generation.sqlite``; ``hits``/``misses`` count
    requests served from the cache and sent to the backend."""

    def __init__(self, backend: Backend, cache_dir: str | Path, *, batch_size: int = 32) -> None:
        self.backend = backend
        self.name = backend.name
        self.model_id = backend.model_id
        self.batch_size = batch_size
        self.hits = 0
        self.misses = 0
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / "generation.sqlite"
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=60)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()

    def __repr__(self) -> str:
        return f"CachedBackend({self.backend!r}, {self.path})"

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------------------------------- the contract
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        p = dataclasses.asdict(params)
        return self._cached(
            "generate", requests, [p] * len(requests),
            lambda reqs, _: self.backend.generate(reqs, params),
            encode=lambda gens: [dataclasses.asdict(g) for g in gens],
            decode=lambda raw: [Generation(**g) for g in raw],
            cacheable=lambda gens: all(g.error is None for g in gens),
        )

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        return self._cached("score", requests, list(continuations),
                            lambda reqs, extra: self.backend.score(reqs, extra))

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        toks = sorted(tokens)
        return self._cached("next_token_logprobs", requests, [toks] * len(requests),
                            lambda reqs, _: self.backend.next_token_logprobs(reqs, toks))

    # ------------------------------------------------------------------------------------------- internals
    def _cached(
        self,
        method: str,
        requests: Sequence[Request],
        extras: list[Any],
        call: Callable[[list[Request], list[Any]], list[Any]],
        *,
        encode: Callable[[Any], Any] = lambda x: x,
        decode: Callable[[Any], Any] = lambda x: x,
        cacheable: Callable[[Any], bool] = lambda x: True,
    ) -> list[Any]:
        keys = [_key(self.name, self.model_id, method, r.prompt, r.meta, e) for r, e in zip(requests, extras)]
        out: list[Any] = [None] * len(requests)
        todo: list[int] = []
        with self._lock:
            for i, key in enumerate(keys):
                row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
                if row is None:
                    todo.append(i)
                else:
                    out[i] = decode(json.loads(row[0]))
        self.hits += len(requests) - len(todo)
        self.misses += len(todo)
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            results = call([requests[i] for i in batch], [extras[i] for i in batch])
            with self._lock:
                for i, result in zip(batch, results):
                    out[i] = result
                    if cacheable(result):
                        self._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?)",
                                         (keys[i], json.dumps(encode(result))))
                self._db.commit()
        return out

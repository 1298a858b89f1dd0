"""An on-disk cache in front of any backend: rerunning a stage costs no calls, an interrupted stage resumes.

Every request is keyed by sha256 of (backend name, model identity, method, prompt, meta, and the sampling
parameters / continuation / token set). The model identity is the backend's ``cache_identity`` where it has one
(the ``openai`` backend: served model, server URL and extra request fields, since its ``model_id`` is only the
served name), else its ``model_id`` (which for ``hf`` / ``vllm`` already fingerprints the weights). Results live in
one SQLite file (WAL mode, so readers and another writer can share it), one row per request, committed as each batch
of requests completes: a stage killed midway keeps every finished batch. Generations that failed
(``Generation.error``) are not stored, so a rerun retries them. With greedy decoding the seed and ``top_p`` do not
change the output and are left out of the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omnimed.generation.types import Backend, Generation, Request, SamplingParams

FILENAME = "generation.sqlite"


def request_key(backend: str, model_id: str, method: str, request: Request, extra: Any) -> str:
    """The cache key of one request: stable across processes and Python versions (sorted-key JSON)."""
    payload = [backend, model_id, method, request.prompt, request.meta, extra]
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _params_key(params: SamplingParams) -> dict[str, Any]:
    p = dataclasses.asdict(params)
    p["stop"] = list(p["stop"])
    if params.temperature <= 0:  # greedy: neither the seed nor top_p changes the output
        p.pop("seed")
        p.pop("top_p")
    return p


class CachedBackend:
    """``backend`` with every call memoised in ``<cache_dir>/generation.sqlite``.

    ``hits`` / ``misses`` count requests answered without a backend call (from the file, or a repeat within the
    same call) and requests sent to the backend. ``batch_size``:
    requests per backend call, each batch committed when it returns (the unit of resumption).
    """

    def __init__(self, backend: Backend, cache_dir: str | Path, *, batch_size: int = 32) -> None:
        self.backend = backend
        self.name = backend.name
        self.model_id = backend.model_id
        # what keys the answers: more than the model's name where the backend says so (server, request options)
        self.identity = str(getattr(backend, "cache_identity", None) or backend.model_id)
        self.batch_size = max(1, int(batch_size))
        self.hits = 0
        self.misses = 0
        folder = Path(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILENAME
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=60)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, method TEXT NOT NULL, "
                         "value TEXT NOT NULL, created REAL NOT NULL)")
        self._db.commit()

    def __repr__(self) -> str:
        return f"CachedBackend({self.backend!r}, {self.path}, hits={self.hits}, misses={self.misses})"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> CachedBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    # ------------------------------------------------------------------------------------------- the contract
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[list[Generation]]:
        return self._cached(
            "generate", requests, [_params_key(params)] * len(requests),
            lambda reqs, _: self.backend.generate(reqs, params),
            encode=lambda gens: [dataclasses.asdict(g) for g in gens],
            decode=lambda raw: [Generation(**g) for g in raw],
            keep=lambda gens: all(g.error is None for g in gens),
        )

    def score(self, requests: Sequence[Request], continuations: Sequence[str]) -> list[float]:
        return self._cached("score", requests, list(continuations),
                            lambda reqs, conts: self.backend.score(reqs, conts))

    def next_token_logprobs(self, requests: Sequence[Request], tokens: Sequence[str]) -> list[dict[str, float]]:
        toks = list(tokens)
        key = sorted(set(toks))
        return self._cached("next_token_logprobs", requests, [key] * len(requests),
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
        keep: Callable[[Any], bool] = lambda x: True,
    ) -> list[Any]:
        keys = [request_key(self.name, self.identity, method, r, e) for r, e in zip(requests, extras)]
        out: list[Any] = [None] * len(requests)
        first: dict[str, int] = {}  # key -> first index asking for it (repeats within a call are asked once)
        with self._lock:
            for i, key in enumerate(keys):
                if key in first:
                    continue
                row = self._db.execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
                if row is None:
                    first[key] = i
                else:
                    out[i] = decode(json.loads(row[0]))
        todo = list(first.values())
        self.misses += len(todo)
        self.hits += len(requests) - len(todo)
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            results = call([requests[i] for i in batch], [extras[i] for i in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name} returned {len(results)} results for {len(batch)} requests")
            rows = []
            for i, result in zip(batch, results):
                out[i] = result
                if keep(result):
                    rows.append((keys[i], method, json.dumps(encode(result)), time.time()))
            with self._lock:
                self._db.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", rows)
                self._db.commit()
        for i, key in enumerate(keys):  # repeats of a request within this call
            if out[i] is None:
                out[i] = out[first[key]]
        return out

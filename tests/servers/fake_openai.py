"""A small scripted OpenAI-compatible server on 127.0.0.1 for fast client tests: failures, slowness, missing
features and what the client sent, all under the test's control.

Its "tokenizer" maps each character to one token id (``ord(c)``) and every echoed prompt token gets log-probability
``TOKEN_LOGPROB``, so expected scores are easy to compute by hand.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_LOGPROB = -0.5


@dataclass
class Script:
    """What the server does. ``fail``: status codes to answer the first requests with, in order (then succeed);
    ``retry_after``: sent with 429s; ``echo_logprobs`` / ``tokenize``: whether those features exist;
    ``leak_auth``: error bodies quote the Authorization header (a careless server)."""

    fail: list[int] = field(default_factory=list)
    retry_after: str | None = None
    delay: float = 0.0
    echo_logprobs: bool = True
    tokenize: bool = True
    leak_auth: bool = False


@dataclass
class Record:
    """What the server saw."""

    paths: list[str] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _text_of(body: dict) -> str:
    if "messages" in body:
        return "".join(m["content"] for m in body["messages"])
    return body.get("prompt", "")


class _Handler(BaseHTTPRequestHandler):
    script: Script
    record: Record

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        rec, script = self.record, self.script
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with rec.lock:
            rec.paths.append(self.path)
            rec.bodies.append(body)
            rec.auth.append(self.headers.get("Authorization"))
            n = len(rec.paths)
            rec.in_flight += 1
            rec.max_in_flight = max(rec.max_in_flight, rec.in_flight)
        try:
            if script.delay:
                time.sleep(script.delay)
            if n <= len(script.fail):
                status = script.fail[n - 1]
                msg = f"scripted failure {status}"
                if script.leak_auth:
                    msg += f" (you sent {self.headers.get('Authorization')})"
                headers = {"Retry-After": script.retry_after} if status == 429 and script.retry_after else {}
                self._send(status, {"error": {"message": msg}}, headers)
                return
            self._answer(body)
        finally:
            with rec.lock:
                rec.in_flight -= 1

    def _answer(self, body: dict) -> None:
        if self.path == "/tokenize":
            if not self.script.tokenize:
                self._send(404, {"detail": "Not Found"})
                return
            self._send(200, {"tokens": [ord(c) for c in _text_of(body)]})
        elif self.path == "/v1/completions":
            prompt = body.get("prompt")
            if body.get("echo"):
                ids = prompt if isinstance(prompt, list) else [ord(c) for c in prompt]
                logprobs = None
                if self.script.echo_logprobs:
                    logprobs = {"token_logprobs": [None] + [TOKEN_LOGPROB] * (len(ids) - 1)}
                self._send(200, {"choices": [{"index": 0, "text": "", "logprobs": logprobs}]})
                return
            n = int(body.get("n", 1))
            self._send(200, {"choices": [{"index": i, "text": f"echo:{prompt}", "finish_reason": "length"}
                                         for i in range(n)], "usage": {"completion_tokens": 3 * n}})
        elif self.path == "/v1/chat/completions":
            last = body["messages"][-1]["content"]
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"chat:{last}"},
                                          "finish_reason": "stop"}], "usage": {"completion_tokens": 2}})
        else:
            self._send(404, {"detail": "Not Found"})


@contextmanager
def fake_openai_server(script: Script | None = None) -> Iterator[tuple[str, Record]]:
    """Yields (base URL ending in ``/v1``, the record of what was received); stops the server on exit."""
    record = Record()
    handler = type("Handler", (_Handler,), {"script": script or Script(), "record": record})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", record
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

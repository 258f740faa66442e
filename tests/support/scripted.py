"""A real OpenAI-compatible chat-completions server on loopback that answers
from a script, for deterministic tests and benchmarks of the client path.

Stdlib only: a ``ThreadingHTTPServer`` in a daemon thread on 127.0.0.1 (a free
port). Each ``POST /v1/chat/completions`` consumes the next :class:`Step` of a
list script (or calls a callable script with the request body); a step either
answers normally or injects a fault:

=============  ==============================================================
``"500"``      HTTP 500 with an OpenAI-style JSON error body
``"429"``      HTTP 429, header ``retry-after: 0``, JSON error body
``"slow"``     sleep ``delay_s`` (2 s if unset), then answer normally
``"truncated"`` 200; content cut to half its length, finish_reason "length"
``"garbage"``  200 with body ``<html>not json`` and content-type text/html
``"badjson"``  200 with body ``{"choices": [`` and content-type application/json
``"disconnect"`` close the socket without sending any response
``"4xx"``/``"5xx"`` any other HTTP error status (e.g. ``"403"``, ``"503"``), JSON error body
=============  ==============================================================

A request with ``"stream": true`` gets server-sent events, one word per chunk
(a "slow" step spreads its delay over the words, like a model generating; a
usage chunk when ``stream_options.include_usage``); a client that closes the
stream early is recorded in ``abandoned`` and the rest is never sent.

Usage is counted in whitespace-separated words: prompt_tokens over the content
of all request messages, completion_tokens over the reply. A reply longer than
the request's ``max_tokens`` is cut to that many words (finish_reason "length").

    with ScriptedServer(["hello", Step(fault="429"), "again"]) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = (None, "500", "429", "slow", "truncated", "garbage", "badjson", "disconnect")
# Every HTTP error status a step may answer with (the client's retry set is tested status by status).
STATUSES = tuple(str(code) for code in range(400, 600))
SLOW_DEFAULT_S = 2.0


@dataclass
class Step:
    """One scripted answer: a reply, optionally with a fault injected."""

    reply: str = ""
    fault: str | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS and self.fault not in STATUSES:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULTS[1:]} or an HTTP status 400-599")


Script = list[Step | str] | Callable[[dict], Step | str]


def _as_step(item: Step | str) -> Step:
    if isinstance(item, Step):
        return item
    if isinstance(item, str):
        return Step(reply=item)
    raise TypeError(f"script items must be Step or str, got {type(item).__name__}")


def _words(text: str) -> int:
    return len(text.split())


def _pieces(text: str) -> list[str]:
    """`text` as one piece per word (with the whitespace after it); joined they give `text` back."""
    lead = text[: len(text) - len(text.lstrip())]
    pieces = re.findall(r"\S+\s*", text[len(lead):])
    if pieces:
        pieces[0] = lead + pieces[0]
    return pieces or ([lead] if lead else [])


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _error_body(message: str, type_: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # bursts of concurrent clients must not hit SYN retries
    owner: "ScriptedServer"

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        # Clients that time out or drop connections (the point of "slow" and
        # "disconnect") make writes fail; nothing to report.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle on, the body waits for a
    # delayed ACK (~40 ms per call on Linux loopback).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # silence the per-request stderr line

    # -- helpers ---------------------------------------------------------
    def _send_json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self._send_raw(status, data, "application/json", headers)

    def _send_raw(self, status: int, data: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _record_auth(self) -> None:
        auth = self.headers.get("Authorization")
        if auth is not None:
            self.server.owner._record_auth(auth)

    # -- routes ----------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        self._record_auth()
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            model = self.server.owner.model
            self._send_json(200, {"object": "list",
                                  "data": [{"id": model, "object": "model", "created": 0,
                                            "owned_by": "scripted"}]})
        else:
            self._send_json(404, _error_body(f"no route GET {path}", "invalid_request_error"))

    def do_POST(self) -> None:  # noqa: N802
        self._record_auth()
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path != "/v1/chat/completions":
            self._send_json(404, _error_body(f"no route POST {path}", "invalid_request_error"))
            return
        try:
            body = json.loads(raw or b"null")
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as err:
            self._send_json(400, _error_body(f"malformed JSON body: {err}", "invalid_request_error"))
            return
        owner = self.server.owner
        owner._record_request(body)
        try:
            step = owner._next_step(body)
        except Exception as err:  # a callable script that raises
            self._send_json(500, _error_body(f"script failed: {type(err).__name__}: {err}",
                                             "server_error"))
            return
        if step is None:
            self._send_json(500, _error_body("script exhausted", "server_error"))
            return
        self._answer(body, step)

    def _answer(self, body: dict, step: Step) -> None:
        owner = self.server.owner
        delay = step.delay_s
        if step.fault == "slow" and delay <= 0:
            delay = SLOW_DEFAULT_S
        if body.get("stream") and step.fault in (None, "slow", "truncated"):
            self._stream(body, *self._content(body, step), delay)
            return
        if delay > 0 and owner._stopping.wait(delay):
            self.close_connection = True  # server stopping: give up quietly
            return
        fault = step.fault
        if fault == "disconnect":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault == "500":
            self._send_json(500, _error_body("scripted fault: internal server error",
                                             "server_error"))
            return
        if fault == "429":
            self._send_json(429, _error_body("scripted fault: rate limit exceeded",
                                             "rate_limit_error", "rate_limit_exceeded"),
                            headers={"retry-after": "0"})
            return
        if fault in STATUSES:
            self._send_json(int(fault), _error_body(f"scripted fault: HTTP {fault}", "scripted_error"))
            return
        if fault == "garbage":
            self._send_raw(200, b"<html>not json", "text/html")
            return
        if fault == "badjson":
            self._send_raw(200, b'{"choices": [', "application/json")
            return
        self._send_json(200, owner._completion(body, *self._content(body, step)))

    @staticmethod
    def _content(body: dict, step: Step) -> tuple[str, str]:
        """The reply and its finish_reason: cut in half ("truncated") or to max_tokens words."""
        content, finish = step.reply, "stop"
        if step.fault == "truncated":
            content, finish = content[: len(content) // 2], "length"
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) \
                and _words(content) > max_tokens:
            content, finish = " ".join(content.split()[:max(max_tokens, 0)]), "length"
        return content, finish

    def _stream(self, body: dict, content: str, finish: str, delay: float) -> None:
        """Server-sent events, one word per chunk, `delay` spread over the words (like a model
        generating); a client that leaves mid-stream is recorded in `owner.abandoned` and the
        rest of the reply is never produced."""
        owner = self.server.owner
        self.close_connection = True    # the body ends when the connection closes
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        pieces = _pieces(content)
        chunks = [owner._chunk(body, {"role": "assistant", "content": ""}, None)]
        chunks += [owner._chunk(body, {"content": piece}, None) for piece in pieces]
        chunks.append(owner._chunk(body, {}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = owner._completion(body, content, finish)["usage"]
            chunks.append({**owner._chunk(body, {}, None), "choices": [], "usage": usage})
        pause = delay / max(1, len(pieces))
        sent = 0
        try:
            for i, chunk in enumerate(chunks):
                if 0 < i <= len(pieces) and pause > 0 and owner._stopping.wait(pause):
                    return
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                sent += 0 < i <= len(pieces)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:     # broken pipe / reset: the client closed the stream
            owner._record_abandoned(body, sent, len(pieces))


class ScriptedServer:
    """OpenAI-compatible chat server on 127.0.0.1 answering from a script."""

    def __init__(self, script: Script = (), *, default: str | None = None,
                 model: str = "scripted") -> None:
        self.model = model
        self.default = default
        self.requests: list[dict] = []
        self.auth_headers: list[str] = []
        self.abandoned: list[dict] = []   # streamed replies the client closed early: request no., words sent
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        if callable(script):
            self._func: Callable[[dict], Step | str] | None = script
            self._steps: list[Step] = []
        else:
            self._func = None
            self._steps = [_as_step(s) for s in script]

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "ScriptedServer":
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"scripted-llm-{httpd.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptedServer is not running; call start() first")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script ----------------------------------------------------------
    def push(self, *steps: Step | str) -> None:
        """Append steps to a list script."""
        if self._func is not None:
            raise TypeError("push() needs a list script, not a callable one")
        new = [_as_step(s) for s in steps]
        with self._lock:
            self._steps.extend(new)

    @property
    def remaining(self) -> int:
        """Steps left in a list script (0 for a callable script)."""
        with self._lock:
            return len(self._steps)

    def _next_step(self, body: dict) -> Step | None:
        if self._func is not None:
            return _as_step(self._func(body))
        with self._lock:
            if self._steps:
                return self._steps.pop(0)
        return None if self.default is None else Step(reply=self.default)

    def _record_request(self, body: dict) -> None:
        with self._lock:
            self.requests.append(body)

    def _record_abandoned(self, body: dict, sent: int, total: int) -> None:
        with self._lock:
            index = next(i for i, r in enumerate(self.requests) if r is body)
            self.abandoned.append({"request": index, "sent": sent, "words": total})

    def _chunk(self, body: dict, delta: dict, finish: str | None) -> dict:
        return {"id": f"chatcmpl-scripted-{next(self._ids)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model") or self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def _record_auth(self, value: str) -> None:
        with self._lock:
            self.auth_headers.append(value)

    def _completion(self, body: dict, content: str, finish: str) -> dict:
        messages = body.get("messages") or []
        prompt = sum(_words(_content_text(m.get("content"))) for m in messages
                     if isinstance(m, dict))
        completion = _words(content)
        return {
            "id": f"chatcmpl-scripted-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
                "logprobs": None,
            }],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }


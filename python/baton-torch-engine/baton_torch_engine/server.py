"""baton-torch-engine's HTTP API, as the router expects of an engine (the reference
engine's, standby/engine_api.h):

    POST /v1/completions, /v1/chat/completions  OpenAI-compatible, streamed as server-sent
                 events when asked; every choice carries its token ids, the first event (or
                 the answer) the prompt's, and each response its seed, so that a router can
                 replay an interrupted request on token ids
    GET  /health   200 {"status":"ok"} while serving; 503 while a standby or stopping
    GET  /v1/models  the served model
    GET  /metrics  Prometheus text

Given engine keys (BATON_ENGINE_KEYS, as the controller launches it with `[engine] key_file`),
it serves a route other than GET /health and GET /metrics only when the request carries
`Authorization: Bearer KEY` with one of them, and answers any other 401 (the reference
engine's proto/http/engine_key.h); as there, an unknown path is 404 and a route's other
method 405, key or no key. A standby answers the completion routes 503 with
Retry-After. Each connection has its own thread (keep-alive, HTTP/1.1); the requests of all of
them are batched on the compute thread (the Generator's scheduler).

This module holds the routes and serve(); the transport under them (timeouts, framing, the
JSON refusals, a client gone) is http_base.py's, the /metrics text metrics.py's.
"""
from __future__ import annotations

import hmac
import json
import os
import string
import threading
import time
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

from .http_base import BaseHandler, EngineHTTPServer
from .metrics import metrics_text
from .openai_requests import ApiError, Completion, Parser, usage

if TYPE_CHECKING:  # generation.py imports PyTorch; the HTTP layer and its tests do without
    from .generation import Generator, Step

MAX_BODY_BYTES = 32 << 20  # 4 x the router's default: a replay resends the prompt as ids

ENGINE_KEYS_ENV = "BATON_ENGINE_KEYS"
ENGINE_KEY_MIN, ENGINE_KEY_MAX = 16, 1024
ENGINE_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "-._~+/=")  # RFC 6750's
ROUTES = {"/health": "GET", "/v1/models": "GET", "/metrics": "GET",
          "/v1/completions": "POST", "/v1/chat/completions": "POST"}  # path: its method
OPEN_ROUTES = frozenset({("GET", "/health"), ("GET", "/metrics")})  # served without a key
KEY_MISSING = ApiError("missing or wrong engine key (Authorization: Bearer KEY)", status=401,
                       code="invalid_api_key", kind="authentication_error")


def engine_key_problem(key: str) -> Optional[str]:
    """What makes `key` no engine key (16 to 1024 characters of A-Z a-z 0-9 - . _ ~ + / =),
    in words that do not repeat it; None for a key."""
    if not ENGINE_KEY_MIN <= len(key) <= ENGINE_KEY_MAX:
        return (f"a key of {len(key)} characters (keys have {ENGINE_KEY_MIN} to "
                f"{ENGINE_KEY_MAX})")
    for i, c in enumerate(key):
        if c not in ENGINE_KEY_CHARS:
            return f"a key with a character out of A-Z a-z 0-9 - . _ ~ + / = at {i + 1}"
    return None


def engine_keys_from_env(environ: Mapping[str, str]) -> list[str]:
    """The keys of BATON_ENGINE_KEYS (comma-separated; none when it is unset or empty), read
    once at start. ValueError naming the variable, the element and what is wrong with it
    (never the key) when an element is empty or no key."""
    text = environ.get(ENGINE_KEYS_ENV, "")
    if not text:
        return []
    keys = text.split(",")
    for n, key in enumerate(keys, 1):
        problem = engine_key_problem(key)
        if problem is not None:
            raise ValueError(f"{ENGINE_KEYS_ENV}, element {n}: {problem}")
    return keys


class State:
    """What the API needs to know: the parser, the generator once there is one, whether the
    engine serves (set by the engine's main thread), and the engine keys a request must carry
    one of (none: every request is served)."""

    def __init__(self, parser: Parser, max_positions: int, keys: Sequence[str] = ()):
        self.parser = parser
        self.max_positions = max_positions
        self.keys = [k.encode("ascii") for k in keys]
        self.generator: Optional[Generator] = None
        self.handoff = None  # the KV handoff (kv_handoff.py), for /metrics
        self.serving = False
        self.stopping = False
        self.responses: dict[int, int] = {}
        self.in_flight = 0
        self.lock = threading.Lock()
        self.next_id = 1
        # The reference engine's HTTP timeouts (proto/http/http_server.h HttpOptions), in
        # seconds: a kept-alive connection's wait for its next request, a request's first
        # byte to its last (408), each write of an answer.
        self.idle_timeout_s, self.request_timeout_s, self.write_timeout_s = 120.0, 30.0, 60.0
        # Connections served at once, a thread each; one past it is answered 503 and closed
        # (http_base.EngineHTTPServer). After a connection's last answer, what its client
        # still sends is read and dropped for linger_s before the close.
        self.max_connections, self.linger_s = 1024, 1.0

    def count(self, status: int) -> None:
        with self.lock:
            self.responses[status] = self.responses.get(status, 0) + 1

    def new_id(self, chat: bool = False) -> str:
        """A response id, `chatcmpl-` for chat as the reference engine's."""
        with self.lock:
            self.next_id += 1
            return f"{'chatcmpl' if chat else 'cmpl'}-{os.getpid():08x}{self.next_id:08x}"


def header(state: State, req: Completion, rid: str, created: int, obj: str) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": req.model, "seed": req.seed}


def original_prompt(req: Completion) -> list[int]:
    """The prompt the client sent: a replay's resumed tokens are its answer's, not its
    prompt's (the reference engine's original_prompt_)."""
    return req.prompt_ids[:len(req.prompt_ids) - req.resume_tokens]


def choice(req: Completion, text: str, finish: str, ids: list[int], first: bool) -> dict:
    part = "delta" if req.chat else "text"
    c: dict = {"index": 0}
    if req.chat:
        c["delta"] = ({"role": "assistant"} if first else {}) | {"content": text}
    else:
        c[part] = text
    c["logprobs"] = None
    c["finish_reason"] = finish or None
    c["token_ids"] = ids
    if first and not req.chat:
        c["prompt_token_ids"] = original_prompt(req)
    return c


class Handler(BaseHandler):
    """The routes: the engine key checked, then /health, /v1/models and /metrics, and the
    completions answered whole or streamed as server-sent events (the transport is
    BaseHandler's, http_base.py)."""

    def _keyed(self) -> bool:
        """Whether this request may be served: no keys, an open route, no route at all (404
        or 405 follows, as the reference engine's key guards its routes only), or
        `Authorization: Bearer K` (the scheme in any case) with K one of the keys, each
        compared in constant time."""
        if not self.state.keys or (self.command, self.path) in OPEN_ROUTES or \
                ROUTES.get(self.path) != self.command:
            return True
        value = (self.headers.get("Authorization") or "").strip(" \t")
        if value[:7].lower() != "bearer ":
            return False
        given = value[7:].encode("latin-1", "replace")  # as http.client decoded it
        matched = False
        for key in self.state.keys:
            matched |= hmac.compare_digest(given, key)
        return matched

    def _refuse_unkeyed(self, length: int) -> None:
        """401 with `WWW-Authenticate: Bearer`. The request's body is read and dropped, so
        that the connection serves its next request; one over MAX_BODY_BYTES is left unread
        and the connection closed."""
        extra = {"WWW-Authenticate": "Bearer"}
        if length > MAX_BODY_BYTES:
            extra["Connection"] = "close"
            self.close_connection = True
        else:
            self._read_body(length)
        self._send(401, KEY_MISSING.body(), extra=extra)

    def _let_through(self, length: int) -> bool:
        """Whether the request, its body of `length` bytes, may go on to its route: False
        once it was answered 401 (no key: _refuse_unkeyed) or 413 (a body over
        MAX_BODY_BYTES, left unread and the connection closed)."""
        if not self._keyed():
            self._refuse_unkeyed(length)
            return False
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            e = ApiError(f"the body is over {MAX_BODY_BYTES} bytes", status=413)
            self._send(413, e.body(), extra={"Connection": "close"})
            return False
        return True

    def _other(self, length: int) -> None:
        if not self._let_through(length):
            return
        self._read_body(length)
        if self.path in ROUTES:
            return self._not_allowed()
        self._error(ApiError(f"no route {self.path}", status=404, kind="not_found_error"))

    def _not_allowed(self) -> None:
        """405 with Allow, as the reference engine's Dispatch answers a route's other
        methods."""
        allow = ROUTES[self.path]
        e = ApiError(f"method {self.command} is not allowed on {self.path}", status=405)
        self._send(405, e.body(), extra={"Allow": allow})

    def _get(self, length: int) -> None:
        s = self.state
        if not self._let_through(length):
            return
        self._read_body(length)
        if ROUTES.get(self.path, "GET") != "GET":
            return self._not_allowed()
        if self.path == "/health":
            status = "ok" if s.serving and not s.stopping else (
                "stopping" if s.stopping else "standby")
            return self._send(200 if status == "ok" else 503,
                              json.dumps({"status": status}).encode())
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [
                {"id": s.parser.served_name, "object": "model", "created": int(time.time()),
                 "owned_by": "baton", "max_model_len": s.max_positions}]}).encode())
        if self.path == "/metrics":
            return self._send(200, metrics_text(s).encode(), "text/plain; version=0.0.4")
        self._error(ApiError(f"no route {self.path}", status=404, kind="not_found_error"))

    def _post(self, length: int) -> None:
        s = self.state
        if not self._let_through(length):
            return
        if ROUTES.get(self.path) != "POST":
            self._read_body(length)
            if self.path in ROUTES:
                return self._not_allowed()
            return self._error(ApiError(f"no route {self.path}", status=404,
                                        kind="not_found_error"))
        # Counted in flight before its body is read and parsed, with the check that the
        # engine serves under the same lock: a drain (main.serve_events) that sets `stopping`
        # either sees it in flight and waits for it, or it is refused.
        with s.lock:
            admitted = s.serving and s.generator is not None and not s.stopping
            if admitted:
                s.in_flight += 1
            standby = not s.serving
        try:
            raw = self._read_body(length)
            try:
                if not admitted:
                    raise ApiError("this engine is a standby and does not serve yet" if standby
                                   else "this engine is stopping", status=503,
                                   kind="server_error")
                req = s.parser.chat(raw) if self.path.endswith("chat/completions") else \
                    s.parser.completion(raw)
            except ApiError as e:
                return self._error(e)
            (self._stream if req.stream else self._whole)(req)
        finally:
            if admitted:
                with s.lock:
                    s.in_flight -= 1

    def _whole(self, req: Completion) -> None:
        ids, text, finish = [], [], ""
        try:  # nothing is written until the end: a client gone is seen by its socket alone
            for step in self.state.generator.run(req, gone=self._client_gone):
                ids.append(step.token)
                text.append(step.text)
                finish = step.finish_reason
        except ApiError as e:
            return self._error(e)
        created, rid = int(time.time()), self.state.new_id(req.chat)
        obj = "chat.completion" if req.chat else "text_completion"
        body = header(self.state, req, rid, created, obj)
        if req.chat:
            body["choices"] = [{"index": 0, "message": {"role": "assistant",
                                                        "content": "".join(text)},
                                "logprobs": None, "finish_reason": finish, "token_ids": ids}]
        else:
            body["choices"] = [choice(req, "".join(text), finish, ids, True)]
        body["usage"] = usage(req, len(ids))
        if req.chat:
            body["prompt_token_ids"] = original_prompt(req)
        self._send(200, json.dumps(body).encode())

    def _stream(self, req: Completion) -> None:
        created, rid = int(time.time()), self.state.new_id(req.chat)
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        steps = self.state.generator.run(req, gone=self._client_gone)
        try:
            first_step: Optional[Step] = next(steps, None)
        except ApiError as e:
            steps.close()
            return self._error(e)
        self._answered = True
        self.state.count(200)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self._chunked = self.request_version != "HTTP/1.0"
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:  # HTTP/1.0 has no chunked coding: the stream ends with the connection
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self._events(req, steps, first_step, rid, created, obj)
        finally:
            steps.close()  # a client gone mid-stream: the generation ends, its blocks freed

    def _events(self, req, steps, step, rid, created, obj) -> None:
        generated, first = 0, True
        try:
            while step is not None:
                generated += 1
                event = header(self.state, req, rid, created, obj)
                event["choices"] = [choice(req, step.text, step.finish_reason, [step.token],
                                           first)]
                if first and req.chat:
                    event["prompt_token_ids"] = original_prompt(req)
                self._chunk(event)
                first = False
                step = next(steps, None)
        except ApiError as e:  # fenced mid-stream: an error event the router replays
            self._chunk(json.loads(e.body()))  # its own type, then [DONE], as the reference
            self._raw(b"data: [DONE]\n\n")
            self._end()
            return
        if req.include_usage:
            event = header(self.state, req, rid, created, obj)
            event["choices"] = []
            event["usage"] = usage(req, generated)
            self._chunk(event)
        self._raw(b"data: [DONE]\n\n")
        self._end()

    def _chunk(self, event: dict) -> None:
        self._raw(b"data: " + json.dumps(event).encode() + b"\n\n")


def serve(state: State, host: str, port: int,
          on_bound: Callable[[int], None]) -> ThreadingHTTPServer:
    """Binds, calls on_bound(port) and serves on a daemon thread; returns the server."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = EngineHTTPServer((host, port), handler)
    on_bound(server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

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
it serves a request other than GET /health and GET /metrics only when it carries
`Authorization: Bearer KEY` with one of them, and answers any other 401 (the reference
engine's proto/http/engine_key.h). A standby answers the completion routes 503 with
Retry-After. Each connection has its own thread (keep-alive, HTTP/1.1); the requests of all of
them are batched on the compute thread (the Generator's scheduler).
"""
from __future__ import annotations

import hmac
import io
import json
import os
import select
import socket
import string
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

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


def _log(text: str) -> None:
    """One line on stderr, as main.log writes them."""
    from .main import log
    log(text)


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


class _TimedReader(io.RawIOBase):
    """The socket's input under the handler's read timeouts (Handler._read_some)."""

    def __init__(self, handler: "Handler"):
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self._handler._read_some(buf)


class _TimedWriter(io.BufferedIOBase):
    """The socket's output, each write under the state's write_timeout_s."""

    def __init__(self, sock: socket.socket, state: "State"):
        self._sock, self._state = sock, state

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.settimeout(self._state.write_timeout_s)
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass made by serve()
    _answered = False  # this request's answer has begun
    _chunked = True  # this stream's events go out in chunks (HTTP/1.1)

    def log_message(self, fmt, *args):  # one line per request is the router's to log
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm
        # holds the body back for the peer's delayed ACK (40 ms and more on loopback).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile.close()  # the socket's own file: reads and writes go through the timeouts
        self.rfile = io.BufferedReader(_TimedReader(self), 1 << 16)
        self.wfile = _TimedWriter(self.connection, self.state)
        self._deadline: Optional[float] = None  # when the request that is arriving is late
        self._served = 0  # requests this connection has read

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with the reference engine's timeouts (State): a
        connection waits idle_timeout_s for a request's first byte (its first request, no
        more than request_timeout_s) and is then closed quietly; from its first byte on, a
        request has request_timeout_s to arrive whole, or is answered 408 and the connection
        closed; each write has write_timeout_s. A peer gone or not reading ends the
        connection quietly."""
        self._deadline, self._answered = None, False
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():  # it answered (send_error)
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(501, f"method {self.command} is not implemented")
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True
            if self._deadline is not None and not self._answered:
                ms = round(self.state.request_timeout_s * 1000)
                try:
                    self._error(ApiError(f"the request did not arrive within {ms} ms",
                                         status=408))
                except OSError:
                    pass
        except ConnectionError:
            self.close_connection = True
        finally:
            self._served += 1

    def _read_timeout(self) -> float:
        """The timeout of the next read: the idle one while no byte of a request has come,
        then what is left of the request's; TimeoutError once that is spent."""
        s = self.state
        if self._deadline is None:
            return s.idle_timeout_s if self._served else min(s.idle_timeout_s,
                                                             s.request_timeout_s)
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request is late")
        return left

    def _read_some(self, buf) -> int:
        self.connection.settimeout(self._read_timeout())
        n = self.connection.recv_into(buf)
        if n and self._deadline is None:  # a request's first byte
            self._deadline = time.monotonic() + self.state.request_timeout_s
        return n

    def _send(self, status: int, body: bytes, ctype: str = "application/json",
              extra: Optional[dict] = None) -> None:
        self._answered = True
        self.state.count(status)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _client_gone(self) -> bool:
        """Whether the client closed or reset its connection while its request is answered
        (the reference engine's Watch): end of stream, or an error, on a peek at the socket.
        Bytes of a pipelined next request are left where they are."""
        try:
            poller = select.poll()
            poller.register(self.connection, select.POLLIN)
            if not poller.poll(0):
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _error(self, e: ApiError) -> None:
        extra = {"Retry-After": "1"} if e.status == 503 else None
        self._send(e.status, e.body(), extra=extra)

    def _keyed(self) -> bool:
        """Whether this request may be served: no keys, an open route, or
        `Authorization: Bearer K` (the scheme in any case) with K one of the keys, each
        compared in constant time."""
        if not self.state.keys or (self.command, self.path) in OPEN_ROUTES:
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

    def _read_body(self, length: int) -> bytes:
        """The request's body of `length` bytes, with which the request has arrived (its
        timeout ends); ConnectionAbortedError when the connection ends first."""
        raw = self.rfile.read(length)
        if len(raw) < length:
            raise ConnectionAbortedError("the connection ended inside the request body")
        self._deadline = None
        return raw

    def _body_length(self) -> Optional[int]:
        """The request body's length (0 without Content-Length), or None once a 400 is sent
        (the connection to be closed: where the body ends is unknown) for a Content-Length
        that is not decimal digits, or several that differ."""
        if self.headers.get("Transfer-Encoding") is not None:
            # Its body would go unread and be parsed as the next request (smuggling behind a
            # proxy that honours it): RFC 9112 6.1, 400 and the connection closed.
            self.close_connection = True
            self._error(ApiError("unsupported Transfer-Encoding: send the body with "
                                 "Content-Length"))
            return None
        values = self.headers.get_all("Content-Length") or []
        for v in values:
            if not (v.isascii() and v.isdigit()) or v.lstrip("0") != values[0].lstrip("0"):
                self.close_connection = True
                self._error(ApiError(f"bad Content-Length: {', '.join(values)[:64]!r}"))
                return None
        return int(values[0]) if values else 0

    def _dispatch(self, serve: Callable[[int], None]) -> None:
        """serve(body length) once the framing is known. A peer that left or stopped reading
        ends the connection quietly; any other exception is a bug: logged in one line and, if
        nothing was sent yet, answered 500 (the reference engine's Dispatch), never a silent
        close."""
        self.path = self.path.split("?", 1)[0]  # routes are paths; a query string is no part
        try:
            length = self._body_length()
            if length is not None:
                serve(length)
        except (ConnectionError, TimeoutError):
            raise  # handle_one_request's
        except Exception as e:  # noqa: BLE001 (the connection's one answer is at stake)
            self.close_connection = True
            where = traceback.extract_tb(e.__traceback__)[-1]
            _log(f"{self.command} {self.path[:200]} raised {type(e).__name__}: {e} "
                 f"({os.path.basename(where.filename)}:{where.lineno})")
            if not self._answered:
                try:
                    self._error(ApiError("internal error", status=500, kind="server_error"))
                except OSError:
                    pass

    def do_GET(self):
        self._dispatch(self._get)

    def do_POST(self):
        self._dispatch(self._post)

    def do_PUT(self):  # and DELETE, PATCH, OPTIONS: 405 on a route, 404 elsewhere
        self._dispatch(self._other)

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def _other(self, length: int) -> None:
        if not self._keyed():
            return self._refuse_unkeyed(length)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(ApiError(f"the body is over {MAX_BODY_BYTES} bytes", status=413))
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

    def send_error(self, code: int, message: Optional[str] = None,
                   explain: Optional[str] = None) -> None:
        """BaseHTTPRequestHandler's own refusals (a malformed request line or header, an
        unknown method) as the reference engine's JSON error body, and the connection
        closed."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # the request line was not understood: the
            self.request_version = "HTTP/1.1"   # answer still has its status line
        try:
            text = message or HTTPStatus(code).phrase
        except ValueError:
            text = f"HTTP {code}"
        e = ApiError(text, status=code, kind="server_error" if code >= 500 else
                     "invalid_request_error")
        self._send(code, e.body(), extra={"Connection": "close"})

    def _get(self, length: int) -> None:
        s = self.state
        if not self._keyed():
            return self._refuse_unkeyed(length)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(ApiError(f"the body is over {MAX_BODY_BYTES} bytes", status=413))
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
        if not self._keyed():
            return self._refuse_unkeyed(length)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(ApiError(f"the body is over {MAX_BODY_BYTES} bytes", status=413))
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

    def _raw(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        self.wfile.flush()

    def _end(self) -> None:
        if self._chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def metrics_text(s: State) -> str:
    g = s.generator
    lines = ["# HELP baton_engine_http_responses_total HTTP responses sent, by status code.",
             "# TYPE baton_engine_http_responses_total counter"]
    with s.lock:
        for code, n in sorted(s.responses.items()):
            lines.append(f'baton_engine_http_responses_total{{code="{code}"}} {n}')
        running = s.in_flight
    sch = g.scheduler if g else None
    invariant = bool(g and g.model.batch_invariant)
    for name, kind, text, value in [
            ("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
             sch.prompt_total if sch else 0),
            ("generated_tokens_total", "counter", "Tokens generated.",
             sch.generated_total if sch else 0),
            ("running_requests", "gauge", "Requests being answered.", running),
            ("batch_sequences", "gauge", "Sequences in the compute thread's batch.",
             len(sch.running) if sch else 0),
            ("waiting_requests", "gauge", "Requests waiting for room in the batch.",
             len(sch.waiting) if sch else 0),
            ("steps_total", "counter", "Batched forward steps computed.",
             sch.steps_total if sch else 0),
            ("preemptions_total", "counter",
             "Sequences preempted for recompute when the KV cache was full.",
             sch.preempted_total if sch else 0),
            ("batch_invariant", "gauge",
             "1 when a row's logits do not depend on the batch it is computed in.",
             int(invariant)),
            ("serving", "gauge", "1 while the engine serves, 0 while it stands by.",
             1 if s.serving and not s.stopping else 0)]:
        lines += [f"# HELP baton_engine_{name} {text}", f"# TYPE baton_engine_{name} {kind}",
                  f"baton_engine_{name} {value}"]
    lines += ["# HELP baton_engine_resumed_requests_total Replays admitted "
              "(baton_resume_tokens > 0); batch_invariant=\"false\": their continuation may "
              "differ from the interrupted run's.",
              "# TYPE baton_engine_resumed_requests_total counter",
              f'baton_engine_resumed_requests_total{{batch_invariant="{str(invariant).lower()}"}} '
              f"{sch.resumed_total if sch else 0}"]
    lines += kv_metrics(s.handoff)
    return "\n".join(lines) + "\n"


def kv_metrics(handoff) -> list[str]:
    """The KV-warm failover's series, named as the reference engine's (none without one)."""
    if handoff is None:
        return []
    c = handoff.counters
    out: list[str] = []
    for name, kind, text, series in [
            ("kv_adopted_sequences_total", "counter",
             "Sequences adopted from a predecessor's KV records.", {"": c.adopted}),
            ("kv_dropped_sequences_total", "counter",
             "A predecessor's sequences not adopted, by reason.",
             {f'{{reason="{r}"}}': n for r, n in sorted(c.dropped.items())}),
            ("kv_continued_requests_total", "counter",
             "Requests that continued from adopted KV.", {"": c.continued}),
            ("kv_tokens_not_recomputed_total", "counter",
             "Tokens whose K and V came from adopted KV instead of a prefill.",
             {"": c.tokens_not_recomputed}),
            ("kv_kept_freed_total", "counter", "Adopted KV freed unclaimed, by reason.",
             {f'{{reason="{r}"}}': n for r, n in sorted(c.kept_freed.items())}),
            ("kv_kept_sequences", "gauge", "Adopted sequences waiting for their request.",
             {"": len(handoff.kept)}),
            ("kv_handed_over_sequences_total", "counter",
             "Running sequences handed over to the next primary by a switch-over.",
             {"": c.handed_over})]:
        out += [f"# HELP baton_engine_{name} {text}", f"# TYPE baton_engine_{name} {kind}"]
        out += [f"baton_engine_{name}{labels} {v}" for labels, v in series.items()]
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # listen(2)'s backlog (socketserver's default is 5): a burst of connections beyond it, from
    # the router or from clients, was reset by the kernel instead of waiting to be accepted.
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        """A peer that closed its connection (the router ends a kept-alive one after a
        replay) or let it time out is no error; anything else is logged with its traceback,
        as socketserver does."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def serve(state: State, host: str, port: int,
          on_bound: Callable[[int], None]) -> ThreadingHTTPServer:
    """Binds, calls on_bound(port) and serves on a daemon thread; returns the server."""
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = _Server((host, port), handler)
    on_bound(server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

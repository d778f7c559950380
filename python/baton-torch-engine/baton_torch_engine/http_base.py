"""The torch engine's HTTP transport, below its routes (server.py): a request handler that
reads and writes under the reference engine's timeouts (proto/http/http_server.h), frames a
request's body by Content-Length alone, answers every refusal and bug with the reference
engine's JSON error body, writes a stream's chunks, and sees a client gone; and the threaded
server that runs it, quiet about peers that leave.

BaseHandler's subclass holds `state` (an object with idle_timeout_s, request_timeout_s,
write_timeout_s, max_connections, linger_s and count(status), as server.State) and serves a
request's routes in _get, _post and _other (the body's length given; every other method goes
to _other).
"""
from __future__ import annotations

import io
import os
import select
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Callable, Optional

from .openai_requests import ApiError

if TYPE_CHECKING:
    from .server import State


# A socket's timeout: socket.timeout is TimeoutError from Python 3.10 on, its own class before.
_TIMEOUTS = (TimeoutError, socket.timeout)


def _log(text: str) -> None:
    """One line on stderr, as main.log writes them."""
    from .main import log
    log(text)


class _TimedReader(io.RawIOBase):
    """The socket's input under the handler's read timeouts (BaseHandler._read_some)."""

    def __init__(self, handler: "BaseHandler"):
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


class BaseHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive under the state's timeouts; a request's framing checked
    (_body_length) before its route (_get, _post, _other) is served, and a bug in one
    answered 500 (_dispatch)."""

    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass made by server.serve()
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
        except _TIMEOUTS:
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
            # At most 18 digits: int() refuses a string of thousands of them (a 500), and no
            # body that long is taken anyway.
            if not (v.isascii() and v.isdigit()) or len(v) > 18 or \
                    v.lstrip("0") != values[0].lstrip("0"):
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
        except (ConnectionError, *_TIMEOUTS):
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

    def _get(self, length: int) -> None:
        """A GET's routes, the body of `length` bytes unread: the subclass's."""
        raise NotImplementedError

    def _post(self, length: int) -> None:
        """A POST's routes, the body of `length` bytes unread: the subclass's."""
        raise NotImplementedError

    def _other(self, length: int) -> None:
        """Any other method's routes, the body of `length` bytes unread: the subclass's."""
        raise NotImplementedError

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

    def _raw(self, data: bytes) -> None:
        """`data` sent now, as one chunk of the answer's body when it is chunked."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        self.wfile.flush()

    def _end(self) -> None:
        """The end of a streamed answer: the last chunk, when it is chunked."""
        if self._chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class EngineHTTPServer(ThreadingHTTPServer):
    """A thread per connection (daemon threads), at most the state's max_connections of them;
    a deep listen backlog; a lingering close; and no traceback for a peer gone."""

    daemon_threads = True
    # listen(2)'s backlog (socketserver's default is 5): a burst of connections beyond it, from
    # the router or from clients, was reset by the kernel instead of waiting to be accepted.
    request_queue_size = 1024

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self._state = handler.state
        self._open_lock = threading.Lock()
        self._open = 0  # connections whose thread runs
        self._full = False  # the last connection accepted was refused (logged once)

    def process_request(self, request, client_address):
        """A thread for the connection while fewer than max_connections have one; past that,
        the connection is answered 503 and closed on the accepting thread (_refuse_busy)."""
        with self._open_lock:
            limit = self._state.max_connections
            full = self._open >= limit
            if not full:
                self._open += 1
            changed, self._full = full != self._full, full
        if changed:
            _log(f"serving its limit of {limit} connections: new ones are answered 503"
                 if full else "below its limit of connections again")
        if full:
            return self._refuse_busy(request, limit)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed_one()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed_one()

    def _closed_one(self) -> None:
        with self._open_lock:
            self._open -= 1

    def _refuse_busy(self, request, limit: int) -> None:
        """503 with Retry-After and the connection closed, never blocking the accepting
        thread: what the client already sent is read first (closing on unread input resets
        the connection and can lose the answer), what it sends later is not waited for."""
        body = ApiError(f"the engine serves its limit of {limit} connections", status=503,
                        kind="server_error").body()
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
        self._state.count(503)
        try:
            request.setblocking(False)
            request.send(head.encode() + body)
            request.shutdown(socket.SHUT_WR)
            while request.recv(65536):
                pass
        except OSError:  # BlockingIOError: nothing more to read now; or the peer left
            pass
        self.close_request(request)

    def shutdown_request(self, request):
        """Half-closes, then reads and drops what the client still sends for the state's
        linger_s, then closes (the reference engine's LingerThenClose): closing with unread
        input resets the connection, and a client still sending a body refused unread (413)
        would fail on its send before it reads the answer."""
        try:
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + self._state.linger_s
            while (left := deadline - time.monotonic()) > 0:
                request.settimeout(left)
                if not request.recv(65536):
                    break
        except OSError:  # the timeout, or the peer gone
            pass
        self.close_request(request)

    def handle_error(self, request, client_address):
        """A peer that closed its connection (the router ends a kept-alive one after a
        replay) or let it time out is no error; anything else is logged with its traceback,
        as socketserver does."""
        if isinstance(sys.exc_info()[1], (ConnectionError, *_TIMEOUTS)):
            return
        super().handle_error(request, client_address)

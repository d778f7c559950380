"""baton-torch-engine's HTTP layer, without PyTorch, as the reference engine's: hostile input
and a handler's bug get a JSON answer, never a silent close; the HTTP timeouts; a client gone
is seen and a pipelined request is not; a drain waits for a request whose body is arriving;
405, 404, the server's own refusals and HTTP/1.0 streams; the connection limit and the
lingering close; and the responses' replay and SSE details."""
import json
import socket
import threading
import time
import types
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_torch_engine.openai_requests import ApiError  # noqa: E402
from baton_torch_engine.server import MAX_BODY_BYTES  # noqa: E402
from torch_http_support import COMPLETION, KEY, HttpTest, OneTokenGenerator  # noqa: E402


class RaisingGenerator(OneTokenGenerator):
    def run(self, req, gone=None):
        raise RuntimeError("a bug")
        yield


class HostileInputTest(HttpTest):
    """Input meant to break the engine gets a 4xx JSON answer, and a bug a 500 one: never a
    connection closed with nothing sent."""

    def test_a_body_nested_deeper_than_64_levels_is_refused(self):
        self.start(generator=OneTokenGenerator())
        for chat in (False, True):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            for nest in (b"[" * 100000, b'{"prompt": "x", "a": ' + b"[" * 65 + b"]" * 65 + b"}"):
                with self.subTest(path=path, size=len(nest)):
                    r, data = self.ask("POST", path, nest)
                    self.assertEqual(r.status, 400, data)
                    self.assertEqual(json.loads(data)["error"]["message"],
                                     "the request body nests deeper than 64 levels")
        r, data = self.ask("POST", "/v1/completions",
                           b'{"prompt": "x", "a": ' + b"[" * 63 + b"]" * 63 + b"}")
        self.assertEqual(r.status, 200, data)

    def test_huge_numbers_and_nan_are_refused_naming_the_param(self):
        self.start(generator=OneTokenGenerator())
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            for value in (b"1" + b"0" * 400, b"-1" + b"0" * 400, b"NaN", b"Infinity", b"1e999"):
                with self.subTest(name=name, value=value[:8]):
                    body = b'{"prompt": "x", "%s": %s}' % (name.encode(), value)
                    r, data = self.ask("POST", "/v1/completions", body)
                    self.assertEqual(r.status, 400, data)
                    param = json.loads(data)["error"]["param"]
                    self.assertIn(param, (name, None), data)  # NaN: no JSON at all

    def test_a_bad_content_length_is_refused_and_the_connection_closed(self):
        self.start([KEY], OneTokenGenerator())
        for value in (b"abc", b"-1", b"+5", b"1 2", b"0x10", b"\xd9\xa3", b"1" * 5000):
            for path in (b"/v1/completions", b"/health"):
                with self.subTest(value=value, path=path):
                    sock = self.raw(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n"
                                    b"\r\n{}" % (path, value))
                    r, body = self.answer(sock)
                    self.assertEqual(r.status, 400, body)
                    self.assertIn("Content-Length", body["error"]["message"])
                    self.assertTrue(self.closed(sock))
        sock = self.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n"
                        b"Content-Length: 3\r\n\r\n{}")
        self.assertEqual(self.answer(sock)[0].status, 400)

    def test_an_exception_of_the_handler_is_a_500_answer(self):
        self.start(generator=RaisingGenerator())
        conn = self.connect()
        r, data = self.ask("POST", "/v1/completions", COMPLETION, conn=conn)
        self.assertEqual(r.status, 500, data)
        self.assertEqual(json.loads(data)["error"],
                         {"message": "internal error", "type": "server_error", "param": None,
                          "code": None})
        self.assertEqual(self.state.responses, {500: 1})


class EndlessGenerator(OneTokenGenerator):
    """A generator of 64 KiB of text per token, for ever, that notes when it is closed."""

    def __init__(self):
        self.closed = threading.Event()

    def run(self, req, gone=None):
        try:
            while True:
                yield types.SimpleNamespace(token=65, text="A" * 65536, finish_reason="")
        finally:
            self.closed.set()


class TimeoutTest(HttpTest):
    """The reference engine's HTTP timeouts, made short: a request that does not arrive whole
    in time is answered 408, an idle connection and a client that stops reading are let go,
    each quietly (no traceback), and the connection's thread ends."""

    def start_short(self, generator=None):
        self.start(generator=generator)
        s = self.state
        s.idle_timeout_s, s.request_timeout_s, s.write_timeout_s = 0.6, 0.4, 0.4

    def assert_late(self, sock, began):
        r, body = self.answer(sock)
        self.assertEqual(r.status, 408, body)
        self.assertEqual(body["error"]["message"], "the request did not arrive within 400 ms")
        self.assertTrue(self.closed(sock))
        self.assertLess(time.monotonic() - began, 5)

    def test_a_request_that_never_ends_is_answered_408_and_its_thread_ends(self):
        self.start_short(OneTokenGenerator())
        threads = threading.active_count()
        began = time.monotonic()
        heads = [self.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ")
                 for _ in range(20)]
        body = self.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99\r\n\r\n{")
        for sock in heads + [body]:
            self.assert_late(sock, began)
        deadline = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertLessEqual(threading.active_count(), threads)
        self.assertEqual(self.state.responses, {408: 21})

    def test_a_trickling_request_is_late_all_the_same(self):
        self.start_short()
        began = time.monotonic()
        sock = self.raw(b"GET /health HTTP/1.1\r\n")
        for _ in range(12):
            try:
                sock.sendall(b"X: y\r\n")
            except OSError:
                break
            time.sleep(0.05)
        self.assert_late(sock, began)

    def test_an_idle_connection_is_closed_quietly(self):
        self.start_short()
        silent = self.raw(b"")
        began = time.monotonic()
        self.assertTrue(self.closed(silent))  # nothing sent: the request timeout, no answer
        self.assertLess(time.monotonic() - began, 3)
        conn = self.connect()
        r, _ = self.ask("GET", "/health", conn=conn)
        sock = conn.sock
        self.assertEqual(r.status, 503)
        self.assertTrue(self.closed(sock))  # kept alive, then idle past its timeout
        self.assertEqual(self.state.responses, {503: 1})

    def test_a_client_that_stops_reading_a_stream_is_let_go(self):
        generator = EndlessGenerator()
        self.start_short(generator)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", self.port))
        self.addCleanup(sock.close)
        body = json.dumps({"prompt": "Hi", "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        self.assertTrue(generator.closed.wait(10), "the generation went on")


class SlowGenerator(OneTokenGenerator):
    """A generator whose one token takes 10 s, unless gone() says the client left first (as
    generation.Generator asks it); notes that it did."""

    def __init__(self):
        self.saw_gone = threading.Event()

    def run(self, req, gone=None):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if gone is not None and gone():
                self.saw_gone.set()
                raise ConnectionAbortedError("the client is gone")
            time.sleep(0.01)
        yield types.SimpleNamespace(token=65, text="A", finish_reason="length")


class ClientGoneTest(HttpTest):
    """A client that leaves while its answer is generated, streamed or not, is seen gone, so
    that its generation is cancelled (docs/engines.md: a client gone)."""

    def test_a_client_gone_before_its_answer_is_seen(self):
        for stream, how in ((False, "close"), (False, "reset"), (True, "close")):
            with self.subTest(stream=stream, how=how):
                generator = SlowGenerator()
                self.start(generator=generator)
                body = json.dumps({"prompt": "Hi", "stream": stream}).encode()
                sock = socket.create_connection(("127.0.0.1", self.port))
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                time.sleep(0.2)
                if how == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()
                self.assertTrue(generator.saw_gone.wait(3), "the client was not seen gone")

    def test_a_pipelined_request_is_no_client_gone(self):
        generator = SlowGenerator()
        self.start(generator=generator)
        self.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                 b"GET /health HTTP/1.1\r\n\r\n" % (len(COMPLETION), COMPLETION))
        self.assertFalse(generator.saw_gone.wait(0.5))


class DrainTest(HttpTest):
    """A request is in flight from its headers on, so that a drain waits for one whose body
    is still arriving; after the drain began, requests are refused 503; every exit of a
    request leaves nothing in flight."""

    def wait_in_flight(self, n):
        deadline = time.monotonic() + 5
        while self.state.in_flight != n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.state.in_flight

    def test_a_request_whose_body_is_arriving_is_in_flight_and_a_drain_waits_for_it(self):
        self.start(generator=OneTokenGenerator())
        sock = self.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(COMPLETION), COMPLETION[:5]))
        self.assertEqual(self.wait_in_flight(1), 1)
        with self.state.lock:  # as main.serve_events on a DRAIN
            self.state.stopping = True
        r, data = self.ask("POST", "/v1/completions", COMPLETION)
        self.assertEqual(r.status, 503, data)
        self.assertEqual(json.loads(data)["error"]["message"], "this engine is stopping")
        self.assertEqual(r.getheader("Retry-After"), "1")
        sock.sendall(COMPLETION[5:])
        r, body = self.answer(sock)
        self.assertEqual((r.status, body["choices"][0]["text"]), (200, "A"))
        self.assertEqual(self.wait_in_flight(0), 0)

    def test_every_exit_of_a_request_leaves_nothing_in_flight(self):
        self.start(generator=RaisingGenerator())
        self.assertEqual(self.ask("POST", "/v1/completions", b'{"prompt": 1}')[0].status, 400)
        self.assertEqual(self.ask("POST", "/v1/completions", COMPLETION)[0].status, 500)
        sock = self.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99\r\n\r\n{")
        self.assertEqual(self.wait_in_flight(1), 1)
        sock.close()
        self.assertEqual(self.wait_in_flight(0), 0)
        self.state.serving = False
        self.assertEqual(self.ask("POST", "/v1/completions", COMPLETION)[0].status, 503)
        self.assertEqual(self.state.in_flight, 0)


class HttpLayerTest(HttpTest):
    """The HTTP layer answers as the reference engine's: JSON errors, 405 with Allow on a
    route's other methods, routes matched without the query string, transfer codings
    refused, HTTP/1.0 streams unchunked."""

    def test_a_routes_other_methods_are_405_with_allow_and_unknown_paths_404(self):
        self.start(generator=OneTokenGenerator())
        for method, path, allow in (("GET", "/v1/completions", "POST"),
                                    ("PUT", "/v1/chat/completions", "POST"),
                                    ("DELETE", "/v1/completions", "POST"),
                                    ("POST", "/health", "GET"), ("PATCH", "/metrics", "GET")):
            with self.subTest(method=method, path=path):
                r, data = self.ask(method, path, b"{}" if method != "GET" else None)
                self.assertEqual((r.status, r.getheader("Allow")), (405, allow), data)
                self.assertEqual(r.getheader("Content-Type"), "application/json")
                self.assertIn("is not allowed", json.loads(data)["error"]["message"])
        r, data = self.ask("DELETE", "/nowhere")
        self.assertEqual(r.status, 404, data)
        self.assertEqual(json.loads(data)["error"]["type"], "not_found_error")

    def test_a_query_string_is_no_part_of_the_route(self):
        self.start(generator=OneTokenGenerator())
        self.assertEqual(self.ask("GET", "/health?x=1")[0].status, 200)
        self.assertEqual(self.ask("GET", "/v1/models?a=b&c")[0].status, 200)
        r, data = self.ask("POST", "/v1/completions?x=1", COMPLETION)
        self.assertEqual(r.status, 200, data)

    def test_a_transfer_coding_is_refused_and_the_connection_closed(self):
        self.start(generator=OneTokenGenerator())
        sock = self.raw(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"%x\r\n%s\r\n0\r\n\r\n" % (len(COMPLETION), COMPLETION))
        r, body = self.answer(sock)
        self.assertEqual(r.status, 400, body)
        self.assertIn("Transfer-Encoding", body["error"]["message"])
        self.assertTrue(self.closed(sock))

    def test_the_servers_own_refusals_are_json(self):
        self.start()
        for request, status in ((b"GET / HTTP/1.1 x\r\n\r\n", 400),
                                (b"BREW /pot HTTP/1.1\r\n\r\n", 501),
                                (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
                                 431)):
            with self.subTest(request=request):
                sock = self.raw(request)
                r, body = self.answer(sock)
                self.assertEqual(r.status, status, body)
                self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
                self.assertTrue(self.closed(sock))

    def test_an_http10_stream_is_not_chunked_and_ends_with_the_connection(self):
        self.start(generator=OneTokenGenerator())
        body = json.dumps({"prompt": "Hi", "stream": True}).encode()
        sock = self.raw(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        head, _, events = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        self.assertNotIn(b"Transfer-Encoding", head)
        self.assertTrue(events.startswith(b"data: {"), events)
        self.assertTrue(events.endswith(b"data: [DONE]\n\n"), events)


class FailingMidStreamGenerator(OneTokenGenerator):
    def run(self, req, gone=None):
        yield types.SimpleNamespace(token=65, text="A", finish_reason="")
        raise ApiError("the KV cache is full", status=429, kind="rate_limit_error")


class ResponseTest(HttpTest):
    """Response details as the reference engine's: a replay's prompt_token_ids are the
    original prompt's, chat ids are chatcmpl-, a mid-stream error keeps its type and is
    followed by [DONE]."""

    def events(self, path, body):
        r, data = self.ask("POST", path, json.dumps(body | {"stream": True}).encode())
        self.assertEqual(r.status, 200, data)
        return [e[len("data: "):] for e in data.decode().split("\n\n") if e]

    def test_a_replays_prompt_token_ids_are_the_original_prompt(self):
        self.start(generator=OneTokenGenerator())
        replay = {"prompt": [256, 1, 2, 3], "baton_resume_tokens": 2, "max_tokens": 1}
        r, data = self.ask("POST", "/v1/completions", json.dumps(replay).encode())
        body = json.loads(data)
        self.assertEqual(body["choices"][0]["prompt_token_ids"], [256, 1])
        self.assertTrue(body["id"].startswith("cmpl-"), body["id"])
        first = json.loads(self.events("/v1/completions", replay)[0])
        self.assertEqual(first["choices"][0]["prompt_token_ids"], [256, 1])
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        r, data = self.ask("POST", "/v1/chat/completions", json.dumps(chat).encode())
        body = json.loads(data)
        self.assertTrue(body["id"].startswith("chatcmpl-"), body["id"])
        self.assertEqual(bytes(body["prompt_token_ids"][1:]),
                         b"<|user|>\nHi\n<|assistant|>\n")
        first = json.loads(self.events("/v1/chat/completions", chat)[0])
        self.assertTrue(first["id"].startswith("chatcmpl-"), first["id"])

    def test_a_mid_stream_error_keeps_its_type_and_is_followed_by_done(self):
        self.start(generator=FailingMidStreamGenerator())
        events = self.events("/v1/completions", {"prompt": "Hi"})
        self.assertEqual(len(events), 3, events)
        self.assertEqual(json.loads(events[1])["error"]["type"], "rate_limit_error")
        self.assertEqual(events[2], "[DONE]")



class ConnectionsTest(HttpTest):
    """Connections past the state's max_connections are answered 503 and closed, and a
    connection closed after an answer lingers: what its client still sends is read and
    dropped, so that a client sending a body refused unread reads its 413."""

    def test_a_body_refused_unread_is_drained_so_its_client_reads_the_413(self):
        self.start(generator=OneTokenGenerator())
        self.state.linger_s = 30.0  # the whole body is sent well within it, on any machine
        conn = self.connect()
        # http.client sends the whole body before it reads: without the lingering close the
        # server's close resets the connection under its send (BrokenPipe, ConnectionReset).
        conn.request("POST", "/v1/completions", body=b"x" * (MAX_BODY_BYTES + (4 << 20)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read())
        self.assertEqual(r.status, 413, body)
        self.assertEqual(body["error"]["message"], f"the body is over {MAX_BODY_BYTES} bytes")
        self.assertEqual(r.getheader("Connection"), "close")
        conn.close()  # the server's linger ends with the client's close
        self.assertEqual(self.state.responses, {413: 1})

    def test_past_max_connections_a_connection_is_answered_503_and_closed(self):
        self.start(generator=OneTokenGenerator())
        self.state.max_connections = 2
        held = [self.raw(b"") for _ in range(2)]
        busy = self.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        r, body = self.answer(busy)
        self.assertEqual(r.status, 503, body)
        self.assertEqual(body["error"]["message"], "the engine serves its limit of 2 connections")
        self.assertEqual(r.getheader("Retry-After"), "1")
        self.assertTrue(self.closed(busy))
        held[0].close()  # a thread ends: the next connection is served
        deadline, status = time.monotonic() + 20, 503
        while status == 503 and time.monotonic() < deadline:
            r, _ = self.ask("GET", "/v1/models")
            status = r.status
            time.sleep(0.05)
        self.assertEqual(status, 200)
        self.assertGreaterEqual(self.state.responses[503], 1)


if __name__ == "__main__":
    unittest.main()

"""What the torch engine's HTTP tests (test_torch_api.py, test_torch_http.py) share: the
request parser, an engine key, a completion request, a one-token stand-in generator, and
HttpTest, an engine's HTTP API served in this process with the clients that talk to it."""
import http.client
import json
import socket
import types
import unittest

import checkout_paths  # noqa: F401 (the checkout's packages on sys.path)

from baton_torch_engine.openai_requests import Parser  # noqa: E402
from baton_torch_engine.server import State, serve  # noqa: E402

PARSER = Parser("tiny", vocab_size=260, max_positions=512, bos=256)
KEY = "k3y-0f.the_Engine~+/=" + "x" * 8
COMPLETION = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()


class OneTokenGenerator:
    """A generator that answers every request with token 65 ("A"), for the HTTP layer; no
    scheduler, for /metrics."""

    scheduler = None
    model = types.SimpleNamespace(batch_invariant=False)

    def run(self, req, gone=None):
        yield types.SimpleNamespace(token=65, text="A", finish_reason="length")


class HttpTest(unittest.TestCase):
    """An engine's HTTP API in this process, with no generator (a standby) or a stand-in."""

    def start(self, keys=(), generator=None):
        self.state = State(PARSER, 512, keys)
        self.state.generator = generator
        self.state.serving = generator is not None
        ports = []
        self.server = serve(self.state, "127.0.0.1", 0, ports.append)
        self.addCleanup(self.server.server_close)
        self.addCleanup(self.server.shutdown)
        self.port = ports[0]

    def connect(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.addCleanup(conn.close)
        return conn

    def ask(self, method, path, body=None, auth=None, conn=None):
        conn = conn or self.connect()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if auth is not None:
            headers["Authorization"] = auth
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r, r.read()

    def raw(self, data: bytes, timeout=30):
        """A connection that sent `data` as it is."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        self.addCleanup(sock.close)
        sock.sendall(data)
        return sock

    def answer(self, sock):
        """The next response on `sock`: (response, JSON body)."""
        r = http.client.HTTPResponse(sock)
        r.begin()
        data = r.read()
        self.assertEqual(r.getheader("Content-Type"), "application/json", data)
        return r, json.loads(data)

    def closed(self, sock) -> bool:
        """Whether the server closed `sock` (after its answers were read)."""
        sock.settimeout(10)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True

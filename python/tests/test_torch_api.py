"""baton-torch-engine's request parsing, text building and engine key, without PyTorch:
refusals name the param as the reference engine's do, a replay's resumed tokens count as
output, text that may start a stop string is held back until it is known not to be one, and
given BATON_ENGINE_KEYS the HTTP API serves only requests that carry one of the keys."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_torch_engine.openai_requests import ApiError, Parser, render_chat  # noqa: E402
from baton_torch_engine.server import (MAX_BODY_BYTES, State, engine_keys_from_env,  # noqa: E402
                                       serve)
from baton_torch_engine.text import TextBuilder  # noqa: E402

PARSER = Parser("tiny", vocab_size=260, max_positions=512, bos=256)
HERE = os.path.dirname(os.path.abspath(__file__))


def parse(body, chat=False):
    raw = json.dumps(body).encode()
    return PARSER.chat(raw) if chat else PARSER.completion(raw)


class ParserTest(unittest.TestCase):
    def refused(self, body, param, chat=False, status=400):
        with self.assertRaises(ApiError) as ctx:
            parse(body, chat)
        self.assertEqual(ctx.exception.param, param, str(ctx.exception))
        self.assertEqual(ctx.exception.status, status)
        self.assertEqual(json.loads(ctx.exception.body())["error"]["param"], param)

    def test_a_text_prompt_gets_the_bos_and_its_bytes(self):
        r = parse({"prompt": "Hi", "max_tokens": 3, "seed": 5})
        self.assertEqual(r.prompt_ids, [256, 72, 105])
        self.assertEqual((r.max_tokens, r.seed, r.stream), (3, 5, False))

    def test_token_ids_and_a_replay(self):
        r = parse({"prompt": [256, 1, 2, 3], "baton_resume_tokens": 2, "seed": 1})
        self.assertEqual(r.resume_tokens, 2)
        self.assertEqual(r.max_tokens, 512 - 4)  # a replay without max_tokens: the room left

    def test_refusals_name_the_param(self):
        self.refused({}, "prompt")
        self.refused({"prompt": [999]}, "prompt")
        self.refused({"prompt": "x", "max_tokens": 0}, "max_tokens")
        self.refused({"prompt": "x", "temperature": -1}, "temperature")
        self.refused({"prompt": "x", "top_p": 0}, "top_p")
        self.refused({"prompt": "x", "n": 2}, "n")
        self.refused({"prompt": "x", "stop": ["a"] * 5}, "stop")
        self.refused({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty")
        self.refused({"prompt": "x", "logit_bias": {"1": 2}}, "logit_bias")
        self.refused({"prompt": "x", "baton_resume_tokens": 5}, "baton_resume_tokens")
        self.refused({"prompt": "x", "model": "other"}, "model", status=404)

    def test_an_empty_prompt_is_refused_as_the_reference_engine_does(self):
        no_bos = Parser("tiny", vocab_size=260, max_positions=512, bos=None)
        for raw in (b'{"prompt": ""}', b'{"prompt": [""]}', b'{"prompt": [], "max_tokens": 1}'):
            with self.subTest(raw=raw), self.assertRaises(ApiError) as ctx:
                no_bos.completion(raw)
            self.assertEqual((ctx.exception.status, ctx.exception.param), (400, "prompt"))
        with self.assertRaises(ApiError) as ctx:
            no_bos.completion(b'{"prompt": ""}')
        self.assertEqual(str(ctx.exception), "'prompt' is empty")
        self.assertEqual(PARSER.completion(b'{"prompt": ""}').prompt_ids, [256])  # the bos

    def test_max_completion_tokens_is_read_for_chat_only_as_the_reference_engine_does(self):
        chat = {"messages": [{"role": "user", "content": "hey"}]}
        self.assertEqual(parse(chat | {"max_completion_tokens": 3, "max_tokens": 5},
                               chat=True).max_tokens, 3)
        self.assertEqual(parse(chat | {"max_completion_tokens": None, "max_tokens": 5},
                               chat=True).max_tokens, 5)
        self.refused(chat | {"max_completion_tokens": 0, "max_tokens": 5},
                     "max_completion_tokens", chat=True)
        self.assertEqual(parse({"prompt": "x", "max_completion_tokens": 3, "max_tokens": 5})
                         .max_tokens, 5)
        self.assertEqual(parse({"prompt": "x", "max_completion_tokens": 3}).max_tokens, 16)

    def test_the_reference_engines_checks_of_resume_streaming_and_chat_fields(self):
        self.refused({"prompt": [256, 1, 2], "baton_resume_tokens": 3}, "baton_resume_tokens")
        self.assertEqual(parse({"prompt": [256, 1, 2], "baton_resume_tokens": 2})
                         .resume_tokens, 2)
        for bad in ("no", 1, "true"):
            self.refused({"prompt": "x", "stream_options": {"include_usage": bad}},
                         "include_usage")
            self.refused({"prompt": "x", "return_token_ids": bad}, "return_token_ids")
        self.assertTrue(parse({"prompt": "x", "stream_options": {"include_usage": True}})
                        .include_usage)
        self.assertFalse(parse({"prompt": "x", "stream_options": None}).include_usage)
        self.refused({"prompt": "x", "stream_options": []}, "stream_options")
        chat = {"messages": [{"role": "user", "content": "hey"}]}
        for bad in (1, 21, -1, "2", 1.5):
            self.refused(chat | {"top_logprobs": bad}, "top_logprobs", chat=True)
        parse(chat | {"top_logprobs": 0}, chat=True)

    def test_a_body_is_strict_utf8(self):
        for raw in ('{"prompt": "x"}'.encode("utf-16"), '{"prompt": "x"}'.encode("utf-32-le"),
                    b'{"prompt": "\xff"}'):
            with self.subTest(raw=raw), self.assertRaises(ApiError) as ctx:
                PARSER.completion(raw)
            self.assertEqual(ctx.exception.status, 400)

    def test_an_unpaired_surrogate_anywhere_is_refused_as_the_reference_engine_does(self):
        for raw in (b'{"prompt": "ab\\ud800cd"}', b'{"prompt": "x", "stop": ["\\udfff"]}'):
            with self.assertRaises(ApiError) as ctx:
                PARSER.completion(raw)
            self.assertEqual(ctx.exception.status, 400)
            self.assertIn("unpaired surrogate", str(ctx.exception))
        with self.assertRaises(ApiError):
            PARSER.chat(b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')
        self.assertEqual(PARSER.completion(b'{"prompt": "\\ud83d\\ude00"}').prompt_ids,
                         [256, 0xF0, 0x9F, 0x98, 0x80])  # a pair is one character

    def test_a_seed_is_read_as_64_unsigned_bits(self):
        self.assertEqual(parse({"prompt": "x", "seed": -1}).seed, (1 << 64) - 1)
        self.assertEqual(parse({"prompt": "x", "seed": -(1 << 63)}).seed, 1 << 63)
        self.assertEqual(parse({"prompt": "x", "seed": (1 << 64) - 1}).seed, (1 << 64) - 1)
        self.refused({"prompt": "x", "seed": 1 << 64}, "seed")
        self.refused({"prompt": "x", "seed": -(1 << 63) - 1}, "seed")

    def test_a_default_that_changes_nothing_is_accepted(self):
        parse({"prompt": "x", "presence_penalty": 0, "logit_bias": {}, "tools": [],
               "tool_choice": "none", "response_format": {"type": "text"}})

    def test_vllm_extensions_are_read_or_refused_never_ignored(self):
        r = parse({"prompt": "x", "max_tokens": 9, "min_tokens": 4, "ignore_eos": True,
                   "stop_token_ids": [65, 7], "top_k": -1, "min_p": 0,
                   "repetition_penalty": 1})
        self.assertEqual((r.min_tokens, r.ignore_eos, r.stop_token_ids), (4, True, [65, 7]))
        self.assertEqual(parse({"prompt": "x", "top_k": 0, "min_tokens": 16}).min_tokens, 16)
        for name, bad in (("min_tokens", -1), ("min_tokens", 17), ("min_tokens", "3"),
                          ("ignore_eos", 1), ("stop_token_ids", 7), ("stop_token_ids", [-1]),
                          ("stop_token_ids", [999]), ("stop_token_ids", ["a"]),
                          ("stop_token_ids", [1] * 65), ("top_k", 40), ("top_k", 1.5),
                          ("min_p", 0.1), ("repetition_penalty", 1.1)):
            self.refused({"prompt": "x", name: bad}, name)

    def test_chat_messages_are_checked_and_rendered_as_the_reference_engine_does(self):
        self.refused({"messages": [{"role": "user"}]}, "messages[0].content", chat=True)
        self.refused({"messages": [{"content": "x"}]}, "messages[0].role", chat=True)
        self.refused({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                     "messages[0].content[0].type", chat=True)
        self.assertEqual(render_chat({"messages": [{"role": "user", "content": "hey"}]}),
                         "<|user|>\nhey\n<|assistant|>\n")
        r = parse({"messages": [{"role": "user", "content": "hey"}], "max_tokens": 4}, chat=True)
        self.assertTrue(r.chat)
        self.assertEqual(bytes(r.prompt_ids[1:]), b"<|user|>\nhey\n<|assistant|>\n")


class TextBuilderTest(unittest.TestCase):
    def test_a_split_character_comes_out_whole(self):
        t = TextBuilder([])
        self.assertEqual([t.push(b) for b in "é".encode()], ["", "é"])

    def test_an_invalid_byte_is_a_replacement_character(self):
        self.assertEqual(TextBuilder([]).push(163), "\ufffd")

    def test_a_possible_stop_string_is_held_back_then_let_out(self):
        t = TextBuilder(["END"])
        self.assertEqual([t.push(b) for b in b"aEN"], ["a", "", ""])
        self.assertEqual(t.push(ord("x")), "ENx")

    def test_a_stop_string_ends_the_text_before_it(self):
        t = TextBuilder(["END"])
        out = "".join(t.push(b) for b in b"abcEND")
        self.assertEqual(out, "abc")
        self.assertTrue(t.stopped)

    def test_each_byte_of_a_broken_sequence_is_one_replacement_as_in_the_reference(self):
        t = TextBuilder([])
        out = "".join(t.push(b) for b in [168, 109, 39, 242, 177, 118]) + t.finish()
        self.assertEqual(out, "\ufffdm'\ufffd\ufffdv")

    def test_text_pushed_without_a_stop_check_keeps_a_possible_start_held_back(self):
        t = TextBuilder(["ab", "zz"])
        self.assertEqual("".join(t.push(b, may_stop=False) for b in b"xzz"), "xz")
        self.assertEqual("".join(t.push(b, may_stop=False) for b in b"aba"), "zab")
        self.assertFalse(t.stopped)
        self.assertEqual(t.push(ord("b")), "")
        self.assertTrue(t.stopped)

    def test_a_stop_string_must_end_in_text_pushed_with_a_stop_check(self):
        t = TextBuilder(["b", "abc"])
        self.assertEqual("".join(t.push(b, may_stop=False) for b in b"xab"), "x")  # "ab" held
        self.assertEqual(t.push(ord("z")), "abz")
        self.assertFalse(t.stopped, "the 'b' came before the stop check")
        t = TextBuilder(["b", "abc"])
        self.assertEqual("".join(t.push(b, may_stop=False) for b in b"xa"), "x")
        self.assertEqual(t.push(ord("b")), "a")
        self.assertTrue(t.stopped)

    def test_special_ids_have_no_text(self):
        self.assertEqual(TextBuilder([]).push(257), "")


KEY = "k3y-0f.the_Engine~+/=" + "x" * 8
OTHER = "0therKEY" * 4
REFUSED = {"error": {"message": "missing or wrong engine key (Authorization: Bearer KEY)",
                     "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
COMPLETION = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
CHAT = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()


class OneTokenGenerator:
    """A generator that answers every request with token 65 ("A"), for the HTTP layer; no
    scheduler, for /metrics."""

    scheduler = None
    model = types.SimpleNamespace(batch_invariant=False)

    def run(self, req, gone=None):
        yield types.SimpleNamespace(token=65, text="A", finish_reason="length")


class EngineKeysFromEnvTest(unittest.TestCase):
    def refused(self, value, problem):
        with self.assertRaises(ValueError) as ctx:
            engine_keys_from_env({"BATON_ENGINE_KEYS": value})
        message = str(ctx.exception)
        self.assertTrue(message.startswith("BATON_ENGINE_KEYS, element "), message)
        self.assertIn(problem, message)
        for key in value.split(","):
            if len(key) >= 4:
                self.assertNotIn(key, message)

    def test_unset_or_empty_is_no_key(self):
        self.assertEqual(engine_keys_from_env({}), [])
        self.assertEqual(engine_keys_from_env({"BATON_ENGINE_KEYS": ""}), [])

    def test_keys_are_split_on_commas_in_order(self):
        self.assertEqual(engine_keys_from_env({"BATON_ENGINE_KEYS": KEY}), [KEY])
        self.assertEqual(engine_keys_from_env({"BATON_ENGINE_KEYS": f"{KEY},{OTHER}"}),
                         [KEY, OTHER])
        edge = ["a" * 16, "Z" * 1024]
        self.assertEqual(engine_keys_from_env({"BATON_ENGINE_KEYS": ",".join(edge)}), edge)

    def test_a_malformed_value_names_the_variable_the_element_and_the_problem(self):
        self.refused(f"{KEY},,{OTHER}", "element 2: a key of 0 characters")
        self.refused(f"{KEY},", "element 2: a key of 0 characters")
        self.refused(",", "element 1: a key of 0 characters")
        self.refused("short-key-15chr", "element 1: a key of 15 characters (keys have 16 to")
        self.refused("y" * 1025, "element 1: a key of 1025 characters")
        self.refused(f"{OTHER},{KEY[:5]} {KEY[5:]}", "element 2: a key with a character out of")
        self.refused("q" * 20 + "\u00e9", "at 21")
        self.refused(f" {KEY}", "element 1: a key with a character out of")

    def test_the_engine_ends_before_it_listens_on_a_malformed_value(self):
        bad_key = "short-secret"
        with tempfile.TemporaryDirectory() as tmp:
            port_file = os.path.join(tmp, "port")
            env = dict(os.environ, BATON_ENGINE_KEYS=f"{KEY},{bad_key}")
            program = ("import sys, checkout_paths; from baton_torch_engine.main import main; "
                       f"sys.exit(main(['--model', {tmp!r}, '--standalone', "
                       f"'--port-file', {port_file!r}]))")
            done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                                  text=True, timeout=60, cwd=HERE)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertIn("BATON_ENGINE_KEYS, element 2: a key of 12 characters", done.stderr)
            self.assertNotIn(bad_key, done.stderr)
            self.assertNotIn(KEY, done.stderr)
            self.assertFalse(os.path.exists(port_file))


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


class EngineKeyHttpTest(HttpTest):
    """The engine keys: a standby (its completion routes answer 503 past the key check) or
    one serving a one-token generator."""

    def assert_refused(self, r, data):
        self.assertEqual(r.status, 401, data)
        self.assertEqual(r.getheader("WWW-Authenticate"), "Bearer")
        self.assertEqual(r.getheader("Content-Type"), "application/json")
        self.assertEqual(json.loads(data), REFUSED)

    def assert_standby(self, r, data):
        """A standby's answer on a completion route: the request got past the key check."""
        self.assertEqual(r.status, 503, data)
        self.assertIsNone(r.getheader("WWW-Authenticate"))
        self.assertIn("standby", json.loads(data)["error"]["message"])

    def assert_models(self, r, data):
        self.assertEqual(r.status, 200, data)
        self.assertEqual(json.loads(data)["data"][0]["id"], "tiny")

    def test_without_the_key_every_route_but_health_and_metrics_is_refused(self):
        self.start([KEY])
        for method, path, body in (("POST", "/v1/completions", COMPLETION),
                                   ("POST", "/v1/chat/completions", CHAT),
                                   ("GET", "/v1/models", None), ("GET", "/nowhere", None),
                                   ("POST", "/nowhere", b"{}"), ("POST", "/health", b"{}")):
            with self.subTest(method=method, path=path):
                self.assert_refused(*self.ask(method, path, body))
        self.assertEqual(self.state.responses, {401: 6})
        for path in ("/health", "/health?x=1"):
            r, data = self.ask("GET", path)
            self.assertEqual((r.status, json.loads(data)), (503, {"status": "standby"}))
        r, data = self.ask("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertIn(b'baton_engine_http_responses_total{code="401"} 6', data)

    def test_a_wrong_or_malformed_authorization_is_refused(self):
        self.start([KEY])
        for auth in ("Bearer " + OTHER, "Bearer " + KEY[:-1], "Bearer " + KEY + "x",
                     "Basic " + KEY, KEY, "Bearer", "Bearer ", "Bearer  " + KEY,
                     "BearerX" + KEY, "Bearer " + KEY + ",x", "Bearer " + KEY[:-1] + "\u00e9"):
            with self.subTest(auth=auth):
                self.assert_refused(*self.ask("POST", "/v1/completions", COMPLETION, auth))
                self.assert_refused(*self.ask("GET", "/v1/models", auth=auth))

    def test_the_key_is_let_through_the_scheme_in_any_case(self):
        self.start([KEY])
        for auth in ("Bearer " + KEY, "bearer " + KEY, "BEARER " + KEY, "bEaReR " + KEY):
            with self.subTest(auth=auth):
                self.assert_standby(*self.ask("POST", "/v1/completions", COMPLETION, auth))
                self.assert_standby(*self.ask("POST", "/v1/chat/completions", CHAT, auth))
                self.assert_models(*self.ask("GET", "/v1/models", auth=auth))
        r, data = self.ask("GET", "/nowhere", auth="Bearer " + KEY)
        self.assertEqual(r.status, 404, data)  # past the key, the route is looked up
        r, data = self.ask("GET", "/health", auth="Bearer " + OTHER)  # a wrong key is no matter
        self.assertEqual(r.status, 503, data)

    def test_either_of_two_keys_is_let_through(self):
        self.start([KEY, OTHER])
        for key in (KEY, OTHER):
            self.assert_standby(*self.ask("POST", "/v1/completions", COMPLETION, "Bearer " + key))
            self.assert_models(*self.ask("GET", "/v1/models", auth="Bearer " + key))
        self.assert_refused(*self.ask("POST", "/v1/completions", COMPLETION,
                                      "Bearer " + KEY + "," + OTHER))

    def test_without_keys_every_request_is_let_through_as_before(self):
        self.start(engine_keys_from_env({}))
        self.assert_standby(*self.ask("POST", "/v1/completions", COMPLETION))
        self.assert_standby(*self.ask("POST", "/v1/chat/completions", CHAT))
        self.assert_models(*self.ask("GET", "/v1/models"))
        self.assert_standby(*self.ask("POST", "/v1/completions", COMPLETION, "Bearer wrong"))
        self.assertEqual(self.ask("GET", "/nowhere")[0].status, 404)
        self.assertEqual(self.state.responses, {503: 3, 200: 1, 404: 1})

    def test_a_kept_alive_connection_serves_its_next_request_after_a_refusal(self):
        self.start([KEY])
        conn = self.connect()
        self.assert_refused(*self.ask("POST", "/v1/completions", COMPLETION, conn=conn))
        sock = conn.sock
        self.assertIsNotNone(sock, "the connection was closed after the 401")
        self.assert_refused(*self.ask("POST", "/v1/chat/completions", CHAT, "Bearer x" * 3,
                                      conn=conn))
        self.assert_standby(*self.ask("POST", "/v1/completions", COMPLETION, "Bearer " + KEY,
                                      conn=conn))
        self.assert_models(*self.ask("GET", "/v1/models", auth="Bearer " + KEY, conn=conn))
        self.assertIs(conn.sock, sock, "the client had to connect again")
        self.assertEqual(self.state.responses, {401: 2, 503: 1, 200: 1})

    def test_a_body_over_the_limit_is_refused_unread_and_its_connection_closed(self):
        self.start([KEY])
        conn = self.connect()
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
        conn.endheaders()
        r = conn.getresponse()
        self.assert_refused(r, r.read())
        self.assertEqual(r.getheader("Connection"), "close")

    def test_a_serving_engine_answers_a_keyed_request(self):
        self.start([KEY, OTHER], OneTokenGenerator())
        self.assert_refused(*self.ask("POST", "/v1/completions", COMPLETION))
        r, data = self.ask("POST", "/v1/completions", COMPLETION, "bearer " + OTHER)
        self.assertEqual(r.status, 200, data)
        self.assertEqual(json.loads(data)["choices"][0]["text"], "A")
        r, data = self.ask("POST", "/v1/chat/completions", CHAT, "Bearer " + KEY)
        self.assertEqual(r.status, 200, data)
        self.assertEqual(json.loads(data)["choices"][0]["message"]["content"], "A")
        r, data = self.ask("GET", "/health")
        self.assertEqual((r.status, json.loads(data)), (200, {"status": "ok"}))
        self.assertEqual(self.state.responses, {401: 1, 200: 3})


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
        for value in (b"abc", b"-1", b"+5", b"1 2", b"0x10", b"\xd9\xa3"):
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


if __name__ == "__main__":
    unittest.main()

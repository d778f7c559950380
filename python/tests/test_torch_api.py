"""baton-torch-engine's request parsing, text building and engine key, without PyTorch:
refusals name the param as the reference engine's do, a replay's resumed tokens count as
output, text that may start a stop string is held back until it is known not to be one, and
given BATON_ENGINE_KEYS the HTTP API serves only requests that carry one of the keys (its
HTTP layer and responses: test_torch_http.py)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_torch_engine.openai_requests import ApiError, Parser, render_chat  # noqa: E402
from baton_torch_engine.server import MAX_BODY_BYTES, engine_keys_from_env  # noqa: E402
from baton_torch_engine.text import TextBuilder  # noqa: E402
from torch_http_support import (COMPLETION, KEY, PARSER, HttpTest,  # noqa: E402
                                OneTokenGenerator)

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
        # A UTF-8 byte order mark is skipped, as the reference engine's parser skips it.
        self.assertEqual(PARSER.completion(b'\xef\xbb\xbf{"prompt": [1]}').prompt_ids, [1])

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


OTHER = "0therKEY" * 4
REFUSED = {"error": {"message": "missing or wrong engine key (Authorization: Bearer KEY)",
                     "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
CHAT = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()


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
                                   ("GET", "/v1/models", None)):
            with self.subTest(method=method, path=path):
                self.assert_refused(*self.ask(method, path, body))
        self.assertEqual(self.state.responses, {401: 3})
        for path in ("/health", "/health?x=1"):
            r, data = self.ask("GET", path)
            self.assertEqual((r.status, json.loads(data)), (503, {"status": "standby"}))
        r, data = self.ask("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertIn(b'baton_engine_http_responses_total{code="401"} 3', data)

    def test_no_route_is_404_or_405_key_or_no_key_as_the_reference_engine_answers(self):
        self.start([KEY])
        for method, path, body, status in (("GET", "/nowhere", None, 404),
                                           ("POST", "/nowhere", b"{}", 404),
                                           ("POST", "/health", b"{}", 405),
                                           ("GET", "/v1/completions", None, 405),
                                           ("PUT", "/v1/models", b"{}", 405)):
            for auth in (None, "Bearer " + KEY):
                with self.subTest(method=method, path=path, auth=auth):
                    r, data = self.ask(method, path, body, auth)
                    self.assertEqual(r.status, status, data)
                    self.assertIsNone(r.getheader("WWW-Authenticate"))
        self.assertNotIn(401, self.state.responses)

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


if __name__ == "__main__":
    unittest.main()

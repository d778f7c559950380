"""baton-torch-engine's request parsing and text building, without PyTorch: refusals name the
param as the reference engine's do, a replay's resumed tokens count as output, and text that
may start a stop string is held back until it is known not to be one."""
import json
import os
import sys
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_torch_engine.openai_requests import ApiError, Parser, render_chat  # noqa: E402
from baton_torch_engine.text import TextBuilder  # noqa: E402

PARSER = Parser("tiny", vocab_size=260, max_positions=512, bos=256)


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


if __name__ == "__main__":
    unittest.main()

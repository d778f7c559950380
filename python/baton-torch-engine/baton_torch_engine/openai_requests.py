"""The OpenAI requests baton-torch-engine accepts, parsed and validated as the reference
engine validates them (standby/openai/completions_api.h): a refusal is an ApiError, a 400
whose `param` names the field, never a silent default.

Fields: model, prompt (a string, token ids, or a one-element list of either), max_tokens,
temperature, top_p, seed, stream, stream_options.include_usage, stop (a string or up to 4),
n (only 1), return_token_ids (token ids are always returned), vLLM's min_tokens, ignore_eos
and stop_token_ids (top_k, min_p and repetition_penalty only at values that change nothing),
and Baton's
baton_resume_tokens (the last K prompt ids were already sent to the client by another
engine: a router's replay) and baton_request_key. Chat requests bring `messages` instead of
`prompt`, rendered with the reference engine's template.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Optional

MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 256
MAX_STOP_TOKEN_IDS = 64
UNSUPPORTED_UNLESS_DEFAULT = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
                              "tools": [], "functions": [], "best_of": 1, "suffix": "",
                              "echo": False, "logprobs": None}
# vLLM's sampling knobs this engine does not implement: the values that change nothing.
VLLM_NEUTRAL = {"top_k": (-1, 0), "min_p": (0,), "repetition_penalty": (1,)}
MAX_JSON_DEPTH = 64  # the reference engine's kMaxJsonDepth (base/text/json_depth.h)
TOO_DEEP = f"the request body nests deeper than {MAX_JSON_DEPTH} levels"


def json_depth_over(value, limit: int) -> bool:
    """Whether parsed JSON `value` nests arrays and objects deeper than `limit` (the top
    one is level 1), walked without recursion."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        for child in (v.values() if isinstance(v, dict) else v):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _finite(v) -> bool:
    """A JSON number that is finite: every integer (math.isfinite overflows on a huge one)."""
    return isinstance(v, int) or math.isfinite(v)


class ApiError(Exception):
    """{"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> bytes:
        return json.dumps({"error": {"message": str(self), "type": self.kind,
                                     "param": self.param, "code": self.code}}).encode()


@dataclass
class Completion:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    min_tokens: int = 0  # vLLM's: no eos or stop id among the first this many tokens, no stop
    #                      string in their text
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    resume_tokens: int = 0
    chat: bool = False
    model: str = ""
    key: tuple[int, int] = (0, 0)  # baton_request_key (hi, lo); (0, 0) when absent


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
        raise ApiError(f"'{name}' must be a number", name)
    if not lo <= v <= hi:
        raise ApiError(f"'{name}' must be in [{lo}, {hi}]", name)
    return float(v)


def _int(body: dict, name: str, default: Optional[int]) -> Optional[int]:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"'{name}' must be an integer", name)
    return v


def _bool(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"'{name}' must be a boolean", name)
    return v


def _request_key(body: dict) -> tuple[int, int]:
    """baton_request_key: the router's key of the client request (32 hex digits, not all
    zero), the same on its replay: what a KV-warm successor finds the request's KV by."""
    v = body.get("baton_request_key")
    if v is None:
        return (0, 0)
    if isinstance(v, str) and len(v) == 32 and all(c in "0123456789abcdefABCDEF" for c in v) \
            and int(v, 16) != 0:
        return (int(v[:16], 16), int(v[16:], 16))
    raise ApiError("'baton_request_key' must be 32 hex digits, not all zero",
                   "baton_request_key")


def _unsupported(body: dict) -> None:
    for name, default in UNSUPPORTED_UNLESS_DEFAULT.items():
        v = body.get(name)
        if v is None or v == default or (name == "logprobs" and v in (False, 0)):
            continue
        raise ApiError(f"'{name}' is not supported", name)
    choice = body.get("tool_choice")
    if choice not in (None, "none"):
        raise ApiError("'tool_choice' is not supported", "tool_choice")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise ApiError("'response_format' is not supported", "response_format")


def _vllm_unimplemented(body: dict) -> None:
    for name, neutral in VLLM_NEUTRAL.items():
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or \
                (name == "top_k" and not isinstance(v, int)):
            raise ApiError(f"'{name}' must be a{'n integer' if name == 'top_k' else ' number'}",
                           name)
        if v not in neutral:
            raise ApiError(f"'{name}' is not supported by this engine (only "
                           f"{' or '.join(str(n) for n in neutral)})", name)


def _stop_token_ids(body: dict, vocab: int) -> list[int]:
    v = body.get("stop_token_ids")
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_STOP_TOKEN_IDS or \
            not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in v):
        raise ApiError(f"'stop_token_ids' must be an array of at most {MAX_STOP_TOKEN_IDS} "
                       f"token ids in [0, {vocab})", "stop_token_ids")
    return list(v)


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(f"'stop' takes at most {MAX_STOP_STRINGS} strings", "stop")
    if any(not s or len(s.encode()) > MAX_STOP_BYTES for s in stops):
        raise ApiError(f"each 'stop' string must be 1 to {MAX_STOP_BYTES} bytes", "stop")
    return stops


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON value")  # json.loads takes NaN and Infinity


class Parser:
    """Parses request bodies for one served model."""

    def __init__(self, served_name: str, vocab_size: int, max_positions: int,
                 bos: Optional[int]):
        self.served_name, self.vocab, self.max_positions, self.bos = \
            served_name, vocab_size, max_positions, bos

    def _body(self, raw: bytes) -> dict:
        try:  # strict UTF-8 (json.loads would take UTF-16 and UTF-32 bytes too); json.loads
            # recurses, to the interpreter's recursion limit
            text = raw.decode("utf-8")
            body = json.loads(text[1:] if text.startswith("\ufeff") else text,  # a BOM, as
                              parse_constant=_no_constant)  # the reference engine skips it
        except RecursionError as e:
            raise ApiError(TOO_DEEP) from e
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(f"the body is not JSON: {e}") from e
        if json_depth_over(body, MAX_JSON_DEPTH):  # what is kept must not recurse deep either
            raise ApiError(TOO_DEEP)
        if not isinstance(body, dict):
            raise ApiError("the body must be a JSON object")
        try:  # an escaped lone surrogate ("\ud800") parses, but is no Unicode text
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as e:
            raise ApiError(f"the body is not valid Unicode: an unpaired surrogate ({e.reason})") \
                from e
        model = body.get("model")
        if model is not None and model != self.served_name:
            raise ApiError(f"the model '{model}' does not exist", "model", 404,
                           "model_not_found")
        return body

    def encode(self, text: str) -> list[int]:
        return ([self.bos] if self.bos is not None else []) + list(text.encode())

    def _prompt(self, body: dict) -> list[int]:
        if "prompt" not in body:
            raise ApiError("'prompt' is required", "prompt", code="missing_required_parameter")
        p = body["prompt"]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str):
            return self.encode(p)
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                             for t in p):
            if any(t < 0 or t >= self.vocab for t in p):
                raise ApiError(f"a prompt token id is outside the vocabulary of {self.vocab}",
                               "prompt")
            return list(p)
        raise ApiError("'prompt' must be a string or a non-empty array of token ids", "prompt")

    def completion(self, raw: bytes, chat_messages: Optional[list] = None) -> Completion:
        body = self._body(raw)
        _unsupported(body)
        _vllm_unimplemented(body)
        if _int(body, "n", 1) != 1:
            raise ApiError("only 'n' = 1 is supported", "n")
        prompt = self._prompt(body) if chat_messages is None else chat_messages
        if not prompt:  # a text prompt of "" on a model without bos: nothing to compute from
            raise ApiError("'prompt' is empty", "prompt" if chat_messages is None else "messages")
        resume = _int(body, "baton_resume_tokens", 0)
        if resume < 0 or resume >= len(prompt):  # the reference engine's ReadResume
            raise ApiError("'baton_resume_tokens' must be at least 0 and less than the "
                           f"prompt's {len(prompt)} tokens", "baton_resume_tokens")
        room = self.max_positions - len(prompt)
        if room < 1:
            raise ApiError(f"the prompt's {len(prompt)} tokens leave no room under "
                           f"{self.max_positions}", "prompt")
        # Chat reads max_completion_tokens first (a null one is absent), completions only
        # max_tokens, as the reference engine's ReadMaxTokens.
        name, max_tokens = "max_tokens", None
        if chat_messages is not None:
            max_tokens = _int(body, "max_completion_tokens", None)
            if max_tokens is not None:
                name = "max_completion_tokens"
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", None)
        if max_tokens is None:
            max_tokens = room if resume or chat_messages is not None else min(16, room)
        if max_tokens < 1 or max_tokens > room:
            raise ApiError(f"'{name}' must be in [1, {room}] for this prompt", name)
        min_tokens = _int(body, "min_tokens", 0)
        if min_tokens < 0 or min_tokens > max_tokens:
            raise ApiError(f"'min_tokens' must be in [0, max_tokens = {max_tokens}]",
                           "min_tokens")
        seed = _int(body, "seed", None)
        if seed is not None:
            if seed < -(1 << 63) or seed >= (1 << 64):
                raise ApiError("'seed' must be an integer in [-2^63, 2^64)", "seed")
            seed &= (1 << 64) - 1  # as the reference engine reads it, and echoes it
        options = body.get("stream_options")
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ApiError("'stream_options' must be an object", "stream_options")
        _bool(body, "return_token_ids")  # token ids are always returned; true or false
        if chat_messages is not None:  # the reference engine's ReadUnimplemented
            top = _int(body, "top_logprobs", 0)
            if not 0 <= top <= 20:
                raise ApiError("'top_logprobs' must be in [0, 20]", "top_logprobs")
            if top != 0:
                raise ApiError("'top_logprobs' is not supported by this engine (only 0)",
                               "top_logprobs")
        return Completion(prompt_ids=prompt, max_tokens=max_tokens,
                          temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                          top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
                          seed=seed if seed is not None else random.getrandbits(63),
                          stream=_bool(body, "stream"),
                          include_usage=_bool(options, "include_usage"),
                          stop=_stop(body), min_tokens=min_tokens,
                          ignore_eos=_bool(body, "ignore_eos"),
                          stop_token_ids=_stop_token_ids(body, self.vocab), resume_tokens=resume,
                          chat=chat_messages is not None, model=self.served_name,
                          key=_request_key(body))

    def chat(self, raw: bytes) -> Completion:
        body = self._body(raw)
        return self.completion(raw, self.encode(render_chat(body)))


def render_chat(body: dict) -> str:
    """The reference engine's chat template (standby/openai/chat_api.h): each message as
    "<|role|>\\ncontent\\n", then "<|assistant|>\\n"; refusals name the path."""
    messages = body.get("messages")
    if messages is None:
        raise ApiError("'messages' is required", "messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"'{where}' must be an object", where)
        role = m.get("role")
        if role is None:
            raise ApiError(f"'{where}.role' is required", f"{where}.role",
                           code="missing_required_parameter")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(f"'{where}.role' must be system, developer, user, assistant or tool",
                           f"{where}.role")
        content = m.get("content")
        if content is None:
            raise ApiError(f"'{where}.content' is required", f"{where}.content",
                           code="missing_required_parameter")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or \
                        not isinstance(part.get("text"), str):
                    raise ApiError(f"'{where}.content[{j}].type' must be text",
                                   f"{where}.content[{j}].type")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(f"'{where}.content' must be a string or text parts",
                           f"{where}.content")
        out.append(f"<|{role}|>\n{content}\n")
    return "".join(out) + "<|assistant|>\n"


def usage(req: Completion, generated: int) -> dict:
    """The `usage` of an answer to `req` that generated `generated` tokens (a replay's resumed
    tokens count as completion tokens, as the client saw them generated)."""
    return {"prompt_tokens": len(req.prompt_ids) - req.resume_tokens,
            "completion_tokens": generated + req.resume_tokens,
            "total_tokens": len(req.prompt_ids) + generated}

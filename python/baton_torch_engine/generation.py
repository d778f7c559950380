"""One request's generation on the LlamaModel: prefill, then a token at a time, each chosen
by the reference engine's sampler at its absolute position, with the text built as the
reference engine builds it. Requests run one at a time on the engine's compute thread (one
lock); their KV blocks go back to the cache when they end."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from .llama import KvBlocks, LlamaModel, Sequence_
from .requests import ApiError, Completion
from .sampler import sample_token
from .text import TextBuilder


@dataclass
class Step:
    """What one generated token lets out: its id, its text, and the finish reason once the
    generation ends ("" while it goes on)."""
    token: int
    text: str
    finish_reason: str = ""


class Generator:
    def __init__(self, model: LlamaModel, kv: KvBlocks, eos: list[int],
                 may_compute: Callable[[], bool] = lambda: True):
        self.model, self.kv, self.eos = model, kv, set(eos)
        self.may_compute = may_compute
        self.lock = threading.Lock()
        self.generated_total = 0
        self.prompt_total = 0

    def run(self, req: Completion) -> Iterator[Step]:
        """Yields a Step per generated token; raises ApiError 503 when the engine may no
        longer compute (fenced) and 429 when the KV cache has no room."""
        with self.lock:
            yield from self._run(req)

    def _run(self, req: Completion) -> Iterator[Step]:
        seq = Sequence_()
        text = TextBuilder(req.stop)
        fresh = len(req.prompt_ids) - req.resume_tokens
        for t in req.prompt_ids[fresh:]:  # already sent by another engine: text only
            text.push(t)
        try:
            logits = self._forward(seq, req.prompt_ids)
            self.prompt_total += fresh
            position = len(req.prompt_ids)
            for n in range(req.max_tokens):
                token = sample_token(logits.tolist(), req.temperature, req.top_p, req.seed,
                                     position)
                position += 1
                self.generated_total += 1
                if token in self.eos:
                    yield Step(token, text.finish(), "stop")
                    return
                out = text.push(token)
                if text.stopped:
                    yield Step(token, out, "stop")
                    return
                if n + 1 == req.max_tokens:
                    yield Step(token, out + text.finish(), "length")
                    return
                yield Step(token, out)
                logits = self._forward(seq, [token])
        finally:
            self.kv.give_back(seq.blocks)

    def _forward(self, seq: Sequence_, tokens: list[int]):
        if not self.may_compute():
            raise ApiError("the engine was fenced", status=503, kind="server_error")
        try:
            return self.model.forward(self.kv, seq, tokens)
        except MemoryError as e:
            raise ApiError(str(e), status=429, kind="server_error") from e


def usage(req: Completion, generated: int) -> dict:
    return {"prompt_tokens": len(req.prompt_ids) - req.resume_tokens,
            "completion_tokens": generated + req.resume_tokens,
            "total_tokens": len(req.prompt_ids) + generated}



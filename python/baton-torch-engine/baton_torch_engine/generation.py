"""The HTTP threads' side of generation: a request becomes a job of the Scheduler (continuous
batching on the compute thread, batching.py), and its tokens come back as Steps, each chosen
by the reference engine's sampler at its absolute position, with the text built as the
reference engine builds it. Closing the iterator (a client gone) cancels the job; its KV
blocks go back to the cache. So does a client found gone while the answer is generated: run()
asks gone() every GONE_POLL_S, and ends with ConnectionAbortedError when it says so."""
from __future__ import annotations

import queue
import time
from typing import Callable, Iterator, Optional

from .batching import Job, Scheduler, Step
from .kv_blocks import KvBlocks
from .llama import LlamaModel
from .openai_requests import ApiError, Completion

__all__ = ["Generator", "Step", "usage"]

GONE_POLL_S = 0.1  # how often run() asks whether its client is gone


class Generator:
    def __init__(self, model: LlamaModel, kv: KvBlocks, eos: list[int],
                 may_compute: Callable[[], bool] = lambda: True, max_batch: int = 16,
                 max_step_tokens: int = 256,
                 on_error: Optional[Callable[[BaseException], int]] = None,
                 log: Callable[[str], None] = lambda text: None,
                 on_progress: Optional[Callable[[int, int], None]] = None,
                 step_interval: float = 0.0):
        self.model = model
        self.scheduler = Scheduler(model, kv, eos, may_compute, max_batch, max_step_tokens,
                                   on_error, log, on_progress, step_interval)
        device = model.device
        self.scheduler.start(on_thread=lambda: _use_device(device))

    @property
    def generated_total(self) -> int:
        return self.scheduler.generated_total

    @property
    def prompt_total(self) -> int:
        return self.scheduler.prompt_total

    def run(self, req: Completion,
            gone: Optional[Callable[[], bool]] = None) -> Iterator[Step]:
        """Yields a Step per generated token; raises ApiError 503 when the engine may no
        longer compute (fenced), 429 when the KV cache has no room, 400 or 503 when it never
        would or cannot now (Scheduler.submit), and
        ConnectionAbortedError (the job cancelled) once gone() says the client left."""
        yield from self._steps(self.scheduler.submit(req), gone)

    def _steps(self, job: Job, gone: Optional[Callable[[], bool]] = None) -> Iterator[Step]:
        next_check = time.monotonic() + GONE_POLL_S
        try:
            while True:
                try:
                    wait = None if gone is None else max(0.0, next_check - time.monotonic())
                    item = job.steps.get(timeout=wait)
                except queue.Empty:
                    item = None
                if gone is not None and time.monotonic() >= next_check:
                    if gone():
                        raise ConnectionAbortedError("the client is gone")
                    next_check = time.monotonic() + GONE_POLL_S
                if item is None:
                    continue
                if isinstance(item, ApiError):
                    raise item
                yield item
                if item.finish_reason:
                    return
        finally:
            if not job.done:
                try:
                    self.scheduler.cancel(job)
                except ApiError:  # stopping: the scheduler fails it anyway
                    pass

    def stop(self) -> None:
        self.scheduler.stop()


def _use_device(device) -> None:
    if device.is_cuda:
        import torch
        torch.cuda.set_device(device.torch)

"""Scheduler: continuous batching of generation requests on one compute thread, as the
reference engine's Generator (standby/model/generator.h) does it.

    s = Scheduler(model, kv, eos, may_compute=engine.may_write)
    s.start()
    job = s.submit(completion)         # from any thread; job.steps is a queue of Steps
    s.cancel(job)                      # the client went away
    s.call(fn)                         # fn() on the compute thread between steps

Each step first takes new requests and cancellations, then admits waiting requests while the
KV cache has room (the whole input plus one token, and a block of headroom per running
sequence), then runs one LlamaModel.step over every running sequence: one token for each
that is decoding, and chunks of prompts for those still in prefill (decodes first, then
prefill, within max_step_tokens). Each sequence whose input is complete gets its next token
sampled at its absolute position (seed, position) and its text built; one that stops (an
end-of-sequence id, a stop string, max_tokens, the context's end) gives its blocks back. When
the cache cannot hold a step, the most recently admitted sequence is preempted: its blocks
are freed and it waits at the head of the queue, to be computed again from prompt + generated
tokens, which gives the same tokens because a row's logits do not depend on the batch.

With a KV handoff (kv_handoff.py, set as `handoff` before the first step), every keyed
request's blocks get their KV records after each step and lose them before they are freed, a
replayed request is first offered the KV its predecessor left (continue_from: only the rest of
its prompt is prefilled), and kept KV is evicted when the cache needs its blocks.

Before and after each step, on_progress(steps done, requests running or waiting) tells the
engine SDK how far the compute has come (Engine.report_progress: the controller fences a
primary whose steps stand still while requests wait). Before each step, may_compute() (the
engine's epoch check) must hold, or every request fails with 503 (a fenced engine's blocks
may already be another's). A step that raises fails its requests: on_error(exc) decides the
status (503 for a device fault it has reported).

With step_interval > 0 (seconds; --step-interval-ms) a step starts at most every
step_interval after the one before, as the reference engine's pace (EngineLoop::Pace): a
stream a reader can follow, or one that lasts long enough for a test to cut it. While it
waits, the thread goes on taking requests, cancellations and call()s.
"""
from __future__ import annotations

import collections
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .kv_blocks import KvBlocks, SequenceBlocks
from .llama import LlamaModel
from .openai_requests import ApiError, Completion
from .sampler import sample_token
from .text import TextBuilder

# A step that found no memory: no free KV block (MemoryError), or the device's own memory
# (torch.OutOfMemoryError, a RuntimeError; torch.cuda.OutOfMemoryError before PyTorch 2.5).
OUT_OF_MEMORY = (MemoryError,) + tuple(
    e for e in (getattr(torch, "OutOfMemoryError", None),
                getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None))
    if isinstance(e, type))

if TYPE_CHECKING:
    from .kv_handoff import KvHandoff


@dataclass
class Step:
    """What one generated token lets out: its id, its text, and the finish reason once the
    generation ends ("" while it goes on)."""
    token: int
    text: str
    finish_reason: str = ""


@dataclass(eq=False)
class Job:
    """One request in the scheduler: its tokens (prompt, then generated) and KV sequence.
    `steps` receives a Step per token, or an ApiError, and nothing after the last."""
    req: Completion
    tokens: list[int]
    text: TextBuilder
    steps: "queue.Queue" = field(default_factory=queue.Queue)
    seq: SequenceBlocks = field(default_factory=SequenceBlocks)
    generated: int = 0
    done: bool = False
    continued: bool = False  # offered to the KV handoff already


class Scheduler:
    def __init__(self, model: LlamaModel, kv: KvBlocks, eos: list[int],
                 may_compute: Callable[[], bool] = lambda: True, max_batch: int = 16,
                 max_step_tokens: int = 256,
                 on_error: Optional[Callable[[BaseException], int]] = None,
                 log: Callable[[str], None] = lambda text: None,
                 on_progress: Optional[Callable[[int, int], None]] = None,
                 step_interval: float = 0.0):
        self.model, self.kv, self.eos = model, kv, set(eos)
        self.step_interval = max(0.0, step_interval)
        self._next_step_at = 0.0  # time.monotonic() before which no step starts
        self.may_compute, self.on_error, self.log = may_compute, on_error, log
        self.on_progress = on_progress
        self.max_batch, self.max_step_tokens = max(1, max_batch), max(1, max_step_tokens)
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []
        self._inbox: list[tuple[str, Any]] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.generated_total = self.prompt_total = self.steps_total = 0
        self.preempted_total = self.resumed_total = 0
        self.handoff: Optional["KvHandoff"] = None

    # --- any thread --------------------------------------------------------------------------

    def start(self, on_thread: Callable[[], None] = lambda: None) -> None:
        """Starts the compute thread; on_thread() runs first on it (a CUDA device's
        selection is per thread)."""
        def run():
            on_thread()
            self._loop()
        self._thread = threading.Thread(target=run, name="compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    def submit(self, req: Completion) -> Job:
        """Queues `req`. ApiError, as the reference engine's Generator::Add: 400 for an empty
        prompt (nothing to compute the first token from) and for a request that would never
        fit the KV cache (no use retrying); 503 for one that fits the blocks the cache may
        reach (its most, or the pool's) but not those it holds now (another engine may take
        it)."""
        if not req.prompt_ids:
            raise ApiError("the prompt is empty", "prompt")
        longest = min(len(req.prompt_ids) + req.max_tokens, self.model.c.max_position_embeddings)
        need, total = self.kv.blocks_for(longest), self.kv.total
        if total < need <= self.kv.reachable_blocks:
            raise ApiError(f"the request needs {need} KV blocks, the cache has {total} now",
                           status=503, kind="server_error")
        if need > total:
            raise ApiError(f"the request needs {need} KV blocks, the cache has {total}: it "
                           "would never fit")
        job = Job(req, list(req.prompt_ids), TextBuilder(req.stop))
        for t in req.prompt_ids[len(req.prompt_ids) - req.resume_tokens:]:
            job.text.push(t, may_stop=False)  # already sent by another engine: text only
        self._post("submit", job)
        return job

    def cancel(self, job: Job) -> None:
        self._post("cancel", job)

    def call(self, fn: Callable[[], Any]) -> Any:
        """fn() run on the compute thread between steps (a standby's rehearsal, which must
        make the thread's own device state); returns its result or raises its exception."""
        done: queue.Queue = queue.Queue()
        self._post("call", (fn, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def hand_over(self) -> int:
        """A planned switch-over (a drain): every keyed request ends with an error the router
        replays on the next primary; a running one's KV is parked with its records
        (KvHandoff.park), so the next primary continues from it. Requests without a key (sent
        to this engine directly) go on to their end. Returns how many ended. Compute thread
        (call())."""
        handed = ApiError("handed over to the next primary", status=503, kind="server_error")
        jobs = [j for j in list(self.running) + list(self.waiting)
                if not j.done and j.req.key != (0, 0)]
        for job in jobs:
            if self.handoff is not None and job in self.running:
                self.handoff.park(job.req.key, job.seq, job.tokens)  # job.seq left empty
        self._fail(jobs, handed)
        return len(jobs)

    def _post(self, what: str, payload: Any) -> None:
        with self._cv:
            if self._stop:
                raise ApiError("the engine is stopping", status=503, kind="server_error")
            self._inbox.append((what, payload))
            self._cv.notify()

    # --- the compute thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._inbox and not self.running and \
                        not self.waiting:
                    self._cv.wait()
                if self._stop:
                    break
                inbox, self._inbox = self._inbox, []
            self._apply(inbox)
            if self.handoff is not None:
                self.handoff.expire()
            if not self.may_compute():
                self._fail(list(self.running) + list(self.waiting),
                           ApiError("the engine was fenced", status=503, kind="server_error"))
                continue
            self._admit()
            if self.running and not self._paced():
                continue
            self._report_progress()
            if self.running:
                self._next_step_at = time.monotonic() + self.step_interval
                self._step()
                self._report_progress()
        stopping = ApiError("the engine is stopping", status=503, kind="server_error")
        for what, payload in self._inbox:
            if what == "call":
                payload[1].put((False, stopping))
        self._fail(list(self.running) + list(self.waiting) +
                   [j for what, j in self._inbox if what == "submit"], stopping)

    def _paced(self) -> bool:
        """True when a step may start now; otherwise waits until it may, or until something
        is posted, and returns False."""
        with self._cv:
            delay = self._next_step_at - time.monotonic()
            if delay <= 0:
                return True
            if not self._inbox and not self._stop:
                self._cv.wait(delay)
            return False

    def _report_progress(self) -> None:
        """on_progress(steps done, requests admitted and not finished): before a step (its
        work pending while a long first prefill runs) and after it."""
        if self.on_progress is not None:
            self.on_progress(self.steps_total, len(self.running) + len(self.waiting))

    def _apply(self, inbox: list[tuple[str, Any]]) -> None:
        for what, payload in inbox:
            if what == "submit":
                self.waiting.append(payload)
                self.prompt_total += len(payload.req.prompt_ids) - payload.req.resume_tokens
                self.resumed_total += 1 if payload.req.resume_tokens else 0
            elif what == "cancel":
                self._finish(payload)
            else:
                fn, done = payload
                try:
                    done.put((True, fn()))
                except BaseException as e:  # raised on the caller's thread
                    done.put((False, e))

    def _continue_from_kept(self, job: Job) -> None:
        if job.continued or self.handoff is None or job.req.key == (0, 0):
            return
        job.continued = True
        if job.seq.length == 0 and not job.seq.blocks:
            self.handoff.continue_from(job.req.key, job.tokens, job.seq)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            job = self.waiting[0]
            self._continue_from_kept(job)
            need = self.kv.blocks_for(len(job.tokens) + 1) - len(job.seq.blocks) + \
                len(self.running)
            if need > self.kv.free_count and self.handoff is not None:
                self.handoff.evict(need - self.kv.free_count)
            if need > self.kv.free_count:
                if not self.running:  # nothing will free blocks: the cache shrank under it
                    self._fail([job], ApiError("the KV cache has no room for the request",
                                               status=429, kind="rate_limit_error"))
                    continue
                return
            self.running.append(self.waiting.popleft())

    def _batch(self) -> list[tuple[Job, int]]:
        """(job, tokens to compute) for this step: decodes first, then prefill chunks."""
        out, budget = [], self.max_step_tokens
        for job in self.running:
            if len(job.tokens) - job.seq.length == 1:
                out.append((job, 1))
                budget -= 1
        for job in self.running:
            left = len(job.tokens) - job.seq.length
            if left > 1 and budget > 0:
                out.append((job, min(left, budget)))
                budget -= min(left, budget)
        return out

    def _step(self) -> None:
        while True:
            batch = self._batch()
            if not batch:  # no running sequence has a token to compute: none would ever end
                stuck = list(self.running)
                self.log(f"{len(stuck)} running requests have no token to compute: answered 500")
                self._fail(stuck, ApiError("the engine has no token to compute for the request",
                                           status=500, kind="server_error"))
                return
            items = [(j.seq, j.tokens[j.seq.length:j.seq.length + n]) for j, n in batch]
            want = [j.seq.length + n == len(j.tokens) for j, n in batch]
            before = [j.seq.length for j, _ in batch]
            try:
                logits = self.model.step(self.kv, items, want)
                break
            except OUT_OF_MEMORY as e:
                if len(self.running) > 1:
                    self._preempt_youngest()
                    continue
                self._fail(list(self.running),
                           ApiError(str(e), status=429, kind="rate_limit_error"))
                return
            except Exception as e:  # a device fault, or a bug: the step's requests fail
                status = self.on_error(e) if self.on_error else 500
                self.log(f"a step failed ({type(e).__name__}: {e}): {len(batch)} requests "
                         f"answered {status}")
                self._fail([j for j, _ in batch], ApiError(f"the engine failed: {e}",
                                                           status=status, kind="server_error"))
                return
        self.steps_total += 1
        if self.handoff is not None:  # the step's K and V are written: its logits are here
            for (job, _), length in zip(batch, before):
                self.handoff.committed(job.req.key, job.seq, job.tokens, length)
        for (job, _), row in zip(batch, logits):
            if row is not None:
                self._emit(job, sample_token(self._logits(job, row), job.req.temperature,
                                             job.req.top_p, job.req.seed, len(job.tokens)))

    def _stop_ids(self, job: Job) -> set[int]:
        return set(job.req.stop_token_ids) | (set() if job.req.ignore_eos else self.eos)

    def _logits(self, job: Job, row) -> list[float]:
        """The row as a list; while the request is under min_tokens, eos (ignore_eos or not,
        as in vLLM) and its stop ids get no probability."""
        values = row.tolist()
        if job.generated < job.req.min_tokens:
            for t in set(job.req.stop_token_ids) | self.eos:
                values[t] = -math.inf
        return values

    def _emit(self, job: Job, token: int) -> None:
        job.tokens.append(token)
        job.generated += 1
        self.generated_total += 1
        if token in self._stop_ids(job):  # its text is left out, as in vLLM
            return self._end(job, Step(token, job.text.finish(), "stop"))
        out = job.text.push(token, may_stop=job.generated > job.req.min_tokens)
        if job.text.stopped:
            return self._end(job, Step(token, out, "stop"))
        if job.generated == job.req.max_tokens or \
                len(job.tokens) >= self.model.c.max_position_embeddings:
            return self._end(job, Step(token, out + job.text.finish(), "length"))
        job.steps.put(Step(token, out))

    def _end(self, job: Job, last: Step) -> None:
        job.steps.put(last)
        self._finish(job)

    def _release(self, seq: SequenceBlocks) -> None:
        if self.handoff is not None and seq.blocks:
            self.handoff.releasing(seq)
        self.kv.give_back(seq.blocks)

    def _preempt_youngest(self) -> None:
        job = self.running.pop()
        self._release(job.seq)
        job.seq = SequenceBlocks()
        self.waiting.appendleft(job)
        self.preempted_total += 1
        self.log(f"preempted a request of {len(job.tokens)} tokens for recompute "
                 "(the KV cache is full)")

    def _finish(self, job: Job) -> None:
        if job.done:
            return
        job.done = True
        self._release(job.seq)
        job.seq = SequenceBlocks()
        if job in self.running:
            self.running.remove(job)
        elif job in self.waiting:
            self.waiting.remove(job)

    def _fail(self, jobs: list[Job], error: ApiError) -> None:
        for job in jobs:
            if not job.done:
                job.steps.put(error)
                self._finish(job)

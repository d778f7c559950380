"""baton-torch-engine's scheduler (batching.py) and its HTTP threads' side (generation.py) on a
stand-in model and KV cache: a request that can never be computed is refused, or failed once,
never left running (the compute thread would spin on it for ever), and a client gone while
its answer is generated cancels the generation and frees its blocks. Needs PyTorch (Debian's
python3-torch for /usr/bin/python3); without it every test says so and is skipped."""
import threading
import time
import types
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

try:
    import torch
    from baton_torch_engine.batching import Job, Scheduler
    from baton_torch_engine.config import LlamaConfig
    from baton_torch_engine.generation import Generator
    from baton_torch_engine.kv_blocks import KvBlocks
    from baton_torch_engine.openai_requests import ApiError, Completion
    from baton_torch_engine.text import TextBuilder
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"

VOCAB, CONTEXT = 260, 512


class FakeKv:
    """A KV cache of `total` blocks of 4 positions, as much of KvBlocks as the scheduler
    uses."""

    block_tokens = 4

    def __init__(self, total: int, reachable: int = 0):
        self.free = list(range(total))
        self.blocks = set(self.free)
        self.reachable = reachable

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_tokens)

    @property
    def total(self) -> int:
        return len(self.blocks)

    @property
    def reachable_blocks(self) -> int:
        return max(self.total, self.reachable)

    @property
    def free_count(self) -> int:
        return len(self.free)

    def take(self, count: int) -> list:
        if count > len(self.free):
            raise MemoryError(f"the KV cache needs {count} more blocks, {len(self.free)} free")
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def give_back(self, blocks) -> None:
        self.free.extend(blocks)


class FakeModel:
    """Stores each item's tokens as LlamaModel.step does (blocks taken, length advanced) and
    gives token 65 the highest logit; `delay` seconds per step. Raises as LlamaModel does for
    an item without tokens."""

    device = types.SimpleNamespace(is_cuda=False)
    c = types.SimpleNamespace(max_position_embeddings=CONTEXT)
    batch_invariant = True

    def __init__(self, delay: float = 0.0):
        self.delay, self.steps = delay, 0

    def step(self, kv, items, want=None):
        self.steps += 1
        for seq, tokens in items:
            if not tokens:
                raise ValueError("forward: no tokens")
        for seq, tokens in items:
            need = kv.blocks_for(seq.length + len(tokens)) - len(seq.blocks)
            if need > 0:
                seq.blocks.extend(kv.take(need))
            seq.length += len(tokens)
        time.sleep(self.delay)
        row = torch.zeros(VOCAB)
        row[65] = 10.0
        return [row if w else None for w in (want or [True] * len(items))]


def completion(prompt, max_tokens=4, **kw):
    return Completion(prompt_ids=list(prompt), max_tokens=max_tokens, temperature=0.0, seed=1,
                      **kw)


@unittest.skipIf(MISSING, MISSING)
class SchedulerTest(unittest.TestCase):
    def start(self, kv=None, delay=0.0):
        self.kv, self.model, self.logs = kv or FakeKv(64), FakeModel(delay), []
        self.scheduler = Scheduler(self.model, self.kv, eos=[257], log=self.logs.append)
        self.scheduler.start()
        self.addCleanup(self.scheduler.stop)
        return self.scheduler

    def steps_of(self, job, limit_s=10.0):
        """The job's steps up to the last, or up to its error (returned last)."""
        out, deadline = [], time.monotonic() + limit_s
        while time.monotonic() < deadline:
            item = job.steps.get(timeout=limit_s)
            out.append(item)
            if isinstance(item, ApiError) or item.finish_reason:
                return out
        self.fail(f"the job did not end in {limit_s} s: {out}")

    def test_an_empty_prompt_is_refused_at_submit(self):
        s = self.start()
        with self.assertRaises(ApiError) as ctx:
            s.submit(completion([]))
        self.assertEqual((ctx.exception.status, ctx.exception.param), (400, "prompt"))
        self.assertEqual(len(self.steps_of(s.submit(completion([1, 2], max_tokens=3)))), 3)

    def test_a_running_request_with_nothing_to_compute_fails_once_and_the_thread_rests(self):
        s = self.start()
        job = Job(completion([]), [], TextBuilder([]))
        s._post("submit", job)  # as submit took an empty prompt before it refused one
        out = self.steps_of(job)
        self.assertEqual(len(out), 1)
        self.assertIsInstance(out[0], ApiError)
        self.assertEqual(out[0].status, 500)
        time.sleep(0.2)
        self.assertEqual(self.model.steps, 0)
        self.assertEqual(self.kv.free_count, 64)
        self.assertEqual(len(self.logs), 1, self.logs)
        self.assertEqual((s.running, list(s.waiting)), ([], []))
        self.assertEqual(len(self.steps_of(s.submit(completion([1, 2], max_tokens=2)))), 2)

    def test_a_request_that_would_never_fit_is_400_one_that_fits_what_is_reachable_503(self):
        s = self.start(FakeKv(8, reachable=16))
        for max_tokens, status, kind in ((29, None, None), (30, 503, "server_error"),
                                         (61, 503, "server_error"),
                                         (62, 400, "invalid_request_error")):
            with self.subTest(max_tokens=max_tokens):
                req = completion([1, 2, 3], max_tokens=max_tokens, ignore_eos=True)
                if status is None:
                    self.assertEqual(len(self.steps_of(s.submit(req))), max_tokens)
                    continue
                with self.assertRaises(ApiError) as ctx:
                    s.submit(req)
                self.assertEqual((ctx.exception.status, ctx.exception.kind), (status, kind))
        with self.assertRaises(ApiError) as ctx:
            s.submit(completion([1, 2, 3], max_tokens=62))
        self.assertIn("would never fit", str(ctx.exception))


@unittest.skipIf(MISSING, MISSING)
class ReachableBlocksTest(unittest.TestCase):
    def test_a_cache_reaches_the_most_it_held_or_what_it_is_told(self):
        config = LlamaConfig(hidden_size=8, intermediate_size=8, num_attention_heads=2,
                             num_key_value_heads=1, num_hidden_layers=1, vocab_size=4,
                             head_dim=4)
        kv = KvBlocks.private(config, 4096, 6)
        self.assertEqual((kv.total, kv.reachable_blocks), (6, 6))
        kv.remove_free(4)
        self.assertEqual((kv.total, kv.reachable_blocks), (2, 6))
        kv.reachable = 10
        self.assertEqual(kv.reachable_blocks, 10)


@unittest.skipIf(MISSING, MISSING)
class ClientGoneTest(unittest.TestCase):
    def test_a_client_gone_cancels_its_generation_and_frees_its_blocks(self):
        kv, model = FakeKv(128), FakeModel(delay=0.01)
        generator = Generator(model, kv, [257])
        self.addCleanup(generator.stop)
        left = threading.Event()
        threading.Timer(0.3, left.set).start()
        got = []
        with self.assertRaises(ConnectionAbortedError):
            for step in generator.run(completion([1, 2, 3], max_tokens=400), gone=left.is_set):
                got.append(step)
        self.assertGreater(len(got), 0)
        self.assertLess(len(got), 100)
        deadline = time.monotonic() + 5
        while kv.free_count < 128 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(kv.free_count, 128)
        steps = model.steps
        time.sleep(0.2)
        self.assertEqual(model.steps, steps, "the generation went on")
        self.assertEqual(generator.scheduler.running, [])

    def test_without_gone_a_generation_runs_to_its_end(self):
        generator = Generator(FakeModel(), FakeKv(64), [257])
        self.addCleanup(generator.stop)
        steps = list(generator.run(completion([1], max_tokens=5)))
        self.assertEqual([s.finish_reason for s in steps], [""] * 4 + ["length"])


if __name__ == "__main__":
    if MISSING:
        print(MISSING)
    unittest.main()

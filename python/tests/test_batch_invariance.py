"""Batch invariance, the promise lossless replay rests on, tested on the same kernels: a row's
product, a sequence's logits and a request's tokens are bit for bit the same whatever else
the step computes and however the sequence's tokens are split into steps.

* Products: each row of a batch of 1 to 37 rows equals the row multiplied alone (fp32, BF16
  and F16 weights, whole and sliced), on the CPU engine's tiles of one row.
* The model: prompt + 40 tokens prefilled at once, in chunks of 7, and decoded one at a time
  give the same logits; three sequences stepped together (prefill beside decode) give each
  one's logits alone. Key chunks wholly past a row's position change nothing (the padding of
  the CUDA engine's attention tiles), and the tile paths the CUDA engine takes (products on
  tiles of 4 rows, attention on tiles of 3) run here and stay within the rounding bound.
* The scheduler (continuous batching): requests submitted together, with a batch limit and a
  KV cache small enough to preempt, get each one's tokens and text alone; a replay (prompt +
  the first tokens, baton_resume_tokens) landing in a batch of another size continues token
  for token, its text completing the original's exactly.
* Over HTTP, for baton-refengine and baton-torch-engine (standalone) alike: requests and
  replays sent concurrently get the tokens each got alone.

Needs PyTorch (Debian's python3-torch for /usr/bin/python3); without it every test says so
and is skipped. BATON_BIN_DIR names the build's bin/ (baton-mkmodel, baton-refengine).
"""
import concurrent.futures
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)
sys.path.insert(0, HERE)

from engine_process import start_engine  # noqa: E402

try:
    import torch
    from baton_torch_engine.attention import StepRows, attend, chunk_blocks
    from baton_torch_engine.batching import Scheduler
    from baton_torch_engine.device import ComputeDevice
    from baton_torch_engine.llama import KvBlocks, LlamaConfig, LlamaModel, SequenceBlocks
    from baton_torch_engine.products import Products
    from baton_torch_engine.openai_requests import ApiError, Completion
    from baton_torch_engine.safetensors_files import read_model
    from baton_torch_engine.scratch import WideningScratch
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"

BIN = os.environ.get("BATON_BIN_DIR", os.path.join(HERE, "..", "..", "build", "bin"))
CPU = None if MISSING else ComputeDevice("cpu")


def make_models(tmp):
    out = {}
    for dtype in ("f32", "bf16"):
        out[dtype] = os.path.join(tmp, dtype)
        subprocess.run([os.path.join(BIN, "baton-mkmodel"), "--out", out[dtype], "--preset",
                        "tiny", "--seed", "5", "--dtype", dtype], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def load(model_dir, device=None):
    config = LlamaConfig.load(model_dir)
    weights, keep = read_model(model_dir)
    model = LlamaModel(config, weights, device or CPU)
    model._keep = keep
    return model


@unittest.skipIf(MISSING, MISSING)
class ProductsTest(unittest.TestCase):
    def test_a_rows_product_is_the_same_in_a_batch_of_any_size(self):
        torch.manual_seed(2)
        budget = WideningScratch.BUDGET
        try:
            for WideningScratch.BUDGET in (budget, 1000):  # whole matrices, then many slices
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    for k in (64, 1000, 2063):
                        w = torch.randn(300, k).to(dtype)
                        x = torch.randn(37, k)
                        p = Products(CPU, [w], torch.float32)
                        alone = torch.cat([p.linear(x[i:i + 1], w) for i in range(37)])
                        for m in (1, 2, 3, 5, 8, 16, 37):
                            self.assertTrue(torch.equal(p.linear(x[:m], w), alone[:m]),
                                            f"{dtype} k={k} batch {m}")
        finally:
            WideningScratch.BUDGET = budget

    def test_rows_are_reduced_alone(self):
        torch.manual_seed(3)
        x = torch.randn(21, 2048)
        p = Products(CPU, [torch.randn(4, 2048)], torch.float32)

        def norm(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)
        alone = torch.cat([p.rows(norm, x[i:i + 1]) for i in range(21)])
        for m in (1, 4, 21):
            self.assertTrue(torch.equal(p.rows(norm, x[:m]), alone[:m]), m)


@unittest.skipIf(MISSING, MISSING)
class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-invariance-")
        cls.models = make_models(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def tokens(self, n, salt):
        return [(i * 37 + salt * 11) % 256 for i in range(n)]

    def test_prefill_chunks_and_decoding_give_the_same_logits(self):
        for dtype, model_dir in self.models.items():
            model = load(model_dir)
            kv = KvBlocks.private(model.c, 1 << 13, 64)  # 15 positions a block: many blocks
            ids = self.tokens(60, 1)
            whole = model.forward(kv, SequenceBlocks(), ids)
            seq = SequenceBlocks()
            for at in range(0, 60, 7):
                chunked = model.forward(kv, seq, ids[at:at + 7])
            seq = SequenceBlocks()
            for t in ids:
                one = model.forward(kv, seq, [t])
            self.assertTrue(torch.equal(whole, chunked), dtype)
            self.assertTrue(torch.equal(whole, one), dtype)

    def test_a_sequence_in_a_batch_gets_its_logits_alone(self):
        for dtype, model_dir in self.models.items():
            model = load(model_dir)
            kv = KvBlocks.private(model.c, 1 << 13, 64)
            prompts = [self.tokens(5, 2), self.tokens(33, 3), self.tokens(1, 4)]
            alone = []
            for prompt in prompts:
                seq = SequenceBlocks()
                got = [model.forward(kv, seq, prompt)]
                for step in range(6):
                    got.append(model.forward(kv, seq, [(step * 13 + len(prompt)) % 256]))
                kv.give_back(seq.blocks)
                alone.append(got)
            seqs = [SequenceBlocks() for _ in prompts]
            together = [[] for _ in prompts]
            # The long prompt arrives late, beside the others' decode steps.
            for step in range(8):
                items = []
                for i, prompt in enumerate(prompts):
                    start = 2 if i == 1 else 0
                    if step < start or step - start > 6:
                        continue
                    at = step - start
                    items.append((i, prompt if at == 0 else [((at - 1) * 13 + len(prompt))
                                                              % 256]))
                logits = model.step(kv, [(seqs[i], t) for i, t in items])
                for (i, _), row in zip(items, logits):
                    together[i].append(row)
            for i in range(len(prompts)):
                for step, (a, b) in enumerate(zip(alone[i], together[i])):
                    self.assertTrue(torch.equal(a, b), f"{dtype} sequence {i} step {step}")

    def test_key_chunks_past_a_rows_position_change_nothing(self):
        model = load(self.models["f32"])
        kv = KvBlocks.private(model.c, 1 << 13, 64)
        seq = SequenceBlocks()
        model.forward(kv, seq, self.tokens(40, 5))
        bt = kv.block_tokens
        per = chunk_blocks(bt)
        view, _ = kv.region()
        q = torch.randn(3, model.c.num_attention_heads, model.c.head_dim)
        positions, lengths = [3, 17, 39], [40, 40, 40]
        tables = [list(seq.blocks)] * 3
        rows = StepRows.build(tables, positions, lengths, 3, per, bt, torch.device("cpu"))
        want = attend(view, 0, q, rows, per)
        # The same rows reading three more chunks, all past every position.
        wide = StepRows.build(tables + [list(seq.blocks)], positions + [(rows.chunks[0] + 3) *
                              per * bt - 1], lengths + [40], 4, per, bt, torch.device("cpu"))
        more = StepRows(3, 3, rows.positions, rows.lengths, wide.tables[:3],
                        [wide.chunks[0]])
        self.assertEqual(more.chunks[0], rows.chunks[0] + 3)
        self.assertTrue(torch.equal(attend(view, 0, q, more, per), want))

    def test_the_cuda_tile_paths_run_and_agree_within_the_rounding_bound(self):
        # Tiles of several rows are the CUDA engine's (device.py): on the CPU their rows are
        # not promised to be computed alike, so they are compared with a tolerance, argued in
        # test_torch_llama.py (LOGIT_TOLERANCE) for this model.
        tiled = ComputeDevice("cpu", None, tile_rows=4, attention_rows=3)
        for dtype, model_dir in self.models.items():
            rows_of_one, tiles = load(model_dir), load(model_dir, tiled)
            kv = KvBlocks.private(rows_of_one.c, 1 << 13, 64)
            ids = self.tokens(23, 6)
            a = rows_of_one.forward(kv, SequenceBlocks(), ids)
            b = tiles.forward(kv, SequenceBlocks(), ids)
            self.assertLess(float((a - b).abs().max()), 1e-3, dtype)


def completion(prompt, max_tokens, temperature=0.0, seed=0, resume=0, stop=()):
    return Completion(prompt_ids=list(prompt), max_tokens=max_tokens, temperature=temperature,
                      top_p=0.95, seed=seed, resume_tokens=resume, stop=list(stop))


def drain(job):
    out = []
    while True:
        item = job.steps.get(timeout=600)
        if isinstance(item, ApiError):
            raise item
        out.append(item)
        if item.finish_reason:
            return out


@unittest.skipIf(MISSING, MISSING)
class SchedulerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-batching-")
        cls.model = load(make_models(cls.tmp.name)["bf16"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def scheduler(self, blocks, **options):
        kv = KvBlocks.private(self.model.c, 1 << 12, blocks)  # 7 positions a block
        s = Scheduler(self.model, kv, self.model.c.eos_token_ids, **options)
        s.start()
        self.addCleanup(s.stop)
        return s, kv

    def requests(self):
        return [completion([256] + list(b"Once upon a time"), 40, 0.9, seed=11),
                completion([256] + list(b"abc"), 25),
                completion([256] + list(b"The quick brown fox jumps"), 30, 1.2, seed=7),
                completion([256, 1, 2, 3], 35, 0.7, seed=3, stop=["\n"]),
                completion([256] + list(b"x" * 50), 12, 0.8, seed=99)]

    def alone(self):
        s, _ = self.scheduler(200)
        return [drain(s.submit(r)) for r in self.requests()]

    def test_requests_batched_together_get_their_tokens_alone(self):
        want = self.alone()
        s, kv = self.scheduler(200, max_batch=3, max_step_tokens=9)
        jobs = [s.submit(r) for r in self.requests()]
        got = [drain(j) for j in jobs]
        self.assertEqual(got, want)
        self.assertEqual(kv.free_count, 200)
        self.assertGreater(s.steps_total, max(len(w) for w in want))

    def test_preempted_requests_are_computed_again_to_the_same_tokens(self):
        want = self.alone()
        s, kv = self.scheduler(12, max_batch=5)  # 84 positions: room for one or two at a time
        got = [drain(j) for j in [s.submit(r) for r in self.requests()]]
        self.assertEqual(got, want)
        self.assertGreater(s.preempted_total, 0)
        self.assertEqual(kv.free_count, 12)

    def test_a_replay_in_a_batch_of_another_size_continues_token_for_token(self):
        want = self.alone()
        for cut in (1, 9):
            s, _ = self.scheduler(200, max_batch=4)
            others = [s.submit(r) for r in self.requests()[1:]]
            first = self.requests()[0]
            sent = [step.token for step in want[0][:cut]]
            replay = completion(first.prompt_ids + sent, first.max_tokens - cut,
                                first.temperature, first.seed, resume=cut)
            got = drain(s.submit(replay))
            self.assertEqual([x.token for x in got], [x.token for x in want[0][cut:]], cut)
            self.assertEqual("".join(x.text for x in want[0][:cut] + got),
                             "".join(x.text for x in want[0]))
            for job, w in zip(others, want[1:]):
                self.assertEqual(drain(job), w)

    def test_stop_ids_stop_and_min_tokens_holds_them_and_stop_strings_off(self):
        s, _ = self.scheduler(200)
        free = [x.token for x in drain(s.submit(completion([256] + list(b"abc"), 12)))]
        stop = free[1]
        first = free.index(stop)
        by_id = completion([256] + list(b"abc"), 12)
        by_id.stop_token_ids = [stop]
        got = drain(s.submit(by_id))
        self.assertEqual([x.token for x in got], free[:first + 1])
        self.assertEqual(got[-1].finish_reason, "stop")
        self.assertEqual("".join(x.text for x in got),
                         "".join(x.text for x in drain(s.submit(completion(
                             [256] + list(b"abc"), first)))), "the stop id's text is left out")
        held = completion([256] + list(b"abc"), 12)
        held.stop_token_ids, held.min_tokens = [stop], 12
        got = drain(s.submit(held))
        self.assertEqual(len(got), 12)
        self.assertNotIn(stop, [x.token for x in got], "masked while under min_tokens")
        self.assertEqual([x.token for x in got[:first]], free[:first])
        self.assertEqual(got[-1].finish_reason, "length")

    def test_min_tokens_looks_for_stop_strings_from_the_token_after_them(self):
        s, _ = self.scheduler(200)
        free = [x.token for x in drain(s.submit(completion([256] + list(b"abc"), 12)))]
        letters = [i for i, t in enumerate(free) if 33 <= t < 127]
        if not letters:
            self.skipTest(f"no printable byte generated: {free}")
        k = letters[0]  # the (k+1)-th token is the first printable one
        for min_tokens, stops in ((k + 1, False), (k, True)):
            held = completion([256] + list(b"abc"), 12)
            held.stop, held.min_tokens = [chr(free[k])], min_tokens
            got = drain(s.submit(held))
            self.assertEqual(got[-1].finish_reason == "stop" and len(got) == k + 1, stops,
                             (min_tokens, [x.token for x in got]))

    def test_progress_counts_the_steps_with_the_requests_pending_before_and_after_each(self):
        reports = []
        s, _ = self.scheduler(200, on_progress=lambda steps, pending: reports.append(
            (steps, pending)))
        drain(s.submit(completion([256] + list(b"abc"), 5)))
        deadline = time.monotonic() + 30
        while reports[-1][1] != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(reports[0], (0, 1), "the first step's work is reported before it runs")
        self.assertEqual(reports[-1], (s.steps_total, 0))
        self.assertGreaterEqual(s.steps_total, 5)
        steps = [r[0] for r in reports]
        self.assertEqual(steps, sorted(steps))

    def test_a_cancelled_request_gives_its_blocks_back_and_a_fenced_engine_answers_503(self):
        fenced = []
        s, kv = self.scheduler(50, may_compute=lambda: not fenced)
        job = s.submit(completion([256] + list(b"hello"), 300))
        job.steps.get(timeout=60)
        s.cancel(job)
        deadline = time.monotonic() + 30
        while kv.free_count != 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(kv.free_count, 50)
        fenced.append(True)
        with self.assertRaises(ApiError) as ctx:
            drain(s.submit(completion([256, 7], 5)))
        self.assertEqual(ctx.exception.status, 503)
        with self.assertRaises(ApiError) as ctx:  # more than the cache ever held: at once
            s.submit(completion([256] * 10, 400))
        self.assertEqual(ctx.exception.status, 400)  # no use retrying, as the reference engine
        self.assertEqual(ctx.exception.kind, "invalid_request_error")

    def test_a_paced_scheduler_gives_the_same_tokens_and_serves_calls_between_steps(self):
        want = self.alone()
        s, _ = self.scheduler(200, max_batch=3, step_interval=0.002)
        self.assertEqual([drain(j) for j in [s.submit(r) for r in self.requests()]], want)
        s, kv = self.scheduler(50, step_interval=3600.0)  # the second step waits an hour
        job = s.submit(completion([256] + list(b"hello"), 5))
        job.steps.get(timeout=60)
        answer = queue.Queue()
        threading.Thread(target=lambda: answer.put(s.call(lambda: s.steps_total)),
                         daemon=True).start()
        self.assertEqual(answer.get(timeout=60), 1, "a call() waits for no paced step")
        s.cancel(job)
        deadline = time.monotonic() + 30
        while kv.free_count != 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(kv.free_count, 50, "a cancel waits for no paced step")


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["token_ids"]


@unittest.skipIf(MISSING, MISSING)
class HttpReplayTest(unittest.TestCase):
    """Both CPU engines, as the router drives them: requests and replays sent together."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-replay-http-")
        cls.model = make_models(cls.tmp.name)["bf16"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def bodies(self):
        return [{"model": "tiny", "prompt": [256] + list(f"request {i}:".encode()) + [122] * 7 * i,
                 "max_tokens": 48, "temperature": 0.9, "top_p": 0.95, "seed": 100 + i}
                for i in range(8)]

    def check(self, argv):
        proc, port = start_engine(argv, os.path.join(self.tmp.name, "port"))
        try:
            bodies = self.bodies()
            alone = [post(port, b) for b in bodies]
            mixed = []
            for i, b in enumerate(bodies):
                cut = 3 + 5 * i
                mixed.append((b, alone[i]))
                mixed.append((dict(b, prompt=b["prompt"] + alone[i][:cut],
                                   max_tokens=48 - cut, baton_resume_tokens=cut),
                              alone[i][cut:]))
            with concurrent.futures.ThreadPoolExecutor(len(mixed)) as pool:
                got = list(pool.map(lambda bw: post(port, bw[0]), mixed))
            for (body, want), tokens in zip(mixed, got):
                self.assertEqual(tokens, want, body)
        finally:
            proc.kill()
            proc.wait()

    def test_the_reference_engine(self):
        self.check([os.path.join(BIN, "baton-refengine"), "--model", self.model,
                    "--served-model-name", "tiny", "--threads", "2"])

    def test_the_torch_engine(self):
        self.check(self.torch_engine())

    def torch_engine(self):
        return [sys.executable, os.path.join(HERE, "..", "bin", "baton-torch-engine"),
                "--model", self.model, "--standalone", "--served-model-name", "tiny",
                "--threads", "1", "--max-batch", "6", "--max-step-tokens", "40"]

    def test_a_burst_of_connections_waits_to_be_accepted_not_reset(self):
        # 64 at once: far past socketserver's default listen backlog of 5, whose overflow the
        # kernel answered with resets.
        proc, port = start_engine(self.torch_engine(), os.path.join(self.tmp.name, "port"))
        try:
            body = {"model": "tiny", "prompt": [256, 65], "max_tokens": 1, "temperature": 0.0}
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                got = list(pool.map(lambda _: post(port, body), range(64)))
            self.assertEqual(len(got), 64)
            self.assertEqual(len({tuple(t) for t in got}), 1, "one answer, greedy")
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    if MISSING:
        print(MISSING)
    unittest.main()

"""The PyTorch Llama (baton_torch_engine) against the reference engine on the same generated
models: the same greedy tokens for 64 steps, and the same seeded samples (temperature and
nucleus) until the reference engine stops at an end-of-sequence token, on F32 and BF16
weights (BF16 also with products sliced into many row slices), except where the two engines'
logits are too close to a tie for two fp32 computations to agree on (below); the widening
scratch widens exactly, and its sliced products are within the rounding bound of the exact
product; the model's files read or mapped give the same tensors, and a broken file is
refused either way; a standby's rehearsal runs a step and changes no weight; the engine runs
itself again on a huge-page heap, keeping its pid, unless GLIBC_TUNABLES already says
otherwise; --device is parsed, and cuda without CUDA refused saying why; a RECLAIM gives
whole free chunks back as the SDK's TakeWholeChunks walks them, and the KV view lays blocks
out as the reference engine. Needs PyTorch (Debian's python3-torch for /usr/bin/python3); without it every test
says so and is skipped. BATON_BIN_DIR names the build's bin/ (baton-mkmodel,
baton-refengine).

The two engines compute the same fp32 operations in different orders (the reference engine's
kernels against PyTorch's, whichever BLAS and vector width this CPU gives it), so their logits
agree to a rounding error, not to the bit. For the tiny model (width 64 to 192, two layers)
each fp32 dot product of length K <= 192 is within K * 2^-24 ~ 1.1e-5 of the sum of its
terms' magnitudes, which here are of the order of the result; through two layers, the
normalized activations and the softmax, the logits of the two engines differ by a few 1e-5
(LOGIT_TOLERANCE leaves a margin of ten). A step where this engine's choice would change under
a shift of every logit by at most LOGIT_TOLERANCE is a near-tie: the engines may choose
differently there and the comparison stops at it (it says so); a difference anywhere else
fails."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_process import start_engine  # noqa: E402

try:
    import torch
    from baton_torch_engine.llama import KvBlocks, LlamaConfig, LlamaModel, SequenceBlocks
    from baton_torch_engine.products import Products
    from baton_torch_engine.device import ComputeDevice
    from baton_torch_engine.rehearsal import rehearse
    from baton_torch_engine.safetensors_files import read_model
    from baton_torch_engine.sampler import sample_token, sample_uniform
    from baton_torch_engine.scratch import WideningScratch
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"

BIN = os.environ.get("BATON_BIN_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                  "build", "bin"))
PROMPT = list(b"The quick brown fox")
STEPS = 64
LOGIT_TOLERANCE = 1e-3


def near_tie(logits, temperature, top_p, seed, position):
    """Whether the sampled token changes when every logit moves by at most LOGIT_TOLERANCE:
    the chosen token's logit down and all others up, and the reverse, and a few random
    shifts in between."""
    chosen = sample_token(logits, temperature, top_p, seed, position)
    shifts = [[-1.0 if i == chosen else 1.0 for i in range(len(logits))],
              [1.0 if i == chosen else -1.0 for i in range(len(logits))]]
    g = torch.Generator().manual_seed(position)
    shifts += [(torch.rand(len(logits), generator=g) * 2 - 1).tolist() for _ in range(8)]
    return any(sample_token([v + LOGIT_TOLERANCE * d for v, d in zip(logits, shift)],
                            temperature, top_p, seed, position) != chosen for shift in shifts)


def start_refengine(model_dir):
    return start_engine([os.path.join(BIN, "baton-refengine"), "--model", model_dir],
                        os.path.join(model_dir, "ref.port"))


def complete(port, model_dir, **params):
    # Both engines answer to the model folder's name unless told another.
    body = {"model": os.path.basename(os.path.normpath(model_dir)), "prompt": PROMPT,
            "max_tokens": STEPS, **params}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]


@unittest.skipIf(MISSING, MISSING)
class TorchLlamaTest(unittest.TestCase):
    models = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-torch-llama-")
        for dtype in ("f32", "bf16"):
            out = os.path.join(cls.tmp.name, dtype)
            subprocess.run([os.path.join(BIN, "baton-mkmodel"), "--out", out, "--preset", "tiny",
                            "--seed", "3", "--dtype", dtype], check=True,
                           stdout=subprocess.DEVNULL)
            cls.models[dtype] = out

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def generate(self, model_dir, temperature=0.0, top_p=1.0, seed=0, mapped=False):
        """The tokens, and for each whether it was a near-tie."""
        config = LlamaConfig.load(model_dir)
        weights, maps = read_model(model_dir, mapped=mapped)
        model = LlamaModel(config, weights)
        kv = KvBlocks(config, 1 << 16)
        memory = torch.zeros(8 << 16, dtype=torch.uint8)
        kv.set_region(memory, 0)
        for b in range(8):
            kv.add(b)
        seq, out, ties = SequenceBlocks(), [], []
        logits = model.forward(kv, seq, PROMPT)
        for i in range(STEPS):
            values = logits.tolist()
            token = sample_token(values, temperature, top_p, seed, len(PROMPT) + i)
            out.append(token)
            ties.append(near_tie(values, temperature, top_p, seed, len(PROMPT) + i))
            logits = model.forward(kv, seq, [token])
        # The KV really lives in the given memory: the first block is no longer all zero.
        first = seq.blocks[0] << 16
        self.assertTrue(bool(memory[first + 64:first + (1 << 16)].any()))
        del maps
        return out, ties, config

    def check_against_reference(self, dtype, mapped=False, **sampling):
        model_dir = self.models[dtype]
        proc, port = start_refengine(model_dir)
        try:
            ref = complete(port, model_dir, return_token_ids=True, seed=sampling.get("seed", 0),
                           temperature=sampling.get("temperature", 0.0),
                           top_p=sampling.get("top_p", 1.0))
        finally:
            proc.terminate()
            proc.wait()
        mine, ties, config = self.generate(model_dir, mapped=mapped, **sampling)
        ids = ref["token_ids"]
        for i, want in enumerate(ids + [None]):
            if i == len(mine) or want is None:
                break
            if mine[i] != want and ties[i]:
                print(f"{dtype} {sampling}: step {i} is a near-tie; compared up to it")
                return
            self.assertEqual(mine[i], want, f"{dtype} {sampling}: step {i} of {mine} {ids}")
        if ref["finish_reason"] == "stop":  # the reference stopped at an end-of-sequence id
            self.assertTrue(mine[len(ids)] in config.eos_token_ids or ties[len(ids)])
        else:
            self.assertEqual(len(ids), STEPS)

    def test_greedy_tokens_match_the_reference_engine_f32(self):
        self.check_against_reference("f32")

    def test_greedy_tokens_match_the_reference_engine_bf16(self):
        self.check_against_reference("bf16")

    def test_greedy_tokens_match_with_many_row_slices_and_mapped_files(self):
        budget = WideningScratch.BUDGET
        WideningScratch.BUDGET = 1000  # each product of the tiny model in many slices
        try:
            self.check_against_reference("bf16", mapped=True)
        finally:
            WideningScratch.BUDGET = budget

    def test_seeded_samples_match_the_reference_engine(self):
        self.check_against_reference("f32", temperature=0.8, seed=7)
        self.check_against_reference("f32", temperature=1.3, top_p=0.9, seed=12345)

    def test_the_uniform_numbers_are_the_reference_engines(self):
        # standby/model/sampler.cc: SplitMix64 keyed by (seed, position), 53 bits.
        u = [sample_uniform(7, p) for p in range(100)]
        self.assertTrue(all(0 <= x < 1 for x in u))
        self.assertEqual(len(set(u)), 100)
        self.assertEqual(sample_uniform(7, 3), sample_uniform(7, 3))

    def test_a_block_too_small_for_one_token_is_refused(self):
        config = LlamaConfig.load(self.models["f32"])
        with self.assertRaises(ValueError):
            KvBlocks(config, 64 + config.kv_bytes_per_token - 1)


@unittest.skipIf(MISSING, MISSING)
class DeviceTest(unittest.TestCase):
    def test_devices_parse_and_bad_ones_are_refused(self):
        self.assertEqual(ComputeDevice.parse("cpu"), ComputeDevice("cpu", None, 1, 1))
        cuda = ComputeDevice.parse("cuda:1")
        self.assertEqual((cuda.index, cuda.tile_rows, cuda.attention_rows), (1, 128, 32))
        self.assertTrue(cuda.batch_invariant)
        self.assertFalse(ComputeDevice.parse("cuda", 0).batch_invariant)
        for text, tiles in (("gpu", None), ("cuda:x", None), ("cpu", 4), ("cuda", -1)):
            with self.assertRaises(ValueError):
                ComputeDevice.parse(text, tiles)

    @unittest.skipIf(not MISSING and torch.cuda.is_available(), "this PyTorch has CUDA")
    def test_cuda_without_cuda_is_refused_saying_why(self):
        with self.assertRaisesRegex(RuntimeError, "no usable CUDA"):
            ComputeDevice.parse("cuda").start()
        engine = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bin",
                              "baton-torch-engine")
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "m")
            subprocess.run([os.path.join(BIN, "baton-mkmodel"), "--out", model, "--preset",
                            "tiny", "--dtype", "bf16"], check=True, stdout=subprocess.DEVNULL)
            r = subprocess.run([engine, "--model", model, "--standalone", "--device", "cuda"],
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("no usable CUDA", r.stderr)


@unittest.skipIf(MISSING, MISSING)
class KvBlocksTest(unittest.TestCase):
    def config(self):
        return LlamaConfig(hidden_size=8, intermediate_size=8, num_attention_heads=2,
                           num_key_value_heads=1, num_hidden_layers=1, vocab_size=4, head_dim=4)

    def test_a_reclaim_gives_whole_free_chunks_from_the_highest_as_the_sdk_does(self):
        # The SDK's TakeWholeChunks(18, 4, 11, every block but 8) gives back 10 blocks.
        kv = KvBlocks(self.config(), 4096)
        kv.set_region(torch.zeros(18 * 4096, dtype=torch.uint8), 0)
        for b in range(18):
            if b != 8:
                kv.add(b)
        self.assertEqual(kv.remove_free(11, 4, 18), [4, 5, 6, 7, 12, 13, 14, 15, 16, 17])
        self.assertEqual(sorted(kv.free), [0, 1, 2, 3, 9, 10, 11])
        self.assertEqual(kv.take(1), [0])  # a block in use keeps its chunk
        self.assertEqual(kv.remove_free(8, 4, 18), [])
        self.assertEqual(kv.remove_free(2, 1, 18), [10, 11])

    def test_the_view_lays_blocks_out_as_the_reference_engine_after_the_record(self):
        kv = KvBlocks(self.config(), 4096)
        memory = torch.zeros(3 * 4096, dtype=torch.uint8)
        kv.set_region(memory[4096:], 1)  # blocks 1 and 2 of a pool
        self.assertTrue(kv.covers(2) and not kv.covers(0))
        view, first = kv.region()
        view[kv.index(2), 0, 1, 0, 3, 2] = 1.5  # block 2, layer 0, V, head 0, slot 3, dim 2
        # After the 64-byte header and the slots' token ids (the KV record, kv_record.py).
        self.assertEqual(kv.data_offset, 64 + (kv.block_tokens * 4 + 63) // 64 * 64)
        floats = memory[2 * 4096 + kv.data_offset:].view(torch.float32)
        self.assertEqual(float(floats[kv.block_tokens * 4 + 3 * 4 + 2]), 1.5)
        with self.assertRaises(ValueError):
            kv.add(0)


def rounding_bound(x, w):
    """How far any fp32 evaluation of x @ w.T may be from the exact product, per element:
    a dot product of K terms, summed in any order (with or without FMA, in blocks or a tree),
    is within gamma_K * sum_i |x_i w_i| of the exact sum, gamma_K = K u / (1 - K u), u = 2^-24
    (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); the inputs are fp32 values
    (widened F16 and BF16 weights are exact), so the products' only errors are the sum's."""
    k = x.shape[1]
    u = 2.0 ** -24
    return (k * u / (1 - k * u)) * (x.double().abs() @ w.double().abs().T)


@unittest.skipIf(MISSING, MISSING)
class WideningScratchTest(unittest.TestCase):
    def test_widened_slices_are_the_weights_exactly(self):
        torch.manual_seed(1)
        for dtype in (torch.bfloat16, torch.float16):
            w = torch.randn(700, 1024).to(dtype)  # 716,800 values: three slices of the budget
            scratch = WideningScratch(w.numel(), w.shape[1])
            ends = []
            for first, end, wide in scratch.slices(w):
                # A conversion, no arithmetic: bit for bit.
                self.assertTrue(torch.equal(wide, w[first:end].float()), dtype)
                ends.append(end)
            self.assertEqual(ends, [256, 512, 700])

    def test_sliced_products_are_within_the_rounding_bound_of_the_exact_product(self):
        torch.manual_seed(1)
        x = torch.randn(3, 1024)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            w = torch.randn(700, 1024).to(dtype)
            exact = x.double() @ w.double().T
            bound = rounding_bound(x, w.float())
            products = Products(ComputeDevice("cpu"), [w], torch.float32)
            for got in (products.linear(x, w), torch.nn.functional.linear(x, w.float())):
                self.assertTrue(bool(((got.double() - exact).abs() <= bound).all()), dtype)

    def test_fp32_weights_are_used_in_place_and_a_too_long_row_is_refused(self):
        w = torch.randn(8, 16)
        for _, _, view in WideningScratch(0, 16).slices(w):
            self.assertEqual(view.data_ptr(), w.data_ptr())
        scratch = WideningScratch(0, 16)
        scratch.elements = 8  # as if sized for another model
        with self.assertRaises(ValueError):
            list(scratch.slices(w.bfloat16()))


@unittest.skipIf(MISSING, MISSING)
class TinyBf16ModelTest(unittest.TestCase):
    """A test on the tiny model in bf16, written once for the class into cls.model."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-torch-bf16-")
        cls.model = os.path.join(cls.tmp.name, "bf16")
        subprocess.run([os.path.join(BIN, "baton-mkmodel"), "--out", cls.model, "--preset",
                        "tiny", "--seed", "3", "--dtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


@unittest.skipIf(MISSING, MISSING)
class ReadModelTest(TinyBf16ModelTest):

    def test_read_and_mapped_give_the_same_tensors(self):
        read, buffers = read_model(self.model)
        mapped, maps = read_model(self.model, mapped=True)
        self.assertEqual(sorted(read), sorted(mapped))
        for name, t in read.items():
            self.assertEqual(t.dtype, mapped[name].dtype, name)
            self.assertTrue(torch.equal(t, mapped[name]), name)
        del maps, buffers

    def test_the_rehearsal_runs_a_step_and_changes_no_weight(self):
        weights, buffers = read_model(self.model)
        before = {n: t.clone() for n, t in weights.items()}
        config = LlamaConfig.load(self.model)
        model = LlamaModel(config, weights)
        rehearse(model, 1 << 16)
        for name, t in weights.items():
            self.assertTrue(torch.equal(t, before[name]), name)  # unchanged: no arithmetic
        with self.assertRaisesRegex(ValueError, "holds no token"):
            rehearse(model, 64)
        del buffers

    def test_a_step_without_logits_waits_for_the_device_before_it_returns(self):
        # A prefill chunk that does not end its prompt has no .cpu() to wait on: its records
        # are committed when step() returns, so its K and V must have landed by then.
        synced = []

        class Counting(ComputeDevice):
            def synchronize(self):
                synced.append(1)
        weights, buffers = read_model(self.model)
        config = LlamaConfig.load(self.model)
        model = LlamaModel(config, weights, Counting("cpu"))
        kv = KvBlocks(config, 1 << 16)
        kv.set_region(torch.zeros(4 << 16, dtype=torch.uint8), 0)
        for b in range(4):
            kv.add(b)
        seq = SequenceBlocks()
        self.assertEqual(model.step(kv, [(seq, [1, 2, 3])], want=[False]), [None])
        self.assertEqual(len(synced), 1)
        self.assertIsNotNone(model.step(kv, [(seq, [4])])[0])
        self.assertEqual(len(synced), 1, "a step with logits waits on their copy instead")
        del buffers

    def test_a_broken_file_is_refused_naming_it_either_way(self):
        bad = os.path.join(self.tmp.name, "bad")
        os.makedirs(bad, exist_ok=True)
        path = os.path.join(bad, "model.safetensors")
        header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})
        cases = [b"\x01\x00", (len(header)).to_bytes(8, "little") + header.encode() + b"\0" * 8,
                 (999).to_bytes(8, "little") + b"{}", (2).to_bytes(8, "little") + b"[]",
                 (len(header)).to_bytes(8, "little") + header.replace("BF16", "Q9").encode()]
        for raw in cases:
            with open(path, "wb") as f:
                f.write(raw)
            for mapped in (False, True):
                with self.assertRaises(ValueError) as ctx:
                    read_model(bad, mapped=mapped)
                self.assertIn(path, str(ctx.exception), raw)

    def test_an_eos_id_outside_the_vocabulary_is_refused_as_the_reference_engine_does(self):
        with open(os.path.join(self.model, "config.json")) as f:
            config = json.load(f)
        bad = os.path.join(self.tmp.name, "bad-eos")
        os.makedirs(bad, exist_ok=True)
        for eos in (-1, config["vocab_size"], [config["vocab_size"] - 1, 10**9], "2"):
            with open(os.path.join(bad, "config.json"), "w") as f:
                json.dump(dict(config, eos_token_id=eos), f)
            with self.assertRaises(ValueError) as ctx:
                LlamaConfig.load(bad)
            self.assertIn("eos_token_id", str(ctx.exception))

    def environ_of_a_standalone_engine(self, env):
        port_file = os.path.join(self.tmp.name, "engine.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        engine = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bin",
                              "baton-torch-engine")
        proc = subprocess.Popen([engine, "--model", self.model, "--standalone", "--port-file",
                                 port_file], env=env, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(port_file) and time.monotonic() < deadline:
                self.assertIsNone(proc.poll(), "the engine exited")
                time.sleep(0.05)
            self.assertTrue(os.path.exists(port_file), "the engine never listened")
            # The pid it was started as. glibc splits GLIBC_TUNABLES in place at each ':', so
            # the NULs are put back between tunables.
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                raw = f.read().replace(b"\0glibc.", b":glibc.")
            return dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)
        finally:
            proc.kill()
            proc.wait()

    def test_the_engine_runs_again_on_a_huge_page_heap_unless_told_otherwise(self):
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "PYTHONMALLOC")}
        seen = self.environ_of_a_standalone_engine(env)
        self.assertEqual(seen.get(b"GLIBC_TUNABLES"),
                         b"glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1")
        self.assertEqual(seen.get(b"PYTHONMALLOC"), b"malloc")
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=0"
        seen = self.environ_of_a_standalone_engine(env)
        self.assertEqual(seen.get(b"GLIBC_TUNABLES"), b"glibc.malloc.hugetlb=0")
        self.assertNotIn(b"PYTHONMALLOC", seen)


@unittest.skipIf(MISSING, MISSING)
class CudaShapedComputeTest(TinyBf16ModelTest):
    """The CUDA engine's arithmetic (device.py, products.py, llama.py when is_cuda): products
    and norms on 128-row tiles, attention on 32-row tiles, in the weights' dtype with a KV
    cache of that dtype, run on the CPU by a device that answers is_cuda but places tensors
    on the CPU. No GPU runs it here, so this is where its code runs at all before a device
    run: every step must work and agree with the CPU engine within bf16's rounding."""

    def run_steps(self, model):
        kv = model.new_kv(1 << 16)
        kv.set_region(torch.zeros(8 << 16, dtype=torch.uint8), 0)
        for b in range(8):
            kv.add(b)
        a, b = SequenceBlocks(), SequenceBlocks()
        prefill = model.step(kv, [(a, list(range(1, 40))), (b, list(range(5, 20)))])
        chunk = model.step(kv, [(a, [3, 4])], want=[False])  # a chunk with no logits
        decode = model.step(kv, [(a, [7]), (b, [9])])
        return prefill + chunk + decode

    def test_the_cuda_arithmetic_runs_and_agrees_with_the_cpu_engine(self):
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class CudaShaped(ComputeDevice):
            @property
            def is_cuda(self):
                return True

            @property
            def torch(self):
                return torch.device("cpu")

            def synchronize(self):
                pass
        config = LlamaConfig.load(self.model)
        weights, buffers = read_model(self.model)
        # The CUDA defaults are 128 and 32 rows; smaller tiles split this test's 54-row step.
        cuda = LlamaModel(config, weights, CudaShaped("cuda", 0, 16, 8))
        self.assertEqual((cuda.dtype, cuda.kv_dtype), (torch.bfloat16, torch.bfloat16))
        rehearse(cuda, 1 << 16)
        got, want = self.run_steps(cuda), self.run_steps(LlamaModel(config, weights))
        self.assertEqual([g is None for g in got], [w is None for w in want])
        for i, (g, w) in enumerate(zip(got, want)):
            if w is None:
                continue
            self.assertEqual(g.dtype, torch.float32)
            # bf16 products and KV against fp32: a few ulps of bf16 (2^-8) at logits of ~3.
            self.assertLess(float((g - w).abs().max()), 0.1, f"logits {i}")
        del buffers


if __name__ == "__main__":
    if MISSING:
        print(MISSING)
    unittest.main()

"""The PyTorch Llama (baton_torch_engine) against the reference engine on the same generated
models: the same greedy tokens for 64 steps, and the same seeded samples (temperature and
nucleus) until the reference engine stops at an end-of-sequence token, on F32 and BF16
weights (BF16 also with products sliced into many row slices); the widening scratch gives the
values of an fp32 product; the model's files read or mapped give the same tensors, and a
broken file is refused either way; a standby's rehearsal runs a step and changes no weight;
the engine runs itself again on a huge-page heap, keeping its pid, unless GLIBC_TUNABLES
already says otherwise. Needs PyTorch (Debian's python3-torch for /usr/bin/python3); without
it every test says so and is skipped. BATON_BIN_DIR names the build's bin/ (baton-mkmodel,
baton-refengine)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

try:
    import torch
    from baton_torch_engine.llama import KvBlocks, LlamaConfig, LlamaModel, Sequence_
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


def start_refengine(model_dir):
    port_file = os.path.join(model_dir, "ref.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    proc = subprocess.Popen([os.path.join(BIN, "baton-refengine"), "--model", model_dir,
                             "--port-file", port_file], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = ""
        if os.path.exists(port_file):
            with open(port_file) as f:
                text = f.read().strip()
        if text:
            return proc, int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"baton-refengine exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("baton-refengine never wrote its port")


def complete(port, model_dir, **params):
    body = {"model": model_dir, "prompt": PROMPT, "max_tokens": STEPS, **params}
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
        config = LlamaConfig.load(model_dir)
        weights, maps = read_model(model_dir, mapped=mapped)
        model = LlamaModel(config, weights)
        kv = KvBlocks(config, 1 << 16)
        memory = [torch.zeros(1 << 16, dtype=torch.uint8) for _ in range(8)]
        for b, m in enumerate(memory):
            kv.add(b, m)
        seq, out = Sequence_(), []
        logits = model.forward(kv, seq, PROMPT)
        for i in range(STEPS):
            token = sample_token(logits.tolist(), temperature, top_p, seed, len(PROMPT) + i)
            out.append(token)
            logits = model.forward(kv, seq, [token])
        # The KV really lives in the given memory: the first block is no longer all zero.
        self.assertTrue(bool(memory[seq.blocks[0]][64:].any()))
        del maps
        return out, config

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
        mine, config = self.generate(model_dir, mapped=mapped, **sampling)
        ids = ref["token_ids"]
        self.assertEqual(mine[:len(ids)], ids, f"{dtype} {sampling}")
        if ref["finish_reason"] == "stop":  # the reference stopped at an end-of-sequence id
            self.assertIn(mine[len(ids)], config.eos_token_ids)
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
class WideningScratchTest(unittest.TestCase):
    def test_sliced_products_equal_the_fp32_product(self):
        torch.manual_seed(1)
        x = torch.randn(3, 1024)
        for dtype in (torch.bfloat16, torch.float16):
            w = torch.randn(700, 1024).to(dtype)  # 716,800 values: three slices of the budget
            scratch = WideningScratch(w.numel(), w.shape[1])
            want = torch.nn.functional.linear(x, w.float())
            self.assertTrue(torch.equal(scratch.linear(x, w), want), dtype)
            self.assertTrue(torch.equal(WideningScratch(0, 1024).linear(x, w), want), dtype)

    def test_fp32_weights_are_used_in_place_and_a_too_long_row_is_refused(self):
        w = torch.randn(8, 16)
        self.assertTrue(torch.equal(WideningScratch(0, 0).linear(torch.ones(1, 16), w),
                                    torch.ones(1, 16) @ w.T))
        scratch = WideningScratch(0, 16)
        scratch.elements = 8  # as if sized for another model
        with self.assertRaises(ValueError):
            scratch.linear(torch.ones(1, 16), w.bfloat16())


@unittest.skipIf(MISSING, MISSING)
class ReadModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-torch-read-")
        cls.model = os.path.join(cls.tmp.name, "bf16")
        subprocess.run([os.path.join(BIN, "baton-mkmodel"), "--out", cls.model, "--preset",
                        "tiny", "--seed", "3", "--dtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

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
        rehearse(config, weights, 1 << 16)
        for name, t in weights.items():
            self.assertTrue(torch.equal(t, before[name]), name)
        with self.assertRaisesRegex(ValueError, "holds no token"):
            rehearse(config, weights, 64)
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


if __name__ == "__main__":
    if MISSING:
        print(MISSING)
    unittest.main()

"""The demo model (models/demo): both engines give it the same text, and the text is English.

What is checked, and why it can be checked on any x86-64:
  * Greedy: for each prompt, baton-refengine (C++ kernels) and baton-torch-engine (PyTorch
    over OpenBLAS), each run standalone over HTTP, and the training code's own forward pass
    (python/baton_demo_model, a whole window at once, no KV cache) continue the prompt with the
    same GREEDY_TOKENS token ids. The three compute in float32 with different summation
    orders, so their logits differ in the last bits (at most 1.7e-5 between the training
    forward and the PyTorch engine over 240 greedy steps of this model). The test therefore
    also checks, on the training forward's logits, that at every greedy step the top logit
    leads the runner-up by at least MIN_MARGIN, some 60 times that: with such margins equal
    text is what correct engines must produce, not luck,
    and a difference is a real divergence (a wrong RoPE pair, a skipped norm, a bad tokenizer).
  * Sampled: at temperature 0.7, for a few seeds, both engines return the same token ids. The
    sampler is a pure function of (logits, seed, position) in both; two engines part only where
    the uniform number falls within rounding of a cumulative-probability boundary, about one
    chance in 1e5 per token at these logit differences; the seeds are fixed, so a failure is
    reproducible, not flaky.
  * The text speaks: every byte of it is printable ASCII or a newline, and at least
    MIN_KNOWN_WORDS of its words are words of the training text (this model's texts score
    81-95 %; the same architecture after 100 of its 1000 training steps scores 35 %, and with
    random weights it writes no words at all).

BATON_BIN_DIR names the build's bin/ (baton-refengine); BATON_DEMO_MODEL another model
directory to check. Needs PyTorch (Debian's python3-torch for /usr/bin/python3); without it
the test says so and is skipped.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

try:
    import torch
    from baton_demo_model import corpus
    from baton_demo_model.model import load_model, greedy
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"

BIN = os.environ.get("BATON_BIN_DIR", os.path.join(ROOT, "build", "bin"))
MODEL = os.environ.get("BATON_DEMO_MODEL", os.path.join(ROOT, "models", "demo"))
TORCH_ENGINE = os.path.join(ROOT, "python", "bin", "baton-torch-engine")

PROMPTS = ["PEACE, n.", "STANDBY, n.", "The pair hands over", "A man who"]
GREEDY_TOKENS = 96
MIN_MARGIN = 1e-3
SEEDS = [11, 22, 33, 44]
SAMPLED_TOKENS = 128
MIN_KNOWN_WORDS = 0.7


def read_port(path):
    """The port an engine wrote to `path`, or 0 while there is none."""
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def start(argv, port_file):
    """Starts an engine that writes its port to `port_file`; (process, port)."""
    proc = subprocess.Popen(argv + ["--port-file", port_file], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    port = 0
    for _ in range(2400):  # two minutes: PyTorch is slow to import on a busy machine
        port = read_port(port_file)
        if port or proc.poll() is not None:
            break
        time.sleep(0.05)
    if not port:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{argv[0]} did not start (exit status {proc.returncode})")
    return proc, port


def complete(port, prompt, tokens, temperature=0.0, seed=0):
    body = {"model": "demo", "prompt": prompt, "max_tokens": tokens,
            "temperature": temperature, "seed": seed}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    return choice["token_ids"], choice["text"]


@unittest.skipIf(MISSING, MISSING)
class DemoModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="baton-demo-model-")
        cls.procs, cls.ports = [], {}
        engines = {
            "refengine": [os.path.join(BIN, "baton-refengine"), "--model", MODEL],
            "torch": [sys.executable, TORCH_ENGINE, "--model", MODEL, "--standalone",
                      "--threads", "1"],
        }
        try:
            for name, argv in engines.items():
                port_file = os.path.join(cls.tmp.name, name + ".port")
                proc, port = start(argv + ["--served-model-name", "demo"], port_file)
                cls.procs.append(proc)
                cls.ports[name] = port
        except BaseException:
            cls.stop()
            raise
        words = re.findall(rb"[a-z]+", corpus.read_corpus().lower())
        cls.vocabulary = set(words)
        cls.model = load_model(torch, MODEL)

    @classmethod
    def stop(cls):
        for proc in cls.procs:
            proc.terminate()
        for proc in cls.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        cls.tmp.cleanup()

    @classmethod
    def tearDownClass(cls):
        cls.stop()

    def assert_speaks(self, text, what):
        self.assertTrue(all(c == "\n" or " " <= c <= "~" for c in text),
                        f"{what}: not printable ASCII: {text!r}")
        words = re.findall(r"[a-z]+", text.lower())
        self.assertGreaterEqual(len(words), 5, f"{what}: too few words: {text!r}")
        known = sum(w.encode() in self.vocabulary for w in words) / len(words)
        self.assertGreaterEqual(known, MIN_KNOWN_WORDS,
                                f"{what}: {known:.0%} of the words are the book's: {text!r}")
        return known

    def test_greedy_text_is_the_same_on_both_engines_and_the_training_forward(self):
        for prompt in PROMPTS:
            ids, margins = greedy(torch, self.model, prompt.encode(), GREEDY_TOKENS)
            step = min(range(len(margins)), key=margins.__getitem__)
            self.assertGreaterEqual(
                margins[step], MIN_MARGIN,
                f"{prompt!r}: greedy step {step} is a near-tie (margin {margins[step]:.2e}); "
                f"equal text would be luck there: choose another prompt")
            ref_ids, ref_text = complete(self.ports["refengine"], prompt, GREEDY_TOKENS)
            torch_ids, torch_text = complete(self.ports["torch"], prompt, GREEDY_TOKENS)
            self.assertEqual(ref_ids, ids, f"{prompt!r}: baton-refengine vs the training forward")
            self.assertEqual(torch_ids, ids, f"{prompt!r}: baton-torch-engine vs the training "
                             f"forward")
            self.assertEqual(ref_text, torch_text, prompt)
            known = self.assert_speaks(prompt + ref_text, f"greedy {prompt!r}")
            print(f"greedy {prompt!r} (smallest margin {margins[step]:.4f} at step {step}, "
                  f"{known:.0%} known words): {ref_text!r}")

    def test_seeded_samples_are_the_same_on_both_engines(self):
        for prompt, seed in zip(PROMPTS, SEEDS):
            ref_ids, ref_text = complete(self.ports["refengine"], prompt, SAMPLED_TOKENS, 0.7, seed)
            torch_ids, torch_text = complete(self.ports["torch"], prompt, SAMPLED_TOKENS, 0.7,
                                             seed)
            self.assertEqual(ref_ids, torch_ids, f"{prompt!r} seed {seed}")
            self.assertEqual(len(ref_ids), SAMPLED_TOKENS, "no end-of-sequence id is trained")
            known = self.assert_speaks(prompt + ref_text, f"{prompt!r} seed {seed}")
            print(f"seed {seed} {prompt!r} ({known:.0%} known words): {ref_text!r}")


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""scripts/train-demo-model is deterministic on this machine: two runs of the same recipe (a
few steps of it, to stay cheap) write byte-identical model files, and another seed writes
different ones (so the comparison can fail). The committed model was trained on the text that
Debian's dict-devil installs here (its sha256 is in models/demo/config.json). Bit equality is
only claimed on one machine: across CPUs the matrix kernels may sum in another order
(python/baton_demo_model/train.py says why the model is committed instead).

Needs PyTorch (python3-torch) and dict-devil; without them the test says so and is skipped.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)
SCRIPT = os.path.join(ROOT, "scripts", "train-demo-model")
MODEL = os.path.join(ROOT, "models", "demo")
STEPS = "2"

from baton_demo_model import corpus  # noqa: E402 (the standard library only)

MISSING = ""
try:
    import torch  # noqa: F401
except ImportError as e:
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"
if not MISSING and not os.path.exists(corpus.DEFAULT_TEXT):
    MISSING = f"SKIP: {corpus.DEFAULT_TEXT} is missing; scripts/install-deps installs dict-devil"


def train(out, *flags):
    """Runs the script; its JSON summary."""
    done = subprocess.run([sys.executable, SCRIPT, "--out", out, "--steps", STEPS, "--json",
                           *flags], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"train-demo-model failed ({done.returncode}): {done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def read(path):
    with open(path, "rb") as f:
        return f.read()


@unittest.skipIf(MISSING, MISSING)
class TrainingTest(unittest.TestCase):
    def test_the_same_recipe_writes_the_same_bytes_and_another_seed_does_not(self):
        with tempfile.TemporaryDirectory(prefix="baton-train-") as tmp:
            a, b, c = (os.path.join(tmp, n) for n in "abc")
            first, second = train(a), train(b)
            other = train(c, "--seed", "2")
            for name in ("model.safetensors", "config.json"):
                self.assertEqual(read(os.path.join(a, name)), read(os.path.join(b, name)), name)
            self.assertEqual(first["sha256"], second["sha256"])
            self.assertNotEqual(first["sha256"], other["sha256"])
            self.assertEqual(first["sha256"],
                             hashlib.sha256(read(os.path.join(a, "model.safetensors")))
                             .hexdigest())
            print(f"{STEPS} steps twice: sha256 {first['sha256']}; seed 2: {other['sha256']}")

    def test_the_committed_model_was_trained_on_this_text(self):
        with open(os.path.join(MODEL, "config.json")) as f:
            provenance = json.load(f)["baton"]
        text = corpus.read_corpus()
        self.assertEqual(provenance["text_bytes"], len(text))
        self.assertEqual(provenance["text_sha256"], hashlib.sha256(text).hexdigest())
        self.assertEqual(provenance["generator"], "scripts/train-demo-model")

    def test_a_missing_text_is_refused_with_the_package_named(self):
        with tempfile.TemporaryDirectory(prefix="baton-train-") as tmp:
            done = subprocess.run([sys.executable, SCRIPT, "--out", tmp, "--text",
                                   os.path.join(tmp, "absent.dz")], capture_output=True,
                                  text=True, timeout=120)
            self.assertEqual(done.returncode, 1)
            self.assertIn("dict-devil", done.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "config.json")))


if __name__ == "__main__":
    unittest.main(verbosity=2)

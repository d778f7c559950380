"""scripts/train-demo-model: trains the demo model, deterministically, and writes its files.

    scripts/train-demo-model --out DIR [--steps N] [--threads K] [--seed S] [--text FILE]
                             [--dtype f32|bf16] [--sample PROMPT]... [--json]

The recipe: seed S (default 1) for the initial weights (torch's global generator) and for
the batches (their own generator); AdamW (betas 0.9/0.95, weight decay 0.01 on matrices),
learning rate warmed up over 50 steps to 3e-3 and decayed on a cosine to 1e-4, gradients
clipped to norm 1; 1000 steps of 8 windows of 384 bytes (3.1 M bytes, eight passes over the
text). torch.use_deterministic_algorithms(True) and a fixed thread count (default 1, set for
OpenMP and OpenBLAS before torch starts) make two runs on one machine write byte-identical
files. Across machines they need not: the matrix kernels pick their code path (AVX2,
AVX-512, cache blocking) from the CPU, and a different summation order changes the last bits,
which training amplifies; the model that comes out is as good, not the same. That is why the
model is committed (models/demo), not trained at `make demo` time: every checkout serves the
same bytes, on any x86-64. One thread is also the fastest on a busy 2-core machine: OpenMP's
threads spin waiting for each other on small matrices.

Exit status: 0 written, 1 failed, 2 bad usage.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

from . import corpus
from .model import ARCH, BOS, VOCAB, build_model, config_json, greedy, safetensors_bytes

CONTEXT = ARCH["max_position_embeddings"]  # bytes after bos: every position the model has
BATCH = 8  # windows a step
LR, LR_MIN, WARMUP = 3e-3, 1e-4, 50


def parse(argv):
    p = argparse.ArgumentParser(prog="train-demo-model",
                                description="Trains the demo model (docs/demo.md).")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="torch threads (part of the recipe)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--text", default=corpus.DEFAULT_TEXT, help="devil.dict.dz (gzip) or text")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--sample", action="append", default=[],
                   help="after training, print the greedy continuation of this prompt")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.steps < 1 or args.threads < 1:
        p.error("--steps and --threads must be positive")
    return args


def pin_threads(threads: int) -> None:
    """Fixes the thread pools torch may use before it starts them: OpenMP (ATen), OpenBLAS."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def learning_rate(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * progress))


def train(torch, args, text: bytes, log):
    """The trained model and each step's loss."""
    torch.manual_seed(args.seed)
    model = build_model(torch)
    data = torch.tensor(list(text), dtype=torch.long)
    starts = corpus.entry_starts(text, CONTEXT)
    generator = torch.Generator().manual_seed(args.seed)
    decay = [p for p in model.parameters() if p.dim() == 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": keep, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), foreach=False)
    losses, began = [], time.monotonic()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps)
        inputs, targets = corpus.batch(torch, data, starts, generator, BATCH, CONTEXT, BOS)
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            recent = sum(losses[-100:]) / len(losses[-100:])
            log(f"step {step + 1}/{args.steps}: loss {recent:.4f} "
                f"({recent * math.log2(math.e):.3f} bits/byte), {time.monotonic() - began:.0f} s")
    return model, losses


def write_model(out: str, files: dict) -> None:
    """Each file under a temporary name, renamed in; config.json last."""
    os.makedirs(out, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "config.json"):
        tmp = os.path.join(out, "." + name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(files[name])
        os.rename(tmp, os.path.join(out, name))


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    pin_threads(args.threads)
    import torch  # after pin_threads: the pools read the variables when they start
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    def log(line):
        print(f"train-demo-model: {line}", file=sys.stderr, flush=True)

    try:
        text = corpus.read_corpus(args.text)
    except (OSError, ValueError) as e:
        log(f"{e} (Debian's dict-devil ships the text: scripts/install-deps installs it)")
        return 1
    log(f"{len(text)} bytes of text, {len(corpus.entry_starts(text, CONTEXT))} entries; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, seed {args.seed}")
    began = time.monotonic()
    model, losses = train(torch, args, text, log)
    seconds = time.monotonic() - began
    final = sum(losses[-100:]) / len(losses[-100:])
    weights = safetensors_bytes(torch, model, args.dtype)
    provenance = {"generator": "scripts/train-demo-model", "tokenizer": "bytes",
                  "text": corpus.TITLE, "text_sha256": hashlib.sha256(text).hexdigest(),
                  "text_bytes": len(text), "seed": args.seed, "steps": args.steps,
                  "threads": args.threads, "context": CONTEXT, "batch": BATCH,
                  "final_loss": round(final, 4)}
    write_model(args.out, {"model.safetensors": weights,
                           "config.json": config_json(args.dtype, provenance).encode()})
    digest = hashlib.sha256(weights).hexdigest()
    log(f"wrote {args.out}: {len(weights)} bytes, sha256 {digest}, {seconds:.0f} s")
    model.eval()
    for prompt in args.sample:
        ids, _ = greedy(torch, model, prompt.encode(), 200)
        print(prompt + bytes(i for i in ids if i < 256).decode("utf-8", "replace"))
    if args.json:
        print(json.dumps({"out": args.out, "steps": args.steps, "threads": args.threads,
                          "seed": args.seed, "final_loss": final, "seconds": seconds,
                          "bytes": len(weights), "sha256": digest}))
    return 0

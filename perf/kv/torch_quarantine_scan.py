#!/usr/bin/env python3
"""perf/kv/torch_quarantine_scan.py: what a promoted torch engine spends reading a dead
primary's quarantined block headers before it serves (baton_torch_engine.kv_inherit), by the
quarantine's size: the count of its own records (_own_records) and the passing chains
(KvHandoff.passing_chains, which plan_copy and adopt run), over BLOCKS headers of which
SEQUENCES sequences of 4 blocks hold records. Private memory, no controller, no GPU.

    perf/kv/torch_quarantine_scan.py [--blocks 32768] [--sequences 64] [--tree DIR]

--tree: the checkout whose python/ packages are measured (default: this one), to compare two
commits. The last line of stdout is one JSON object; times are the best of 5, in ms.
"""
import argparse
import json
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=32768)
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--tree", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    return p.parse_args()


def best_ms(fn, runs=5):
    best = float("inf")
    for _ in range(runs):
        at = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - at) * 1e3)
    return round(best, 3)


def main():
    args = parse()
    python = os.path.join(os.path.abspath(args.tree), "python")
    sys.path[:0] = [os.path.join(python, "baton-engine"), os.path.join(python, "baton-torch-engine")]
    import ctypes
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch")
        return 0
    from baton_torch_engine import kv_record
    from baton_torch_engine.kv_blocks import KvBlocks, SequenceBlocks
    from baton_torch_engine.kv_handoff import AdoptionReport, KvHandoff
    from baton_torch_engine.kv_inherit import _own_records
    from baton_torch_engine.llama import LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=2, vocab_size=300, head_dim=8)
    block_bytes, identity = 4096, 7
    kv = KvBlocks.private(config, block_bytes, args.blocks)
    base = kv._region_memory.data_ptr()
    address = lambda b: base + b * block_bytes  # noqa: E731
    writer = KvHandoff(kv, identity, address, lambda: 3)
    bt = kv.block_tokens
    for s in range(args.sequences):  # 4 blocks each, spread over the pool
        first = (s * args.blocks // max(args.sequences, 1)) // 4 * 4
        seq = SequenceBlocks(list(range(first, first + 4)), 0)
        tokens = [(i * 7) % 250 for i in range(4 * bt + 1)]
        seq.length = 4 * bt
        writer.committed((s + 1, s + 1), seq, tokens, 0)
    blocks = list(range(args.blocks))
    headers = b"".join(ctypes.string_at(address(b), kv_record.HEADER_BYTES) for b in blocks)
    heir = KvHandoff(kv, identity, address, lambda: 4)
    report = AdoptionReport()
    chains = heir.passing_chains(blocks, headers, report)
    own = _own_records(headers, identity)
    result = {"blocks": args.blocks, "record_blocks": own, "passing_sequences": len(chains),
              "own_records_ms": best_ms(lambda: _own_records(headers, identity)),
              "passing_chains_ms": best_ms(
                  lambda: heir.passing_chains(blocks, headers, AdoptionReport()))}
    result["ok"] = own == 4 * args.sequences and len(chains) == args.sequences
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""An engine written on baton_engine (Baton's Python SDK), for the chaos drills
(tests/chaos/python_engine_test.cc): what baton_test_engine_helper does, in Python.

It registers and waits as a half-started standby, reading every weight tensor's table entry
(no copy). Once promoted it marks itself serving and stamps every block it holds (engine id,
epoch, a counter, in the first 24 of the 64 header bytes the SDK scrubs for each new holder)
every few milliseconds while engine.may_write(). Before each write it checks that the header
is its own or scrubbed; anything else breaks fencing invariants 1/2: it reports the error
through the SDK and writes VIOLATIONS_DIR/violation-<id>.txt, which the tests look for. It
answers RECLAIM with the blocks asked for, DRAIN through engine.drain(), and exits on STOP.

    sdk_engine.py --violations-dir DIR [--model-dir DIR] [--torch-model-dir DIR]

--model-dir: check, without PyTorch, that every weight tensor's bytes in the arena are the
bytes of that tensor in DIR's safetensors files (whatever pages, or memfds, the arena is on).

--torch-model-dir: with PyTorch, also check baton_engine.tensors: every weight tensor's storage
is the arena itself (its data_ptr is the table's address) and equals the tensor in DIR's
safetensors files; once promoted, a granted block written through block_tensor() reads back
through the C view. A mismatch is reported as an error and written as a violation.
"""
import argparse
import ctypes
import json
import os
import struct
import sys
import threading

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_engine import BatonError, Engine, EventKind, Extent, FailedPrecondition  # noqa: E402

STAMP = struct.Struct("<QQQ")  # engine id, epoch, counter


class Stamper:
    """The compute thread: stamps the held blocks' headers until stopped or fenced."""

    def __init__(self, engine, block_bytes, violations_dir):
        self.engine = engine
        self.block_bytes = block_bytes
        self.violations_dir = violations_dir
        self.lock = threading.Lock()
        self.extents = []
        self.done = threading.Event()
        self.counter = 0

    def set_extents(self, extents):
        with self.lock:
            self.extents = list(extents)

    def give_back(self, blocks):
        """Takes up to `blocks` blocks off the end of what is held, whole extents or a tail."""
        out = []
        with self.lock:
            while blocks > 0 and self.extents:
                e = self.extents.pop()
                take = min(blocks, e.count)
                out.append(Extent(first=e.first + e.count - take, count=take))
                if take < e.count:
                    self.extents.append(Extent(first=e.first, count=e.count - take,
                                               address=e.address,
                                               nbytes=(e.count - take) * self.block_bytes))
                blocks -= take
        return out

    def run(self):
        me, epoch = self.engine.id, self.engine.epoch
        while not self.done.wait(0.005):
            with self.lock:
                if not self.engine.may_write():
                    return
                self.counter += 1
                for e in self.extents:
                    for i in range(e.count):
                        self.stamp(e.address + i * self.block_bytes, e.first + i, me, epoch)

    def stamp(self, address, block, me, epoch):
        raw = ctypes.string_at(address, STAMP.size)
        owner, their_epoch, _ = STAMP.unpack(raw)
        if raw != bytes(STAMP.size) and (owner, their_epoch) != (me, epoch):
            self.violation(f"block {block} header names engine {owner} epoch {their_epoch}; "
                           f"engine {me} holds it at epoch {epoch}")
        ctypes.memmove(address, STAMP.pack(me, epoch, self.counter), STAMP.size)

    def violation(self, text):
        os.makedirs(self.violations_dir, exist_ok=True)
        with open(os.path.join(self.violations_dir, f"violation-{self.engine.id}.txt"), "a") as f:
            f.write(text + "\n")
        try:
            self.engine.report_error("fencing violation: " + text)
        except BatonError:
            pass
        self.done.set()


def check_torch_views(engine, model_dir):
    """What --torch-model-dir checks before the promotion; returns what is wrong, or ""."""
    import torch
    from baton_engine.tensors import weight_tensors
    from baton_torch_engine.safetensors_files import read_model
    views = weight_tensors(engine)
    files, maps = read_model(model_dir)
    table = {t.name: t for t in engine.tensors()}
    for name, view in views.items():
        if view.data_ptr() != table[name].address:
            return f"tensor {name} is not a view of the arena"
        if not torch.equal(view, files[name]):
            return f"tensor {name} differs from {model_dir}'s file"
    del files, maps
    return ""


def check_weight_bytes(engine, model_dir):
    """What --model-dir checks before the promotion; returns what is wrong, or ""."""
    table = {t.name: t for t in engine.tensors()}
    seen = 0
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_len))
            data = f.read()
        for tensor, entry in header.items():
            if tensor == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            if tensor not in table:
                return f"tensor {tensor} of {name} is not in the weight table"
            if ctypes.string_at(table[tensor].address, table[tensor].nbytes) != data[begin:end]:
                return f"tensor {tensor} differs from {name}'s bytes"
            seen += 1
    if seen != len(table):
        return f"{seen} tensors in {model_dir}'s files, {len(table)} in the weight table"
    return ""


def check_block_tensor(engine, extent):
    from baton_engine.tensors import block_tensor
    blocks = block_tensor(engine, extent)
    blocks[0, 100:104] = torch_bytes(b"\x01\x02\x03\x04")
    back = ctypes.string_at(extent.address + 100, 4)
    return "" if back == b"\x01\x02\x03\x04" else "a block_tensor write did not reach the block"


def torch_bytes(data):
    import torch
    return torch.tensor(list(data), dtype=torch.uint8)


def serve(engine, stamper):
    for event in engine.events():
        if event.kind == EventKind.GRANTED:
            stamper.set_extents(engine.extents())
        elif event.kind == EventKind.RECLAIM:
            engine.return_blocks(stamper.give_back(event.blocks))
        elif event.kind == EventKind.DRAIN:
            follows = "a next primary follows" if event.successor else "no next primary follows"
            print(f"sdk engine {engine.id}: drain: {follows}", file=sys.stderr)
            with engine.drain(event) as d:
                d.unfinished = 0
        elif event.kind in (EventKind.STOP, EventKind.DISCONNECTED):
            print(f"sdk engine {engine.id}: {event.kind.name.lower()}: {event.reason}",
                  file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--violations-dir", required=True)
    parser.add_argument("--model-dir", default="")
    parser.add_argument("--torch-model-dir", default="")
    args = parser.parse_args()
    with Engine.connect(engine_version="python-sdk-engine/1") as engine:
        tensors = engine.tensors()
        if not tensors or any(t.address == 0 or t.nbytes == 0 for t in tensors):
            engine.report_error("the weight table is empty or has a tensor without memory")
            return 1
        problem = check_weight_bytes(engine, args.model_dir) if args.model_dir else ""
        if not problem and args.torch_model_dir:
            problem = check_torch_views(engine, args.torch_model_dir)
        if problem:
            Stamper(engine, 0, args.violations_dir).violation(problem)
            return 1
        try:
            promoted = engine.wait_promotion()
        except FailedPrecondition as e:  # told to stop while a standby
            print(f"sdk engine {engine.id}: {e}", file=sys.stderr)
            return 0
        engine.mark_serving()
        stamper = Stamper(engine, engine.pool().block_bytes, args.violations_dir)
        problem = check_block_tensor(engine, promoted.extents[0]) if args.torch_model_dir else ""
        if problem:
            stamper.violation(problem)
            return 1
        stamper.set_extents(promoted.extents)
        thread = threading.Thread(target=stamper.run, daemon=True)
        thread.start()
        try:
            serve(engine, stamper)
        finally:
            stamper.done.set()
            thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

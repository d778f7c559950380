#!/usr/bin/env python3
"""A PyTorch engine on Baton's C ABI, for perf/gpu_check's torch step (docs/gpu.md).

The controller launches it as its engine command. It does what a vLLM or SGLang worker would:
start CUDA and PyTorch before it connects (the standby's half start), connect with
BATON_ENGINE_USE_DEVICE_MEMORY and BATON_ENGINE_HANDLES_RESUME (the current protocol, so that
its promotion need not wait for a dead primary's teardown), read the device copy of the weights as tensors without
copying them and compare them with the host arena, wait to be promoted, mark itself serving,
then put a KV tensor in Baton's device pool through libbaton_torch_alloc.so as PyTorch's
pluggable allocator and compute on it. Once promoted it writes REPORT_DIR/engine-<id>.json,
then serves the controller's events until told to stop.

Where PyTorch (or a GPU) is missing it does the same through the C ABI alone (the allocator
called through ctypes), so that the ctypes calls below (on the SDK's declarations) are tested on every machine.

    gpu_check_torch_engine.py --lib LIB_DIR --report-dir DIR
"""
import argparse
import ctypes
import json
import os
import sys
import time

USE_DEVICE_MEMORY = 1
HANDLES_RESUME = 2
READY_WHEN_WAITING = 8
DEADLINE_EXCEEDED = 8
EVENT_RECLAIM, EVENT_DRAIN, EVENT_STOP, EVENT_DISCONNECTED = 3, 4, 5, 6


# The C ABI's structures, as the Python SDK declares them (python/baton-engine).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python",
                                "baton-engine"))
from baton_engine._abi import DeviceRegion as Region  # noqa: E402
from baton_engine._abi import Event, Extent, Options, PoolInfo, Tensor  # noqa: E402
from baton_engine.reclaim import whole_chunks  # noqa: E402
from baton_engine.tensors import bytes_tensor, device_bytes_tensor  # noqa: E402


def load(lib_dir):
    """libbaton_engine.so (global, so the allocator's dlopen by PyTorch finds it) and the
    allocator library, with the prototypes used here."""
    ctypes.CDLL(os.path.join(lib_dir, "libbaton_engine.so"), mode=ctypes.RTLD_GLOBAL)
    path = os.path.join(lib_dir, "libbaton_torch_alloc.so")
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    p, u64, i64 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64
    for name, res, args in [
        ("baton_engine_abi_version", ctypes.c_int, []),
        ("baton_engine_last_error", ctypes.c_char_p, []),
        ("baton_engine_connect_flags", ctypes.c_int,
         [ctypes.POINTER(Options), ctypes.c_uint, ctypes.POINTER(p)]),
        ("baton_engine_device_weights", ctypes.c_int, [p, ctypes.POINTER(Region)]),
        ("baton_engine_device_pool", ctypes.c_int, [p, ctypes.POINTER(Region)]),
        ("baton_engine_pool", ctypes.c_int, [p, ctypes.POINTER(PoolInfo)]),
        ("baton_engine_id", u64, [p]),
        ("baton_engine_epoch", u64, [p]),
        ("baton_engine_tensor_count", ctypes.c_size_t, [p]),
        ("baton_engine_tensor", ctypes.c_int, [p, ctypes.c_size_t, ctypes.POINTER(Tensor)]),
        ("baton_engine_weights_base", p, [p]),
        ("baton_engine_wait_promotion", ctypes.c_int, [p, i64, ctypes.POINTER(Event)]),
        ("baton_engine_mark_serving", ctypes.c_int, [p]),
        ("baton_engine_next_event", ctypes.c_int, [p, i64, ctypes.POINTER(Event)]),
        ("baton_engine_report_drained", ctypes.c_int, [p, ctypes.c_uint32]),
        ("baton_engine_extents", ctypes.c_size_t, [p, ctypes.POINTER(Extent), ctypes.c_size_t]),
        ("baton_engine_return_blocks", ctypes.c_int,
         [p, ctypes.POINTER(Extent), ctypes.c_size_t]),
        ("baton_engine_close", None, [p]),
        ("baton_torch_alloc_attach", ctypes.c_int, [p]),
        ("baton_torch_alloc_refresh", ctypes.c_int, []),
        ("baton_torch_alloc_free_bytes", u64, []),
        ("baton_torch_alloc_last_error", ctypes.c_char_p, []),
        ("baton_torch_malloc", p, [ctypes.c_ssize_t, ctypes.c_int, p]),
        ("baton_torch_free", None, [p, ctypes.c_ssize_t, ctypes.c_int, p]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib, path


class Failed(Exception):
    pass


def check(lib, rc, what, last_error=None):
    if rc != 0:
        text = (last_error or lib.baton_engine_last_error)().decode()
        raise Failed(f"{what}: code {rc}: {text}")


def start_torch():
    """PyTorch with CUDA started, or the reason it cannot be."""
    try:
        import torch
    except Exception as e:  # not installed here
        return None, f"import: {e}"
    if not torch.cuda.is_available():
        return None, "torch.cuda.is_available() is false"
    try:
        # The context, before the controller waits on us (on the default device: the engine
        # learns Baton's device when it connects).
        torch.zeros(1, device="cuda")
    except Exception as e:  # a broken CUDA set-up: said in the report, the C ABI path runs
        return None, f"torch.zeros on cuda: {e}"
    return torch, ""


def check_weights(lib, engine, torch, report):
    """The device weights, wrapped in place, equal the host arena; a kernel reads them."""
    w = Region()
    check(lib, lib.baton_engine_device_weights(engine, ctypes.byref(w)), "device weights")
    report["weights_bytes"] = w.bytes
    arena = lib.baton_engine_weights_base(engine)
    tensors = [_tensor(lib, engine, i) for i in range(lib.baton_engine_tensor_count(engine))]
    size = max((t.data - arena + t.size for t in tensors), default=0)  # the tensors' span
    report["tensors"] = len(tensors)
    if size > w.bytes:
        raise Failed(f"the tensors span {size} bytes, the device weights {w.bytes}")
    if torch is None or size == 0:
        return
    start = time.monotonic()
    # PyTorch has no read-only tensors; the mapping itself is read-only. Both are wrapped
    # through DLPack, as the SDK does (baton_engine.tensors), so numpy is not needed.
    gpu = f"cuda:{w.device}"
    device = device_bytes_tensor(w.device, w.address, size)
    host = bytes_tensor(arena, size)
    copy = host.to(gpu)
    report["weights_equal"] = bool(torch.equal(device, copy))  # every byte, on the GPU
    del copy
    torch.cuda.empty_cache()  # the comparison's memory, not kept next to the weights
    report["weights_check_ms"] = round((time.monotonic() - start) * 1e3, 3)
    report["weights_wrapped_in_place"] = device.data_ptr() == w.address


def _tensor(lib, engine, i):
    t = Tensor()
    check(lib, lib.baton_engine_tensor(engine, i, ctypes.byref(t)), f"tensor {i}")
    return t


# PyTorch's allocator objects live as long as the process: its pools keep raw pointers to them.
_KEEP = []


def use_pool(lib, path, engine, torch, report):
    """A KV tensor in Baton's device pool through the pluggable allocator, filled and summed."""
    check(lib, lib.baton_torch_alloc_attach(engine), "baton_torch_alloc_attach",
          lib.baton_torch_alloc_last_error)
    pool = Region()
    check(lib, lib.baton_engine_device_pool(engine, ctypes.byref(pool)), "device pool")
    info = PoolInfo()
    check(lib, lib.baton_engine_pool(engine, ctypes.byref(info)), "pool")
    held = lib.baton_torch_alloc_free_bytes()
    report.update(pool_bytes=pool.bytes, held_bytes=held, block_bytes=info.block_bytes)
    # 8 blocks: over PyTorch's 10 MiB, so its caching allocator asks for exactly this much.
    size = min(held, 8 * info.block_bytes)
    if size == 0:
        raise Failed("no pool blocks held after the promotion")
    start = time.monotonic()
    if torch is None:
        kv_through_c_abi(lib, pool, size, report)
    else:
        kv_through_torch(lib, path, pool, size, torch, report)
    report["kv_bytes"] = size
    report["kv_ms"] = round((time.monotonic() - start) * 1e3, 3)
    report["kv_freed"] = lib.baton_torch_alloc_free_bytes() == held


def in_pool(pool, ptr, size):
    return pool.address <= ptr and ptr + size <= pool.address + pool.bytes


def kv_through_c_abi(lib, pool, size, report):
    ptr = lib.baton_torch_malloc(size, pool.device, None)
    if not ptr:
        raise Failed("baton_torch_malloc: " + lib.baton_torch_alloc_last_error().decode())
    report["kv_in_pool"] = in_pool(pool, ptr, size)
    lib.baton_torch_free(ptr, size, pool.device, None)


def kv_through_torch(lib, path, pool, size, torch, report):
    from torch.cuda.memory import CUDAPluggableAllocator, MemPool, use_mem_pool
    report["torch_version"] = torch.__version__
    report["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    torch.cuda.set_device(pool.device)
    alloc = CUDAPluggableAllocator(path, "baton_torch_malloc", "baton_torch_free")
    _KEEP.append(alloc)
    mem_pool = MemPool(alloc.allocator())
    with use_mem_pool(mem_pool):
        kv = torch.empty(size, dtype=torch.uint8, device=f"cuda:{pool.device}")
    report["kv_in_pool"] = in_pool(pool, kv.data_ptr(), size)
    kv.fill_(7)
    report["kv_sum_ok"] = int(kv.sum(dtype=torch.int64)) == 7 * size
    torch.cuda.synchronize()
    # Freed tensors stay in PyTorch's cache; the pool's end gives the blocks back to Baton.
    del kv
    del mem_pool
    torch.cuda.empty_cache()


def chunk_extents(held, per_chunk, pool_blocks, want):
    """Up to `want` blocks of `held` in whole chunks (baton_engine.reclaim), as extents: what a
    RECLAIM takes back (baton_engine.h)."""
    extents = []
    for b in whole_chunks(held, per_chunk, pool_blocks, want):
        if extents and extents[-1][0] + extents[-1][1] == b:
            extents[-1][1] += 1
        else:
            extents.append([b, 1])
    return extents


def reclaim(lib, engine, want):
    """Answers a RECLAIM (the promotion reserve refilled after a failover): this engine's
    KV tensor is gone by now, so every block it holds is free to give, in whole chunks."""
    pool, info = Region(), PoolInfo()
    check(lib, lib.baton_engine_device_pool(engine, ctypes.byref(pool)), "device pool")
    check(lib, lib.baton_engine_pool(engine, ctypes.byref(info)), "pool")
    mapped = (Extent * info.block_count)()
    n = lib.baton_engine_extents(engine, mapped, info.block_count)
    held = {e.first + i for e in mapped[:n] for i in range(e.count)}
    per_chunk = max(1, pool.chunk_bytes // info.block_bytes) if info.block_bytes else 1
    give = chunk_extents(held, per_chunk, info.block_count, want)
    out = (Extent * max(1, len(give)))(*[Extent(first=f, count=c) for f, c in give])
    check(lib, lib.baton_engine_return_blocks(engine, out, len(give)), "return blocks")
    lib.baton_torch_alloc_refresh()


def serve(lib, engine):
    ev = Event()
    while True:
        rc = lib.baton_engine_next_event(engine, 200, ctypes.byref(ev))
        if rc != 0 or ev.kind in (EVENT_STOP, EVENT_DISCONNECTED):
            return
        if ev.kind == EVENT_DRAIN:
            lib.baton_engine_report_drained(engine, 0)
        elif ev.kind == EVENT_RECLAIM:
            reclaim(lib, engine, ev.blocks)
        # A GRANTED event needs nothing (the SDK maps the blocks; the allocator is refreshed at
        # the next RECLAIM), nor a RESUME (this engine admits no requests of its own).


def write_report(report_dir, report):
    os.makedirs(report_dir, exist_ok=True)
    name = os.path.join(report_dir, f"engine-{report.get('engine_id', os.getpid())}.json")
    with open(name + ".tmp", "w") as f:
        json.dump(report, f)
    os.rename(name + ".tmp", name)
    print(f"torch engine: {json.dumps(report)}", file=sys.stderr, flush=True)


def run(args, report):
    began = time.monotonic()
    torch, why = start_torch()
    report["torch"] = torch is not None
    report["torch_reason"] = why
    report["torch_start_ms"] = round((time.monotonic() - began) * 1e3, 3)
    lib, path = load(args.lib)
    opts = Options(engine_version=b"torch-engine/1")
    engine = ctypes.c_void_p()
    check(lib, lib.baton_engine_connect_flags(ctypes.byref(opts),
                                              USE_DEVICE_MEMORY | HANDLES_RESUME |
                                              READY_WHEN_WAITING,
                                              ctypes.byref(engine)), "connect")
    report["engine_id"] = lib.baton_engine_id(engine)
    try:
        check_weights(lib, engine, torch, report)
        ev = Event()
        while True:
            rc = lib.baton_engine_wait_promotion(engine, 200, ctypes.byref(ev))
            if rc != DEADLINE_EXCEEDED:
                break
        if rc != 0:
            return  # told to stop before a promotion: a standby that never served
        promoted = time.monotonic()
        check(lib, lib.baton_engine_mark_serving(engine), "mark serving")
        report["epoch"] = ev.epoch
        report["promoted_blocks"] = sum(ev.extents[i].count for i in range(ev.extent_count))
        use_pool(lib, path, engine, torch, report)
        report["kv_ready_after_promotion_ms"] = round((time.monotonic() - promoted) * 1e3, 3)
        report["ok"] = all(report.get(k, True) for k in
                           ("weights_equal", "kv_in_pool", "kv_sum_ok"))
        write_report(args.report_dir, report)
        serve(lib, engine)
    finally:
        lib.baton_engine_close(engine)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="folder of libbaton_torch_alloc.so")
    parser.add_argument("--report-dir", required=True)
    args = parser.parse_args()
    report = {"pid": os.getpid(), "ok": False}
    try:
        run(args, report)
    except Exception as e:  # a report says what failed, whatever it was
        report["ok"] = False  # also after a report that said ok (a RECLAIM that failed)
        report["error"] = str(e) if isinstance(e, Failed) else repr(e)
        write_report(args.report_dir, report)
        print(f"torch engine: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

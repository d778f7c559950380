"""What a copy of a dead predecessor's KV out of quarantine costs on this engine, per block:
measured once by the standby, for inherit_kv's choice between the copy and the barrier
(kv_inherit.py).

Most of a copy's time is not its bytes: for each block kv_copy.copy_in takes a free block,
copies it, reads the source header again and the copy's record back, and commits the copy at
the engine's epoch, all from Python. A copy speed alone (memmove's) put the estimate 7 to 300
times below the copy on a CPU host, the smaller the blocks the further. So the measure is the
copy itself: plan_copy and copy_in over a scratch cache of the engine's geometry (its model,
block size and KV dtype) in private host memory, holding one sequence of SEQUENCE_BLOCKS
blocks (fewer when the blocks are large) that a writer of an earlier epoch committed; the time
per block, best of three (the first run pays what the pool's pre-faulted blocks do not: page
faults, cold caches). On a device pool the KV goes device to device: the host part is
measured with only each block's record and token ids copied, and the device's part,
kv_copy.measure_device_copy_gbps (16 blocks, one `copy_` each), is added per block.

Thread: the compute thread (scheduler.call) or before serving; it uses no pool block.
"""
from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

from . import kv_record
from .kv_blocks import KvBlocks, SequenceBlocks
from .kv_copy import copy_in, host_block_copy, measure_device_copy_gbps, plan_copy
from .kv_handoff import KvHandoff

if TYPE_CHECKING:  # pragma: no cover
    from .device import ComputeDevice

SEQUENCE_BLOCKS = 8
SCRATCH_BYTES = 64 << 20  # the scratch cache's size at most (two copies of the sequence)
_KEY = (0x0B470C0C057, 0x5C4A7C4)
_IDENTITY = 1


def _scratch(kv: KvBlocks) -> tuple[KvBlocks, KvHandoff, SequenceBlocks]:
    """A private cache of `kv`'s geometry and a sequence in it committed at epoch 1."""
    blocks = max(1, min(SEQUENCE_BLOCKS, SCRATCH_BYTES // (2 * kv.block_bytes)))
    scratch = KvBlocks.private(kv.config, kv.block_bytes, 2 * blocks, kv.dtype)
    base = scratch.block_memory(0).data_ptr()  # a private cache's blocks start at 0
    writer = KvHandoff(scratch, _IDENTITY, lambda b: base + b * kv.block_bytes, lambda: 1)
    seq = SequenceBlocks(scratch.take(blocks), blocks * scratch.block_tokens)
    tokens = [i % 251 for i in range(seq.length)]
    writer.committed(_KEY, seq, tokens, 0)
    for b in seq.blocks:  # out of the cache, as a dead writer's blocks in quarantine
        scratch.blocks.discard(b)
    return scratch, writer, seq


def _copy_once(scratch: KvBlocks, writer: KvHandoff, seq: SequenceBlocks,
               record_only: bool) -> float:
    """One planned copy of `seq` by a successor at epoch 2, its copies freed after: seconds."""
    heir = KvHandoff(scratch, _IDENTITY, writer.block_address, lambda: 2)
    headers = b"".join(ctypes.string_at(writer.block_address(b), kv_record.HEADER_BYTES)
                        for b in seq.blocks)
    # A device pool's host part of a block's copy is its record and token ids only.
    copy = host_block_copy(heir, heir.kv.data_offset if record_only else None)
    at = time.perf_counter()
    plan = plan_copy(heir, seq.blocks, headers)
    copy_in(heir, plan, lambda: scratch.take(1)[0], copy)
    seconds = time.perf_counter() - at
    kept = heir.kept.pop(_KEY, None)
    if kept is None or len(kept.seq.blocks) != len(seq.blocks):
        raise RuntimeError("the scratch copy was not kept whole: its time measures no copy")
    heir.releasing(kept.seq)
    scratch.give_back(kept.seq.blocks)
    return seconds


def measure_block_copy_ms(kv: KvBlocks, device: "ComputeDevice") -> float:
    """The copy's cost per block (ms) on this engine: see the module's comment."""
    scratch, writer, seq = _scratch(kv)
    best = min(_copy_once(scratch, writer, seq, device.is_cuda) for _ in range(3))
    per_block_ms = best * 1e3 / len(seq.blocks)
    if device.is_cuda:
        gbps = measure_device_copy_gbps(device, kv.block_bytes)
        per_block_ms += kv.block_bytes / (gbps * 1e6) if gbps > 0 else float("inf")
    return per_block_ms

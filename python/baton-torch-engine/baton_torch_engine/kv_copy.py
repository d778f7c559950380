"""The copy of a dead predecessor's committed KV out of its quarantined blocks, as the reference
engine's KvHandoff::PlanCopy and CopyIn (standby/kv/kv_handoff_copy.cc).

A promotion before the predecessor's barrier leaves its blocks in quarantine: a write of the
dying engine may still land in them. The engine maps them read-only (Engine.map_quarantined:
on a device pool the device chunks that hold their KV too) and, when the copy is expected to
take less than the barrier, copies each passing sequence's blocks, whole, into free blocks of
its own (BlockCopy: on a host pool the host block, record, token ids and KV; on a device pool
the record and ids in the host block and the KV device to device, synchronized before the
check), then checks every source header again after the copy (unchanged since the plan:
the writer did not move on) and the copy's record (valid, the same key, block, index, token
count, epoch and ids). A sequence that fails either check is dropped as "changed" and its
copies freed; the caller then waits for the blocks' grant to adopt it in place. The copies
are kept for the replay with their records committed again at this engine's epoch.

Thread: the compute thread (scheduler.call), as adoption.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from . import kv_record
from .kv_blocks import SequenceBlocks
from .kv_handoff import AdoptionReport, Key, KvHandoff

if TYPE_CHECKING:  # pragma: no cover
    from .device import ComputeDevice


@dataclass
class CopySequence:
    key: Key
    chain: list[kv_record.Read]  # in index order
    headers: bytes               # the source blocks' headers when planned


@dataclass
class CopyPlan:
    sequences: list[CopySequence] = field(default_factory=list)
    blocks: int = 0
    nbytes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def plan_copy(handoff: KvHandoff, blocks: Sequence[int], headers: bytes) -> CopyPlan:
    """What a copy out of the quarantined `blocks` (mapped read-only; `headers`, 64 bytes per
    block, as of the promotion) would take: the passing sequences and their bytes."""
    report = AdoptionReport()
    plan = CopyPlan()
    for key, chain in handoff.passing_chains(blocks, headers, report):
        now = b"".join(ctypes.string_at(handoff.block_address(r.record.block),
                                        kv_record.HEADER_BYTES) for r in chain)
        plan.sequences.append(CopySequence(key, chain, now))
        plan.blocks += len(chain)
    plan.nbytes = plan.blocks * handoff.kv.block_bytes
    plan.dropped = report.dropped
    return plan


def _copy_holds(handoff: KvHandoff, s: CopySequence, copies: list[int]) -> bool:
    """Every source header as planned, and every copy the record planned."""
    h = kv_record.HEADER_BYTES
    for i, (r, dst) in enumerate(zip(s.chain, copies)):
        source = ctypes.string_at(handoff.block_address(r.record.block), h)
        if source != s.headers[i * h:(i + 1) * h]:
            return False  # the writer moved on: what was copied may be of another commit
        at = handoff.block_address(dst)
        got = kv_record.read(ctypes.string_at(at, h), at + h, handoff.kv.block_tokens)
        if got.state != kv_record.State.VALID or got.record != r.record or got.ids != r.ids:
            return False
    return True


@dataclass
class BlockCopy:
    """How a block is copied: `block(src, dst)` issues the copy of pool block `src` into `dst`,
    `done()` returns once every copy issued has landed (the check reads the source after)."""
    block: Callable[[int, int], None]
    done: Callable[[], None] = lambda: None


def host_block_copy(handoff: KvHandoff, size: Optional[int] = None) -> BlockCopy:
    """A host pool's block, whole (record, token ids and KV), or its first `size` bytes."""
    size = handoff.kv.block_bytes if size is None else size
    return BlockCopy(lambda src, dst: ctypes.memmove(handoff.block_address(dst),
                                                      handoff.block_address(src), size))


def device_block_copy(handoff: KvHandoff, source: torch.Tensor, source_first: int) -> BlockCopy:
    """A device pool's block: the record and token ids from the host pool block
    (handoff.block_address), the KV from `source` (uint8 device memory of the quarantined
    blocks from block `source_first`, mapped READ) into the cache's own device block, on the
    current stream; done() synchronizes the device."""
    kv = handoff.kv
    record, size = kv.data_offset, kv.block_bytes

    def block(src: int, dst: int) -> None:
        ctypes.memmove(handoff.block_address(dst), handoff.block_address(src), record)
        at = (src - source_first) * size
        kv.block_memory(dst)[record:].copy_(source[at + record:at + size], non_blocking=True)

    def done() -> None:
        if source.is_cuda:
            torch.cuda.synchronize(source.device)
    return BlockCopy(block, done)


# Reasons a sequence is not copied that the wait for the quarantined blocks' grant retries.
RETRIED = ("changed", "hold_failed")


def copy_in(handoff: KvHandoff, plan: CopyPlan, take: Callable[[], int],
            copy: Optional[BlockCopy] = None) -> AdoptionReport:
    """Copies the planned sequences into blocks `take()` gives (MemoryError: none left) with
    `copy` (default: host_block_copy) and keeps those whose copy holds; the report counts the
    others by reason ("changed", "hold_failed") with the plan's refusals."""
    start = handoff.clock()
    report = AdoptionReport(dropped=dict(plan.dropped))
    epoch = handoff.epoch()
    copy = copy or host_block_copy(handoff)
    for s in plan.sequences:
        copies: list[int] = []
        reason = ""
        try:
            for r in s.chain:
                try:
                    dst = take()
                except MemoryError:
                    reason = "hold_failed"
                    break
                copies.append(dst)
                copy.block(r.record.block, dst)
            # The source headers are read again only after every byte of the copy.
            copy.done()
        except BaseException:  # a copy that failed (a device fault) leaves no record behind
            handoff.releasing(SequenceBlocks(copies, 0))
            handoff.kv.give_back(copies)
            raise
        if not reason and not _copy_holds(handoff, s, copies):
            reason = "changed"
        seq = SequenceBlocks(copies, sum(r.record.tokens for r in s.chain))
        if reason or not handoff.keep(s.key, seq, [t for r in s.chain for t in r.ids], report,
                                      epoch):
            handoff.releasing(seq)
            handoff.kv.give_back(copies)
            if reason:
                report.dropped[reason] = report.dropped.get(reason, 0) + 1
                handoff.log(f"not copying request {s.key[0]:016x}{s.key[1]:016x}: {reason}")
    report.ms = (handoff.clock() - start) * 1e3
    # "changed" and "hold_failed" are taken again from the blocks once granted (kv_inherit):
    # counted there, as adopted or dropped, not twice.
    handoff.count(AdoptionReport(
        adopted=report.adopted, tokens=report.tokens, ms=report.ms,
        dropped={r: n for r, n in report.dropped.items() if r not in RETRIED}))
    return report


def measure_device_copy_gbps(device: "ComputeDevice", block_bytes: int, blocks: int = 16) -> float:
    """The device's copy speed (GB/s, best of 3) as device_block_copy copies: `blocks` blocks
    of `block_bytes`, one copy_ each from Python, then a synchronize, so that what each
    block's copy costs beyond its bytes (the launch, this loop) is in the estimate too."""
    dev = device.torch
    size = max(1, block_bytes)
    src = torch.ones(blocks * size, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(3):
        device.synchronize()
        at = time.perf_counter()
        for b in range(blocks):
            dst[b * size:(b + 1) * size].copy_(src[b * size:(b + 1) * size], non_blocking=True)
        device.synchronize()
        seconds = time.perf_counter() - at
        if seconds > 0:
            best = max(best, blocks * size / seconds / 1e9)
    return best

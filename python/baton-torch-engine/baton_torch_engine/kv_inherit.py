"""What a promoted torch engine takes of its predecessor's KV (KV-warm failover), as the
reference engine's AdoptPromotedBlocks (standby/controller_link.h) does it:

  1. the records in the promoted blocks (their headers as the SDK copied them before its
     scrub) are adopted in place; those blocks join the cache, the adopted ones held;
  2. a promotion before the predecessor's barrier (protocol 7) leaves the predecessor's blocks
     in quarantine, unmapped, until the barrier has passed. If their header copies show
     records of this engine's identity, it copies their KV into blocks of its own
     (kv_copy.py: when the copy is expected, at the cost per block the standby measured
     (kv_copy_cost.py), to take less than the barrier, the blocks mapped
     read-only for it, on a device pool device to device at the device's copy speed, every
     record checked again after the copy), or else waits (at most the controller's wait
     limit) for their grant and adopts in place what they hold: when the copy would cost
     more than the wait, where the blocks cannot be mapped read-only, and for a sequence that
     changed under the copy or found no free block to copy into.
     Without such records it takes nothing from them. Either way it releases the read-only
     view and tells the controller how it went (copied, waited or none);
  3. the controller is told what was adopted ("engine N at epoch E adopted S sequences (T
     tokens not prefilled again)"), and the replayed requests continue from it.

Runs on the engine's control thread before mark_serving(); each adoption runs on the compute
thread (scheduler.call).
"""
from __future__ import annotations

import struct
import time
from typing import Callable

from baton_engine import BatonError, Engine, Event, KvInheritMode, Quarantine
from baton_engine.tensors import device_block_region

from . import kv_record
from .batching import Scheduler
from .kv_copy import RETRIED, copy_in, device_block_copy, plan_copy
from .kv_handoff import AdoptionReport, KvHandoff
from .pool_kv import PoolKv


def _blocks(extents) -> list[int]:
    return [e.first + i for e in extents for i in range(e.count)]


def _adopt(kv: PoolKv, handoff: KvHandoff, scheduler: Scheduler, event: Event,
           report: AdoptionReport) -> None:
    def run() -> None:
        # The region first (on CUDA it grows to the lowest block), then the records.
        kv.take(event.extents, held=_blocks(event.extents))
        more, held = handoff.adopt(_blocks(event.extents), event.headers)
        kept = set(held)
        kv.blocks.give_back([b for b in _blocks(event.extents) if b not in kept])
        report.merge(more)
    scheduler.call(run)


def _own_records(headers: bytes, identity: int) -> int:
    """Blocks whose header copy is a committed record of `identity` (read from the copy the
    SDK took at the promotion, never from the quarantined block)."""
    n = 0
    for i in kv_record.present(headers):
        magic, counter, ident = struct.unpack_from("<IIQ", headers, i * kv_record.HEADER_BYTES)
        n += magic == kv_record.MAGIC and counter % 2 == 0 and ident == identity
    return n


def _copy(engine: Engine, kv: PoolKv, handoff: KvHandoff, scheduler: Scheduler,
          quarantine: Quarantine, block_copy_ms: float, report: AdoptionReport,
          log: Callable[[str], None]) -> tuple[KvInheritMode, int, int, float]:
    """Copies the quarantined blocks' KV when that beats the barrier, or waits for their
    grant; the mode it took, the blocks and bytes that hold committed KV, and the copy's
    estimate (ms)."""
    blocks = _own_records(quarantine.headers, handoff.identity)
    if not blocks:
        return KvInheritMode.NONE, 0, 0, 0.0
    nbytes = blocks * kv.block_bytes
    estimate = blocks * block_copy_ms if block_copy_ms > 0 else float("inf")
    wait = lambda retried=None: _wait(  # noqa: E731
        engine, kv, handoff, scheduler, quarantine, report, log, retried or {})
    if estimate > quarantine.barrier_estimate_ms:
        return wait(), blocks, nbytes, estimate
    try:
        engine.map_quarantined()
    except BatonError as e:  # granted meanwhile, or no read-only access on this device
        log(f"the quarantined blocks' kv is not read ({e}): adopted in place once granted")
        return wait(), blocks, nbytes, estimate
    quarantined = _blocks(quarantine.extents)
    try:
        copy = None
        if kv.model.device.is_cuda:  # their chunks are mapped READ now: the KV is read there
            lowest = min(quarantined)
            copy = device_block_copy(handoff, device_block_region(engine, lowest), lowest)
        plan = scheduler.call(lambda: plan_copy(handoff, quarantined, quarantine.headers))
        copied = scheduler.call(
            lambda: copy_in(handoff, plan, lambda: kv.blocks.take(1)[0], copy))
    except Exception as e:  # a device fault in the copy: the grant still brings the KV
        log(f"the copy of the quarantined blocks' kv failed ({type(e).__name__}: {e}): "
            "adopted in place once granted")
        return wait(), blocks, nbytes, estimate
    # Changed under the copy (the dying writer, or the blocks' grant scrubbing their headers),
    # or no free block left to copy into: adopted in place once granted instead.
    retried = {r: copied.dropped.pop(r) for r in RETRIED if r in copied.dropped}
    report.merge(copied)
    if retried:
        log(f"{sum(retried.values())} sequences not copied (changed, or no block to copy into): "
            "waiting for the quarantined blocks to adopt them in place")
        return wait(retried), plan.blocks, plan.nbytes, estimate
    mode = KvInheritMode.COPIED if plan.sequences else KvInheritMode.NONE
    return mode, plan.blocks, plan.nbytes, estimate


def _wait(engine: Engine, kv: PoolKv, handoff: KvHandoff, scheduler: Scheduler,
          quarantine: Quarantine, report: AdoptionReport, log: Callable[[str], None],
          retried: dict[str, int]) -> KvInheritMode:
    """Adopts the quarantined blocks once granted; `retried`: the sequences a copy left to this
    wait, by reason, counted as dropped when the grant does not come."""
    try:
        granted = engine.wait_inherited_blocks(quarantine.wait_limit_ms)
        _adopt(kv, handoff, scheduler, granted, report)
    except BatonError as e:
        log(f"the quarantined blocks' kv is replayed: {e}")
        lost = AdoptionReport(dropped=dict(retried))
        handoff.count(lost)
        report.merge(lost)
    return KvInheritMode.WAITED


def inherit_kv(engine: Engine, kv: PoolKv, handoff: KvHandoff, scheduler: Scheduler,
               promoted: Event, log: Callable[[str], None],
               block_copy_ms: float = 0.0) -> AdoptionReport:
    report = AdoptionReport()
    _adopt(kv, handoff, scheduler, promoted, report)
    quarantine = engine.quarantined()
    if quarantine.extents:
        started = time.monotonic()
        try:
            mode, blocks, nbytes, estimate = _copy(engine, kv, handoff, scheduler, quarantine,
                                                   block_copy_ms, report, log)
        finally:  # the read-only view goes, whatever happened to the copy
            engine.release_quarantined()
        ms = (time.monotonic() - started) * 1e3
        how = {KvInheritMode.COPIED: "copied", KvInheritMode.WAITED: "waited for the barrier",
               KvInheritMode.NONE: "nothing to take"}[mode]
        log(f"epoch {promoted.epoch}: {blocks} quarantined blocks hold committed kv "
            f"({nbytes} bytes, a {estimate:.3f} ms copy against a "
            f"{quarantine.barrier_estimate_ms:.3f} ms barrier): {how} in {ms:.2f} ms")
        try:
            engine.report_kv_inheritance(mode, blocks, nbytes, ms, min(estimate, 4e6))
        except BatonError as e:
            log(f"inheritance not reported: {e}")
    log(f"epoch {promoted.epoch}: {report.summary()}")
    try:
        engine.report_kv_adoption(report.adopted, report.tokens, report.dropped, report.ms)
    except BatonError as e:
        log(f"adoption not reported: {e}")
    return report

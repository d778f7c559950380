"""What a promoted torch engine takes of its predecessor's KV (KV-warm failover), as the
reference engine's AdoptPromotedBlocks (standby/controller_link.h) does it:

  1. the records in the promoted blocks (their headers as the SDK copied them before its
     scrub) are adopted in place; those blocks join the cache, the adopted ones held;
  2. a promotion before the predecessor's barrier (protocol 7) leaves the predecessor's blocks
     in quarantine, read-only, until the barrier has passed. This engine never reads them: if
     their header copies show records of its own identity it waits (at most the controller's
     wait limit) for their grant, then adopts in place what they hold, as the reference
     engine does when a copy would cost more than the barrier (always, on a device pool,
     which the SDK does not map for a copy); without such records it takes nothing from them.
     Either way it releases the read-only view and tells the controller how it went;
  3. the controller is told what was adopted ("engine N at epoch E adopted S sequences (T
     tokens not prefilled again)"), and the replayed requests continue from it.

Runs on the engine's control thread before mark_serving(); each adoption runs on the compute
thread (scheduler.call).
"""
from __future__ import annotations

import struct
import time
from typing import Callable

from baton_engine import BatonError, Engine, Event, KvInheritMode

from . import kv_record
from .batching import Scheduler
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
    for at in range(0, len(headers) - kv_record.HEADER_BYTES + 1, kv_record.HEADER_BYTES):
        magic, counter, ident = struct.unpack_from("<IIQ", headers, at)
        n += magic == kv_record.MAGIC and counter % 2 == 0 and ident == identity
    return n


def inherit_kv(engine: Engine, kv: PoolKv, handoff: KvHandoff, scheduler: Scheduler,
               promoted: Event, log: Callable[[str], None]) -> AdoptionReport:
    report = AdoptionReport()
    _adopt(kv, handoff, scheduler, promoted, report)
    quarantine = engine.quarantined()
    if quarantine.extents:
        started = time.monotonic()
        blocks = _own_records(quarantine.headers, handoff.identity)
        mode = KvInheritMode.NONE
        if blocks:
            mode = KvInheritMode.WAITED
            try:
                granted = engine.wait_inherited_blocks(quarantine.wait_limit_ms)
                _adopt(kv, handoff, scheduler, granted, report)
            except BatonError as e:
                log(f"the quarantined blocks' kv is replayed: {e}")
        engine.release_quarantined()
        ms = (time.monotonic() - started) * 1e3
        log(f"epoch {promoted.epoch}: {blocks} quarantined blocks hold committed kv: "
            f"{'waited for the barrier' if blocks else 'nothing to take'} in {ms:.2f} ms "
            f"(the controller expected the barrier in {quarantine.barrier_estimate_ms:.2f} ms)")
        try:
            engine.report_kv_inheritance(mode, blocks, blocks * kv.block_bytes, ms)
        except BatonError as e:
            log(f"inheritance not reported: {e}")
    log(f"epoch {promoted.epoch}: {report.summary()}")
    try:
        engine.report_kv_adoption(report.adopted, report.tokens, report.dropped, report.ms)
    except BatonError as e:
        log(f"adoption not reported: {e}")
    return report

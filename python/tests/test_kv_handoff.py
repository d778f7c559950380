"""The torch engine's KV records and handoff (kv_record.py, kv_handoff.py) over private
memory, without a controller: a record reads back as written, a torn or corrupted one is
refused; a successor adopts a sequence's chain of blocks at a later epoch and hands it to the
request that comes back with the same key, refusing other identities, its own epoch and a
broken chain. The checksum is the SDK's CRC32C (libbaton_engine.so)."""
import ctypes
import sys
import types
import unittest

import checkout_paths  # noqa: F401 (the checkout's packages on sys.path)

try:
    import torch  # noqa: F401
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"
if not MISSING:  # the engine's own modules: a failure to import them fails the test
    from baton_torch_engine import kv_record
    from baton_torch_engine.kv_blocks import KvBlocks, SequenceBlocks
    from baton_torch_engine import kv_inherit
    from baton_torch_engine.device import ComputeDevice
    from baton_torch_engine.kv_copy import (BlockCopy, copy_in, device_block_copy,
                                            measure_device_copy_gbps, plan_copy)
    from baton_torch_engine.kv_inherit import inherit_kv
    from baton_engine import BatonError, Event, EventKind, Extent, KvInheritMode, Quarantine
    from baton_torch_engine.kv_handoff import AdoptionReport, KvHandoff
    from baton_torch_engine.llama import LlamaConfig

KEY = (0x0123456789ABCDEF, 0x0FEDCBA987654321)
BLOCK_BYTES = 4096


def config():
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=2, vocab_size=300, head_dim=8)


class Pool:
    """`count` blocks of private memory, as a KV cache and as a handoff of `epoch`."""

    def __init__(self, count=16):
        self.kv = KvBlocks.private(config(), BLOCK_BYTES, count)
        self.base = self.kv._region_memory.data_ptr()

    def address(self, block):
        return self.base + block * BLOCK_BYTES

    def handoff(self, epoch, identity=7, clock=None):
        return KvHandoff(self.kv, identity, self.address, lambda: epoch,
                         clock=clock or (lambda: 0.0))

    def headers(self, blocks):
        return b"".join(ctypes.string_at(self.address(b), kv_record.HEADER_BYTES)
                        for b in blocks)


@unittest.skipIf(MISSING, MISSING)
class KvRecordTest(unittest.TestCase):
    def test_the_layout_is_the_reference_engines(self):
        self.assertEqual(kv_record.data_offset(16), 128)
        self.assertEqual(kv_record.data_offset(17), 192)
        bt = kv_record.block_tokens_for(4096, 100)
        self.assertLessEqual(kv_record.data_offset(bt) + bt * 100, 4096)
        self.assertGreater(kv_record.data_offset(bt + 1) + (bt + 1) * 100, 4096)
        kv = KvBlocks(config(), BLOCK_BYTES)
        self.assertEqual(kv.data_offset, kv_record.data_offset(kv.block_tokens))

    def test_a_record_reads_back_and_a_torn_or_corrupt_one_is_refused(self):
        pool = Pool()
        a = pool.address(3)
        r = kv_record.Record(identity=9, key=KEY, writer_epoch=4, block=3, index=0, tokens=3)
        kv_record.commit(a, r, [5, 6, 7])
        got = kv_record.read(pool.headers([3]), a + 64, pool.kv.block_tokens)
        self.assertEqual(got.state, kv_record.State.VALID)
        self.assertEqual((got.record, got.ids), (r, [5, 6, 7]))
        ctypes.c_int32.from_address(a + 64).value = 99  # an id changed under the checksum
        self.assertEqual(kv_record.read(pool.headers([3]), a + 64, 8).state,
                         kv_record.State.CORRUPT)
        ctypes.c_uint32.from_address(a + 4).value += 1  # mid-commit
        self.assertEqual(kv_record.read(pool.headers([3]), a + 64, 8).state,
                         kv_record.State.TORN)
        kv_record.clear(a)
        self.assertEqual(kv_record.read(pool.headers([3]), a + 64, 8).state,
                         kv_record.State.ABSENT)

    def test_present_finds_every_header_that_read_does_not_find_absent(self):
        pool = Pool()
        r = kv_record.Record(identity=9, key=KEY, writer_epoch=4, block=5, index=0, tokens=1)
        kv_record.commit(pool.address(5), r, [1])
        kv_record.commit(pool.address(9), kv_record.Record(9, (0, 1), 4, 9, tokens=1), [2])
        ctypes.c_uint32.from_address(pool.address(9) + 4).value += 1  # torn: still present
        headers = pool.headers(range(16))
        want = [b for b in range(16) if kv_record.read(
            headers[b * 64:(b + 1) * 64], pool.address(b) + 64, 8).state !=
            kv_record.State.ABSENT]
        self.assertEqual(want, [5, 9])
        self.assertEqual(kv_record.present(headers), want)
        self.assertEqual(kv_record.present(headers[:9 * 64 + 10]), [5], "whole headers only")
        self.assertEqual(kv_record.present(b""), [])


def written(pool, length, epoch=3, identity=7):
    """A sequence of `length` tokens committed by a writer at `epoch`, step by step."""
    writer = pool.handoff(epoch, identity)
    seq = SequenceBlocks(pool.kv.take(pool.kv.blocks_for(length)), 0)
    tokens = [(i * 7) % 250 for i in range(length + 1)]
    for step in (length - 1, 1):
        before, seq.length = seq.length, seq.length + step
        writer.committed(KEY, seq, tokens, before)
    return seq, tokens


@unittest.skipIf(MISSING, MISSING)
class KvHandoffTest(unittest.TestCase):
    def written(self, pool, length, epoch=3, identity=7):
        return written(pool, length, epoch, identity)

    def successor(self, pool, seq, epoch=4, identity=7):
        for b in seq.blocks:  # the promotion's blocks come back as inherited
            pool.kv.blocks.discard(b)
        heir = pool.handoff(epoch, identity)
        report, held = heir.adopt(seq.blocks, pool.headers(seq.blocks))
        return heir, report, held

    def test_the_same_sequence_found_again_is_no_drop_but_another_is(self):
        # A copy taken before the barrier keeps a sequence; the blocks' grant brings the
        # same one again: not a drop. Another sequence as long for the key is one.
        pool = Pool()
        heir = pool.handoff(4)
        report = AdoptionReport()

        def keep(tokens):
            return heir.keep(KEY, SequenceBlocks(pool.kv.take(1), 3), tokens, report, 4)
        self.assertTrue(keep([1, 2, 3, 4]))
        self.assertFalse(keep([1, 2, 3, 4]))
        self.assertEqual((report.adopted, report.dropped), (1, {}))
        self.assertFalse(keep([9, 9, 9, 9]))
        self.assertEqual(report.dropped, {"duplicate": 1})

    def test_a_successor_adopts_the_chain_and_the_replay_continues_from_it(self):
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, tokens = self.written(pool, 2 * bt + 3)
        heir, report, held = self.successor(pool, seq)
        self.assertEqual((report.adopted, report.tokens, report.dropped),
                         (1, 2 * bt + 3, {}))
        self.assertEqual(held, seq.blocks)
        replay = SequenceBlocks()
        for b in held:
            pool.kv.add(b, held=True)
        used = heir.continue_from(KEY, tokens[:2 * bt + 3] + [1, 2], replay)
        self.assertEqual(used, 2 * bt + 3)
        self.assertEqual(replay.blocks, seq.blocks)
        self.assertEqual(heir.counters.tokens_not_recomputed, 2 * bt + 3)
        self.assertEqual(heir.kept, {})

    def test_a_replay_that_differs_keeps_only_the_common_prefix(self):
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, tokens = self.written(pool, 2 * bt + 3)
        heir, _, held = self.successor(pool, seq)
        for b in held:
            pool.kv.add(b, held=True)
        free = pool.kv.free_count
        replay = SequenceBlocks()
        other = tokens[:bt + 1] + [299] * (bt + 5)
        self.assertEqual(heir.continue_from(KEY, other, replay), bt + 1)
        self.assertEqual(replay.blocks, seq.blocks[:2])
        self.assertEqual(pool.kv.free_count, free + 1)  # the third block is free again

    def test_refusals_are_counted_by_reason(self):
        for why, kwargs in (("identity", {"identity": 8}), ("epoch", {"epoch": 3})):
            pool = Pool()
            seq, _ = self.written(pool, 5)
            _, report, held = self.successor(pool, seq, **kwargs)
            self.assertEqual((report.adopted, report.dropped, held), (0, {why: 1}, []), why)
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, _ = self.written(pool, 2 * bt + 1)
        heir = pool.handoff(4)
        report, _ = heir.adopt(seq.blocks[1:], pool.headers(seq.blocks[1:]))
        self.assertEqual(report.dropped, {"not_granted": 1})
        ctypes.c_uint32.from_address(pool.address(seq.blocks[0]) + 4).value += 1
        report, _ = heir.adopt(seq.blocks, pool.headers(seq.blocks))
        self.assertEqual(report.dropped, {"torn": 1})

    def test_a_parked_sequence_keeps_its_records_for_the_next_primary(self):
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, tokens = self.written(pool, bt + 2)
        blocks = list(seq.blocks)
        writer = pool.handoff(3)
        writer.park(KEY, seq, tokens)  # a switch-over hands the running sequence over
        self.assertEqual((seq.blocks, seq.length, writer.counters.handed_over), ([], 0, 1))
        self.assertEqual(writer.kept[KEY].seq.blocks, blocks)
        _, report, held = self.successor(pool, SequenceBlocks(blocks, bt + 2))
        self.assertEqual((report.adopted, report.tokens, held), (1, bt + 2, blocks))

    def test_released_blocks_carry_no_record(self):
        pool = Pool()
        seq, _ = self.written(pool, 5)
        pool.handoff(3).releasing(seq)
        _, report, _ = self.successor(pool, seq)
        self.assertEqual((report.adopted, report.dropped), (0, {}))

    def test_unclaimed_kv_expires(self):
        pool = Pool()
        now = [0.0]
        seq, _ = self.written(pool, 5)
        heir = KvHandoff(pool.kv, 7, pool.address, lambda: 4, keep_s=30,
                         clock=lambda: now[0])
        _, held = heir.adopt(seq.blocks, pool.headers(seq.blocks))
        for b in held:
            pool.kv.add(b, held=True)
        now[0] = 31.0
        self.assertEqual(heir.expire(), 1)
        self.assertEqual(heir.counters.kept_freed, {"expired": 1})


def quarantined(pool, length):
    """A dead writer's sequence, its blocks out of the cache (in quarantine), its KV data a
    pattern per block."""
    seq, tokens = written(pool, length)
    off = pool.kv.data_offset
    for i, b in enumerate(seq.blocks):
        ctypes.memset(pool.address(b) + off, 0x50 + i, BLOCK_BYTES - off)
        pool.kv.blocks.discard(b)
    return seq, tokens


@unittest.skipIf(MISSING, MISSING)
class KvCopyTest(unittest.TestCase):
    """A successor promoted before the dead writer's barrier copies its KV out of the
    quarantined blocks into blocks of its own (kv_copy.py)."""

    def test_the_copy_is_kept_in_own_blocks_and_the_replay_continues_from_it(self):
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, tokens = quarantined(pool, 2 * bt + 3)
        heir = pool.handoff(4)
        plan = plan_copy(heir, seq.blocks, pool.headers(seq.blocks))
        self.assertEqual((len(plan.sequences), plan.blocks, plan.nbytes),
                         (1, 3, 3 * BLOCK_BYTES))
        free = pool.kv.free_count
        report = copy_in(heir, plan, lambda: pool.kv.take(1)[0])
        self.assertEqual((report.adopted, report.tokens, report.dropped), (1, 2 * bt + 3, {}))
        self.assertEqual(heir.counters.adopted, 1)
        copies = heir.kept[KEY].seq.blocks
        self.assertTrue(set(copies).isdisjoint(seq.blocks), "never a quarantined block")
        self.assertEqual(pool.kv.free_count, free - 3)
        off = pool.kv.data_offset
        for i, (src, dst) in enumerate(zip(seq.blocks, copies)):
            self.assertEqual(ctypes.string_at(pool.address(dst) + off, BLOCK_BYTES - off),
                             bytes([0x50 + i]) * (BLOCK_BYTES - off))
            got = kv_record.read(pool.headers([dst]), pool.address(dst) + 64, bt)
            self.assertEqual((got.state, got.record.block, got.record.writer_epoch),
                             (kv_record.State.VALID, dst, 4), "committed again, as this engine's")
        replay = SequenceBlocks()
        self.assertEqual(heir.continue_from(KEY, tokens[:2 * bt + 3] + [1], replay), 2 * bt + 3)
        self.assertEqual(replay.blocks, copies)

    def test_a_record_that_changes_under_the_copy_is_dropped_and_its_copies_freed(self):
        pool = Pool()
        seq, _ = quarantined(pool, 5)
        heir = pool.handoff(4)
        plan = plan_copy(heir, seq.blocks, pool.headers(seq.blocks))
        free = pool.kv.free_count

        def take():  # the dying writer commits the block again while the copy runs
            ctypes.c_uint32.from_address(pool.address(seq.blocks[0]) + 4).value += 2
            return pool.kv.take(1)[0]
        report = copy_in(heir, plan, take)
        self.assertEqual((report.adopted, report.dropped), (0, {"changed": 1}))
        self.assertEqual((pool.kv.free_count, heir.kept), (free, {}))
        for b in pool.kv.free:
            self.assertEqual(ctypes.string_at(pool.address(b), 64), bytes(64), "no record left")

    def test_no_block_to_copy_into_drops_the_sequence(self):
        pool = Pool()
        seq, _ = quarantined(pool, 5)
        heir = pool.handoff(4)
        plan = plan_copy(heir, seq.blocks, pool.headers(seq.blocks))

        def take():
            raise MemoryError("none left")
        report = copy_in(heir, plan, take)
        self.assertEqual((report.adopted, report.dropped), (0, {"hold_failed": 1}))

    def test_the_plan_counts_what_it_refuses(self):
        pool = Pool()
        seq, _ = quarantined(pool, 5)
        ctypes.c_uint32.from_address(pool.address(seq.blocks[0]) + 4).value += 1  # mid-commit
        plan = plan_copy(pool.handoff(4), seq.blocks, pool.headers(seq.blocks))
        self.assertEqual((plan.sequences, plan.blocks, plan.dropped), ([], 0, {"torn": 1}))
        report = copy_in(pool.handoff(4), plan, lambda: pool.kv.take(1)[0])
        self.assertEqual(report.dropped, {"torn": 1})


@unittest.skipIf(MISSING, MISSING)
class DeviceKvCopyTest(unittest.TestCase):
    """On a device pool the records and token ids lie in the host pool blocks and the KV in
    the device blocks of the same numbers: the copy takes each from its own memory (here a
    second private region stands in for the device pool)."""

    def test_records_come_from_the_host_blocks_and_kv_from_the_device_blocks(self):
        host = Pool()  # the records, as the SDK maps the host pool on a device engine
        bt = host.kv.block_tokens
        seq, tokens = quarantined(host, bt + 2)
        device = KvBlocks.private(config(), BLOCK_BYTES, 16)  # the engine's own device blocks
        for b in range(16):
            device.blocks.discard(b)
        device.free = []
        for b in host.kv.free:
            device.add(b)
        dead = torch.zeros(16 * BLOCK_BYTES, dtype=torch.uint8)  # the quarantined chunks, READ
        off = host.kv.data_offset
        for i, b in enumerate(seq.blocks):
            dead[b * BLOCK_BYTES + off:(b + 1) * BLOCK_BYTES] = 0x70 + i
        heir = KvHandoff(device, 7, host.address, lambda: 4)
        plan = plan_copy(heir, seq.blocks, host.headers(seq.blocks))
        copy = device_block_copy(heir, dead[seq.blocks[0] * BLOCK_BYTES:], seq.blocks[0])
        report = copy_in(heir, plan, lambda: device.take(1)[0], copy)
        self.assertEqual((report.adopted, report.tokens, report.dropped), (1, bt + 2, {}))
        copies = heir.kept[KEY].seq.blocks
        self.assertTrue(set(copies).isdisjoint(seq.blocks), "never a quarantined block")
        for i, dst in enumerate(copies):
            self.assertTrue(bool((device.block_memory(dst)[off:] == 0x70 + i).all()),
                            f"block {dst}: the dead engine's device KV")
            self.assertEqual(ctypes.string_at(host.address(dst) + off, 8), bytes(8),
                             "the host block's KV bytes are not copied")
            got = kv_record.read(host.headers([dst]), host.address(dst) + 64, bt)
            self.assertEqual((got.state, got.record.block), (kv_record.State.VALID, dst))
        replay = SequenceBlocks()
        self.assertEqual(heir.continue_from(KEY, tokens[:bt + 2] + [1], replay), bt + 2)

    def test_a_copy_that_fails_leaves_no_block_taken_and_no_record_behind(self):
        pool = Pool()
        bt = pool.kv.block_tokens
        seq, _ = quarantined(pool, 2 * bt + 1)  # three blocks
        heir = pool.handoff(4)
        plan = plan_copy(heir, seq.blocks, pool.headers(seq.blocks))
        free_before = pool.kv.free_count
        taken = []

        def block(src, dst):  # the record lands, then the device faults on the second block
            taken.append(dst)
            ctypes.memmove(pool.address(dst), pool.address(src), pool.kv.data_offset)
            if len(taken) == 2:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
        with self.assertRaises(RuntimeError):
            copy_in(heir, plan, lambda: pool.kv.take(1)[0], BlockCopy(block))
        self.assertEqual(pool.kv.free_count, free_before, "every block taken is given back")
        for dst in taken:
            self.assertEqual(pool.headers([dst]), bytes(kv_record.HEADER_BYTES),
                             f"block {dst} keeps no copied record")

    def test_the_copy_speed_is_measured_block_by_block_on_the_engines_device(self):
        # The engine's ComputeDevice, as main.py hands it (on a GPU its CUDA ordinal).
        gbps = measure_device_copy_gbps(ComputeDevice.parse("cpu"), BLOCK_BYTES, blocks=4)
        self.assertGreater(gbps, 0.0)


class FakeEngine:
    """The SDK's side of a promotion before the barrier, for inherit_kv: the dead writer's
    `quarantined` blocks (their headers as of the promotion), their grant once waited for."""

    def __init__(self, pool, quarantined, barrier_ms):
        self.pool, self.blocks, self.barrier_ms = pool, quarantined, barrier_ms
        self.headers = pool.headers(quarantined)
        self.mapped = self.waited = self.released = False
        self.inheritance = None

    def quarantined(self):
        return Quarantine(extents=tuple(Extent(b, 1) for b in self.blocks), headers=self.headers,
                          barrier_estimate_ms=self.barrier_ms, wait_limit_ms=100)

    def map_quarantined(self):
        self.mapped = True
        return self.quarantined()

    def wait_inherited_blocks(self, timeout_ms):
        self.waited = True
        return Event(EventKind.GRANTED, 4, tuple(Extent(b, 1) for b in self.blocks),
                     headers=self.headers)

    def release_quarantined(self):
        self.released = True

    def report_kv_inheritance(self, mode, blocks, nbytes, ms, estimate_ms=0.0):
        self.inheritance = (mode, blocks, nbytes)

    def report_kv_adoption(self, adopted, tokens, dropped, ms):
        pass


@unittest.skipIf(MISSING, MISSING)
class InheritTest(unittest.TestCase):
    """inherit_kv's choice between a copy and the wait (kv_inherit.py)."""

    def quarantine(self, barrier_ms, count=16, length=5):
        """A pool whose dead writer left a `length`-token sequence in quarantine, and the SDK's
        side of a promotion that expects the barrier in `barrier_ms`."""
        pool = Pool(count)
        seq, _ = quarantined(pool, length)
        return pool, FakeEngine(pool, seq.blocks, barrier_ms)

    def inherit(self, pool, engine, block_copy_ms=0.001):
        kv = types.SimpleNamespace(
            blocks=pool.kv, block_bytes=BLOCK_BYTES,
            model=types.SimpleNamespace(device=types.SimpleNamespace(is_cuda=False)),
            take=lambda extents, held=(): [pool.kv.add(e.first + i, held=e.first + i in held)
                                           for e in extents for i in range(e.count)])
        scheduler = types.SimpleNamespace(call=lambda fn: fn())
        promoted = Event(EventKind.PROMOTED, 4)
        return inherit_kv(engine, kv, pool.handoff(4), scheduler, promoted, lambda text: None,
                          block_copy_ms)

    def test_a_copy_that_beats_the_barrier_is_taken(self):
        pool, engine = self.quarantine(barrier_ms=50.0)
        report = self.inherit(pool, engine)
        self.assertEqual((report.adopted, engine.mapped, engine.waited), (1, True, False))
        self.assertEqual(engine.inheritance, (KvInheritMode.COPIED, 1, BLOCK_BYTES))

    def test_the_copy_is_estimated_per_block(self):
        # Three blocks at 0.4 ms each cost more than a 1 ms barrier; at 0.3 ms, less.
        for block_ms, mode in ((0.4, KvInheritMode.WAITED), (0.3, KvInheritMode.COPIED)):
            pool = Pool()
            pool, engine = self.quarantine(1.0, length=2 * pool.kv.block_tokens + 1)
            self.inherit(pool, engine, block_copy_ms=block_ms)
            self.assertEqual(engine.inheritance, (mode, 3, 3 * BLOCK_BYTES), block_ms)

    def test_a_copy_slower_than_the_barrier_waits_for_the_grant(self):
        pool, engine = self.quarantine(barrier_ms=0.0001)
        report = self.inherit(pool, engine)
        self.assertEqual((report.adopted, engine.mapped, engine.waited), (1, False, True))
        self.assertEqual(engine.inheritance[0], KvInheritMode.WAITED)

    def test_no_block_to_copy_into_waits_for_the_grant(self):
        pool, engine = self.quarantine(barrier_ms=50.0, count=4)
        pool.kv.take(pool.kv.free_count)  # every free block in use
        report = self.inherit(pool, engine)
        self.assertEqual((report.adopted, report.dropped), (1, {}))
        self.assertEqual((engine.mapped, engine.waited), (True, True))
        self.assertEqual(engine.inheritance[0], KvInheritMode.WAITED)

    def test_a_grant_that_came_first_is_adopted_in_place(self):
        pool, engine = self.quarantine(barrier_ms=50.0)

        def refused():
            raise BatonError(9, "baton_engine_map_quarantined", "granted meanwhile")
        engine.map_quarantined = refused
        report = self.inherit(pool, engine)
        self.assertEqual((report.adopted, engine.waited), (1, True))

    def test_a_copy_that_fails_waits_for_the_grant_and_lets_the_view_go(self):
        pool, engine = self.quarantine(barrier_ms=50.0)

        def faulted(*args):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real, kv_inherit.copy_in = kv_inherit.copy_in, faulted
        try:
            report = self.inherit(pool, engine)
        finally:
            kv_inherit.copy_in = real
        self.assertEqual((report.adopted, engine.mapped, engine.waited, engine.released),
                         (1, True, True, True))
        self.assertEqual(engine.inheritance[0], KvInheritMode.WAITED)


if __name__ == "__main__":
    if MISSING:
        print(MISSING)
        sys.exit(0)
    unittest.main()

"""The torch engine's measure of what a quarantined block's copy costs (kv_copy_cost.py): the
copy itself, over scratch memory of the engine's geometry, never the engine's own cache."""
import ctypes
import math
import unittest

import checkout_paths  # noqa: F401 (the checkout's packages on sys.path)

try:
    import torch  # noqa: F401
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"
if not MISSING:  # the engine's own modules: a failure to import them fails the test
    from baton_torch_engine import kv_copy_cost
    from baton_torch_engine.device import ComputeDevice
    from baton_torch_engine.kv_blocks import KvBlocks
    from baton_torch_engine.llama import LlamaConfig


def config():
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=2, vocab_size=300, head_dim=8)


@unittest.skipIf(MISSING, MISSING)
class BlockCopyCostTest(unittest.TestCase):
    def cache(self, block_bytes=4096, count=8):
        return KvBlocks.private(config(), block_bytes, count)

    def test_a_block_costs_a_finite_positive_time(self):
        ms = kv_copy_cost.measure_block_copy_ms(self.cache(), ComputeDevice.parse("cpu"))
        self.assertGreater(ms, 0.0)
        self.assertTrue(math.isfinite(ms))

    def test_the_engines_cache_is_not_touched(self):
        kv = self.cache()
        base, size = kv.block_memory(0).data_ptr(), kv.region_blocks * kv.block_bytes
        free, memory = kv.free_count, ctypes.string_at(base, size)
        kv_copy_cost.measure_block_copy_ms(kv, ComputeDevice.parse("cpu"))
        self.assertEqual(kv.free_count, free)
        self.assertEqual(ctypes.string_at(base, size), memory)

    def test_the_scratch_copy_is_kept_whole_and_freed(self):
        # One measured copy: the sequence is copied whole, its copies freed with no record.
        scratch, writer, seq = kv_copy_cost._scratch(self.cache(block_bytes=8192))
        self.assertEqual(len(seq.blocks), kv_copy_cost.SEQUENCE_BLOCKS)
        free = scratch.free_count
        self.assertGreater(kv_copy_cost._copy_once(scratch, writer, seq, False), 0.0)
        self.assertEqual(scratch.free_count, free)
        for b in range(scratch.region_blocks):
            if b not in seq.blocks:
                self.assertEqual(ctypes.string_at(writer.block_address(b), 64), bytes(64), b)

    def test_large_blocks_keep_the_scratch_bounded(self):
        block = kv_copy_cost.SCRATCH_BYTES // 4
        scratch, _, seq = kv_copy_cost._scratch(self.cache(block_bytes=block, count=1))
        self.assertEqual(len(seq.blocks), 2)
        self.assertLessEqual(scratch.region_blocks * block, kv_copy_cost.SCRATCH_BYTES)


if __name__ == "__main__":
    unittest.main()

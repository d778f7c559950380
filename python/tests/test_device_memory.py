"""Baton's memory as PyTorch tensors through DLPack (baton_engine.dlpack), and the CUDA settings
of baton-torch-engine's device policy, on a machine without a GPU.

The CPU path (kDLCPU) is the device path (kDLCUDA) but for the device type: a buffer and an
mmap'd region are wrapped without a copy, written through the tensor and read in the memory,
the deleter (C's free, or one a test gives) runs when the last tensor over it dies, and all of
it without numpy (PyTorch's pip
wheel has none). The kDLCUDA structure is checked field by field against dlpack.h."""
import ctypes
import gc
import mmap
import os
import subprocess
import sys
import types
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_engine import dlpack  # noqa: E402

try:
    import torch
    MISSING = ""
except ImportError as e:  # PyTorch is not installed for this interpreter
    MISSING = f"SKIP: PyTorch is missing ({e}); scripts/install-deps installs python3-torch"
if not MISSING:
    from baton_engine import tensors
    from baton_torch_engine import device


class StructureTest(unittest.TestCase):
    def test_the_layout_is_dlpack_h(self):
        offsets = [(f, getattr(dlpack.DLTensor, f).offset) for f, _ in dlpack.DLTensor._fields_]
        self.assertEqual(offsets, [("data", 0), ("device", 8), ("ndim", 16), ("dtype", 20),
                                   ("shape", 24), ("strides", 32), ("byte_offset", 40)])
        self.assertEqual(ctypes.sizeof(dlpack.DLTensor), 48)
        self.assertEqual(dlpack.DLManagedTensor.manager_ctx.offset, 48)
        self.assertEqual(dlpack.DLManagedTensor.deleter.offset, 56)
        self.assertEqual(ctypes.sizeof(dlpack.DLManagedTensor), 64)
        self.assertEqual(ctypes.sizeof(dlpack.DLDataType), 4)

    def test_a_cuda_range_is_described_as_dlpack_asks(self):
        block = dlpack.describe(0x7F0000200000, 3 << 30, dlpack.KDL_CUDA, 3)
        try:
            managed = dlpack.DLManagedTensor.from_address(block)
            t = managed.dl_tensor
            self.assertEqual(t.data, 0x7F0000200000)
            self.assertEqual((t.device.device_type, t.device.device_id), (2, 3))
            self.assertEqual((t.dtype.code, t.dtype.bits, t.dtype.lanes), (1, 8, 1))  # kDLUInt
            self.assertEqual(t.ndim, 1)
            self.assertEqual(t.shape[0], 3 << 30)
            # The shape is in the same block, right after the structure: one free frees both.
            self.assertEqual(ctypes.addressof(t.shape.contents),
                             block + ctypes.sizeof(dlpack.DLManagedTensor))
            self.assertFalse(t.strides)  # NULL: compact
            self.assertEqual(t.byte_offset, 0)
            self.assertIsNone(managed.manager_ctx)
            self.assertEqual(managed.deleter, dlpack.FREE)  # C: no Python runs to let it go
        finally:
            dlpack.free(block)


class Freed:
    """A deleter that notes each block, then frees it as the default one does."""

    def __init__(self):
        self.blocks = []

        def deleter(block):
            self.blocks.append(block)
            dlpack.free(block)
        self.function = dlpack.DELETER(deleter)  # kept alive with this object
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value


@unittest.skipIf(MISSING, MISSING)
class HostMemoryTest(unittest.TestCase):
    def test_a_buffer_is_wrapped_written_and_let_go(self):
        buf = (ctypes.c_uint8 * 4096)()
        freed = Freed()
        t = dlpack.wrap_bytes(torch, ctypes.addressof(buf), 4096, dlpack.KDL_CPU,
                              deleter=freed.address)
        self.assertEqual(t.data_ptr(), ctypes.addressof(buf))  # no copy
        self.assertEqual((t.dtype, tuple(t.shape), t.device.type), (torch.uint8, (4096,), "cpu"))
        t[10:20] = 0x5A
        self.assertEqual(bytes(buf[10:20]), b"\x5a" * 10)
        buf[100] = 7
        self.assertEqual(int(t[100]), 7)
        view = t[8:].view(torch.int32)  # a view keeps the storage, and so the structures
        del t
        gc.collect()
        self.assertEqual(freed.blocks, [])
        del view
        gc.collect()
        self.assertEqual(len(freed.blocks), 1)  # the deleter ran, once

    def test_an_mmapped_region_through_the_sdk(self):
        region = mmap.mmap(-1, 1 << 20)
        anchor = ctypes.c_char.from_buffer(region)
        address = ctypes.addressof(anchor)
        t = tensors.bytes_tensor(address, 1 << 20)
        self.assertEqual(t.data_ptr(), address)
        t[-4:] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
        self.assertEqual(region[-4:], b"\x01\x02\x03\x04")
        region[0:2] = b"\xff\xfe"
        self.assertEqual(t[:2].tolist(), [255, 254])
        self.assertEqual(tensors.bytes_tensor(address, 0).numel(), 0)
        del t, anchor
        gc.collect()
        region.close()

    def test_a_device_torch_refuses_is_not_left_live(self):
        if torch.cuda.is_available():
            self.skipTest("this host has CUDA: the refusal is for a CPU-only PyTorch")
        buf = (ctypes.c_uint8 * 64)()
        freed = Freed()
        with self.assertRaises(Exception):
            dlpack.wrap_bytes(torch, ctypes.addressof(buf), 64, dlpack.KDL_CUDA, 0,
                              deleter=freed.address)
        self.assertEqual(len(freed.blocks), 1)  # let go by the wrapper, PyTorch did not take it

    def test_no_numpy_is_needed(self):
        code = """
import ctypes, gc, sys
sys.modules["numpy"] = None  # as on a host with PyTorch's pip wheel alone
import checkout_paths, torch
from baton_engine import dlpack, tensors
try:
    import numpy
    sys.exit("numpy still imports")
except ImportError:
    pass
buf = (ctypes.c_uint8 * 256)()
t = tensors.bytes_tensor(ctypes.addressof(buf), 256)
t.view(torch.float32)[1] = 1.5
assert bytes(buf[4:8]) == bytes([0, 0, 0xC0, 0x3F]), bytes(buf[4:8])
freed = []
deleter = dlpack.DELETER(lambda block: (freed.append(block), dlpack.free(block)))
u = dlpack.wrap_bytes(torch, ctypes.addressof(buf), 256, dlpack.KDL_CPU,
                      deleter=ctypes.cast(deleter, ctypes.c_void_p).value)
assert int(u[6]) == 0xC0
del t, u
gc.collect()
assert len(freed) == 1, freed
print("ok")
"""
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)


class FakeMatmul:
    """An older torch's cuBLAS settings: an unknown one raises AssertionError."""

    def __init__(self, names):
        object.__setattr__(self, "_names", set(names))
        object.__setattr__(self, "values", {})

    def __getattr__(self, name):
        if name in self._names:
            return self.values.get(name, True)
        raise AssertionError(f"Unknown attribute {name}")

    def __setattr__(self, name, value):
        if name not in self._names:
            raise AssertionError(f"Unknown attribute {name}")
        self.values[name] = value


@unittest.skipIf(MISSING, MISSING)
class CudaSettingsTest(unittest.TestCase):
    def backends(self, new_api):
        names = {"allow_tf32", "allow_bf16_reduced_precision_reduction"}
        if new_api:
            names.add("fp32_precision")
        cudnn = types.SimpleNamespace(allow_tf32=True)
        if new_api:
            cudnn.fp32_precision = "none"
            cudnn.conv = types.SimpleNamespace(fp32_precision="tf32")
            cudnn.rnn = types.SimpleNamespace(fp32_precision="tf32")
        return types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=FakeMatmul(names)),
                                     cudnn=cudnn)

    def test_a_new_torch_is_told_through_fp32_precision_alone(self):
        b = self.backends(new_api=True)
        device.fp32_products(b)
        self.assertEqual(b.cuda.matmul.values, {"fp32_precision": "ieee",
                                                "allow_bf16_reduced_precision_reduction": False})
        self.assertEqual((b.cudnn.fp32_precision, b.cudnn.conv.fp32_precision,
                          b.cudnn.rnn.fp32_precision), ("ieee",) * 3)
        self.assertTrue(b.cudnn.allow_tf32)  # the legacy flag untouched

    def test_an_older_torch_through_allow_tf32(self):
        b = self.backends(new_api=False)
        device.fp32_products(b)
        self.assertEqual(b.cuda.matmul.values, {"allow_tf32": False,
                                                "allow_bf16_reduced_precision_reduction": False})
        self.assertFalse(b.cudnn.allow_tf32)

    def test_the_cuda_error_is_the_contexts_then_the_exceptions(self):
        class Driver:
            result = 0

            def cuCtxSynchronize(self):
                return self.result

        class AcceleratorError(RuntimeError):
            error_code = 719  # cudaErrorLaunchFailure

        saved, device._cuda_driver = device._cuda_driver, Driver()
        try:
            device._cuda_driver.result = 700  # CUDA_ERROR_ILLEGAL_ADDRESS, sticky
            self.assertEqual(device.cuda_error_code(AcceleratorError()), 700)
            device._cuda_driver.result = 0
            self.assertEqual(device.cuda_error_code(AcceleratorError()), 719)
            self.assertEqual(device.cuda_error_code(ValueError("not CUDA")), 0)
        finally:
            device._cuda_driver = saved


if __name__ == "__main__":
    if MISSING:
        print(MISSING)  # the structures are still checked
    unittest.main()

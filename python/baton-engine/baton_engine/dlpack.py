"""Memory this process did not allocate as a PyTorch tensor, through DLPack, without numpy.

    t = wrap_bytes(torch, address, nbytes, KDL_CUDA, device_id)   # uint8, shape (nbytes,)

PyTorch's reading of `__cuda_array_interface__` needs numpy, which its pip wheel does not
bring. DLPack needs nothing: the structures of dlpack.h (a DLManagedTensor: the DLTensor, then
manager_ctx and the deleter) are written with ctypes into one block from the C library's
malloc, followed by the shape, and handed to torch.utils.dlpack.from_dlpack in a PyCapsule
named "dltensor". PyTorch renames the capsule "used_dltensor" when it takes it, and calls the
deleter, the C library's free, when the tensor's storage dies: no Python runs then, so a
tensor that outlives the interpreter's shutdown, or dies on a thread of PyTorch's own, frees
the block safely. Nothing is copied, and the memory is not owned: the caller keeps it mapped
for as long as the tensor is used.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

KDL_CPU = 1       # DLDeviceType: host memory
KDL_CUDA = 2      # DLDeviceType: CUDA device memory (device_id: the CUDA ordinal)
KDL_UINT = 1      # DLDataTypeCode: unsigned integer


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    # deleter: void (*)(DLManagedTensor* self), the address of a C function.
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # a deleter's type, for one written in Python

_libc = ctypes.CDLL(None)  # this process's C library (its own function objects: no one else's)
_malloc = _libc.malloc
_malloc.restype = ctypes.c_void_p
_malloc.argtypes = [ctypes.c_size_t]
_free = _libc.free
_free.restype = None
_free.argtypes = [ctypes.c_void_p]
FREE = ctypes.cast(_free, ctypes.c_void_p).value  # the default deleter: free(block)

# A block: the DLManagedTensor, then its one-element shape.
_SHAPE_AT = ctypes.sizeof(DLManagedTensor)
_BLOCK_BYTES = _SHAPE_AT + ctypes.sizeof(ctypes.c_int64)

_CAPSULE_NAME = b"dltensor"
# Private prototypes: ctypes.pythonapi's function objects are shared by the whole process.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))


def free(block: int) -> None:
    """Frees a block of describe() (what the default deleter does)."""
    _free(block)


def describe(address: int, nbytes: int, device_type: int, device_id: int = 0,
             deleter: Optional[int] = None) -> int:
    """A new block from malloc holding the DLManagedTensor of `nbytes` bytes at `address` (one
    dimension of uint8, contiguous) and its shape; its deleter is `deleter` (the address of a
    C function), free by default. Returns the block's address; MemoryError without one."""
    block = _malloc(_BLOCK_BYTES)
    if not block:
        raise MemoryError("malloc of a DLManagedTensor")
    ctypes.memset(block, 0, _BLOCK_BYTES)
    shape = ctypes.c_int64.from_address(block + _SHAPE_AT)
    shape.value = nbytes
    managed = DLManagedTensor.from_address(block)
    t = managed.dl_tensor
    t.data = address
    t.device = DLDevice(device_type, device_id)
    t.ndim = 1
    t.dtype = DLDataType(KDL_UINT, 8, 1)
    t.shape = ctypes.cast(block + _SHAPE_AT, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # compact, row-major
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = FREE if deleter is None else deleter
    return block


def wrap_bytes(torch: Any, address: int, nbytes: int, device_type: int,
               device_id: int = 0, deleter: Optional[int] = None) -> Any:
    """A uint8 tensor of shape (nbytes,) over the memory at `address` (no copy): on the CPU
    (KDL_CPU) or on CUDA device `device_id` (KDL_CUDA; PyTorch may ask the driver whether the
    address is on that device, so its first byte must be mapped). nbytes > 0. `deleter`: as
    describe's; it also gets the block when PyTorch refuses it."""
    from torch.utils.dlpack import from_dlpack
    block = describe(address, nbytes, device_type, device_id, deleter)
    try:
        capsule = _capsule_new(block, _CAPSULE_NAME, None)
    except BaseException:
        _release(block, deleter)
        raise
    try:
        return from_dlpack(capsule)
    except BaseException:
        if _capsule_is_valid(capsule, _CAPSULE_NAME):  # not taken: PyTorch calls no deleter
            _release(block, deleter)
        raise


def _release(block: int, deleter: Optional[int]) -> None:
    if deleter is None:
        _free(block)
    else:
        DELETER(deleter)(block)

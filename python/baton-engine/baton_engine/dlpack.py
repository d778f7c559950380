"""Memory this process did not allocate as a PyTorch tensor, through DLPack, without numpy.

    t = wrap_bytes(torch, address, nbytes, KDL_CUDA, device_id)   # uint8, shape (nbytes,)

PyTorch's reading of `__cuda_array_interface__` needs numpy, which its pip wheel does not
bring. DLPack needs nothing: the structures of dlpack.h (a DLManagedTensor: the DLTensor,
then manager_ctx and the deleter) are built here with ctypes and handed to
torch.utils.dlpack.from_dlpack in a PyCapsule named "dltensor". PyTorch renames the capsule
"used_dltensor" when it takes it and calls the deleter when the tensor's storage dies; until
then the structures stay in `_LIVE`, keyed by their address. Nothing is copied, and the memory
is not owned: the caller keeps it mapped for as long as the tensor is used.
"""
from __future__ import annotations

import ctypes
from typing import Any

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


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor* self)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


# The structures of every tensor PyTorch has not let go of yet, by the DLManagedTensor's address.
_LIVE: dict[int, tuple] = {}


def _release(address: int) -> None:
    live = _LIVE  # None late in the interpreter's shutdown
    if live is not None:
        live.pop(address, None)


_RELEASE = DELETER(_release)  # a module global: it outlives every tensor

_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def describe(address: int, nbytes: int, device_type: int,
             device_id: int = 0) -> tuple[DLManagedTensor, Any]:
    """The DLManagedTensor of `nbytes` bytes at `address` (one dimension of uint8, contiguous)
    and the shape array it points to; both must live as long as the tensor."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = address
    t.device = DLDevice(device_type, device_id)
    t.ndim = 1
    t.dtype = DLDataType(KDL_UINT, 8, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # compact, row-major
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _RELEASE
    return managed, shape


def wrap_bytes(torch: Any, address: int, nbytes: int, device_type: int,
               device_id: int = 0) -> Any:
    """A uint8 tensor of shape (nbytes,) over the memory at `address` (no copy): on the CPU
    (KDL_CPU) or on CUDA device `device_id` (KDL_CUDA; PyTorch may ask the driver whether the
    address is on that device, so its first byte must be mapped). nbytes > 0."""
    from torch.utils.dlpack import from_dlpack
    managed, shape = describe(address, nbytes, device_type, device_id)
    key = ctypes.addressof(managed)
    _LIVE[key] = (managed, shape)
    capsule = _capsule_new(key, _CAPSULE_NAME, None)
    try:
        return from_dlpack(capsule)
    except BaseException:
        if _capsule_is_valid(capsule, _CAPSULE_NAME):  # not taken: PyTorch calls no deleter
            _release(key)
        raise


def live_count() -> int:
    """How many wrapped tensors PyTorch still holds (for tests)."""
    return len(_LIVE)

"""Zero-copy PyTorch views of Baton's memory (needs `torch`; the rest of the package does not).

    weights = weight_tensors(engine)          # {name: tensor} over the read-only arena
    kv = block_tensor(engine, extent)         # one granted extent, uint8, writable

Nothing is copied and no model file is read: each tensor's storage is the controller's
memory, mapped into this process. PyTorch has no read-only tensors; the weight arena is mapped
read-only, so writing a weight tensor kills the process with SIGSEGV rather than change what
the other engine of the pair reads. On a CUDA-backend controller, `device_weight_tensors`
wraps the device copy the same way (no host memory involved); the device KV pool is served to
PyTorch by libbaton_torch_alloc.so as a pluggable allocator (docs/gpu.md).
"""
from __future__ import annotations

import ctypes
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .session import Engine, Extent, TensorInfo


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError("baton_engine.tensors needs PyTorch (Debian: python3-torch): "
                          f"{e}") from e
    return torch


def torch_dtype(name: str) -> Any:
    """The torch dtype of a safetensors dtype name; None for one torch lacks (F8 in older
    releases), whose tensors are then given as raw uint8 bytes."""
    torch = _torch()
    table = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
             "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
             "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
             "F8_E5M2": getattr(torch, "float8_e5m2", None)}
    return table.get(name)


def bytes_tensor(address: int, nbytes: int) -> Any:
    """A uint8 CPU tensor over `nbytes` of this process's memory at `address` (no copy)."""
    torch = _torch()
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    buf = (ctypes.c_uint8 * nbytes).from_address(address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable"
        return torch.frombuffer(buf, dtype=torch.uint8)


def weight_tensor(info: "TensorInfo") -> Any:
    """One weight as a CPU tensor of its dtype and shape over the arena (no copy)."""
    raw = bytes_tensor(info.address, info.nbytes)
    dtype = torch_dtype(info.dtype)
    if dtype is None:
        return raw
    return raw.view(dtype).reshape(info.shape)


def weight_tensors(engine: "Engine") -> dict[str, Any]:
    """Every weight of the model, by name, as CPU tensors over the controller's arena."""
    return {t.name: weight_tensor(t) for t in engine.tensors()}


def device_weight_tensors(engine: "Engine") -> dict[str, Any]:
    """Every weight as a CUDA tensor over the controller's device copy (no copy); needs
    Engine.connect(use_device_memory=True) on a CUDA-backend controller."""
    torch = _torch()
    region = engine.device_weights()
    out = {}
    for t in engine.tensors():
        holder = _DeviceBytes(region.address + t.offset, t.nbytes)
        raw = torch.as_tensor(holder, device=f"cuda:{region.device}")
        dtype = torch_dtype(t.dtype)
        out[t.name] = raw if dtype is None else raw.view(dtype).reshape(t.shape)
    return out


class _DeviceBytes:
    """A device range as a uint8 array PyTorch can wrap (__cuda_array_interface__)."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "strides": None,
                                         "data": (address, False), "version": 3}


def block_tensor(engine: "Engine", extent: "Extent") -> Any:
    """A granted extent's blocks as a writable uint8 tensor of shape (count, block_bytes).
    Valid until the extent is returned or the engine fenced: check engine.may_write() before
    each step that writes it."""
    block_bytes = engine.pool().block_bytes
    raw = bytes_tensor(extent.address, extent.count * block_bytes)
    return raw.view(extent.count, block_bytes)

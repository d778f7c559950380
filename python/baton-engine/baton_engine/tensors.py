"""Zero-copy PyTorch views of Baton's memory (needs `torch`; the rest of the package does not).

    weights = weight_tensors(engine)          # {name: tensor} over the read-only arena
    kv = block_tensor(engine, extent)         # one granted extent, uint8, writable

Nothing is copied and no model file is read: each tensor's storage is the controller's
memory, mapped into this process. PyTorch has no read-only tensors; the weight arena is mapped
read-only, so writing a weight tensor kills the process with SIGSEGV rather than change what
the other engine of the pair reads. On a CUDA-backend controller, `device_weight_tensors`
wraps the device copy the same way (no host memory involved), and `device_block_region`
wraps the device KV pool's blocks for an engine that lays out its own cache in them
(baton-torch-engine); a framework that allocates its cache itself gets the pool's blocks
through libbaton_torch_alloc.so as a pluggable allocator (docs/gpu.md). Both kinds of memory are
wrapped through DLPack (baton_engine.dlpack), so numpy is not needed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import dlpack

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
    return dlpack.wrap_bytes(torch, address, nbytes, dlpack.KDL_CPU)


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
    region = engine.device_weights()
    out = {}
    for t in engine.tensors():
        raw = device_bytes_tensor(region.device, region.address + t.offset, t.nbytes)
        dtype = torch_dtype(t.dtype)
        out[t.name] = raw if dtype is None else raw.view(dtype).reshape(t.shape)
    return out


def device_bytes_tensor(device: int, address: int, nbytes: int) -> Any:
    """A uint8 CUDA tensor over `nbytes` of device memory at `address` on CUDA device
    `device` (no copy). The first byte must be mapped: PyTorch asks the driver which device
    the address is on."""
    torch = _torch()
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}")
    return dlpack.wrap_bytes(torch, address, nbytes, dlpack.KDL_CUDA, device)


def device_block_region(engine: "Engine", first: int) -> Any:
    """The device pool from block `first` (held, so mapped) to its end, as one uint8 CUDA
    tensor: block b at [(b - first) * block_bytes, ...). Blocks this engine does not hold lie
    in it unmapped and must not be touched."""
    region, pool = engine.device_pool(), engine.pool()
    start = first * pool.block_bytes
    return device_bytes_tensor(region.device, region.address + start,
                               pool.block_count * pool.block_bytes - start)


def host_block_region(engine: "Engine") -> Any:
    """The host pool's whole reserved range as one uint8 CPU tensor (block b at
    b * block_bytes): only granted blocks are mapped; the rest must not be touched."""
    pool = engine.pool()
    return bytes_tensor(pool.base, pool.block_count * pool.block_bytes)


def block_tensor(engine: "Engine", extent: "Extent") -> Any:
    """A granted extent's blocks as a writable uint8 tensor of shape (count, block_bytes).
    Valid until the extent is returned or the engine fenced: check engine.may_write() before
    each step that writes it."""
    block_bytes = engine.pool().block_bytes
    raw = bytes_tensor(extent.address, extent.count * block_bytes)
    return raw.view(extent.count, block_bytes)

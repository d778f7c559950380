"""Weights read from a model directory's safetensors files, for a cold start without Baton
(what an engine does today, and what perf/failover_torch compares Baton against).

By default every file's tensor data is read into the engine's own memory before the engine
serves, as vLLM's and SGLang's loaders copy each tensor into the model's parameters: a cold
start pays for every byte of its weights. With mapped=True the files are memory-mapped
read-only instead and each tensor is a view of their bytes, so the first forward pass pages
them in. Either way each tensor is a view of the file's data (no copy per tensor). A header
that is not valid safetensors (sizes that do not match dtype and shape, data outside the
file) is refused with ValueError naming the file.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from pathlib import Path
from typing import Any

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool"}
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1}


def read_model(model_dir: str, mapped: bool = False) -> tuple[dict[str, Any], list[Any]]:
    """Every tensor of every *.safetensors file in `model_dir`, and the buffers that back
    them (keep them as long as the tensors): read into memory, or mapped when `mapped`."""
    tensors: dict[str, Any] = {}
    buffers: list[Any] = []
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no .safetensors file")
    for path in files:
        with open(path, "rb") as f:
            header, base, data = _map_file(path, f) if mapped else _read_file(path, f)
        buffers.append(data)
        tensors.update(_views(path, header, base, data))
    return tensors, buffers


def _header(path: Path, prefix: bytes, size: int) -> tuple[dict, int]:
    """The JSON header and where the data starts, from the file's first bytes."""
    if size < 8 or len(prefix) < 8:
        raise ValueError(f"{path}: shorter than its header length")
    (n,) = struct.unpack_from("<Q", prefix, 0)
    if 8 + n > size or 8 + n > len(prefix):
        raise ValueError(f"{path}: the header runs past the end of the file")
    try:
        header = json.loads(bytes(prefix[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object")
    return header, 8 + n


def _map_file(path: Path, f) -> tuple[dict, int, Any]:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size \
        else b""
    header, base = _header(path, m, len(m))
    return header, base, m


def _read_file(path: Path, f) -> tuple[dict, int, Any]:
    """The header, and the whole file read into one uint8 tensor of the engine's memory.

    The memory asks for transparent huge pages: on the 2-core VM a GiB read into 4 KiB pages
    takes 4 s, mostly page faults, and 1.8 s into huge pages. The cold start is measured at
    its fastest."""
    import torch
    size = os.fstat(f.fileno()).st_size
    memory = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages
            pass
    data = torch.frombuffer(memory, dtype=torch.uint8, count=size) if size else \
        torch.empty(0, dtype=torch.uint8)
    view = memoryview(memory)[:size]
    done = 0
    while done < size:
        got = f.readinto(view[done:])
        if not got:
            raise ValueError(f"{path}: ended after {done} of {size} bytes")
        done += got
    header, base = _header(path, view, size)
    return header, base, data


def _views(path: Path, header: dict, base: int, data: Any) -> dict[str, Any]:
    """Each tensor of the header as a view of `data`, whose tensor data starts at `base`."""
    import torch
    tensors: dict[str, Any] = {}
    size = len(data)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: tensor '{name}' has no valid dtype, shape and "
                             f"data_offsets ({e!r})") from e
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {dtype}")
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * _SIZES[dtype] or base + end > size or begin > end:
            raise ValueError(f"{path}: tensor '{name}' has offsets [{begin}, {end}) that do "
                             f"not hold {dtype}{shape} inside the file")
        tensors[name] = _bytes(data, base + begin, end - begin).view(
            getattr(torch, _DTYPES[dtype])).reshape(shape)
    return tensors


def _bytes(data: Any, offset: int, count: int) -> Any:
    """`count` bytes of `data` (a uint8 tensor or a mapping) from `offset`, without a copy."""
    import torch
    if count == 0:
        return torch.empty(0, dtype=torch.uint8)
    if isinstance(data, torch.Tensor):  # a copy only where the file misaligns the tensor
        part = data[offset:offset + count]
        return part if offset % 8 == 0 else part.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the mapping is read-only
        return torch.frombuffer(data, dtype=torch.uint8, offset=offset, count=count)

"""Weights read from a model directory's safetensors files, for a cold start without Baton
(what an engine does today, and what perf/failover_torch compares Baton against).

The files are memory-mapped read-only and each tensor is a view of its bytes: the first
forward pass pages them in from the page cache or the disk. A header that is not valid
safetensors (sizes that do not match dtype and shape, data outside the file) is refused with
ValueError naming the file.
"""
from __future__ import annotations

import json
import mmap
import struct
import warnings
from pathlib import Path
from typing import Any

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool"}
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1}


def read_model(model_dir: str) -> tuple[dict[str, Any], list[mmap.mmap]]:
    """Every tensor of every *.safetensors file in `model_dir`, and the mappings that back
    them (keep them as long as the tensors)."""
    import torch
    tensors: dict[str, Any] = {}
    maps: list[mmap.mmap] = []
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no .safetensors file")
    for path in files:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(m)
        if len(m) < 8:
            raise ValueError(f"{path}: shorter than its header length")
        (n,) = struct.unpack_from("<Q", m, 0)
        if 8 + n > len(m):
            raise ValueError(f"{path}: the header runs past the end of the file")
        header = json.loads(bytes(m[8:8 + n]))
        base = 8 + n
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype, shape = entry["dtype"], entry["shape"]
            begin, end = entry["data_offsets"]
            if dtype not in _DTYPES:
                raise ValueError(f"{path}: tensor '{name}' has dtype {dtype}")
            count = 1
            for d in shape:
                count *= d
            if end - begin != count * _SIZES[dtype] or base + end > len(m) or begin > end:
                raise ValueError(f"{path}: tensor '{name}' has offsets [{begin}, {end}) that do "
                                 f"not hold {dtype}{shape} inside the file")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the mapping is read-only
                raw = torch.frombuffer(m, dtype=torch.uint8, offset=base + begin,
                                       count=end - begin) if end > begin else \
                    torch.empty(0, dtype=torch.uint8)
            tensors[name] = raw.view(getattr(torch, _DTYPES[dtype])).reshape(shape)
    return tensors, maps

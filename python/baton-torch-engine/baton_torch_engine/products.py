"""Products: the model's matrix products and per-row reductions, batch-invariant.

    p = Products(device, weights.values(), compute_dtype)
    y = p.linear(x, w)          # x (M, K) -> (M, N) in the compute dtype: x @ w.T
    z = p.logits(x, w)          # the same in fp32 (the LM head)
    n = p.rows(fn, x)           # fn on fixed-shape tiles of x's rows (norms, activations)

Every call hands the kernels the same shapes whatever M is: the rows are copied, a tile at a
time, into fresh tiles of `device.tile_rows` rows (zero-padded; an allocator's alignment, 64
bytes on the CPU, 512 on CUDA, whatever the row's place in x), and each tile is multiplied by
the same weight slices (the WideningScratch's on the CPU, the whole weight on CUDA). So row r's result is the result of the same calls on the same operands
as if r were alone: bit for bit the same in a batch of any size, in a prefill or a decode
step (device.py says why each device needs its tile size). On the CPU (tiles of one row) the
product of a row is a matrix-vector product over each widened slice, which costs no more than
the matrix product of a small batch: the widening, shared by the batch, is the bulk of a step.

The compute dtype: fp32 on the CPU (F16 and BF16 weights widened exactly); on CUDA the dtype
of the weights (products accumulate in fp32 inside the GEMM; device.start() turns TF32 and
reduced-precision reductions off). Not thread-safe: one compute thread.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch

from .device import ComputeDevice
from .scratch import WideningScratch


def compute_dtype_of(device: ComputeDevice, weights: Iterable[torch.Tensor]) -> torch.dtype:
    """fp32 on the CPU; on CUDA the dtype of the 2-D weights (one dtype for all of them)."""
    if not device.is_cuda:
        return torch.float32
    dtypes = {w.dtype for w in weights if w.dim() == 2}
    if len(dtypes) > 1:
        raise ValueError(f"the model's matrices mix dtypes {sorted(map(str, dtypes))}")
    return dtypes.pop() if dtypes else torch.float32


class Products:
    def __init__(self, device: ComputeDevice, weights: Iterable[torch.Tensor],
                 compute_dtype: torch.dtype):
        matrices = [w for w in weights if w.dim() == 2]
        self.device, self.dtype = device, compute_dtype
        self.tile = device.tile_rows
        narrow = [w for w in matrices if w.dtype != compute_dtype]
        if narrow and device.is_cuda:
            raise ValueError("on CUDA the products use the weights in their own dtype")
        longest = max((w.shape[1] for w in matrices), default=1)
        self.scratch: Optional[WideningScratch] = None
        if not device.is_cuda:  # the CPU multiplies by cache-sized slices, widened or not
            self.scratch = WideningScratch(max((w.numel() for w in narrow), default=0),
                                           longest)
        self._fp32_logits = device.is_cuda and compute_dtype != torch.float32 and \
            _has_fp32_output(device.torch, compute_dtype)

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T in the compute dtype, each row as if alone."""
        return self._product(x, w, self.dtype, lambda s, ws: torch.nn.functional.linear(s, ws))

    def logits(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T in fp32: on CUDA with narrow weights the GEMM's fp32 accumulator is kept
        where this PyTorch has mm(..., out_dtype=torch.float32), else it is rounded to the
        weights' dtype once and widened (as vLLM computes logits)."""
        if not self._fp32_logits:
            return self.linear(x, w).float()
        return self._product(x, w, torch.float32,
                             lambda s, ws: torch.mm(s, ws.t(), out_dtype=torch.float32))

    def _product(self, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype,
                 mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        m, k = x.shape
        if w.dim() != 2 or w.shape[1] != k:
            raise ValueError(f"a product of {list(x.shape)} with a weight of {list(w.shape)}")
        if self.tile == 0:  # the batch as it comes: no promise
            return mm(x.to(self.dtype), w)
        tiles = self._tiles(x)
        out = torch.empty(m, w.shape[0], dtype=out_dtype, device=self.device.torch)
        for first, end, ws in self._slices(w):
            out[:, first:end] = torch.cat([mm(t, ws)[:rows] for rows, t in tiles])
        return out

    def _tiles(self, x: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(real rows, a fresh zero-padded tile in the compute dtype) for each tile of x."""
        m, k = x.shape
        if self.tile == 1:
            return [(1, x[r:r + 1].to(self.dtype, copy=True)) for r in range(m)]
        out = []
        for r in range(0, m, self.tile):
            rows = min(self.tile, m - r)
            t = torch.zeros(self.tile, k, dtype=self.dtype, device=self.device.torch)
            t[:rows] = x[r:r + rows]
            out.append((rows, t))
        return out

    def _slices(self, w: torch.Tensor):
        if self.scratch is None:
            return iter([(0, w.shape[0], w)])
        return self.scratch.slices(w)

    def rows(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """fn applied to fixed-shape tiles of x's rows (fn must treat rows independently and
        keep the row count), concatenated: each row's result as if alone."""
        m = x.shape[0]
        if m == 0 or self.tile == 0:
            return fn(x)
        if self.tile == 1:
            return torch.cat([fn(x[r:r + 1].clone()) for r in range(m)])
        parts = []
        for r in range(0, m, self.tile):
            rows = min(self.tile, m - r)
            tile = x.new_zeros((self.tile,) + tuple(x.shape[1:]))
            tile[:rows] = x[r:r + rows]
            parts.append(fn(tile)[:rows])
        return torch.cat(parts)


def _has_fp32_output(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch.mm takes out_dtype=torch.float32 for `dtype` inputs on `device`."""
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False

"""WideningScratch: fp32 products with F16 and BF16 weights, widened into one reused buffer.

A product with a narrow weight widens it to fp32 first (exactly: every F16 and BF16 value is
an fp32 value). Widened into a fresh tensor, each product would allocate the matrix anew, and
for a matrix of megabytes glibc hands out fresh pages that the kernel must fault in and zero:
on the 2-core VM, 190 ms for one 5632x2048 BF16 matrix, against 3 ms to widen it into pages
already there. So the widening goes into one small buffer, allocated once when the model is
built (the standby's half start, not its first token) with its pages faulted in then, and a
matrix is multiplied a slice of rows at a time: each slice is widened into the buffer and
multiplied while it is still in the cache, so the fp32 copy never goes out to memory (on the
VM, 1.05 s a forward pass of the ~2 GiB BF16 model against 1.25 s with a buffer the size of
the widest matrix). Each output is the same dot product of one row either way, so slicing
the rows changes no value. The buffer asks for transparent huge pages: a few faults to fill,
a few frees when its process is torn down.

Not thread-safe: the model's one compute thread uses it.
"""
from __future__ import annotations

import mmap

import torch

_HUGE_PAGE = 2 << 20


class WideningScratch:
    # The slice budget: 1 MiB of fp32, about what a core's L2 cache holds.
    BUDGET = 1 << 18

    def __init__(self, widest: int, longest_row: int):
        """A buffer for slices of matrices of up to `widest` values whose rows have up to
        `longest_row` values: at most BUDGET values, and always at least one row."""
        self.elements = max(min(int(widest), self.BUDGET), int(longest_row), 1)
        size = -(-self.elements * 4 // _HUGE_PAGE) * _HUGE_PAGE
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # a kernel without transparent huge pages: 4 KiB pages then
                pass
        self.buffer = torch.frombuffer(self._map, dtype=torch.float32, count=self.elements)
        self.buffer.zero_()

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T in fp32, for a 2-D weight `w` of any of fp32, F16 or BF16."""
        if w.dtype == torch.float32:
            return torch.nn.functional.linear(x, w)
        rows, cols = w.shape
        step = max(self.elements // max(cols, 1), 1)
        if step >= rows:
            return torch.nn.functional.linear(x, self._widen(w))
        parts = [torch.nn.functional.linear(x, self._widen(w[r:r + step]))
                 for r in range(0, rows, step)]
        return torch.cat(parts, dim=-1)

    def _widen(self, w: torch.Tensor) -> torch.Tensor:
        n = w.numel()
        if n > self.elements:
            raise ValueError(f"a row of {w.shape[-1]} values is longer than the scratch "
                             f"buffer of {self.elements}")
        wide = self.buffer[:n].view(w.shape)
        wide.copy_(w)
        return wide

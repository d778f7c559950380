"""WideningScratch: F16 and BF16 weights widened to fp32 a slice of rows at a time, into one
reused buffer, for the CPU's fp32 products.

A product with a narrow weight widens it to fp32 first (exactly: every F16 and BF16 value is
an fp32 value). Widened into a fresh tensor, each product would allocate the matrix anew, and
for a matrix of megabytes glibc hands out fresh pages that the kernel must fault in and zero:
on the 2-core VM, 190 ms for one 5632x2048 BF16 matrix, against 3 ms to widen it into pages
already there. So the widening goes into one small buffer, allocated once when the model is
built (the standby's half start, not its first token) with its pages faulted in then, and a
matrix is multiplied a slice of rows at a time: each slice is widened into the buffer and
multiplied while it is still in the cache, so the fp32 copy never goes out to memory (on the
VM, 1.05 s a forward pass of the ~2 GiB BF16 model against 1.25 s with a buffer the size of
the widest matrix). The buffer asks for transparent huge pages: a few faults to fill, a few
frees when its process is torn down.

Slicing changes the products' values in the last bits: a slice is a product of another shape,
and a CPU's matrix kernels choose their blocking, vector body and tail from the shape. On the
2-core AMD EPYC VM (AVX-512), 37 rows times a 700x1024 fp32 matrix and the same matrix cut in
slices of 100 rows differ in 9,255 of the 25,900 outputs (3 rows agree there, and not on
another CPU). Each result is within the rounding bound of the exact product; none is "the"
fp32 product. What the engine relies on is that the slices are the same for every call with
the same matrix: their boundaries depend only on the matrix's shape and BUDGET, never on the
input, so a row's product is the same whatever the batch (products.py).

Not thread-safe: the model's one compute thread uses it.
"""
from __future__ import annotations

import mmap
from typing import Iterator

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

    def slices(self, w: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(first row, end row, the rows in fp32) for each slice of BUDGET values of the 2-D
        weight `w`, in order: F16 and BF16 rows widened into the buffer (valid until the next
        slice is asked for), fp32 rows as views of `w` (used in place; a slice stays in the
        cache while a batch's rows are multiplied by it). ValueError when a row does not fit
        the buffer."""
        rows, cols = w.shape
        step = max(self.BUDGET // max(cols, 1), 1)
        for r in range(0, rows, step):
            end = min(r + step, rows)
            yield r, end, w[r:end] if w.dtype == torch.float32 else self._widen(w[r:end])

    def _widen(self, w: torch.Tensor) -> torch.Tensor:
        n = w.numel()
        if n > self.elements:
            raise ValueError(f"a row of {w.shape[-1]} values is longer than the scratch "
                             f"buffer of {self.elements}")
        wide = self.buffer[:n].view(w.shape)
        wide.copy_(w)
        return wide

"""Where the model computes, and the shapes it computes in: the device policy.

    dev = ComputeDevice.parse("cuda:0")     # or "cpu" (the default), "cuda"
    dev.start()                             # CUDA: the context and the matmul settings

A token's logits must not depend on what else its step computes (the other sequences of a
batch, or whether its own tokens come in a prefill or one at a time): lossless replay
continues an interrupted stream as prompt + the tokens already sent, prefilled in a batch of
another size, and promises the same tokens as the undisturbed run. Kernels choose their
reduction order from the shapes they are given (the CPU's vector body and scalar tail, its
thread split, a GPU library's tile and split-K choice), so the model never hands a kernel a
shape that depends on the batch: every product, norm and attention runs on tiles of a fixed
number of rows, padded, and each row's result is then a function of that row alone.

* CPU: tiles of one row (`tile_rows` 1, `attention_rows` 1). Each row goes through the same
  calls, on the same shapes, as it would alone; this is what makes the CPU engine
  batch-invariant, bit for bit, on any x86-64 (python/tests/test_batch_invariance.py).
* CUDA: products on tiles of 128 rows (the GEMM a library picks for a fixed problem is the
  same every time, and a GEMM treats its rows alike), attention on tiles of 32 rows; TF32 and
  reduced-precision split-K reductions are turned off, so products accumulate in fp32. A
  decode step's products read the weights once either way (128 rows keep an H200's GEMM
  memory-bound); a prefill of T tokens reads them T / 128 times. `--tile-rows 0` hands the
  products the batch as it comes instead: faster prefills, and no promise (the engine's
  `baton_engine_batch_invariant` is 0 and its replays are counted as such).

The CUDA-only parts are here and in `cuda_error_code`; the rest of the engine is the same
code on both devices.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional

import torch

CUDA_TILE_ROWS = 128
CUDA_ATTENTION_ROWS = 32


class DeviceError(RuntimeError):
    """The device asked for cannot be used (no CUDA in this torch, no such GPU)."""


@dataclass(frozen=True)
class ComputeDevice:
    kind: str                      # "cpu" or "cuda"
    index: Optional[int] = None    # the CUDA ordinal; None: the current device
    tile_rows: int = 1             # rows per product and norm tile; 0: the batch as it comes
    attention_rows: int = 1        # query rows per attention tile

    @classmethod
    def parse(cls, text: str, tile_rows: Optional[int] = None) -> "ComputeDevice":
        """"cpu", "cuda" or "cuda:N"; tile_rows sets the CUDA product tile (None: the
        default; 0: none). ValueError naming what is wrong."""
        kind, _, index = text.strip().partition(":")
        if kind == "cpu" and not index:
            if tile_rows not in (None, 1):
                raise ValueError("--tile-rows applies to --device cuda only (the CPU computes "
                                 "one row at a time)")
            return cls("cpu")
        if kind != "cuda":
            raise ValueError(f"--device {text!r}: expected cpu, cuda or cuda:N")
        if index and not index.isdigit():
            raise ValueError(f"--device {text!r}: the CUDA ordinal must be a number")
        if tile_rows is not None and tile_rows < 0:
            raise ValueError("--tile-rows must be 0 (no tiles) or more")
        return cls("cuda", int(index) if index else None,
                   CUDA_TILE_ROWS if tile_rows is None else tile_rows, CUDA_ATTENTION_ROWS)

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's results do not depend on the batch (fixed tiles)."""
        return self.tile_rows > 0

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch(self) -> torch.device:
        if not self.is_cuda:
            return torch.device("cpu")
        return torch.device("cuda", self.index if self.index is not None else
                            torch.cuda.current_device())

    def with_index(self, index: int) -> "ComputeDevice":
        """This device on CUDA ordinal `index` (what the controller's device memory is on)."""
        return ComputeDevice(self.kind, index, self.tile_rows, self.attention_rows)

    def start(self) -> str:
        """Makes the device ready to compute: on CUDA, the context (the first allocation) and
        the settings that keep products in fp32 accumulation. Returns a line for the log.
        DeviceError when CUDA cannot be used."""
        if not self.is_cuda:
            return f"computing on the CPU with {torch.get_num_threads()} threads, one row per tile"
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {self.name}: this PyTorch ({torch.__version__}) has no "
                              "usable CUDA (torch.cuda.is_available() is false); Debian's "
                              "python3-torch is CPU-only: install a CUDA build of PyTorch")
        count = torch.cuda.device_count()
        if self.index is not None and not 0 <= self.index < count:
            raise DeviceError(f"--device {self.name}: there are {count} CUDA devices")
        torch.cuda.set_device(self.torch)
        fp32_products(torch.backends)
        torch.zeros(1, device=self.torch)  # the context, before anything waits on this engine
        return (f"computing on {self.name} ({torch.cuda.get_device_name(self.torch)}), "
                f"products on tiles of {self.tile_rows} rows, attention on tiles of "
                f"{self.attention_rows}")

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch)


def _has(module: Any, name: str) -> bool:
    """Whether a torch.backends module has the setting `name` (an older torch's raises
    AssertionError for an unknown one, which hasattr does not catch)."""
    try:
        getattr(module, name)
    except (AttributeError, AssertionError):
        return False
    return True


def fp32_products(backends: Any) -> None:
    """Products and convolutions in fp32 accumulation, without TF32 or reduced-precision
    split-K. A torch with `fp32_precision` (2.9 and later) is told through it alone ("ieee"):
    the allow_tf32 flags are its legacy API, which it refuses to mix with the new. An older one is
    told through allow_tf32."""
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    if _has(matmul, "fp32_precision"):
        for module in (matmul, cudnn, getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None)):
            if module is not None and _has(module, "fp32_precision"):
                module.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False
        cudnn.allow_tf32 = False
    for flag in ("allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction"):
        if _has(matmul, flag):
            setattr(matmul, flag, False)


_cuda_driver: Any = None


def cuda_error_code(error: BaseException) -> int:
    """The CUDA error behind `error` (0 when it was not one): what cuCtxSynchronize() returns
    now, a CUresult, which after a sticky error (an illegal address, a launch failure, an
    uncorrectable ECC error) is that error for the rest of the context's life; where the
    context is sound (or the driver library is missing), the exception's own code where
    PyTorch gives one (AcceleratorError.error_code: a runtime cudaError_t, not a CUresult;
    baton_engine_report_cuda_error takes either, as the two agree on every sticky error)."""
    result = _synchronize_context()
    if result != 0:
        return result
    code = getattr(error, "error_code", None)
    return code if isinstance(code, int) else 0


def _synchronize_context() -> int:
    """cuCtxSynchronize() of this thread's context; 0 without a driver library."""
    global _cuda_driver
    try:
        if _cuda_driver is None:
            _cuda_driver = ctypes.CDLL("libcuda.so.1")
            _cuda_driver.cuCtxSynchronize.restype = ctypes.c_int
        return int(_cuda_driver.cuCtxSynchronize())
    except OSError:  # no driver library: not a CUDA error
        return 0
